// Callbacks: hooks at the begin and end of training, of each epoch and of each step, with a context
// that carries epoch, step, loss, loss scale, overflow flag and throughput (MindSpore's RunContext).
//
//   model.train(2, dataset, {std::make_shared<TimeMonitor>(), std::make_shared<LossMonitor>(10)});
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace demi::train {

class Model;

struct RunContext {
  int epoch = 0;                 // 1-based, the epoch running now
  int epochs = 0;                // epochs asked for
  int64_t step_in_epoch = 0;     // 1-based step within the epoch
  int64_t cur_step_num = 0;      // 1-based step across epochs
  int64_t steps_per_epoch = 0;   // -1 when unknown
  int64_t batch_size = 0;        // samples in the current step (in sink mode: in the sink's steps)
  float loss = 0;                // the step's (unscaled) loss
  double loss_scale = 1;
  bool overflow = false;         // a gradient was not finite this step
  bool skipped = false;          // the update was skipped
  double step_seconds = 0;       // wall time of the train step itself (in sink mode: the sink's steps)
  double data_wait_seconds = 0;  // time the step waited for its batch (in sink mode: the sink's steps)
  // Sink mode (Model::train's sink_size): at step begin/end, the train steps (updates) this call covers
  // and how many of them were skipped for overflow. Without sinking 1, and 0 or 1.
  int64_t sink_steps = 1;
  int64_t sink_skipped = 0;
  // Where the data pipeline stands after this step, as a checkpoint resumes it: the data set's epoch
  // (0-based) and the batches of it consumed. Model::train fills them; -1: the epochs are the data set's
  // (a hand-written loop), so the place follows from epoch and step_in_epoch.
  int64_t data_epoch = -1;
  int64_t data_position = -1;
  double epoch_seconds = 0;      // at epoch end
  double epoch_samples_per_second = 0;
  std::map<std::string, double> metrics;  // at epoch end: train metrics (and eval ones when run)
  bool stop_requested = false;   // a callback may ask training to stop after this step/epoch
  bool stopped_mid_epoch = false;  // at train end: a stop (or the step budget) came inside an epoch
  // At step end, what the step's AMP diagnostics said (empty when nothing):
  std::string overflow_op;                // on an overflow step: the op that first produced Inf/NaN
  std::vector<std::string> promotions;    // layers adaptive AMP promoted to FP32 after this step
  std::vector<std::string> warnings;      // early warnings said at this step (also in TrainSummary)
  Model* model = nullptr;

  // Whether this call's steps (a whole sink in sink mode) reach the next multiple of `every` steps of the
  // run: what "every N steps" means for a callback that sees a sink at once.
  bool passes_multiple_of(int64_t every) const {
    return every > 0 && cur_step_num / every != (cur_step_num - sink_steps) / every;
  }
};

class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_train_begin(RunContext&) {}
  virtual void on_train_end(RunContext&) {}
  virtual void on_epoch_begin(RunContext&) {}
  virtual void on_epoch_end(RunContext&) {}
  virtual void on_step_begin(RunContext&) {}
  virtual void on_step_end(RunContext&) {}
};
using CallbackPtr = std::shared_ptr<Callback>;

// Where callbacks print (std::cout unless set; tests capture it).
void set_callback_stream(std::ostream* os);
std::ostream& callback_stream();

// Per-step and per-epoch time: "epoch time: 412.3 ms, per step time: 12.9 ms".
class TimeMonitor : public Callback {
 public:
  void on_epoch_begin(RunContext&) override;
  void on_epoch_end(RunContext& ctx) override;

 private:
  std::chrono::steady_clock::time_point start_;
};

// "epoch: 1 step: 10, loss is 2.3026" every per_print_times steps of the run (in sink mode, at the end of
// each sink that reaches the next multiple: the sink's last loss, as MindSpore prints); a non-finite loss
// is an error unless the step was skipped (its update dropped for the overflow).
class LossMonitor : public Callback {
 public:
  explicit LossMonitor(int64_t per_print_times = 1);
  void on_step_end(RunContext& ctx) override;

 private:
  int64_t every_;
};

// A progress bar with rate, ETA and loss, redrawn in place on a terminal; plain lines (every
// `line_every` steps and at each epoch end) when the stream is not a terminal.
class ProgressBar : public Callback {
 public:
  explicit ProgressBar(int64_t line_every = 50, bool force_terminal = false);
  void on_epoch_begin(RunContext& ctx) override;
  void on_step_end(RunContext& ctx) override;
  void on_epoch_end(RunContext& ctx) override;

 private:
  int64_t line_every_;
  bool terminal_;
  std::chrono::steady_clock::time_point start_;
  int64_t samples_ = 0;
  int64_t last_step_ = 0;  // step_in_epoch at the previous call
};

// Reports every loss-scale change and every skipped step.
class LossScaleMonitor : public Callback {
 public:
  void on_step_end(RunContext& ctx) override;
  void on_train_end(RunContext& ctx) override;
  int64_t skipped_steps() const { return skipped_; }

 private:
  double last_scale_ = -1;
  int64_t skipped_ = 0;
};

// Writes one record per epoch (and optionally per step) as CSV or JSON lines.
class HistoryLogger : public Callback {
 public:
  enum class Format { kCsv, kJsonLines };
  HistoryLogger(std::string path, Format format = Format::kJsonLines, bool per_step = false);
  void on_train_begin(RunContext& ctx) override;
  void on_step_end(RunContext& ctx) override;
  void on_epoch_end(RunContext& ctx) override;
  void on_train_end(RunContext& ctx) override;

 private:
  void write(const RunContext& ctx, const char* kind);
  std::string path_;
  Format format_;
  bool per_step_;
  std::ofstream out_;
  bool header_written_ = false;
};

// Stops training when `monitor` (a metric name from the epoch's metrics, or "loss": the epoch's mean
// train loss) has not improved by min_delta for `patience` epochs.
class EarlyStopping : public Callback {
 public:
  EarlyStopping(std::string monitor = "loss", int patience = 3, double min_delta = 0, bool maximize = false);
  void on_epoch_end(RunContext& ctx) override;
  int stopped_epoch() const { return stopped_epoch_; }

 private:
  std::string monitor_;
  int patience_;
  double min_delta_;
  bool maximize_;
  double best_ = 0;
  bool has_best_ = false;
  int bad_epochs_ = 0;
  int stopped_epoch_ = 0;
};

}  // namespace demi::train
