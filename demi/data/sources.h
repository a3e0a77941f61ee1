// In-memory sources: GeneratorDataset, fed by C++ callables (the seed's
// `GeneratorDataset(source=lambda: get_data(num), column_names=["image", "label"])`), and
// NumpySlicesDataset, whose columns are tensors sliced along their first dimension.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "demi/data/dataset.h"

namespace demi::data {

// A generator: each call yields the next row, nullopt at the end of the epoch.
using RowGenerator = std::function<std::optional<Row>()>;
// A source: called at the start of every epoch for a fresh generator (Python's `lambda: get_data(num)`).
using GeneratorSource = std::function<RowGenerator()>;
// The same, told which epoch it serves, so that its data can depend on the epoch deterministically.
using EpochGeneratorSource = std::function<RowGenerator(int64_t epoch)>;
// A random-accessible source (Python's __getitem__ and __len__): row `index` of `size`.
struct RandomAccessSource {
  int64_t size = 0;
  std::function<Row(int64_t index)> get;
};

struct GeneratorOptions {
  // Rows per epoch, when the source knows it: get_dataset_size() then needs no counting pass, and a
  // source yielding a different number of rows is an error. -1: unknown.
  int64_t num_rows = -1;
  // Every row's columns must keep the shape and dtype of the epoch's first row (off for sources of
  // variable-length rows that a map pads before batching).
  bool check_shapes = true;
};

// Rows from a C++ callable. Each row must have one defined tensor per column name; a row that does not,
// or (with check_shapes) whose column differs in shape or dtype from the first row's, is a demi::Error
// naming the row, the column, and what was expected and found. Tensors a generator yields are handed on
// as they are (no copy): it should not modify them afterwards.
//
// Without num_rows, get_dataset_size() runs the source's generator once for epoch 0 to count its rows,
// as MindSpore does. Calls into the source are serialized, but a generator is used by one pass only.
class GeneratorDataset final : public Dataset {
 public:
  GeneratorDataset(GeneratorSource source, std::vector<std::string> column_names, GeneratorOptions options = {});
  GeneratorDataset(EpochGeneratorSource source, std::vector<std::string> column_names,
                   GeneratorOptions options = {});
  GeneratorDataset(RandomAccessSource source, std::vector<std::string> column_names,
                   GeneratorOptions options = {});

  std::string describe() const override;
  bool is_random_access() const override { return random_access_.get != nullptr; }
  Row get_row(int64_t index, int64_t epoch) const override;
  std::unique_ptr<RowReader> open(int64_t epoch) const override;

  // Checks one row's columns against the column names (and the first row's shapes); throws naming
  // row `index`. `first` holds the first row's signature, filled from the first row checked.
  void check_row(const Row& row, int64_t index, std::vector<Tensor>& first, int64_t& first_index) const;
  RowGenerator make_generator(int64_t epoch) const;
  const GeneratorOptions& options() const { return options_; }

 protected:
  int64_t compute_size() const override;

 private:
  EpochGeneratorSource source_;
  RandomAccessSource random_access_;
  GeneratorOptions options_;
  mutable std::mutex source_mutex_;  // the source is user code: one call at a time
  mutable std::mutex first_mutex_;   // guards first_ for get_row from several threads
  mutable std::vector<Tensor> first_;
  mutable int64_t first_index_ = -1;
};

// Rows are slices along dimension 0 of `columns` (all of one length): row i holds columns[c][i], a view
// without a copy (the tensors are shared, not copied: do not modify them while the dataset is in use).
class NumpySlicesDataset final : public Dataset {
 public:
  NumpySlicesDataset(std::vector<Tensor> columns, std::vector<std::string> column_names);

  std::string describe() const override;
  bool is_random_access() const override { return true; }
  Row get_row(int64_t index, int64_t epoch) const override;

 protected:
  int64_t compute_size() const override { return rows_; }

 private:
  std::vector<Tensor> columns_;
  std::vector<Shape> row_shapes_;
  int64_t rows_ = 0;
};

}  // namespace demi::data
