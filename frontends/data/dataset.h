// Labelled datasets for training (`kiln train --data`): readers of IDX files (the MNIST /
// Fashion-MNIST format) and NumPy .npy pairs into memory, the train/validation split, and a
// batch loader that shuffles per epoch and prepares batches on a background thread while the
// step runs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ir/status.h"
#include "ir/tensor_data.h"

namespace kiln::frontends {

// Samples x (f32 [M, ...]) and their class labels (i64 [M]), in memory; or, for image folders,
// the labels in memory and the samples read when a batch is gathered (`sample`, on the loader's
// thread), x left empty.
struct Dataset {
  ir::TensorData x, labels;
  std::string source;   // What it was read from, for messages.
  ir::Shape lazyShape;  // One sample's shape, where `sample` reads them.
  std::function<Status(int64_t index, float* dst)> sample;
  int64_t size() const { return labels.shape().empty() ? 0 : labels.shape()[0]; }
  ir::Shape sampleShape() const {
    return sample ? lazyShape : ir::Shape(x.shape().begin() + 1, x.shape().end());
  }
};

// IDX files: a big-endian header (two zero bytes, a type byte, the rank, then each dim as u32)
// and the data. Images of unsigned bytes [M, H, W] become f32 [M, 1, H, W] scaled to [0, 1];
// labels of unsigned bytes [M] become i64. Errors name the file: a wrong magic or type, a rank
// other than 3 (images) or 1 (labels), a size that is not the header's, counts that differ.
Expected<Dataset> readIdx(const std::string& imagesPath, const std::string& labelsPath);

// x.npy (f32 [M, ...], or u8 scaled to [0, 1]) and y.npy (i64, i32 or u8 [M]).
Expected<Dataset> readNpyPair(const std::string& xPath, const std::string& yPath);

struct DataSplit {
  Dataset train;
  std::optional<Dataset> validation;
};

// A NumPy .npz archive (frontends/npy/npy.h): arrays x_train and y_train, with x_test and y_test
// as the validation set where present (the layout of Keras's mnist.npz), or x and y; samples as
// readNpyPair takes them, reshaped to `sampleShape` (when given) where the element counts agree.
Expected<DataSplit> readNpzData(const std::string& path, const ir::Shape& sampleShape = {});

// Image folders as torchvision's ImageFolder lays them out: DIR/<class>/<image>.png|.jpg|.jpeg,
// the classes sorted by name (class i is label i), the images of a class sorted by name; with
// DIR/train/ and DIR/val/ the two are the training and validation sets (val's classes must be
// train's). Each image is decoded when its batch is gathered, to `sampleShape` ([C, H, W], C 1
// or 3): resized and center-cropped (images.h), then normalized as (v - mean[c]) / std[c] when
// `mean` is given. The first image is decoded at once, so that a folder of unreadable files
// fails here, naming the file.
Expected<DataSplit> readImageFolder(const std::string& dir, const ir::Shape& sampleShape,
                                    std::vector<float> mean = {}, std::vector<float> std = {});

// A --data spec: "idx:DIR" reads DIR/train-images-idx3-ubyte and DIR/train-labels-idx1-ubyte,
// and DIR/t10k-images-idx3-ubyte with DIR/t10k-labels-idx1-ubyte as the validation set when
// both exist; "npy:X.npy,Y.npy" reads a pair (no validation set); "npz:FILE.npz" an archive
// (readNpzData); "folder:DIR" an image folder
// (readImageFolder, for samples of `sampleShape`, normalized by `mean` and `std` when given).
// Errors list the forms.
Expected<DataSplit> loadDataSpec(const std::string& spec, const ir::Shape& sampleShape = {},
                                 std::vector<float> mean = {}, std::vector<float> std = {});

// Moves a seeded random `fraction` (0 < fraction < 1) of `d` into a validation set, keeping
// the rest (in their original order) for training.
Expected<DataSplit> splitValidation(Dataset d, double fraction, uint64_t seed);

// Samples `order[first, first + n)` of `d` copied (or read) into one batch (x [n, ...],
// labels [n]); an error where reading a sample failed.
struct Batch {
  ir::TensorData x, labels;
  int64_t epoch = 0, index = 0;  // Which epoch, and which batch of it.
  Status status;                 // Of the loader's gathering.
};
Expected<Batch> gatherBatch(const Dataset& d, const std::vector<int64_t>& order, int64_t first,
                            int64_t n);

// The order of epoch `epoch`'s samples: a permutation drawn from (seed, epoch) alone, so that
// a resumed run sees the same order; the identity when not shuffling.
std::vector<int64_t> epochOrder(int64_t size, uint64_t seed, int64_t epoch, bool shuffle);

// Batches of `batch` samples, the last partial batch of each epoch dropped (the compiled step
// has a fixed batch), shuffled per epoch (epochOrder), prepared up to `prefetch` batches ahead
// by a background thread so that gathering overlaps the step. Starts at batch `startIndex` of
// epoch `startEpoch` (a resumed run). `dataset` must outlive the loader.
//
// Data-parallel ranks (`shard` of `shards`): the epoch is cut into global batches of
// batch x shards samples, and each rank's batch is its consecutive part of each (rank r takes
// samples [r batch, (r + 1) batch) of it), so that the ranks together see what one process with
// the global batch sees. Each rank gathers only its own samples.
struct Shard {
  int index = 0, count = 1;
};
class BatchLoader {
 public:
  BatchLoader(const Dataset& dataset, int64_t batch, uint64_t seed, bool shuffle, int prefetch = 2,
              int64_t startEpoch = 0, int64_t startIndex = 0, Shard shard = {});
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch; blocks while the thread prepares it (that wait is counted in waitMs()).
  // An empty batch when the dataset holds fewer samples than one batch; the error where a
  // sample could not be read (an image folder's damaged file).
  Expected<Batch> next();
  int64_t batchesPerEpoch() const { return perEpoch_; }
  // Milliseconds next() spent waiting for batches, in total.
  double waitMs() const { return waitMs_; }

 private:
  void produce();

  const Dataset& data_;
  const int64_t batch_;
  const Shard shard_;
  const int64_t perEpoch_;
  const uint64_t seed_;
  const bool shuffle_;
  const size_t prefetch_;
  int64_t epoch_, index_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  bool stop_ = false;
  double waitMs_ = 0;
  std::thread worker_;
};

}  // namespace kiln::frontends
