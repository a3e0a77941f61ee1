// Cifar10Dataset: CIFAR-10 in its binary format (cifar-10-batches-bin: data_batch_1.bin ...
// data_batch_5.bin and test_batch.bin, records of one label byte and 3072 pixel bytes).
//
// Columns: "image", uint8 (3, 32, 32) CHW (the format's own plane order; MindSpore gives HWC) and
// "label", an int32 scalar in 0..9 (MindSpore gives uint32). Loaded once, when the dataset is created,
// into one (N, 3, 32, 32) buffer; rows are views of it. A missing file, a file that is not whole records
// and a label above 9 are demi::Errors naming the file (and record).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "demi/data/dataset.h"

namespace demi::data {

class Cifar10Dataset final : public Dataset {
 public:
  // `dataset_dir` holds the .bin files, directly or in a cifar-10-batches-bin subfolder. usage: "train"
  // (the five data batches, 50000 rows), "test" (test_batch.bin, 10000) or "all" (train, then test).
  explicit Cifar10Dataset(const std::string& dataset_dir, const std::string& usage = "train");

  std::string describe() const override;
  bool is_random_access() const override { return true; }
  Row get_row(int64_t index, int64_t epoch) const override;

  const Tensor& images() const { return images_; }  // uint8 (N, 3, 32, 32)
  const Tensor& labels() const { return labels_; }  // int32 (N)
  const std::vector<std::string>& files() const { return files_; }

 protected:
  int64_t compute_size() const override { return images_.dim(0); }

 private:
  std::string dir_, usage_;
  Tensor images_, labels_;
  std::vector<std::string> files_;
};

}  // namespace demi::data
