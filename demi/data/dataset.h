// Datasets in MindSpore's vocabulary. A dataset yields rows; a Row is one Tensor per column, and the
// column names live on the dataset. Pipeline operations (map, shuffle, batch, repeat, take, skip,
// project) return new datasets that pull from their input, so
//
//   auto ds = std::make_shared<MnistDataset>(dir, "train")
//                 ->map({Rescale(1.0 / 255, 0.0)}, {"image"})->shuffle(10000)->batch(128);
//
// builds a pipeline without running it; an Iterator (iterator.h) runs it one epoch at a time.
//
// Determinism: every random decision is drawn from a counter-based generator keyed by (seed, epoch, row)
// (demi/core/rng.h), never from a stream shared across rows, so a pipeline yields the same rows for the
// same seed whatever the number of map workers and whether it is prefetched. A new epoch re-shuffles
// and re-draws augmentations from its own key. An op created without a seed takes the global seed
// (demi::set_seed) at the time it is created.
//
// Datasets are immutable once built and may be shared between iterators and threads; each epoch's pass
// keeps its state in a RowReader of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "demi/core/tensor.h"
#include "demi/data/transforms.h"

namespace demi::data {

// One row (or, after batch, one batch): a tensor per column, in column_names() order. Rows handed out
// by the file readers are views of the reader's one buffer: treat them as read-only.
using Row = std::vector<Tensor>;

// Column names, spelled out where a braced list cannot be forwarded:
// std::make_shared<GeneratorDataset>(source, Columns{"image", "label"}).
using Columns = std::vector<std::string>;

// get_dataset_size() of a dataset repeated forever.
inline constexpr int64_t kInfiniteSize = -1;

// One epoch's pass over a dataset.
class RowReader {
 public:
  virtual ~RowReader() = default;
  // The next row, or nullopt at the end of the epoch.
  virtual std::optional<Row> next() = 0;
};

struct MapOptions {
  // Rows transformed at once on this many threads (the pass's own, besides demi's compute threads).
  // Results do not depend on it: each row's random draws come from its own key. 1, the default, keeps
  // the pipeline single-threaded (see prefetch.h).
  int num_parallel_workers = 1;
  std::optional<uint64_t> seed = std::nullopt;  // for random transforms; default: the global seed
};

struct IteratorOptions {
  // Rows (batches) a background thread keeps ready (prefetch.h); 0 runs the pipeline on the caller's
  // thread inside next().
  int prefetch = 0;
  int64_t epoch = 0;        // the first epoch (a resumed run starts at its saved epoch)
  int64_t position = 0;     // rows of the first epoch to pass over (a resumed run's saved position)
  int64_t num_epochs = -1;  // epochs the prefetcher will produce; -1: until the iterator is destroyed
};

class Iterator;

// One process's share of a data set split across processes (data-parallel training; MindSpore's
// DistributedSampler): the rows shard_id, shard_id + num_shards, shard_id + 2 num_shards, ... of every
// epoch. The other processes take the others, so each row is seen exactly once per epoch across them,
// in the order one process would see them; a shuffle before the shard draws the same permutation on
// every process (same seed, same epoch). A resumed run first passes over `start_offset` rows of epoch
// `start_epoch` (counted in the unsharded rows, so the world size may change between runs).
struct DistributedSampler {
  int64_t num_shards = 1;
  int64_t shard_id = 0;
  int64_t start_epoch = 0;
  int64_t start_offset = 0;
};

class Dataset : public std::enable_shared_from_this<Dataset> {
 public:
  virtual ~Dataset() = default;
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  const std::vector<std::string>& column_names() const { return column_names_; }
  // The position of a column, or a demi::Error listing the dataset's columns.
  int column_index(std::string_view name) const;

  // Rows (batches, after batch) per epoch, kInfiniteSize after repeat(-1). Computed from the sources'
  // sizes without running the pipeline; a GeneratorDataset given no size counts its rows once (one pass
  // of its source alone) and remembers the count.
  int64_t get_dataset_size() const;

  // "MnistDataset(dir, train)", "batch(32) <- GeneratorDataset(image, label)": for error messages.
  virtual std::string describe() const = 0;

  // Random access: rows addressable by index in [0, size) (the sources, and map/take/skip over them).
  // Shuffling such a dataset permutes indices instead of buffering rows.
  virtual bool is_random_access() const { return false; }
  virtual Row get_row(int64_t index, int64_t epoch) const;
  // Starts one epoch's pass. The default serves random-access datasets: rows 0, 1, ... in order.
  virtual std::unique_ptr<RowReader> open(int64_t epoch) const;

  // Runs the pipeline, one epoch at a time; options.prefetch > 0 runs it on a background thread.
  std::unique_ptr<Iterator> create_iterator(IteratorOptions options = {}) const;

  // ---- Pipeline operations: each returns a new dataset reading from this one. ----

  // Applies `operations`, in order, to each of `input_columns` (default: the first column) of every row.
  // A column's transforms see one generator per row, keyed by (seed, epoch, row index); every listed
  // column starts from the same key, so equally shaped columns (an image and its mask) get the same crop
  // and flip.
  std::shared_ptr<Dataset> map(std::vector<Transform> operations, std::vector<std::string> input_columns = {},
                               MapOptions options = {}) const;
  // MindSpore's shuffle: a buffer of `buffer_size` rows from which each output row is drawn at random and
  // refilled from the input; buffer_size >= get_dataset_size() is a full uniform shuffle. Each epoch
  // draws from its own key (seed, epoch).
  std::shared_ptr<Dataset> shuffle(int64_t buffer_size, std::optional<uint64_t> seed = std::nullopt) const;
  // Stacks `batch_size` consecutive rows into one (batch_size, ...) tensor per column; the last, smaller
  // batch is kept unless drop_remainder. Rows of one batch must agree in shape and dtype per column.
  std::shared_ptr<Dataset> batch(int64_t batch_size, bool drop_remainder = false) const;
  // The whole dataset `count` times per epoch (-1: forever); each repetition is a new pass with its own
  // shuffle and augmentations.
  std::shared_ptr<Dataset> repeat(int64_t count = -1) const;
  // The first `count` rows; skip drops them instead.
  std::shared_ptr<Dataset> take(int64_t count) const;
  std::shared_ptr<Dataset> skip(int64_t count) const;
  // Keeps (and reorders) the named columns.
  std::shared_ptr<Dataset> project(std::vector<std::string> columns) const;
  // This process's share (see DistributedSampler). Sharding a batch(b) of a random-access dataset shards
  // its rows in groups of b instead, so no process reads, transforms or stacks another's rows; the
  // batches are the same. Its size is the rows of an epoch that starts at row 0.
  std::shared_ptr<Dataset> shard(const DistributedSampler& sampler) const;

 protected:
  // Column names must be non-empty and distinct.
  explicit Dataset(std::vector<std::string> column_names);
  // The size, computed by the subclass (called once; the result is cached).
  virtual int64_t compute_size() const = 0;

 private:
  std::vector<std::string> column_names_;
  mutable std::mutex size_mutex_;
  mutable std::optional<int64_t> size_;
};

// The seed an op uses when given none: the global seed (demi::set_seed) when it is created.
uint64_t default_data_seed();

}  // namespace demi::data
