// Train-step objects: one call runs forward, loss, scaled backward, the fused unscale + all-finite
// check, and (unless the step overflowed and the manager drops such steps) the optimizer update.
//
//   auto train_step = amp::build_train_network(net, optimizer, loss_fn, amp::Level::kO2);
//   for (auto& [data, label] : batches) {
//     amp::StepResult r = train_step(data, label);   // {loss, overflow, loss_scale}
//   }
//
// Large-model training features (TrainOptions / TrainStep):
//   - clip_grad_norm > 0 clips by global L2 norm AFTER unscaling, so the threshold means what it says at
//     every loss scale (clipping the scaled gradients — a classic AMP bug — would clip almost always and
//     shrink the update by the loss scale); an overflowing step is never clipped, it is skipped.
//   - Gradient accumulation: accumulate(data, label) runs forward and a scaled backward on one micro-batch,
//     adding its gradients to the ones already there; step() then applies them once: one fused unscale +
//     all-finite pass that also divides by the micro-batch count (the update is the mean of the micro-batch
//     gradients, as one big batch would give), one clip, one optimizer step and ONE loss-scale decision for
//     the whole update. Every micro-batch of an update uses the same loss scale; an overflow in any of them
//     skips the update. operator()(data, label) is accumulate + step.
//   - Optimizer in backward: each parameter is updated as soon as backward completes its gradient, and the
//     gradient freed at once, so no step ever holds every gradient (issue 15's memory). It needs an update
//     that waits on no global decision: no loss scale, no clipping, no gradient accumulation, no data
//     parallelism. A non-finite gradient cannot skip the whole step any more: that parameter's update is
//     skipped, the others stand, and the step reports overflow (not skipped) naming it; there is no
//     overflow attribution re-run; and no .grad outlives the step.
//     By default (set_optimizer_in_backward(std::nullopt)) GRAPH_MODE schedules it this way wherever a
//     whole-batch update waits on no global decision and no step is expected to overflow (no cell computes
//     in float16: FP32 and bfloat16 have FP32's range, so a non-finite gradient is a bug, not an overflow
//     to skip and attribute). Graph mode compiles the whole step, so the update is its to place: a
//     training peak below PYNATIVE's, bit for bit the same weights. PYNATIVE_MODE never (its updates run
//     after backward, and .grad stays readable until the next step). true: always (the conditions above
//     are then errors naming what is in the way); false: never.
//
// MindSpore's per-level defaults: O2 -> DynamicLossScaleManager and BatchNorm kept FP32; O3 -> no loss
// scale, BatchNorm low too; O0/O1 -> no loss scale. With bfloat16 (same exponent range as FP32) no loss
// scale is needed, so O2-bf16 defaults to none as well.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "demi/amp/attribution.h"
#include "demi/amp/loss_scale.h"
#include "demi/amp/policy.h"
#include "demi/core/context.h"
#include "demi/graph/step_graph.h"
#include "demi/nn/cell.h"
#include "demi/optim/optimizer.h"

namespace demi::amp {

struct StepResult {
  float loss = 0;           // the unscaled loss (FP32)
  bool overflow = false;    // a gradient was not finite
  bool skipped = false;     // the update was not applied (overflow with drop_overflow_update)
  double loss_scale = 1;    // the scale this step used
  std::string first_nonfinite;  // parameter path of the first non-finite gradient, when overflow
  int64_t micro_batches = 1;    // micro-batches accumulated into this update
  double grad_norm = -1;        // global L2 norm of the unscaled gradients before clipping (-1: not computed)
  bool clipped = false;         // the gradients were scaled down to clip_grad_norm
  // On an overflow step with attribution on: the op that first produced Inf/NaN (amp/attribution.h).
  OverflowSource overflow_source;
};

struct TrainOptions {
  DType low_dtype = DType::kF16;                       // the seed's float16; kBF16 for bfloat16
  std::shared_ptr<LossScaleManager> loss_scale_manager;  // null: the level's default
  bool no_loss_scale = false;                          // force no loss scaling (overrides the default)
  std::optional<bool> keep_batchnorm_fp32;             // default: true at O2, false at O3
  double clip_grad_norm = 0;                           // > 0: max global L2 norm, applied after unscaling
  // Update each parameter as backward completes it (TrainStep's optimizer in backward): null, graph mode's
  // choice (wherever nothing waits on every gradient, in GRAPH_MODE only); true always; false never.
  std::optional<bool> optimizer_in_backward;
  // Parameter gradients in the low dtype (no FP32 gradient buffer; AmpPolicy::low_precision_param_grads).
  // Default: the policy's (bfloat16 at O2 and O3, in float16 runs too).
  std::optional<bool> low_precision_param_grads;
  // How the network's float16 products multiply (kernels/matmul.h): exact (the default), or rounded to
  // bfloat16 on the bf16 kernels, faster with other numbers. kBf16 needs a level that computes in float16
  // (O1-O3 with low_dtype kF16) and AVX512-BF16; else build_train_network refuses it.
  F16Products f16_products = F16Products::kExact;
};

// Combines the gradients of processes that train one model on different batches (data parallelism;
// demi/distributed implements it on MPI). TrainStep calls it in this order every update:
//   gradient_ready(p)   during the last micro-batch's backward, for each parameter whose gradient is
//                       final, in the order backward completes them (so the reducer may start combining
//                       them while backward goes on); not called for updates made of accumulate() calls
//   reduce(params, k)   after backward: every parameter's .grad replaced by the combined gradient (one
//                       defined, zeros where this process has none), identical on every process; k is
//                       this process's micro-batch count, whose mean it contributes
//   agree(loss, bad)    the update's loss averaged over the processes and the overflow decision ORed, so
//                       every process skips the same steps and keeps the same loss scale
class GradReducer {
 public:
  virtual ~GradReducer() = default;
  virtual void gradient_ready(const Tensor& param) = 0;
  virtual void reduce(const std::vector<Tensor>& params, int64_t micro_batches) = 0;
  virtual void agree(float& loss, bool& overflow) = 0;
};

// Wraps a network and a loss: construct(data) -> logits; loss(logits, label) -> FP32 loss.
class TrainStep {
 public:
  TrainStep(std::shared_ptr<nn::Cell> net, std::shared_ptr<nn::LossCell> loss_fn,
            std::shared_ptr<optim::Optimizer> optimizer, std::shared_ptr<LossScaleManager> manager);

  // One update from one batch: accumulate(data, label) then step(). In GRAPH_MODE (set_context; the
  // default) each call of the three below runs under graph mode's static memory plans
  // (graph/step_graph.h): the same results bit for bit, its allocations served from one planned arena;
  // PYNATIVE_MODE runs it as it comes.
  StepResult operator()(const Tensor& data, const Tensor& label);
  // Forward and scaled backward on one micro-batch, gradients added to the accumulated ones; returns its
  // (unscaled) loss. The first micro-batch after an update clears the gradients and fixes the loss scale.
  float accumulate(const Tensor& data, const Tensor& label);
  // Applies the accumulated micro-batches as one update (see the top of this file).
  StepResult step();
  // With a GradReducer: the update of a process that has no batch this step while others have (the last
  // batches of an epoch split over processes). It contributes no gradient and applies the combined one.
  StepResult step_without_batch();
  // Gradients combined across processes by `reducer` before every update (null: this process alone).
  void set_grad_reducer(std::shared_ptr<GradReducer> reducer) { reducer_ = std::move(reducer); }
  GradReducer* grad_reducer() const { return reducer_.get(); }
  int64_t accumulated_micro_batches() const { return micro_batches_; }

  // Overflow attribution (on by default): an overflowing update is re-run once, with its batches, loss
  // scale and random numbers, under an observer that finds the first op producing Inf/NaN
  // (StepResult::overflow_source); running statistics and generators are restored afterwards, so the
  // re-run changes nothing. Only overflowing steps pay for it (one more forward and backward). Off, an
  // update keeps no handle on its batches.
  void set_attribute_overflow(bool on) { attribute_overflow_ = on; }
  bool attribute_overflow() const { return attribute_overflow_; }

  // Runs forward and the scaled backward of one batch exactly as a train step would (same policy, loss
  // scale and random numbers; in graph mode the layer calls it would fuse fused, nn/call_fusion.h) with
  // `observer` installed, then puts back everything it changed: no update, gradients, running statistics
  // and generators as they were. The dtype trace and Model::forecast use it.
  void run_observed(const Tensor& data, const Tensor& label, ops::OpObserver& observer);

  // How float16 products multiply in this step's forward and backward (TrainOptions::f16_products), put in
  // force on the calling thread for each call of the four above.
  void set_f16_products(F16Products mode);
  F16Products f16_products() const { return f16_products_; }

  // Clipping by global norm after unscaling (0: off).
  void set_clip_grad_norm(double max_norm);
  // The optimizer in backward (see the top of this file): null, graph mode's choice; true, always (its
  // conditions are checked at every step); false, never.
  void set_optimizer_in_backward(std::optional<bool> on) { optimizer_in_backward_ = on; }
  // Whether a whole-batch update made now (operator(), in the current ExecMode) runs it.
  bool optimizer_in_backward() const;
  double clip_grad_norm() const { return clip_grad_norm_; }

  nn::Cell& network() { return *net_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  LossScaleManager* loss_scale_manager() { return manager_.get(); }
  // The optimizer's parameters' paths in the network (for messages), in the optimizer's order.
  const std::vector<std::string>& parameter_names() const { return param_names_; }
  // Graph mode's plans and counters for this step's updates (forget the plans with graphs().clear()
  // when the program changes, as adaptive AMP does when it promotes a layer).
  graph::StepGraphs& graphs() { return graphs_; }
  const graph::StepGraphs& graphs() const { return graphs_; }
  // The last step's logits (FP32), for metrics without a second forward pass.
  const Tensor& last_logits() const { return last_logits_; }
  // Told after each batch's forward (with its unscaled loss) and after its backward, in the steps this
  // TrainStep trains (not in an overflow's attribution re-run): Model::train's step hooks
  // (train/hooks.h). It must not run ops on the network (graph mode replays the step's memory plan).
  enum class Phase { kAfterForward, kAfterBackward };
  using PhaseObserver = std::function<void(Phase, float loss)>;
  void set_phase_observer(PhaseObserver observer) { phase_observer_ = std::move(observer); }

 private:
  std::shared_ptr<nn::Cell> net_;
  std::shared_ptr<nn::LossCell> loss_fn_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<LossScaleManager> manager_;
  std::shared_ptr<GradReducer> reducer_;
  std::vector<std::string> param_names_;
  std::unordered_map<const TensorImpl*, size_t> param_index_;  // an optimizer parameter -> its index
  Tensor last_logits_;
  double clip_grad_norm_ = 0;
  int64_t micro_batches_ = 0;  // accumulated since the last step()
  double micro_loss_sum_ = 0;
  double micro_scale_ = 1;     // the loss scale every micro-batch of this update uses
  bool reduce_in_backward_ = false;  // operator(): the reducer hears of gradients as backward makes them
  bool attribute_overflow_ = true;
  PhaseObserver phase_observer_;
  bool rerunning_ = false;  // an attribution re-run: the phase observer is not told
  std::optional<bool> optimizer_in_backward_;
  F16Products f16_products_ = F16Products::kExact;
  // Whether a cell of the network computes in float16, and the nn::Cell::structure_version it was found
  // at (walking the cells costs microseconds, a step of a small network tens of them).
  mutable std::optional<std::pair<uint64_t, bool>> computes_in_float16_;
  bool computes_in_float16() const;
  // step_in_backward's per-parameter flags, kept so that a step allocates none.
  std::vector<char> updated_in_backward_;
  // With attribution on, what it needs to re-run this update's micro-batches: each one's batch and the
  // generators' positions before it.
  struct MicroBatch {
    Tensor data, label;
    std::vector<std::pair<uint64_t, uint64_t>> generators;  // (seed, offset), in generators_of order
  };
  std::vector<MicroBatch> micro_inputs_;
  std::vector<std::pair<std::string, Generator*>> generators_;  // nn::generators_of(net), at construction

  graph::StepGraphs graphs_{"train step"};
  // operator(), accumulate() and step() without graph mode; `in_backward`: optimizer_in_backward() for the
  // update, decided once per call.
  StepResult update(const Tensor& data, const Tensor& label, bool in_backward);
  float accumulate_micro_batch(const Tensor& data, const Tensor& label);
  StepResult apply_update();
  const std::string& graph_key(graph::SignatureKey& key, std::string_view kind, const Tensor* data,
                               const Tensor* label, bool in_backward);
  graph::SignatureKey update_key_, first_micro_key_, micro_key_, apply_key_;  // one per kind of call
  float forward_backward(const Tensor& data, const Tensor& label, bool notify_reducer);
  StepResult step_in_backward(const Tensor& data, const Tensor& label);
  // The network's forward on the first samples of `data` (nn::CallFusions::learning_batch) without
  // gradients, its running statistics and generators put back: what graph mode's rewrite of the calls
  // learns from (StepGraphs::run's `learn`); nothing where the network has no cell a chain could end in.
  void forward_leaving_no_trace(const Tensor& data);
  void replay(const std::vector<MicroBatch>& micro, double loss_scale, ops::OpObserver& observer,
              const std::function<bool()>& done);
  OverflowSource find_overflow_source(const std::vector<MicroBatch>& micro, double loss_scale);
  StepResult finish(StepResult r, const std::vector<MicroBatch>& batches = {});
};

// Scales `grads` (FP32, FP16 or BF16; undefined ones skipped) in place so that their global L2 norm is at
// most max_norm (coefficient max_norm / (norm + 1e-6), as PyTorch's clip_grad_norm_) and returns the norm
// before clipping. One fused sum-of-squares pass, and one scaling pass only when clipping (a low-precision
// gradient's products are rounded to its dtype; TrainStep instead folds the coefficient into what the
// optimizer multiplies them by).
double clip_grad_norm(std::vector<Tensor>& grads, double max_norm);

// Graph mode's rewrite of a step's layer calls (nn::CallFusions: the eager fusions applied to any
// network's calls) as the StepGraphs rewrite of each key. TrainStep's steps and Model::eval's use it.
std::unique_ptr<graph::StepRewrite> make_call_fusions();

// MindSpore's amp.build_train_network(network, optimizer, loss_fn, level): attaches the level's precision
// policy to `net` and returns its train step.
std::shared_ptr<TrainStep> build_train_network(std::shared_ptr<nn::Cell> net,
                                               std::shared_ptr<optim::Optimizer> optimizer,
                                               std::shared_ptr<nn::LossCell> loss_fn, Level level,
                                               const TrainOptions& options = {});

// The level's default loss-scale manager for a low dtype (null when none is needed).
std::shared_ptr<LossScaleManager> default_loss_scale_manager(Level level, DType low_dtype);

}  // namespace demi::amp
