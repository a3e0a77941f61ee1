// MnistDataset: MNIST and Fashion-MNIST from their IDX files, plain or gzip-compressed (Debian's
// dataset-fashion-mnist installs /usr/share/datasets/fashion-mnist/*.gz).
//
// Columns: "image", uint8 (1, 28, 28) — CHW, since demi is NCHW (MindSpore gives HWC (28, 28, 1)) — and
// "label", an int32 scalar (MindSpore gives uint32; int32 is what demi's losses and metrics take).
// Each split is loaded once, when the dataset is created, into one (N, 1, 28, 28) buffer; rows are views
// of it. Every malformed input is a demi::Error naming the file (see internal/formats.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "demi/data/dataset.h"

namespace demi::data {

struct MnistOptions {
  // Labels must lie in [0, num_classes): a label file with a stray value is refused when loaded, not
  // discovered by the loss in the middle of training.
  int num_classes = 10;
};

class MnistDataset final : public Dataset {
 public:
  // `dataset_dir` holds train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
  // t10k-labels-idx1-ubyte, each possibly with a .gz suffix (or "-images.idx3-ubyte" naming). usage:
  // "train" (60000 rows), "test" (10000) or "all" (train, then test). Unlike MindSpore the default is
  // "train", so that a test split never leaks into training by accident, and rows come in file order
  // (call shuffle()).
  explicit MnistDataset(const std::string& dataset_dir, const std::string& usage = "train", MnistOptions options = {});

  std::string describe() const override;
  bool is_random_access() const override { return true; }
  Row get_row(int64_t index, int64_t epoch) const override;

  const Tensor& images() const { return images_; }  // uint8 (N, 1, rows, cols)
  const Tensor& labels() const { return labels_; }  // int32 (N)
  // The files read, for messages ("…/train-images-idx3-ubyte.gz").
  const std::vector<std::string>& files() const { return files_; }

 protected:
  int64_t compute_size() const override { return images_.dim(0); }

 private:
  std::string dir_, usage_;
  Tensor images_, labels_;
  Shape image_shape_;
  std::vector<std::string> files_;
};

}  // namespace demi::data
