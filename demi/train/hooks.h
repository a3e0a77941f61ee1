// Step hooks: the named points of Model::train's loop. Everything the loop does besides feeding batches
// to the train step and timing it is a hook — the callbacks (MindSpore's Callback, the public face of the
// same seam, run by one hook), the loss-scale warnings, the float16 underflow watch, the overflow log,
// adaptive AMP and the non-finite loss stop — and a hook of your own sees exactly what they see:
//
//   class GradNormLog : public train::TrainHook {
//     void on_after_update(train::TrainLoop& loop) override {
//       if (loop.step.result.grad_norm > 100) loop.warn(str_cat("gradient norm ", loop.step.result.grad_norm));
//     }
//   };
//   model.add_hook(std::make_shared<GradNormLog>());
//
// At each point the hooks run in order: the built-in ones (in the order above), then the model's own
// (Model::add_hook) in the order added. The points, in the order one train() call reaches them:
//
//   on_train_begin
//   per epoch:   on_epoch_begin
//     per update: [on_sink_begin] on_step_begin (on_after_forward on_after_backward)+ on_after_update
//                 on_step_end [on_sink_end]
//   on_epoch_end (not after an epoch a stop or the step budget cut short)
//   on_train_end
//
// An update is one optimizer step (or its skip) over `ModelOptions::accumulate` batches. on_step_begin
// comes once the update's batches are read: with accumulate > 1 the earlier batches' forward and backward
// have already run (their on_after_forward / on_after_backward came first, the loop does not hold them).
// In sink mode (Model::train's sink_size) on_sink_begin / on_sink_end enclose the updates of one sink:
// the callbacks' on_step_begin / on_step_end; without sinking each update is a sink of its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

#include "demi/amp/train_step.h"
#include "demi/train/callback.h"

namespace demi::train {

class Model;
struct TrainSummary;

// One update as the loop ran it: valid from on_after_update to on_step_end.
struct StepRecord {
  amp::StepResult result;        // loss, loss scale, overflow, skip, gradient norm, the overflowing op
  int64_t samples = 0;           // the update's samples (every process's)
  int64_t batches = 0;           // this process's batches in it
  double seconds = 0;            // its train step: every batch's forward and backward, and the update
  double data_wait_seconds = 0;  // waiting for its batches
  bool steady = false;           // past the warm-up: counted in the throughput, time and allocation figures
  // Set by adaptive AMP's hook: this update's overflow counts towards promoting a layer, so the loss stop
  // lets the non-finite loss pass (the layer is promoted instead).
  bool adapt_acting = false;
};

// What a hook sees, and the loop's services to it.
struct TrainLoop {
  Model& model;
  RunContext& context;     // what the callbacks see; a hook may set context.stop_requested
  TrainSummary& summary;   // this train() call's so far
  StepRecord step;         // the update being made (on_after_update .. on_step_end)
  bool sinking = false;    // sink mode: callbacks see sinks, not updates

  // `w` as a warning: said on the callback stream ("Model.train: warning: ..."), kept in the summary's
  // warnings and in this step's RunContext::warnings (the report and the CLI's JSON line show them).
  void warn(std::string w);
};

class TrainHook {
 public:
  virtual ~TrainHook() = default;
  virtual void on_train_begin(TrainLoop&) {}
  virtual void on_epoch_begin(TrainLoop&) {}
  virtual void on_sink_begin(TrainLoop&) {}
  virtual void on_step_begin(TrainLoop&) {}
  virtual void on_after_forward(TrainLoop&, float /*loss: the batch's, unscaled*/) {}
  virtual void on_after_backward(TrainLoop&) {}
  virtual void on_after_update(TrainLoop&) {}
  virtual void on_step_end(TrainLoop&) {}
  virtual void on_sink_end(TrainLoop&) {}
  virtual void on_epoch_end(TrainLoop&) {}
  virtual void on_train_end(TrainLoop&) {}
};
using TrainHookPtr = std::shared_ptr<TrainHook>;

// In sink mode the callbacks speak at a sink's end only, and a sink may be long (sink_size 10^6): this
// hook says where the sink is, on `out`, once `every_seconds` have passed without a sink ending —
//   "Model.train: sink in progress: update 1200 of the sink (step 3200 of the run), loss 0.4120, 51.3 updates/s"
// — so that a long sink is never silence.
class SinkProgress : public TrainHook {
 public:
  explicit SinkProgress(std::ostream& out, double every_seconds = 30);
  void on_sink_begin(TrainLoop&) override;
  void on_step_end(TrainLoop& loop) override;

 private:
  std::ostream& out_;
  double every_;
  std::chrono::steady_clock::time_point since_;  // the sink's start, or the last line
  int64_t updates_ = 0, at_last_line_ = 0;
};

}  // namespace demi::train
