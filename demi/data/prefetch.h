// Prefetcher: an Iterator that runs the pipeline on one background std::thread into a bounded queue,
// so that in steady state the trainer finds its next batch ready (what dataset_sink_mode=true means
// in demi until graph mode exists). The producer runs ahead across epoch boundaries; reset() moves the
// consumer to the next epoch and discards what is left of the current one.
//
// - An exception in the pipeline is carried to the consumer and rethrown by next(), every time next()
//   is called after it (the producer stops); it never reaches std::terminate.
// - Destruction mid-epoch stops the producer after the row it is making and joins it; a source that
//   blocks forever inside its own code cannot be interrupted.
// - The consumer's wait and the producer's busy and blocked time are measured (stats()).
//
// Threads: the producer runs the pipeline single-threaded (map with num_parallel_workers = 1, the
// default), leaving the cores to the trainer's OpenMP pool; the pipeline's small per-row tensor work
// stays below demi::parallel_for's grain and so never opens a parallel region of its own. Rows come out
// exactly as without prefetching: every random draw is keyed by (seed, epoch, row).
#pragma once

#include <memory>

#include "demi/data/iterator.h"

namespace demi::data {

class Prefetcher final : public Iterator {
 public:
  // Keeps up to `queue_depth` rows (batches) ready; produces epochs options.epoch, options.epoch + 1, ...
  // (options.num_epochs of them, or until destroyed when -1), starting options.position rows into the
  // first. options.prefetch is ignored (queue_depth is the depth).
  explicit Prefetcher(std::shared_ptr<const Dataset> dataset, int queue_depth = 4, IteratorOptions options = {});
  ~Prefetcher() override;

  std::optional<Row> next() override;
  void reset() override;
  int64_t epoch() const override;
  int64_t position() const override;
  IteratorStats stats() const override;
  void reset_stats() override;

  int queue_depth() const { return depth_; }

 private:
  struct State;
  void produce();

  int depth_;
  int64_t first_epoch_, first_position_, num_epochs_;
  std::unique_ptr<State> s_;
};

}  // namespace demi::data
