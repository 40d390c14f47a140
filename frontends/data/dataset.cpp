#include "frontends/data/dataset.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>

#include "frontends/data/images.h"
#include "frontends/file_io.h"
#include "frontends/npy/npy.h"

namespace kiln::frontends {

namespace {

struct IdxArray {
  uint8_t type = 0;
  std::vector<uint64_t> dims;
  std::vector<uint8_t> bytes;
};

constexpr uint8_t kIdxUnsignedByte = 0x08;

Expected<IdxArray> readIdxFile(const std::string& path, size_t expectedRank) {
  KILN_ASSIGN_OR_RETURN(InputFile f, openInputFile(path, "IDX file"));
  unsigned char header[4];
  if (f.size < 4 || !f.stream.read(reinterpret_cast<char*>(header), 4))
    return invalidArgument("IDX file '" + path + "': shorter than its 4-byte magic");
  if (header[0] != 0 || header[1] != 0)
    return invalidArgument("IDX file '" + path +
                           "': not an IDX file (it must start with two zero bytes)");
  IdxArray a;
  a.type = header[2];
  if (a.type != kIdxUnsignedByte) {
    char type[8];
    std::snprintf(type, sizeof type, "0x%02x", a.type);
    return unimplemented("IDX file '" + path + "': element type " + type +
                         " (kiln reads unsigned bytes, 0x08, as MNIST and Fashion-MNIST use)");
  }
  if (header[3] != expectedRank)
    return invalidArgument("IDX file '" + path + "': rank " + std::to_string(header[3]) +
                           ", expected " + std::to_string(expectedRank) +
                           (expectedRank == 3 ? " (images: count, rows, columns)" : " (labels)"));
  if (f.size < 4 + 4 * uint64_t{header[3]})
    return invalidArgument("IDX file '" + path + "': truncated header");
  for (int d = 0; d < header[3]; ++d) {
    unsigned char b[4];
    f.stream.read(reinterpret_cast<char*>(b), 4);
    a.dims.push_back((uint64_t{b[0]} << 24) | (uint64_t{b[1]} << 16) | (uint64_t{b[2]} << 8) |
                     uint64_t{b[3]});
  }
  const std::optional<uint64_t> bytes = checkedByteSize(a.dims, 1);
  const uint64_t headerBytes = 4 + 4 * uint64_t{header[3]};
  if (!bytes || *bytes != f.size - headerBytes)
    return invalidArgument("IDX file '" + path + "': its header gives " +
                           (bytes ? std::to_string(*bytes) : std::string("too many")) +
                           " bytes of data, the file holds " +
                           std::to_string(f.size - headerBytes));
  a.bytes.resize(*bytes);
  if (*bytes > 0 &&
      !f.stream.read(reinterpret_cast<char*>(a.bytes.data()), static_cast<std::streamsize>(*bytes)))
    return ioError("IDX file '" + path + "': read failed");
  return a;
}

}  // namespace

Expected<Dataset> readIdx(const std::string& imagesPath, const std::string& labelsPath) {
  KILN_ASSIGN_OR_RETURN(IdxArray images, readIdxFile(imagesPath, 3));
  KILN_ASSIGN_OR_RETURN(IdxArray labels, readIdxFile(labelsPath, 1));
  if (images.dims[0] != labels.dims[0])
    return invalidArgument("IDX files '" + imagesPath + "' and '" + labelsPath +
                           "': " + std::to_string(images.dims[0]) + " images but " +
                           std::to_string(labels.dims[0]) + " labels");
  if (images.dims[0] == 0) return invalidArgument("IDX file '" + imagesPath + "' holds no images");
  const auto m = static_cast<int64_t>(images.dims[0]);
  const auto h = static_cast<int64_t>(images.dims[1]), w = static_cast<int64_t>(images.dims[2]);
  Dataset d{ir::TensorData(ir::DType::kF32, {m, 1, h, w}),
            ir::TensorData(ir::DType::kI64, {m}),
            imagesPath,
            {},
            {}};
  float* x = d.x.as<float>();
  for (size_t i = 0; i < images.bytes.size(); ++i)
    x[i] = static_cast<float>(images.bytes[i]) / 255.f;
  int64_t* y = d.labels.as<int64_t>();
  for (int64_t i = 0; i < m; ++i) y[i] = labels.bytes[static_cast<size_t>(i)];
  return d;
}

namespace {

// Samples `x` and class indices `y` (named `xName` and `yName` in messages): f32 samples as they
// are, u8 ones (images) scaled to [0, 1] as IDX images are; i32 and u8 labels (Keras's
// mnist.npz) widened to i64. Samples
// with as many elements as `sampleShape` (when given) take that shape ([M, 28, 28] images for a
// model of [1, 28, 28]).
Expected<Dataset> makeDataset(ir::TensorData x, ir::TensorData y, const std::string& xName,
                              const std::string& yName, const ir::Shape& sampleShape = {}) {
  if (x.dtype() == ir::DType::kU8 && !x.shape().empty()) {
    ir::TensorData f(ir::DType::kF32, x.shape());
    for (int64_t i = 0; i < x.numElements(); ++i)
      f.as<float>()[i] = static_cast<float>(x.as<uint8_t>()[i]) / 255.f;
    x = std::move(f);
  }
  if (x.dtype() != ir::DType::kF32 || x.shape().empty())
    return invalidArgument(xName + ": expected f32 or u8 samples [M, ...], got " +
                           x.type().toString());
  if (!sampleShape.empty() && x.shape()[0] > 0 &&
      x.numElements() / x.shape()[0] ==
          ir::TensorType{ir::DType::kF32, sampleShape}.numElements()) {
    ir::Shape shape = sampleShape;
    shape.insert(shape.begin(), x.shape()[0]);
    // The same bytes under the model's sample shape (the wrap keeps the storage alive).
    auto owner = std::make_shared<ir::TensorData>(x);
    x = ir::TensorData::wrap(ir::DType::kF32, shape, owner->data(), owner);
  }
  if ((y.dtype() != ir::DType::kI64 && y.dtype() != ir::DType::kI32 &&
       y.dtype() != ir::DType::kU8) ||
      y.shape().size() != 1 || y.shape()[0] != x.shape()[0])
    return invalidArgument(yName + ": expected i64, i32 or u8 [" + std::to_string(x.shape()[0]) +
                           "] class indices, got " + y.type().toString());
  if (y.dtype() != ir::DType::kI64) {
    ir::TensorData wide(ir::DType::kI64, y.shape());
    for (int64_t i = 0; i < y.numElements(); ++i)
      wide.as<int64_t>()[i] = y.dtype() == ir::DType::kU8 ? y.as<uint8_t>()[i] : y.as<int32_t>()[i];
    y = std::move(wide);
  }
  return Dataset{std::move(x), std::move(y), xName, {}, {}};
}

}  // namespace

Expected<Dataset> readNpyPair(const std::string& xPath, const std::string& yPath) {
  KILN_ASSIGN_OR_RETURN(ir::TensorData x, readNpy(xPath));
  KILN_ASSIGN_OR_RETURN(ir::TensorData y, readNpy(yPath));
  return makeDataset(std::move(x), std::move(y), xPath, yPath);
}

Expected<DataSplit> readNpzData(const std::string& path, const ir::Shape& sampleShape) {
  KILN_ASSIGN_OR_RETURN(auto arrays, readNpz(path));
  auto take = [&](const std::string& xKey, const std::string& yKey) -> Expected<Dataset> {
    return makeDataset(std::move(arrays.at(xKey)), std::move(arrays.at(yKey)),
                       path + " [" + xKey + "]", path + " [" + yKey + "]", sampleShape);
  };
  DataSplit s;
  if (arrays.count("x_train") && arrays.count("y_train")) {
    KILN_ASSIGN_OR_RETURN(s.train, take("x_train", "y_train"));
    if (arrays.count("x_test") && arrays.count("y_test")) {
      KILN_ASSIGN_OR_RETURN(Dataset v, take("x_test", "y_test"));
      if (v.sampleShape() != s.train.sampleShape())
        return invalidArgument(v.source + ": samples of " + ir::shapeToString(v.sampleShape()) +
                               ", the training samples are " +
                               ir::shapeToString(s.train.sampleShape()));
      s.validation = std::move(v);
    }
    return s;
  }
  if (arrays.count("x") && arrays.count("y")) {
    KILN_ASSIGN_OR_RETURN(s.train, take("x", "y"));
    return s;
  }
  std::string names;
  for (const auto& [name, t] : arrays) names += (names.empty() ? "" : ", ") + name;
  return invalidArgument("npz file '" + path +
                         "': expected arrays x_train and y_train (x_test and y_test: the "
                         "validation set), or x and y; it holds " +
                         (names.empty() ? std::string("no .npy arrays") : names));
}

Expected<DataSplit> loadDataSpec(const std::string& spec, const ir::Shape& sampleShape,
                                 std::vector<float> mean, std::vector<float> std) {
  namespace fs = std::filesystem;
  auto usage = [&](const std::string& why) {
    return invalidArgument("--data '" + spec + "': " + why +
                           "; expected idx:DIR (MNIST-format IDX files), npy:X.npy,Y.npy, "
                           "npz:FILE.npz or folder:DIR (DIR/<class>/*.png|jpg)");
  };
  if (spec.rfind("idx:", 0) == 0) {
    const std::string dir = spec.substr(4);
    if (!fs::is_directory(dir))
      return notFound("--data '" + spec + "': no directory '" + dir + "'");
    DataSplit s;
    KILN_ASSIGN_OR_RETURN(
        s.train, readIdx(dir + "/train-images-idx3-ubyte", dir + "/train-labels-idx1-ubyte"));
    const std::string vi = dir + "/t10k-images-idx3-ubyte", vl = dir + "/t10k-labels-idx1-ubyte";
    if (fs::exists(vi) && fs::exists(vl)) {
      KILN_ASSIGN_OR_RETURN(Dataset v, readIdx(vi, vl));
      if (!std::equal(v.x.shape().begin() + 1, v.x.shape().end(), s.train.x.shape().begin() + 1,
                      s.train.x.shape().end()))
        return invalidArgument(vi + ": images of " + v.x.type().toString() +
                               ", the training images are " + s.train.x.type().toString());
      s.validation = std::move(v);
    }
    return s;
  }
  if (spec.rfind("npy:", 0) == 0) {
    const std::string rest = spec.substr(4);
    const size_t comma = rest.find(',');
    if (comma == std::string::npos) return usage("npy: needs two files, X.npy,Y.npy");
    DataSplit s;
    KILN_ASSIGN_OR_RETURN(s.train, readNpyPair(rest.substr(0, comma), rest.substr(comma + 1)));
    return s;
  }
  if (spec.rfind("npz:", 0) == 0) return readNpzData(spec.substr(4), sampleShape);
  if (spec.rfind("folder:", 0) == 0)
    return readImageFolder(spec.substr(7), sampleShape, std::move(mean), std::move(std));
  return usage("unknown form");
}

namespace {

bool isImageFile(const std::filesystem::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

// The classes (sorted subdirectories) of `dir`, or those given.
Expected<Dataset> readFolder(const std::string& dir, std::vector<std::string>& classes,
                             const ir::Shape& shape, const std::vector<float>& mean,
                             const std::vector<float>& std) {
  namespace fs = std::filesystem;
  const bool given = !classes.empty();
  if (!given) {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory()) classes.push_back(e.path().filename().string());
    std::sort(classes.begin(), classes.end());
    if (classes.empty())
      return invalidArgument("image folder '" + dir +
                             "': no class subdirectories (expected DIR/<class>/<image>.png)");
  }
  auto files = std::make_shared<std::vector<std::string>>();
  std::vector<int64_t> labels;
  for (size_t k = 0; k < classes.size(); ++k) {
    const fs::path sub = fs::path(dir) / classes[k];
    if (!fs::is_directory(sub)) {
      if (given) continue;  // A validation set may lack a class.
      return invalidArgument("image folder '" + sub.string() + "' is not a directory");
    }
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(sub))
      if (e.is_regular_file() && isImageFile(e.path())) names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    for (std::string& n : names) {
      files->push_back(std::move(n));
      labels.push_back(static_cast<int64_t>(k));
    }
  }
  if (given)
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory() &&
          std::find(classes.begin(), classes.end(), e.path().filename().string()) == classes.end())
        return invalidArgument("image folder '" + dir + "': class '" +
                               e.path().filename().string() +
                               "' is not one of the training set's classes");
  if (files->empty())
    return invalidArgument("image folder '" + dir + "': no .png, .jpg or .jpeg files in " +
                           std::to_string(classes.size()) + " class directories");
  Dataset d;
  d.source = dir;
  d.labels = ir::TensorData(ir::DType::kI64, {static_cast<int64_t>(labels.size())});
  std::copy(labels.begin(), labels.end(), d.labels.as<int64_t>());
  d.lazyShape = shape;
  const int channels = static_cast<int>(shape[0]);
  const int64_t h = shape[1], w = shape[2];
  d.sample = [files, channels, h, w, mean, std](int64_t i, float* dst) -> Status {
    KILN_ASSIGN_OR_RETURN(Image im, decodeImage((*files)[static_cast<size_t>(i)], channels));
    imageToTensor(im, h, w, dst);
    if (!mean.empty())
      for (int c = 0; c < channels; ++c)
        for (int64_t k = 0; k < h * w; ++k)
          dst[c * h * w + k] =
              (dst[c * h * w + k] - mean[static_cast<size_t>(c)]) / std[static_cast<size_t>(c)];
    return Status::ok();
  };
  std::vector<float> first(static_cast<size_t>(channels * h * w));
  KILN_TRY(d.sample(0, first.data()));  // A folder of unreadable files fails now.
  return d;
}

}  // namespace

Expected<DataSplit> readImageFolder(const std::string& dir, const ir::Shape& sampleShape,
                                    std::vector<float> mean, std::vector<float> std) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) return notFound("image folder '" + dir + "' does not exist");
  if (sampleShape.size() != 3 || (sampleShape[0] != 1 && sampleShape[0] != 3) ||
      sampleShape[1] < 1 || sampleShape[2] < 1)
    return invalidArgument("image folder '" + dir + "': the model's samples are " +
                           ir::shapeToString(sampleShape) +
                           "; images become [C, H, W] with C 1 (grey) or 3 (RGB)");
  if (mean.size() != std.size() ||
      (!mean.empty() && mean.size() != static_cast<size_t>(sampleShape[0])))
    return invalidArgument("image folder '" + dir +
                           "': normalization needs one mean and one "
                           "std per channel");
  std::vector<std::string> classes;
  DataSplit s;
  const bool split =
      fs::is_directory(fs::path(dir) / "train") && fs::is_directory(fs::path(dir) / "val");
  KILN_ASSIGN_OR_RETURN(s.train, readFolder(split ? (fs::path(dir) / "train").string() : dir,
                                            classes, sampleShape, mean, std));
  if (split) {
    KILN_ASSIGN_OR_RETURN(
        Dataset v, readFolder((fs::path(dir) / "val").string(), classes, sampleShape, mean, std));
    s.validation = std::move(v);
  }
  return s;
}

std::vector<int64_t> epochOrder(int64_t size, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), 0);
  if (shuffle) {
    // Fisher-Yates with a generator of (seed, epoch) alone; std::shuffle's algorithm is not
    // specified, and a resumed run must see the same order on every library.
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1);
    for (int64_t i = size - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
  }
  return order;
}

Expected<DataSplit> splitValidation(Dataset d, double fraction, uint64_t seed) {
  if (!(fraction > 0 && fraction < 1))
    return invalidArgument("--val-split must be in (0, 1), got " + std::to_string(fraction));
  const int64_t m = d.size();
  const auto nVal = static_cast<int64_t>(static_cast<double>(m) * fraction);
  if (nVal < 1 || nVal >= m)
    return invalidArgument("--val-split " + std::to_string(fraction) + " of " + std::to_string(m) +
                           " samples leaves no validation or no training set");
  std::vector<int64_t> perm = epochOrder(m, seed, -1, true);
  std::vector<int64_t> val(perm.begin(), perm.begin() + nVal),
      train(perm.begin() + nVal, perm.end());
  std::sort(val.begin(), val.end());
  std::sort(train.begin(), train.end());
  DataSplit s;
  if (d.sample) {  // Read lazily: each part reads through its own index map.
    auto part = [&](const std::vector<int64_t>& idx, std::string source) {
      Dataset p;
      p.source = std::move(source);
      p.lazyShape = d.lazyShape;
      p.labels = ir::TensorData(ir::DType::kI64, {static_cast<int64_t>(idx.size())});
      for (size_t k = 0; k < idx.size(); ++k)
        p.labels.as<int64_t>()[k] = d.labels.as<int64_t>()[idx[k]];
      p.sample = [base = d.sample, idx](int64_t i, float* dst) {
        return base(idx[static_cast<size_t>(i)], dst);
      };
      return p;
    };
    s.train = part(train, d.source);
    s.validation = part(val, d.source + " (validation split)");
    return s;
  }
  KILN_ASSIGN_OR_RETURN(Batch t, gatherBatch(d, train, 0, static_cast<int64_t>(train.size())));
  KILN_ASSIGN_OR_RETURN(Batch v, gatherBatch(d, val, 0, nVal));
  s.train = {std::move(t.x), std::move(t.labels), d.source, {}, {}};
  s.validation =
      Dataset{std::move(v.x), std::move(v.labels), d.source + " (validation split)", {}, {}};
  return s;
}

Expected<Batch> gatherBatch(const Dataset& d, const std::vector<int64_t>& order, int64_t first,
                            int64_t n) {
  ir::Shape shape = d.sampleShape();
  const int64_t per = ir::numElements(shape);
  shape.insert(shape.begin(), n);
  Batch b{ir::TensorData(ir::DType::kF32, shape), ir::TensorData(ir::DType::kI64, {n}), 0, 0, {}};
  for (int64_t k = 0; k < n; ++k) {
    const int64_t src = order[static_cast<size_t>(first + k)];
    if (d.sample) {
      KILN_TRY(d.sample(src, b.x.as<float>() + k * per));
    } else {
      std::memcpy(b.x.as<float>() + k * per, d.x.as<float>() + src * per,
                  static_cast<size_t>(per) * sizeof(float));
    }
    b.labels.as<int64_t>()[k] = d.labels.as<int64_t>()[src];
  }
  return b;
}

BatchLoader::BatchLoader(const Dataset& dataset, int64_t batch, uint64_t seed, bool shuffle,
                         int prefetch, int64_t startEpoch, int64_t startIndex, Shard shard)
    : data_(dataset),
      batch_(batch),
      shard_(shard),
      perEpoch_(dataset.size() / (batch * shard.count)),
      seed_(seed),
      shuffle_(shuffle),
      prefetch_(static_cast<size_t>(std::max(1, prefetch))),
      epoch_(startEpoch),
      index_(startIndex) {
  worker_ = std::thread([this] { produce(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void BatchLoader::produce() {
  std::vector<int64_t> order;
  int64_t orderEpoch = -1;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || ready_.size() < prefetch_; });
      if (stop_) return;
    }
    if (perEpoch_ == 0) return;  // Fewer samples than one batch: next() reports nothing.
    if (index_ >= perEpoch_) {
      ++epoch_;
      index_ = 0;
    }
    if (orderEpoch != epoch_) {
      order = epochOrder(data_.size(), seed_, epoch_, shuffle_);
      orderEpoch = epoch_;
    }
    Expected<Batch> got =
        gatherBatch(data_, order, (index_ * shard_.count + shard_.index) * batch_, batch_);
    Batch b;
    if (got)
      b = std::move(*got);
    else
      b.status = got.status();
    b.epoch = epoch_;
    b.index = index_++;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(b));
    }
    cv_.notify_all();
  }
}

Expected<Batch> BatchLoader::next() {
  if (perEpoch_ == 0) return Batch{};
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty(); });
  waitMs_ +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  Batch b = std::move(ready_.front());
  ready_.pop_front();
  lock.unlock();
  cv_.notify_all();
  if (!b.status) return b.status;
  return b;
}

}  // namespace kiln::frontends
