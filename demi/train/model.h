// Model: the high-level API of the seed's "way 1". Switching precision is one argument:
//
//   auto model = train::Model(net, loss_fn, optimizer, {{"Accuracy", std::make_shared<train::Accuracy>()}},
//                             {.amp_level = amp::Level::kO2,
//                              .loss_scale_manager = std::make_shared<amp::FixedLossScaleManager>(1024.0, false)});
//   model.train(2, train_ds, {std::make_shared<train::TimeMonitor>(), std::make_shared<train::LossMonitor>(10)},
//               /*dataset_sink_mode=*/true);
//   auto metrics = model.eval(test_ds);   // {"Accuracy": 0.89}
//
// Data parallelism (demi/distributed): when dist::init() was called in a world of several processes and the
// auto-parallel context says kDataParallel, the Model trains data-parallel by itself. train() copies the
// parameters and buffers from rank 0 (parameter_broadcast), shards the training set — pass the whole
// pipeline with the per-process batch size: each process takes every N-th batch, so every sample is
// seen once per epoch across the processes, and N processes with batch b make the updates one process
// with batch N·b would — and combines the gradients before every update (dist::DataParallel). Losses,
// skipped steps and the loss scale are the job's, agreed by every process; samples/s counts the job's
// samples; eval() splits the data set over the processes when every metric is additive (the built-in
// ones are; Metric::sums), with rank 0's buffers, else runs on each process over the whole set. A
// resumed run may use another number of processes: the data position is kept in batches of the
// unsharded pipeline.
//
// dataset_sink_mode=true means the input pipeline runs on a background thread into a bounded queue
// (demi/data's Prefetcher), so steps never wait on data in steady state; with a sink_size, steps also run
// in sinks, MindSpore's way (train() below). The first dataset column is the input, the second the label.
#pragma once

#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <array>
#include <string>
#include <vector>

#include "demi/amp/adapt.h"
#include "demi/amp/train_step.h"
#include "demi/core/memory.h"
#include "demi/data/dataset.h"
#include "demi/distributed/data_parallel.h"
#include "demi/train/callback.h"
#include "demi/train/hooks.h"
#include "demi/train/metrics.h"

namespace demi::train {

struct ModelOptions {
  amp::Level amp_level = amp::Level::kO0;
  DType low_dtype = DType::kF16;                              // the seed's float16; kBF16 for bfloat16
  std::shared_ptr<amp::LossScaleManager> loss_scale_manager;  // null: the level's default
  bool no_loss_scale = false;                                 // no loss scaling, whatever the level's default
  std::optional<bool> keep_batchnorm_fp32;                    // default: MindSpore's per level
  // Parameter gradients in bfloat16 (amp::TrainOptions); default: the policy's (on at O2 and O3).
  std::optional<bool> low_precision_param_grads;
  // Update each parameter as soon as backward completes its gradient and free the gradient at once
  // (amp::TrainStep's optimizer in backward): less memory; needs no loss scale, no clipping, accumulate 1
  // and one process. Null: graph mode's choice (GRAPH_MODE wherever those hold, not with amp_adapt, whose
  // overflow attribution it would skip); true: always; false: never.
  std::optional<bool> optimizer_in_backward;
  int prefetch_depth = 4;                                     // batches queued ahead in sink mode
  // Stop with an error when the loss becomes NaN/Inf at O0 (or without a loss scale), instead of
  // training on garbage. With a loss-scale manager a non-finite step is an overflow and is handled there.
  bool stop_on_nonfinite_loss = true;
  // Check every batch's floating columns for NaN/Inf before the step and stop with an error naming the
  // epoch, the step (batch) and the column at the first one. Off by default: it costs a pass over the data.
  bool check_input_finite = false;
  // Clip the gradients to this global L2 norm after unscaling (0: off); see amp/train_step.h.
  double clip_grad_norm = 0;
  // How float16 products multiply in training, eval and predict (amp::TrainOptions::f16_products): exact,
  // or rounded to bfloat16 on the bf16 kernels (O1-O3 with low_dtype float16, AVX512-BF16).
  F16Products f16_products = F16Products::kExact;
  // Batches per update: each batch's forward and backward add into the gradients, and one update
  // applies their mean (gradient accumulation; an FP32 parameter's gradients are accumulated in FP32,
  // also where O2/O3 keeps a single batch's gradient in the low dtype). Every batch of an update uses the same loss scale; an overflow in any skips it.
  int accumulate = 1;
  // Stop train() once this many updates have been made in all (counting a resumed run's earlier ones);
  // -1: no budget, the epochs decide.
  int64_t max_steps = -1;
  // Name the op behind every overflowing step (amp/attribution.h): the step is re-run once under a
  // checking observer, only when it overflowed. The result is in the RunContext (overflow_op), the log
  // (the first few, and each new op), TrainSummary::overflow_ops and the CLI's JSON line.
  bool attribute_overflow = true;
  // Adaptive AMP (amp/adapt.h): a layer that keeps overflowing for reasons the loss scale cannot cure is
  // promoted to FP32 for the rest of training. Needs attribute_overflow. Data parallel, a promotion any
  // process's overflows call for is made on every process at once.
  bool amp_adapt = false;
  amp::AdaptOptions adapt;
};

// What one train() call measured.
// A training step's memory, measured before training (Model::forecast).
struct MemForecast {
  int64_t train_peak = 0;                          // bytes: every tracked category but the data set's
  std::array<int64_t, kNumMemCategories> at_peak{};  // what the peak is made of (kData 0)
  // Where the peak is reached: the op call and its layer ("Dense backward in 'encoder.layers.3.linear1'"),
  // which says what recompute() or a smaller batch would act on.
  std::string peak_op;
};

struct TrainSummary {
  int64_t steps = 0;                  // updates made in all (a resumed run's earlier ones included)
  int64_t samples = 0;
  double seconds = 0;                 // wall time of the whole call
  // Over the steady steps: after the first (warm-up) epoch when there are several, else after the
  // first 3 steps (the whole run when it is shorter).
  double samples_per_second = 0;
  double median_step_seconds = 0;    // median train-step time of the steady steps, excluding data waits
  double data_wait_fraction = 0;      // fraction of the trainer's time spent waiting for batches
  float final_loss = 0;
  double mean_last_epoch_loss = 0;
  // The first finite step loss of the call (the weights it started from; NaN when no step had one): a
  // last epoch's loss far above it means the run diverged.
  double first_loss = std::numeric_limits<double>::quiet_NaN();
  int64_t skipped_steps = 0;
  // Epochs in which at least 40 of 50 consecutive steps were skipped for overflow: each was warned about
  // on the callback stream as it happened.
  int64_t skip_warnings = 0;
  // The early warnings about the loss scale said during the run, one line each (also printed on the
  // callback stream when they happened): skips above 5% of 200 steps, overflow at the scale's floor, a
  // dynamic scale that has not grown for 10 windows; float16 gradients underflowing (1% or more of a
  // sampled step's nonzero float16 gradient values subnormal; one step in 100 is sampled).
  std::vector<std::string> warnings;
  double final_loss_scale = 1;
  // Overflow attributions of this call: "<op> <fwd|bwd> in '<layer>'" -> steps, and the first
  // description of each.
  std::map<std::string, int64_t> overflow_ops;
  std::map<std::string, std::string> overflow_examples;
  // Adaptive AMP's promotions so far (a resumed run's restored ones included), in order.
  std::vector<amp::Promotion> promotions;
  // Steady state (the steps after the first epoch when there are several, else after the third step):
  // calls into the system allocator and minor page faults of the whole process (every thread: compute,
  // prefetch) during those steps, per step. Both are 0 when nothing is allocated or touched afresh.
  int64_t steady_steps = 0;
  double system_allocs_per_step = 0;
  double page_faults_per_step = 0;
  // Graph mode (GRAPH_MODE): the updates' counters, and the plan of the batch shape traced first (the
  // full batch), with its bounds. All zero in PYNATIVE mode.
  graph::StepGraphs::Stats graph;
  graph::PlanSummary graph_plan;
  int64_t reserved_end = 0;           // bytes the allocator holds from the system at the end (arena included)
  MemStats peak;                      // tracked memory: peaks per category during train()
  int64_t peak_rss_bytes = 0;         // the process's peak RSS (VmHWM) at the end
};

namespace internal {
class TrainRun;
}

class Model {
 public:
  Model(std::shared_ptr<nn::Cell> network, std::shared_ptr<nn::LossCell> loss_fn,
        std::shared_ptr<optim::Optimizer> optimizer, std::map<std::string, MetricPtr> metrics = {},
        const ModelOptions& options = {});

  // Trains for `epoch` epochs over `train_dataset` (batches of (input, label)).
  //
  // sink_size (MindSpore's; needs dataset_sink_mode): the steps of a sink run back to back, and the
  // callbacks see each sink once, as one step — on_step_begin before its first step, on_step_end after
  // its last, with the last step's loss, loss scale and overflow flag, and the sink's steps
  // (RunContext::sink_steps), skipped updates, samples and time. A stop a callback asks for takes effect
  // at the end of a sink; max_steps ends a sink early.
  //   -1 (MindSpore's default): one sink per epoch of the data set; without dataset_sink_mode, no sinking.
  //   0: no sinking: callbacks see every step.
  //   N > 0: every epoch of train() is one sink of N batches (a multiple of `accumulate`), and the data
  //     runs on across the data set's epochs: train(2, ds, cbs, true, 100) trains 200 batches whatever
  //     the data set's size, the second epoch starting where the first stopped. Checkpoints record the
  //     data place apart from the epochs, so a resumed run takes the same batches. Single process only.
  // In GRAPH_MODE the steps of a sink replay the step's static memory plan like any other steps.
  void train(int epoch, const std::shared_ptr<const data::Dataset>& train_dataset,
             std::vector<CallbackPtr> callbacks = {}, bool dataset_sink_mode = true, int64_t sink_size = -1);
  // A step hook (train/hooks.h) every later train() call runs at each of its points, after the built-in
  // hooks (the callbacks among them), in the order added.
  void add_hook(TrainHookPtr hook);
  // Forgets graph mode's plans of the train and eval steps (the program changed: adaptive AMP promoted a
  // layer); the next steps trace again.
  void forget_graph_plans();
  const ModelOptions& options() const { return options_; }
  // Evaluates every metric over the dataset (eval mode, no gradients, the same precision policy). In
  // GRAPH_MODE each batch's forward and metric updates run under a static memory plan, as train steps do.
  std::map<std::string, double> eval(const std::shared_ptr<const data::Dataset>& dataset, bool dataset_sink_mode = true);
  // The network's output for `input` in eval mode (FP32).
  Tensor predict(const Tensor& input);

  nn::Cell& network() { return *network_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  amp::LossScaleManager* loss_scale_manager() { return train_step_->loss_scale_manager(); }
  amp::TrainStep& train_step() { return *train_step_; }
  // The gradient reducer when training data-parallel (null otherwise).
  dist::DataParallel* data_parallel() { return data_parallel_.get(); }
  // Adaptive AMP's state (null unless ModelOptions::amp_adapt).
  amp::AmpAdapter* amp_adapter() { return adapter_.get(); }
  amp::Level amp_level() const { return options_.amp_level; }
  DType low_dtype() const { return options_.low_dtype; }
  const TrainSummary& last_summary() const { return summary_; }
  // Graph mode's plans and counters: the train steps' (TrainStep::graphs) and the eval batches'.
  const graph::StepGraphs& train_graphs() const { return train_step_->graphs(); }
  const graph::StepGraphs& eval_graphs() const { return eval_graphs_; }
  // What training on batches like (data, label) will take at its peak, before training: a probe runs
  // the train step's forward and scaled backward on this batch exactly as training would (the same
  // policy, loss scale, fusions, recomputation), twice — the first makes the kernel choices for these
  // shapes, which training's first step would otherwise make — and puts back gradients, running
  // statistics and generators: nothing is trained. The parameters, optimizer state and persistent
  // low-precision copies count as training's do. It is a measurement of one step, not a model of it:
  // exact where every step allocates alike (the reference models), and it costs two steps' time.
  MemForecast forecast(const Tensor& data, const Tensor& label);
  // Epochs completed by train() so far (where a resumed run continues).
  int64_t epochs_done() const { return epochs_done_; }
  // Updates made so far (skipped ones included; a resumed run's earlier ones too).
  int64_t steps_done() const { return steps_done_; }
  // The run this Model continues (restore_checkpoint sets it from the checkpoint: "-" for a file without a
  // run id); "" for a new run. ModelCheckpoint takes it, so a resumed run owns the checkpoints it resumed.
  const std::string& resumed_run_id() const { return resumed_run_id_; }
  void set_resumed_run_id(std::string id) { resumed_run_id_ = std::move(id); }
  // Also puts the data pipeline at the start of that epoch of the data set (set_resume_position moves it).
  void set_epochs_done(int64_t e) {
    epochs_done_ = e;
    data_epoch_ = -1;
    resume_step_in_epoch_ = -1;
  }
  // A resumed run: the next train() starts its first epoch `position` batches in (the data pipeline
  // skips them without drawing different random numbers) and counts steps from `steps_done`. When
  // steps_per_epoch (the checkpointed run's batches per epoch) is known and the position is mid-epoch,
  // train() refuses a training set with another count (another batch size, data set or sample count):
  // the position would no longer continue the same run. With sink_size > 0 the data place differs from
  // the epochs: `data_epoch` is the data set's epoch the position is in (-1: epochs_done) and
  // `step_in_epoch` the batches of the interrupted train() epoch already done (-1: `position`).
  void set_resume_position(int64_t position, int64_t steps_done, int64_t steps_per_epoch = 0, int64_t data_epoch = -1,
                           int64_t step_in_epoch = -1) {
    resume_position_ = position;
    steps_done_ = steps_done;
    resume_steps_per_epoch_ = steps_per_epoch;
    data_epoch_ = data_epoch;
    resume_step_in_epoch_ = step_in_epoch;
  }

 private:
  std::shared_ptr<nn::Cell> network_;
  std::shared_ptr<nn::LossCell> loss_fn_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  std::map<std::string, MetricPtr> metrics_;
  ModelOptions options_;
  std::shared_ptr<amp::TrainStep> train_step_;
  graph::StepGraphs eval_graphs_{"eval step"};
  graph::SignatureKey eval_key_;
  std::shared_ptr<dist::DataParallel> data_parallel_;
  std::shared_ptr<amp::AmpAdapter> adapter_;
  TrainSummary summary_;
  int64_t epochs_done_ = 0;
  std::string resumed_run_id_;
  int64_t resume_position_ = 0;
  int64_t resume_steps_per_epoch_ = 0;
  int64_t data_epoch_ = -1;            // the data set's epoch train() starts in (-1: epochs_done_)
  int64_t resume_step_in_epoch_ = -1;  // batches of the first epoch already done (-1: resume_position_)
  int64_t steps_done_ = 0;
  std::vector<TrainHookPtr> hooks_;  // add_hook's
  friend class internal::TrainRun;   // the loop of train() (internal/train_loop.h)
};

}  // namespace demi::train
