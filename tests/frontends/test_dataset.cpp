// Training data: IDX reading and its refusals, the validation split, per-epoch orders and the
// prefetching batch loader.
#include "frontends/data/dataset.h"

#include <png.h>
#include <turbojpeg.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <set>

#include "frontends/data/images.h"
#include "frontends/test_files.h"

namespace kiln::frontends {
namespace {

using test::errorOf;

std::string idxBytes(uint8_t type, const std::vector<uint32_t>& dims, size_t dataBytes,
                     uint8_t fill = 0) {
  std::string s{'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((d >> shift) & 255));
  for (size_t i = 0; i < dataBytes; ++i) s.push_back(static_cast<char>(fill + i));
  return s;
}

struct IdxFiles {
  test::TempDir dir;
  std::string images = dir.file("images"), labels = dir.file("labels");
  IdxFiles(const std::string& imageBytes, const std::string& labelBytes) {
    test::writeBytes(images, imageBytes);
    test::writeBytes(labels, labelBytes);
  }
};

TEST_CASE("IDX images and labels become f32 images scaled to 0..1 and i64 labels") {
  IdxFiles f(idxBytes(0x08, {3, 2, 2}, 12), idxBytes(0x08, {3}, 3, 7));
  auto d = readIdx(f.images, f.labels);
  KILN_REQUIRE_OK(d);
  CHECK(d->x.shape() == ir::Shape{3, 1, 2, 2});
  CHECK(d->size() == 3);
  CHECK(d->x.as<float>()[0] == 0.f);
  CHECK(d->x.as<float>()[11] == Approx(11.f / 255.f));
  CHECK(d->labels.as<int64_t>()[0] == 7);
  CHECK(d->labels.as<int64_t>()[2] == 9);
}

TEST_CASE("malformed IDX files are refused, naming the file and what is wrong") {
  const std::string labels = idxBytes(0x08, {3}, 3);
  struct Case {
    std::string images, expected;
  };
  const std::vector<Case> cases = {
      {"\x01\x02", "shorter than its 4-byte magic"},
      {idxBytes(0x08, {3, 2, 2}, 12).replace(0, 1, "\x05"), "not an IDX file"},
      {idxBytes(0x0D, {3, 2, 2}, 48), "element type 0x0d"},
      {idxBytes(0x08, {3, 4}, 12), "rank 2, expected 3"},
      {idxBytes(0x08, {3, 2, 2}, 11), "header gives 12 bytes of data, the file holds 11"},
      {idxBytes(0x08, {3, 2, 2}, 13), "header gives 12 bytes of data, the file holds 13"},
      {idxBytes(0x08, {4, 2, 2}, 16), "4 images but 3 labels"},
      {idxBytes(0x08, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, 0), "the file holds 0"},
      {std::string("\0\0\x08\x03\0\0", 6), "truncated header"},
  };
  for (const Case& c : cases) {
    IdxFiles f(c.images, labels);
    const Status st = errorOf(readIdx(f.images, f.labels));
    INFO(st.message());
    CHECK(st.message().find(c.expected) != std::string::npos);
    CHECK(st.message().find(f.images) != std::string::npos);
  }
  IdxFiles f(idxBytes(0x08, {3, 2, 2}, 12), idxBytes(0x08, {3}, 3));
  CHECK(errorOf(readIdx(f.images, f.dir.file("missing"))).code() == ErrorCode::kNotFound);
}

TEST_CASE("data specs: idx:DIR with its t10k validation set; npy pairs; errors") {
  test::TempDir dir;
  test::writeBytes(dir.file("train-images-idx3-ubyte"), idxBytes(0x08, {5, 2, 2}, 20));
  test::writeBytes(dir.file("train-labels-idx1-ubyte"), idxBytes(0x08, {5}, 5));
  auto s = loadDataSpec("idx:" + dir.path());
  KILN_REQUIRE_OK(s);
  CHECK(s->train.size() == 5);
  CHECK_FALSE(s->validation.has_value());
  test::writeBytes(dir.file("t10k-images-idx3-ubyte"), idxBytes(0x08, {2, 2, 2}, 8));
  test::writeBytes(dir.file("t10k-labels-idx1-ubyte"), idxBytes(0x08, {2}, 2));
  s = loadDataSpec("idx:" + dir.path());
  KILN_REQUIRE_OK(s);
  REQUIRE(s->validation.has_value());
  CHECK(s->validation->size() == 2);
  test::writeBytes(dir.file("t10k-images-idx3-ubyte"), idxBytes(0x08, {2, 3, 3}, 18));
  CHECK(errorOf(loadDataSpec("idx:" + dir.path())).message().find("the training images are") !=
        std::string::npos);
  CHECK(errorOf(loadDataSpec("csv:x.csv")).message().find("expected idx:DIR") != std::string::npos);
  CHECK(errorOf(loadDataSpec("npy:x.npy")).message().find("two files") != std::string::npos);
  CHECK(errorOf(loadDataSpec("idx:" + dir.file("nope"))).code() == ErrorCode::kNotFound);
}

Dataset indexed(int64_t m) {
  // Sample i holds the value i and has label i: what a batch holds says where it came from.
  Dataset d{
      ir::TensorData(ir::DType::kF32, {m, 1}), ir::TensorData(ir::DType::kI64, {m}), "t", {}, {}};
  for (int64_t i = 0; i < m; ++i) {
    d.x.as<float>()[i] = static_cast<float>(i);
    d.labels.as<int64_t>()[i] = i;
  }
  return d;
}

TEST_CASE("epoch orders are seeded permutations, new each epoch, the identity unshuffled") {
  const auto a = epochOrder(100, 7, 0, true), b = epochOrder(100, 7, 0, true);
  CHECK(a == b);
  CHECK(std::set<int64_t>(a.begin(), a.end()).size() == 100);
  CHECK(a != epochOrder(100, 7, 1, true));
  CHECK(a != epochOrder(100, 8, 0, true));
  const auto id = epochOrder(5, 7, 3, false);
  CHECK(id == std::vector<int64_t>{0, 1, 2, 3, 4});
}

TEST_CASE("the validation split is seeded, disjoint and complete") {
  auto s = splitValidation(indexed(50), 0.2, 3);
  KILN_REQUIRE_OK(s);
  REQUIRE(s->validation.has_value());
  CHECK(s->validation->size() == 10);
  CHECK(s->train.size() == 40);
  std::set<int64_t> all;
  for (const Dataset* d : {&s->train, &*s->validation})
    for (int64_t i = 0; i < d->size(); ++i) all.insert(d->labels.as<int64_t>()[i]);
  CHECK(all.size() == 50);
  CHECK(errorOf(splitValidation(indexed(50), 1.5, 3)).message().find("(0, 1)") !=
        std::string::npos);
  CHECK(errorOf(splitValidation(indexed(3), 0.1, 3)).message().find("leaves no") !=
        std::string::npos);
}

TEST_CASE("the batch loader covers each epoch once, drops the last partial batch and resumes") {
  const Dataset d = indexed(23);
  BatchLoader loader(d, 5, 11, true, 3);
  CHECK(loader.batchesPerEpoch() == 4);
  std::vector<Batch> seen;
  for (int k = 0; k < 12; ++k) seen.push_back(*loader.next());  // Three epochs.
  for (int64_t e = 0; e < 3; ++e) {
    const std::vector<int64_t> order = epochOrder(23, 11, e, true);
    std::set<int64_t> labels;
    for (int64_t b = 0; b < 4; ++b) {
      const Batch& batch = seen[static_cast<size_t>(e * 4 + b)];
      CHECK(batch.epoch == e);
      CHECK(batch.index == b);
      for (int64_t k = 0; k < 5; ++k) {
        const int64_t label = batch.labels.as<int64_t>()[k];
        CHECK(label == order[static_cast<size_t>(b * 5 + k)]);
        CHECK(batch.x.as<float>()[k] == static_cast<float>(label));
        labels.insert(label);
      }
    }
    CHECK(labels.size() == 20);  // 20 distinct samples; 3 dropped with the partial batch.
  }
  CHECK(loader.waitMs() >= 0);
  // A loader started at epoch 1, batch 2 continues where the first one was then.
  BatchLoader resumed(d, 5, 11, true, 2, 1, 2);
  for (int k = 6; k < 12; ++k) {
    const Batch b = *resumed.next();
    CHECK(b.epoch == seen[static_cast<size_t>(k)].epoch);
    CHECK(b.index == seen[static_cast<size_t>(k)].index);
    CHECK(b.labels.bitwiseEqual(seen[static_cast<size_t>(k)].labels));
  }
  BatchLoader tooSmall(indexed(3), 5, 0, true);
  CHECK(tooSmall.batchesPerEpoch() == 0);
  CHECK(tooSmall.next()->x.empty());
}

TEST_CASE("data-parallel shards: each rank's part of the global batch, together the whole") {
  const Dataset d = indexed(23);
  BatchLoader whole(d, 6, 11, true, 2);  // One process with the global batch of 2 x 3.
  BatchLoader rank0(d, 3, 11, true, 2, 0, 0, {0, 2}), rank1(d, 3, 11, true, 2, 0, 0, {1, 2});
  CHECK(rank0.batchesPerEpoch() == 3);  // 23 / 6.
  for (int k = 0; k < 7; ++k) {         // Into the third epoch.
    const Batch w = *whole.next(), a = *rank0.next(), b = *rank1.next();
    CHECK(a.epoch == w.epoch);
    CHECK(a.index == w.index);
    for (int64_t i = 0; i < 3; ++i) {
      CHECK(a.labels.as<int64_t>()[i] == w.labels.as<int64_t>()[i]);
      CHECK(b.labels.as<int64_t>()[i] == w.labels.as<int64_t>()[3 + i]);
    }
  }
  // A resumed rank continues where it was.
  BatchLoader again(d, 3, 11, true, 2, 1, 1, {1, 2});
  BatchLoader fresh(d, 3, 11, true, 2, 0, 0, {1, 2});
  for (int k = 0; k < 4; ++k) (void)*fresh.next();
  CHECK(again.next()->labels.bitwiseEqual(fresh.next()->labels));
}

}  // namespace
}  // namespace kiln::frontends

// ---- Image folders ------------------------------------------------------------------------

namespace kiln::frontends {
namespace {

// A w x h RGB image whose pixel (x, y) is (10x, 10y, 100).
std::vector<uint8_t> rgbPattern(int w, int h) {
  std::vector<uint8_t> px;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      px.push_back(static_cast<uint8_t>(10 * x));
      px.push_back(static_cast<uint8_t>(10 * y));
      px.push_back(100);
    }
  return px;
}

void writePng(const std::string& path, int w, int h) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(w);
  png.height = static_cast<png_uint_32>(h);
  png.format = PNG_FORMAT_RGB;
  const std::vector<uint8_t> px = rgbPattern(w, h);
  REQUIRE(png_image_write_to_file(&png, path.c_str(), 0, px.data(), 0, nullptr) != 0);
}

void writeJpeg(const std::string& path, int w, int h) {
  tjhandle tj = tjInitCompress();
  REQUIRE(tj != nullptr);
  const std::vector<uint8_t> px = rgbPattern(w, h);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  REQUIRE(tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &out, &size, TJSAMP_444, 100,
                      TJFLAG_ACCURATEDCT) == 0);
  test::writeBytes(path, std::string(reinterpret_cast<char*>(out), size));
  tjFree(out);
  tjDestroy(tj);
}

TEST_CASE("images: PNG and JPEG decode to grey or RGB; damaged files are refused by name") {
  test::TempDir dir;
  writePng(dir.file("a.png"), 5, 4);
  writeJpeg(dir.file("b.jpg"), 8, 8);
  auto png = decodeImage(dir.file("a.png"), 3);
  KILN_REQUIRE_OK(png);
  CHECK(png->width == 5);
  CHECK(png->height == 4);
  CHECK(png->pixels == rgbPattern(5, 4));
  auto grey = decodeImage(dir.file("a.png"), 1);
  KILN_REQUIRE_OK(grey);
  CHECK(grey->pixels.size() == 20);
  auto jpg = decodeImage(dir.file("b.jpg"), 3);
  KILN_REQUIRE_OK(jpg);
  const std::vector<uint8_t> want = rgbPattern(8, 8);
  int worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(jpg->pixels[i] - want[i]));
  CHECK(worst <= 4);  // Quality 100, 4:4:4: within a few levels.

  const std::string pngBytes = test::readBytes(dir.file("a.png"));
  const std::string jpgBytes = test::readBytes(dir.file("b.jpg"));
  struct Case {
    std::string name, bytes, expected;
  };
  const Case cases[] = {
      {"text.png", "hello", "neither a PNG nor a JPEG"},
      {"cut.png", pngBytes.substr(0, pngBytes.size() / 2), "PNG ("},
      {"cut.jpg", jpgBytes.substr(0, jpgBytes.size() / 2), "JPEG"},
      {"header.jpg", jpgBytes.substr(0, 40), "JPEG"},
  };
  for (const Case& c : cases) {
    test::writeBytes(dir.file(c.name), c.bytes);
    const Status st = test::errorOf(decodeImage(dir.file(c.name), 3));
    INFO(st.message());
    CHECK(st.message().find(c.expected) != std::string::npos);
    CHECK(st.message().find(dir.file(c.name)) != std::string::npos);
  }
  CHECK(test::errorOf(decodeImage(dir.file("a.png"), 4)).message().find("1 (grey) or 3 (RGB)") !=
        std::string::npos);
}

TEST_CASE("images: resize and center crop to the model's input, as Resize + CenterCrop") {
  Image im{4, 4, 1, {}};
  for (int i = 0; i < 16; ++i) im.pixels.push_back(static_cast<uint8_t>(i * 10));
  std::vector<float> out(16);
  imageToTensor(im, 4, 4, out.data());  // Same size: the pixels themselves.
  for (int i = 0; i < 16; ++i) CHECK(out[static_cast<size_t>(i)] == Approx(i * 10 / 255.f));
  Image wide{6, 4, 1, {}};
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 6; ++x) wide.pixels.push_back(static_cast<uint8_t>(x * 40));
  imageToTensor(wide, 4, 4, out.data());  // The middle four columns.
  for (int x = 0; x < 4; ++x) CHECK(out[static_cast<size_t>(x)] == Approx((x + 1) * 40 / 255.f));
  Image small{2, 2, 1, {0, 255, 0, 255}};
  imageToTensor(small, 4, 4, out.data());  // Upscaled: between the two columns' values.
  CHECK(out[0] == 0.f);
  CHECK(out[3] == 1.f);
  CHECK(out[1] > 0.f);
  CHECK(out[1] < out[2]);
}

TEST_CASE("image folders: classes by name, decoded lazily, train/val, and their errors") {
  test::TempDir dir;
  namespace fs = std::filesystem;
  fs::create_directories(dir.file("cat"));
  fs::create_directories(dir.file("dog"));
  writePng(dir.file("cat/1.png"), 6, 6);
  writePng(dir.file("cat/2.PNG"), 8, 6);
  writeJpeg(dir.file("dog/1.jpg"), 6, 9);
  test::writeBytes(dir.file("dog/notes.txt"), "not an image");
  auto s = readImageFolder(dir.path(), {3, 4, 4});
  KILN_REQUIRE_OK(s);
  CHECK_FALSE(s->validation.has_value());
  REQUIRE(s->train.size() == 3);
  CHECK(s->train.sampleShape() == ir::Shape{3, 4, 4});
  CHECK(s->train.labels.as<int64_t>()[0] == 0);
  CHECK(s->train.labels.as<int64_t>()[2] == 1);
  auto b = gatherBatch(s->train, {2, 0}, 0, 2);
  KILN_REQUIRE_OK(b);
  CHECK(b->x.shape() == ir::Shape{2, 3, 4, 4});
  CHECK(b->labels.as<int64_t>()[0] == 1);
  for (int64_t i = 0; i < b->x.numElements(); ++i) {
    CHECK(b->x.as<float>()[i] >= 0.f);
    CHECK(b->x.as<float>()[i] <= 1.f);
  }
  // Normalized: (v - mean) / std per channel.
  auto n = readImageFolder(dir.path(), {3, 4, 4}, {0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f});
  KILN_REQUIRE_OK(n);
  auto nb = gatherBatch(n->train, {2, 0}, 0, 2);
  KILN_REQUIRE_OK(nb);
  CHECK(nb->x.as<float>()[5] == Approx((b->x.as<float>()[5] - 0.5f) / 0.25f));
  // A file damaged after the folder was read fails the batch that reads it, naming it.
  test::writeBytes(dir.file("dog/1.jpg"), "broken");
  const Status st = test::errorOf(gatherBatch(s->train, {2}, 0, 1));
  CHECK(st.message().find("dog/1.jpg") != std::string::npos);
  BatchLoader loader(s->train, 3, 0, false);
  CHECK(test::errorOf(loader.next()).message().find("dog/1.jpg") != std::string::npos);
  // train/ and val/.
  test::TempDir split;
  for (const char* sub : {"train/a", "train/b", "val/a"}) fs::create_directories(split.file(sub));
  writePng(split.file("train/a/x.png"), 4, 4);
  writePng(split.file("train/b/y.png"), 4, 4);
  writePng(split.file("val/a/z.png"), 4, 4);
  auto tv = readImageFolder(split.path(), {1, 4, 4});
  KILN_REQUIRE_OK(tv);
  REQUIRE(tv->validation.has_value());
  CHECK(tv->validation->size() == 1);
  fs::create_directories(split.file("val/c"));
  CHECK(test::errorOf(readImageFolder(split.path(), {1, 4, 4}))
            .message()
            .find("class 'c' is not one of the training set's classes") != std::string::npos);
  // Errors: no classes, no images, a model input that is not [C, H, W].
  test::TempDir empty;
  CHECK(test::errorOf(readImageFolder(empty.path(), {3, 4, 4}))
            .message()
            .find("no class subdirectories") != std::string::npos);
  fs::create_directories(empty.file("a"));
  CHECK(test::errorOf(readImageFolder(empty.path(), {3, 4, 4}))
            .message()
            .find("no .png, .jpg or .jpeg files") != std::string::npos);
  CHECK(test::errorOf(readImageFolder(dir.path(), {784})).message().find("[C, H, W]") !=
        std::string::npos);
}

}  // namespace
}  // namespace kiln::frontends
