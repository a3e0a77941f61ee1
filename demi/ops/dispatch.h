// The one dispatch point every op call goes through.
//
// An op function (ops/*.h) opens a Dispatch, asks it for its inputs (cast to the compute dtype the
// precision policy chooses), runs its kernels, and finishes with its outputs and a backward rule:
//
//   Tensor relu(const Tensor& x) {
//     Dispatch d(Op::kRelu, {&x});
//     Tensor xin = d.input(0);                       // cast per AMP (parameters through the cast cache)
//     Tensor y = ...kernel...;
//     return d.finish(y, [y](const TensorList& g) { return TensorList{relu_backward(g[0], y)}; });
//   }
//
// Three parties look at every call through interfaces defined here, so that ops depends on none of them:
//   - a GradRecorder (demi/autograd; later demi/graph) records the call with its backward rule;
//   - a PrecisionPolicy (demi/amp) decides the dtype each op computes in;
//   - observers (ops/observer.h: the op trace, the profiler, the numerics report, overflow
//     attribution) see each call: op, layer, dtypes, shapes, outputs and, when asked, its time.
#pragma once

#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "demi/core/tensor.h"
#include "demi/ops/observer.h"
#include "demi/ops/op.h"

namespace demi::ops {

using TensorList = std::vector<Tensor>;
// Given the gradients of an op's outputs (undefined where an output got none), returns the gradients of
// its inputs (undefined for an input that needs none). A gradient may be wider than its tensor's dtype
// (an f32 weight gradient computed from bf16 operands); consumers convert.
using BackwardFn = std::function<TensorList(const TensorList& grad_outputs)>;

class GradRecorder {
 public:
  virtual ~GradRecorder() = default;
  // Whether a call with these inputs must be recorded (grad mode on and an input requires grad).
  virtual bool needs_grad(std::span<const Tensor* const> inputs) const = 0;
  // Records the call: outputs become non-leaf tensors whose backward runs `backward`.
  virtual void record(Op op, std::span<const Tensor* const> inputs, std::span<Tensor> outputs,
                      BackwardFn backward) = 0;
};
// Installed once by demi/autograd; nullptr records nothing.
void set_grad_recorder(GradRecorder* recorder);
GradRecorder* grad_recorder();

class PrecisionPolicy {
 public:
  virtual ~PrecisionPolicy() = default;
  // The dtype `op` computes in, given `natural`: the dtype it would use without AMP (its floating
  // inputs' promoted dtype).
  virtual DType compute_dtype(Op op, DType natural) const = 0;
  // Whether the op's floating outputs are cast back to FP32 (MindSpore's O1).
  virtual bool outputs_to_fp32(Op op) const = 0;
  // Whether an FP32 parameter cast to a low dtype gets its gradient in bfloat16 (CastGrad::kKeepBf16).
  virtual bool low_precision_param_grads() const { return false; }
};

// Makes `policy` the one in force in this thread for a scope (nullptr: no AMP); scopes nest.
class PrecisionScope {
 public:
  explicit PrecisionScope(const PrecisionPolicy* policy);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  const PrecisionPolicy* saved_;
};
const PrecisionPolicy* current_precision_policy();

// Pins every floating op in the scope to `dtype`, overriding the policy (a cell's to_float); FP32-class
// ops (the losses) stay FP32. Scopes nest; the innermost wins.
class DTypePinScope {
 public:
  explicit DTypePinScope(std::optional<DType> dtype);
  ~DTypePinScope();
  DTypePinScope(const DTypePinScope&) = delete;
  DTypePinScope& operator=(const DTypePinScope&) = delete;

 private:
  std::optional<DType> saved_;
};

// The pin in force in this thread (DTypePinScope), if any.
std::optional<DType> current_dtype_pin();

// The compute dtype of `op` now, given its natural dtype (pin, then policy, then natural).
DType resolve_compute_dtype(Op op, DType natural);

// Casts of parameters (leaf tensors that require grad) made inside the scope are kept and reused: each
// parameter is cast to the low dtype once per scope (per train step), not once per use. The cached
// tensors are tagged MemCategory::kCastCache and released when the scope ends.
class CastCacheScope {
 public:
  CastCacheScope();
  ~CastCacheScope();
  CastCacheScope(const CastCacheScope&) = delete;
  CastCacheScope& operator=(const CastCacheScope&) = delete;
};
bool cast_cache_active();
int64_t cast_cache_hits();    // uses served from the cache in this thread (for tests)
int64_t cast_cache_misses();  // casts made and stored
// A parameter's first cast in a scope (with low copies on, the default) is also kept as its persistent
// low copy (AutogradMeta::low_copy), which the optimizer rewrites in the same pass as each FP32 update;
// while it is current, casts of that parameter read it (a Cast node over its bytes, no conversion).
// Turning low copies off (tests comparing both ways) makes every step cast again.
int64_t low_copy_uses();  // casts served by a current low copy in this thread (for tests)
void set_low_copies(bool enabled);

// ---- Dispatch ------------------------------------------------------------------------------------

class Dispatch {
 public:
  // inputs: every tensor input of the call (nullptr or undefined for an absent optional input).
  Dispatch(Op op, std::initializer_list<const Tensor*> inputs)
      : Dispatch(op, std::span<const Tensor* const>(inputs.begin(), inputs.size())) {}
  // The same for an op with a variable number of inputs (Concat).
  Dispatch(Op op, std::span<const Tensor* const> inputs);
  ~Dispatch();
  Dispatch(const Dispatch&) = delete;
  Dispatch& operator=(const Dispatch&) = delete;

  Op op() const { return op_; }
  DType compute_dtype() const { return compute_; }
  // Input i cast to the compute dtype (non-floating inputs unchanged; parameters through the cast cache).
  Tensor input(size_t i) const;
  // Input i cast to `dtype` (for ops that keep some inputs, e.g. BatchNorm's gamma, in FP32).
  Tensor input_as(size_t i, DType dtype) const;
  // Input i cast to the compute dtype, bypassing the cast cache: for an op that does not keep the copy
  // past the forward call (it recasts the caller's tensor in backward), so that the copy is freed at once.
  Tensor input_uncached(size_t i) const;
  // The dtype an op writes input i's gradient in when it computes it from that input cast to `operand` (a
  // weight or bias): for a low-precision operand, FP32 (AMP's master gradient: the product's FP32 sums
  // rounded once), or bfloat16 where the policy keeps parameter gradients low and input i is a parameter
  // (PrecisionPolicy::low_precision_param_grads; bfloat16 for float16 operands too: see AmpPolicy). Call it
  // in the forward, where the policy is in force.
  DType param_grad_dtype(size_t i, DType operand) const;
  bool needs_grad() const { return needs_grad_; }
  // Whether input i (as given by the caller) needs a gradient: a backward rule skips the work for the
  // others (the first layer's input-gradient convolution, say).
  bool input_needs_grad(size_t i) const;
  // The call's floating-point operations (forward), for observers; ops that know them cheaply say so
  // (convolutions); others are estimated from shapes by the observer that needs them.
  void set_flops(int64_t flops) { flops_ = flops; }
  // Records the call and returns the outputs (cast to FP32 when the policy says so).
  Tensor finish(Tensor output, BackwardFn backward = nullptr);
  TensorList finish(TensorList outputs, BackwardFn backward = nullptr);

 private:
  Tensor cast_input(size_t i, DType dtype, bool use_cache) const;

  Op op_;
  std::vector<const Tensor*> inputs_;
  DType compute_;
  bool needs_grad_ = false;
  std::chrono::steady_clock::time_point start_;
  bool observed_ = false;
  int64_t flops_ = -1;
  bool timed_ = false;
};

// How a Cast's backward hands the gradient to its source: cast back to the source's dtype (the default),
// or a bfloat16 gradient as it is (any other still cast back). Dispatch casts an FP32 parameter to the low
// dtype with kKeepBf16 when the policy in force says low_precision_param_grads() (AMP O2/O3), and the op
// writes that parameter's gradient in bfloat16 (Dispatch::param_grad_dtype): the parameter's .grad is then
// bfloat16, and no FP32 gradient buffer exists (the product that makes it still sums in FP32 inside).
enum class CastGrad { kToSource, kKeepBf16 };
// Casts `x` to `dtype` as a recorded, differentiable op.
Tensor cast(const Tensor& x, DType dtype, CastGrad grad = CastGrad::kToSource);
// x cast to copy's dtype where copy already holds exactly those values (a parameter's low copy): the
// same Cast node as cast(), over copy's bytes.
Tensor cast_from_copy(const Tensor& x, const Tensor& copy, CastGrad grad = CastGrad::kToSource);

}  // namespace demi::ops
