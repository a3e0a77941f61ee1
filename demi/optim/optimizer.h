// Optimizers on FP32 master weights: Momentum (MindSpore's, with Nesterov and weight decay), SGD, Adam,
// AdamW, RMSProp, Adagrad, LAMB. Parameters and optimizer state are FP32, and so is the arithmetic; each update
// is one fused pass over a parameter, its gradient and its state (not a chain of tensor ops), parallel over
// elements.
//
// Gradients are read from each parameter's .grad (accumulated there by autograd): FP32, or FP16/BF16 (AMP
// O2/O3's low-precision parameter gradients), widened to FP32 a cache-sized chunk at a time as the update
// reads them, so no FP32 copy of a low-precision gradient is ever made (LAMB, which needs its whole
// gradient before the update, widens one parameter's at a time). step() applies one
// update and advances the step counter and the learning-rate schedule; a step that AMP skips for an
// overflow never calls step(), so weights, state and counters stay untouched. A parameter with a current
// low-precision copy (AMP O2/O3, ops/dispatch.h) gets it rewritten in the same pass as its update.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "demi/core/tensor.h"
#include "demi/ops/ops.h"
#include "demi/optim/lr_schedule.h"

namespace demi::optim {

// A group of parameters sharing a weight decay and a learning-rate multiplier (e.g. no decay on norms
// and biases).
struct ParamGroup {
  std::vector<Tensor> params;
  double weight_decay = 0;
  double lr_scale = 1;
};

class Optimizer {
 public:
  Optimizer(std::string name, std::vector<ParamGroup> groups, LrSchedulePtr lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Applies one update from the parameters' gradients (a parameter without a gradient is left alone).
  // low_grad_multiplier multiplies every FP16/BF16 gradient value as it is read (FP32 ones are read as
  // they are): the AMP train step's unscale (and clip) factor for gradients it cannot unscale in place
  // without flushing the small values the loss scale saved (see ops::unscale_and_check_finite).
  void step(float low_grad_multiplier = 1.0f);
  // The same update one parameter at a time (index in parameters()), for updating each parameter as soon
  // as backward completes its gradient (amp::TrainStep's optimizer in backward): step_param for every
  // parameter with a gradient, then finish_step(), is step().
  void step_param(size_t index, float low_grad_multiplier = 1.0f);
  void finish_step() { ++step_; }
  // Drops every parameter's gradient (the next backward writes fresh ones).
  void zero_grad();

  int64_t global_step() const { return step_; }
  void set_global_step(int64_t s) { step_ = s; }
  double current_lr() const { return lr_->lr(step_); }
  const std::string& name() const { return name_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  const std::vector<Tensor>& parameters() const { return flat_; }
  // Every state tensor, named "<slot>.<param index>" (for checkpoints), in a stable order.
  std::vector<std::pair<std::string, Tensor>> state();
  // The dtype the optimizer keeps its state in (moments, mean squares, LAMB's update): FP32, the default
  // and MindSpore's, or BF16 — half the bytes (on a model with as many parameters as activations, a sixth
  // of an O2 training peak), FP32's range, 8 significant bits instead of 24. The arithmetic stays FP32:
  // each update widens a chunk of state, computes, and rounds it back to nearest even. That changes the
  // numerics (the moments carry a relative error of up to 2^-9 per step, an exponential average does not
  // let it accumulate), so it is never implied by an AMP level: it is the caller's explicit choice.
  // Adagrad refuses it (its sums only grow: increments below 2^-9 of the sum would be lost). Existing
  // state is converted (rounded, to BF16); a checkpoint restores into whichever dtype is set.
  void set_state_dtype(DType dtype);
  DType state_dtype() const { return state_dtype_; }

 protected:
  // One fused update of n elements of a parameter: p, g and state[s] (one pointer per state slot, in the
  // order add_state_slots named them) point at the chunk's first element, FP32 whatever the state dtype
  // (BF16 state is widened for the call and rounded back after it). Called in parallel on disjoint chunks.
  virtual void update(float* const* state, float* p, const float* g, int64_t n, double lr, double weight_decay) = 0;
  // Called once per parameter before its chunks are updated, with the whole parameter, gradient and state:
  // an optimizer whose update depends on whole-parameter quantities (LAMB's trust ratio) computes them here
  // and returns the learning rate the chunks then get (default: lr unchanged). Where reads_whole_gradient()
  // says false, g and state are null (a low-precision gradient and BF16 state are widened a chunk at a time).
  virtual double prepare(float* const* state, const float* p, const float* g, int64_t n, double lr,
                         double weight_decay) {
    (void)state, (void)p, (void)g, (void)n, (void)weight_decay;
    return lr;
  }
  // Whether prepare() reads the whole gradient and state: then a low-precision gradient, and BF16 state,
  // are widened whole (one parameter's) before it.
  virtual bool reads_whole_gradient() const { return false; }
  // Whether update_mixed() exists: update() on a gradient and state as they are stored (a low-precision
  // gradient times g_scale, BF16 state: ops::MixedOperands, one state slot), in one pass, with the bits of
  // widening them, update() and rounding the state back. Without it the chunks are widened into FP32 buffers
  // around update().
  virtual bool has_update_mixed() const { return false; }
  virtual void update_mixed(const ops::MixedOperands& x, float* p, int64_t n, double lr, double weight_decay) {
    (void)x, (void)p, (void)n, (void)lr, (void)weight_decay;
    DEMI_ASSERT(false, name_, " has no update_mixed");
  }
  // Whether state_dtype BF16 suits this optimizer's state (Adagrad's ever-growing sums do not).
  virtual bool allows_bf16_state() const { return true; }
  // Allocates `slots` zero-initialised FP32 state tensors per parameter (MemCategory::kOptimizerState).
  void add_state_slots(const std::vector<std::string>& slot_names);
  // Slot s of parameter i, while the state is FP32 (constructors that initialise it).
  float* slot(size_t slot_index, size_t param_index) { return state_[slot_index][param_index].data<float>(); }

 private:
  std::string name_;
  std::vector<ParamGroup> groups_;
  std::vector<Tensor> flat_;           // every parameter, in group order
  std::vector<size_t> group_of_;       // group index of each flat parameter
  LrSchedulePtr lr_;
  int64_t step_ = 0;
  std::vector<std::string> slot_names_;
  std::vector<std::vector<Tensor>> state_;  // [slot][param]
  DType state_dtype_ = DType::kF32;
};

// MindSpore's Momentum: accum = momentum * accum + (g + wd * w); w -= lr * accum
// (Nesterov: w -= lr * (g + wd * w + momentum * accum)).
class Momentum : public Optimizer {
 public:
  Momentum(std::vector<Tensor> params, double learning_rate, double momentum, double weight_decay = 0,
           bool nesterov = false);
  Momentum(std::vector<ParamGroup> groups, LrSchedulePtr lr, double momentum, bool nesterov = false);

 protected:
  void update(float* const* state, float* p, const float* g, int64_t n, double lr, double weight_decay) override;
  bool has_update_mixed() const override { return true; }
  void update_mixed(const ops::MixedOperands& x, float* p, int64_t n, double lr, double weight_decay) override;

 private:
  double momentum_;
  bool nesterov_;
};

// Plain SGD (no state): w -= lr * (g + wd * w).
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, double learning_rate, double weight_decay = 0);
  SGD(std::vector<ParamGroup> groups, LrSchedulePtr lr);

 protected:
  void update(float* const* state, float* p, const float* g, int64_t n, double lr, double weight_decay) override;
};

struct AdamOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

// Adam (L2 weight decay added to the gradient) and AdamW (decoupled decay: w -= lr * wd * w).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, double learning_rate, const AdamOptions& options = {}, double weight_decay = 0);
  Adam(std::vector<ParamGroup> groups, LrSchedulePtr lr, const AdamOptions& options = {}, bool decoupled = false);

 protected:
  void update(float* const* state, float* p, const float* g, int64_t n, double lr, double weight_decay) override;

 private:
  AdamOptions options_;
  bool decoupled_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, double learning_rate, const AdamOptions& options = {},
        double weight_decay = 0.01);
  AdamW(std::vector<ParamGroup> groups, LrSchedulePtr lr, const AdamOptions& options = {});
};

struct RMSPropOptions {
  double decay = 0.9;      // MindSpore's decay (PyTorch's alpha)
  double momentum = 0.0;
  double epsilon = 1e-10;
  bool centered = false;   // divide by the estimated variance (mean square minus squared mean)
};

// MindSpore's RMSProp (nn.RMSProp): with g = grad + wd * w,
//   ms = decay * ms + (1 - decay) * g^2                 [centered: mg = decay * mg + (1 - decay) * g]
//   mom = momentum * mom + lr * g / sqrt(ms + eps)       [centered: sqrt(ms - mg^2 + eps)]
//   w -= mom
// (PyTorch's RMSprop adds eps outside the square root: the same update up to eps.)
class RMSProp : public Optimizer {
 public:
  RMSProp(std::vector<Tensor> params, double learning_rate, const RMSPropOptions& options = {},
          double weight_decay = 0);
  RMSProp(std::vector<ParamGroup> groups, LrSchedulePtr lr, const RMSPropOptions& options = {});

 protected:
  void update(float* const* state, float* p, const float* g, int64_t n, double lr, double weight_decay) override;

 private:
  RMSPropOptions options_;
};

// MindSpore's Adagrad (nn.Adagrad): with g = grad + wd * w, accum += g^2; w -= lr * g / sqrt(accum). The
// accumulators start at initial_accum (MindSpore's accum = 0.1), which keeps the first step finite; there
// is no epsilon (PyTorch's Adagrad starts at 0 and adds eps = 1e-10 to the root).
class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<Tensor> params, double learning_rate, double initial_accum = 0.1, double weight_decay = 0);
  Adagrad(std::vector<ParamGroup> groups, LrSchedulePtr lr, double initial_accum = 0.1);

 protected:
  bool allows_bf16_state() const override { return false; }
  void update(float* const* state, float* p, const float* g, int64_t n, double lr, double weight_decay) override;
};

// MindSpore's Lamb (You et al., "Large Batch Optimization for Deep Learning", 2019): Adam's bias-corrected
// moments, then per parameter a trust ratio. With u = m_hat / (sqrt(v_hat) + eps) + wd * w,
//   w -= lr * (||w|| / ||u||) * u        (ratio 1 when either norm is 0)
// The norms are taken over the whole parameter (in f64, in a fixed order: thread-count independent), so
// each parameter's update is two passes: moments and u (kept in the "update" slot), then the step.
class LAMB : public Optimizer {
 public:
  LAMB(std::vector<Tensor> params, double learning_rate, const AdamOptions& options = {.beta1 = 0.9,
                                                                                      .beta2 = 0.999,
                                                                                      .eps = 1e-6},
       double weight_decay = 0);
  LAMB(std::vector<ParamGroup> groups, LrSchedulePtr lr, const AdamOptions& options = {.beta1 = 0.9,
                                                                                      .beta2 = 0.999,
                                                                                      .eps = 1e-6});

 protected:
  double prepare(float* const* state, const float* p, const float* g, int64_t n, double lr,
                 double weight_decay) override;
  bool reads_whole_gradient() const override;
  void update(float* const* state, float* p, const float* g, int64_t n, double lr, double weight_decay) override;

 private:
  AdamOptions options_;
};

}  // namespace demi::optim
