// Model::train's loop: feeds each update's batches to the train step, times it, keeps the data place a
// checkpoint resumes, runs sinks, and calls the step hooks (train/hooks.h) at their points. Everything
// else — callbacks, warnings, adaptive AMP, the loss stop — is a hook (internal/builtin_hooks.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "demi/data/dataset.h"
#include "demi/data/iterator.h"
#include "demi/train/hooks.h"

namespace demi::train {
class Model;
}

namespace demi::train::internal {

// A batch has (input, label) columns, else a demi::Error naming Model.<what>.
void check_row(const data::Row& row, const char* what);

class TrainRun {
 public:
  // `hooks` run in this order at every point. Model::train has checked its arguments.
  TrainRun(Model& model, int epochs, std::shared_ptr<const data::Dataset> dataset, bool sink_mode, int64_t sink_size,
           std::vector<TrainHookPtr> hooks);
  void run();

 private:
  using Clock = std::chrono::steady_clock;
  template <typename F>
  void each(F&& f) {
    for (const TrainHookPtr& h : hooks_) f(*h);
  }
  void open_data();
  bool run_epoch(int e);                               // true: stop after it
  bool read_update();                                  // false: no batch left in the epoch (or the sink)
  bool run_update(int64_t allocs0, int64_t faults0);   // true: stop
  void close_sink();
  void set_data_place();
  bool fixed_sink_done() const { return fixed_sinks_ && ctx_.step_in_epoch >= sink_size_; }
  bool agreed(bool local);
  void finish(const MemStats& peak);

  Model& model_;
  const int epochs_;
  const std::shared_ptr<const data::Dataset> dataset_;
  const bool sink_mode_;
  const int64_t sink_size_;
  const bool fixed_sinks_;  // sink_size > 0: an epoch of train() is one sink, the data runs on across epochs
  std::vector<TrainHookPtr> hooks_;
  RunContext ctx_;
  TrainLoop loop_;

  std::unique_ptr<data::Iterator> it_;
  int64_t data_batches_ = 0;  // batches of the unsharded pipeline per epoch (-1: unknown)
  int64_t first_data_epoch_ = 0, first_step_in_epoch_ = 0;
  int64_t data_epoch_ = 0, data_position_ = 0;  // where the data pipeline stands, as a checkpoint resumes it
  int64_t mid_epoch_position_ = 0;              // batches of the epoch done when a stop came inside it

  // The update being read and run.
  std::optional<data::Row> row_;
  int64_t local_batches_ = 0;
  double wait_ = 0, compute_seconds_ = 0;

  // Sink mode: the steps of one sink run back to back, and the callbacks see each sink once.
  struct Sink {
    bool open = false;
    int64_t steps = 0, skipped = 0, samples = 0;
    double seconds = 0, wait = 0;
  } sink_;

  // Steady state: the steps after the first epoch when there are several, else after the first
  // kWarmupSteps (kernel choices, first allocations, the prefetcher filling up): samples/s, the median
  // step, allocations and page faults are measured over those steps only.
  static constexpr int64_t kWarmupSteps = 3;
  std::vector<double> step_times_, all_step_times_;
  double wait_total_ = 0, busy_total_ = 0, steady_seconds_ = 0;
  int64_t steady_samples_ = 0, steady_allocs_ = 0, steady_faults_ = 0;
  bool steady_started_ = false;
  Clock::time_point steady_since_, run_start_;
  int64_t epoch_samples_ = 0, loss_count_ = 0;
  double loss_sum_ = 0;
};

}  // namespace demi::train::internal
