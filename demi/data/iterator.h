// Iterator: runs a dataset's pipeline one epoch at a time, MindSpore's create_tuple_iterator and
// create_dict_iterator in one. It also measures how long its consumer waited for data, so that a
// trainer can report the fraction of its time spent idle on the input pipeline:
//
//   auto it = ds->create_iterator({.prefetch = 4});
//   for (int epoch = 0; epoch < 2; ++epoch, it->reset())
//     while (auto batch = it->next()) train_step((*batch)[0], (*batch)[1]);
//   double idle = it->stats().wait_seconds / it->stats().elapsed_seconds;
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "demi/data/dataset.h"

namespace demi::data {

struct IteratorStats {
  int64_t rows = 0;                       // rows (batches) returned by next() since the window began
  double wait_seconds = 0;                // consumer time inside next() waiting for a row
  double producer_busy_seconds = 0;       // time spent running the pipeline to make rows
  double producer_blocked_seconds = 0;    // prefetch only: the producer waiting for room in the queue
  double elapsed_seconds = 0;             // wall time since the window began
  // The consumer's idle fraction: wait_seconds / elapsed_seconds (0 before any time passed).
  double idle_fraction() const { return elapsed_seconds > 0 ? wait_seconds / elapsed_seconds : 0; }
};

class Iterator {
 public:
  virtual ~Iterator() = default;
  Iterator(const Iterator&) = delete;
  Iterator& operator=(const Iterator&) = delete;

  // The next row (batch) of the current epoch, or nullopt once the epoch is over (and on every call
  // after that, until reset()). A pipeline error is thrown here, on the consumer's thread, and again on
  // every later call (until reset() for a synchronous iterator; for good with a Prefetcher, whose
  // producer stops), so that an error never turns into a silently short epoch.
  virtual std::optional<Row> next() = 0;
  // The next row as {column name: tensor}.
  std::optional<std::map<std::string, Tensor>> next_dict();
  // Starts the next epoch, abandoning what is left of the current one.
  virtual void reset() = 0;
  virtual int64_t epoch() const = 0;
  // Rows delivered in the current epoch. (epoch(), position()) is the pipeline's place in a checkpoint:
  // create_iterator({.epoch = e, .position = p}) resumes there, with the same rows as an uninterrupted
  // run, since every random draw depends only on (seed, epoch, row).
  virtual int64_t position() const = 0;

  // Time measurements since creation or the last reset_stats(). With prefetch 0 every second of the
  // pipeline is a second the consumer waits, so wait_seconds == producer_busy_seconds.
  virtual IteratorStats stats() const = 0;
  virtual void reset_stats() = 0;
  double wait_seconds() const { return stats().wait_seconds; }

  const std::vector<std::string>& column_names() const { return dataset_->column_names(); }
  const Dataset& dataset() const { return *dataset_; }

 protected:
  explicit Iterator(std::shared_ptr<const Dataset> dataset);
  std::shared_ptr<const Dataset> dataset_;
};

}  // namespace demi::data
