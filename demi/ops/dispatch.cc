#include "demi/ops/dispatch.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>

namespace demi::ops {
namespace {

GradRecorder* g_recorder = nullptr;
thread_local const PrecisionPolicy* t_policy = nullptr;
thread_local std::optional<DType> t_pin;

// ---- cast cache ----
struct CastKey {
  const TensorImpl* impl;
  int64_t version;
  DType dtype;
  bool operator==(const CastKey&) const = default;
};
struct CastKeyHash {
  size_t operator()(const CastKey& k) const {
    return std::hash<const void*>()(k.impl) ^ (static_cast<size_t>(k.version) << 8) ^
           static_cast<size_t>(k.dtype);
  }
};
struct CastCache {
  int depth = 0;
  std::unordered_map<CastKey, Tensor, CastKeyHash> entries;
  int64_t hits = 0;
  int64_t misses = 0;
};
thread_local CastCache t_cast_cache;
thread_local int64_t t_low_copy_uses = 0;
std::atomic<bool> g_low_copies{true};

DType natural_dtype(std::span<const Tensor* const> inputs) {
  std::optional<DType> result;
  std::optional<DType> first;
  for (const Tensor* t : inputs) {
    if (t == nullptr || !t->defined()) continue;
    if (!first) first = t->dtype();
    if (!is_floating(t->dtype())) continue;
    result = result ? promote_types(*result, t->dtype()) : t->dtype();
  }
  if (result) return *result;
  return first.value_or(DType::kF32);
}

bool is_parameter_like(const Tensor& x) {
  return x.has_autograd_meta() && x.impl().autograd->requires_grad && !x.impl().autograd->grad_fn;
}

// Whether x, cast to `dtype`, gets a bfloat16 gradient (PrecisionPolicy::low_precision_param_grads).
bool keeps_low_grad(const Tensor& x, DType dtype) {
  return t_policy != nullptr && t_policy->low_precision_param_grads() && x.dtype() == DType::kF32 &&
         is_low_precision(dtype) && is_parameter_like(x);
}

}  // namespace

void set_grad_recorder(GradRecorder* recorder) { g_recorder = recorder; }
GradRecorder* grad_recorder() { return g_recorder; }

PrecisionScope::PrecisionScope(const PrecisionPolicy* policy) : saved_(t_policy) { t_policy = policy; }
PrecisionScope::~PrecisionScope() { t_policy = saved_; }
const PrecisionPolicy* current_precision_policy() { return t_policy; }

DTypePinScope::DTypePinScope(std::optional<DType> dtype) : saved_(t_pin) {
  if (dtype) t_pin = dtype;
}
DTypePinScope::~DTypePinScope() { t_pin = saved_; }
std::optional<DType> current_dtype_pin() { return t_pin; }

DType resolve_compute_dtype(Op op, DType natural) {
  const OpInfo& info = op_info(op);
  if (!is_floating(natural) || info.amp == AmpClass::kFollow) return natural;
  if (info.amp == AmpClass::kFp32) return natural == DType::kF64 ? DType::kF64 : DType::kF32;
  if (t_pin) return *t_pin;
  if (t_policy) return t_policy->compute_dtype(op, natural);
  return natural;
}

CastCacheScope::CastCacheScope() { ++t_cast_cache.depth; }
CastCacheScope::~CastCacheScope() {
  if (--t_cast_cache.depth == 0) t_cast_cache.entries.clear();
}
bool cast_cache_active() { return t_cast_cache.depth > 0; }
int64_t low_copy_uses() { return t_low_copy_uses; }
void set_low_copies(bool enabled) { g_low_copies.store(enabled); }
int64_t cast_cache_hits() { return t_cast_cache.hits; }
int64_t cast_cache_misses() { return t_cast_cache.misses; }

// ---- Dispatch ----
Dispatch::Dispatch(Op op, std::span<const Tensor* const> inputs) : op_(op), inputs_(inputs.begin(), inputs.end()) {
  compute_ = resolve_compute_dtype(op, natural_dtype(inputs_));
  needs_grad_ = g_recorder != nullptr && op_info(op).differentiable && g_recorder->needs_grad(inputs_);
  if (observing()) {
    observed_ = true;
    timed_ = timing_wanted();
    if (timed_) start_ = std::chrono::steady_clock::now();
  }
}

Dispatch::~Dispatch() = default;

Tensor Dispatch::input(size_t i) const { return input_as(i, compute_); }

bool Dispatch::input_needs_grad(size_t i) const {
  if (!needs_grad_ || i >= inputs_.size()) return false;
  const Tensor* t = inputs_[i];
  return t != nullptr && t->defined() && t->requires_grad();
}

Tensor Dispatch::input_as(size_t i, DType dtype) const { return cast_input(i, dtype, true); }

Tensor Dispatch::input_uncached(size_t i) const { return cast_input(i, compute_, false); }

Tensor Dispatch::cast_input(size_t i, DType dtype, bool use_cache) const {
  DEMI_ASSERT(i < inputs_.size(), "op ", op_name(op_), " has ", inputs_.size(), " inputs, asked for ", i);
  const Tensor* t = inputs_[i];
  if (t == nullptr || !t->defined()) return Tensor();
  if (!is_floating(t->dtype()) || !is_floating(dtype) || t->dtype() == dtype) return *t;
  const CastGrad grad = keeps_low_grad(*t, dtype) ? CastGrad::kKeepBf16 : CastGrad::kToSource;
  if (use_cache && is_parameter_like(*t)) {
    AutogradMeta& meta = *t->impl().autograd;
    CastKey key{&t->impl(), meta.version, dtype};
    if (t_cast_cache.depth > 0) {
      auto it = t_cast_cache.entries.find(key);
      if (it != t_cast_cache.entries.end()) {
        ++t_cast_cache.hits;
        return it->second;
      }
    }
    // The low copy the optimizer keeps current: this step's Cast node over its bytes, no conversion.
    const bool low_current = g_low_copies.load(std::memory_order_relaxed) && meta.low_copy &&
                             meta.low_copy->dtype() == dtype && meta.low_version == meta.version;
    if (t_cast_cache.depth == 0 && !low_current) return cast(*t, dtype, grad);
    Tensor c;
    if (low_current) {
      ++t_low_copy_uses;
      c = cast_from_copy(*t, *meta.low_copy, grad);
    } else {
      ++t_cast_cache.misses;
      MemCategoryScope cat(MemCategory::kCastCache);
      c = cast(*t, dtype, grad);
      if (g_low_copies.load(std::memory_order_relaxed) && t->dtype() == DType::kF32) {
        meta.low_copy = std::make_shared<Tensor>(c.reshape(c.shape()));  // the bytes, without c's graph
        meta.low_version = meta.version;
      }
    }
    if (t_cast_cache.depth > 0) t_cast_cache.entries.emplace(key, c);
    return c;
  }
  return cast(*t, dtype, grad);
}

DType Dispatch::param_grad_dtype(size_t i, DType operand) const {
  if (!is_low_precision(operand)) return operand;
  const Tensor* t = i < inputs_.size() ? inputs_[i] : nullptr;
  return t != nullptr && t->defined() && keeps_low_grad(*t, operand) ? DType::kBF16 : DType::kF32;
}

TensorList Dispatch::finish(TensorList outputs, BackwardFn backward) {
  if (needs_grad_ && backward) {
    g_recorder->record(op_, inputs_, outputs, std::move(backward));
  }
  if (observed_) {
    OpEvent e{.op = op_, .backward = false, .compute_dtype = compute_, .layer = current_layer(),
              .inputs = inputs_, .outputs = outputs};
    e.flops = flops_;
    if (timed_) e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    notify(e);
  }
  if (t_policy != nullptr && !t_pin && t_policy->outputs_to_fp32(op_)) {
    for (auto& o : outputs)
      if (o.defined() && is_low_precision(o.dtype())) o = cast(o, DType::kF32);
  }
  return outputs;
}

Tensor Dispatch::finish(Tensor output, BackwardFn backward) {
  TensorList outs{std::move(output)};
  return std::move(finish(std::move(outs), std::move(backward))[0]);
}

namespace {

BackwardFn cast_backward(DType src, CastGrad grad) {
  return [src, grad](const TensorList& g) {
    const Tensor& gy = g[0];
    const bool keep = gy.dtype() == src || (grad == CastGrad::kKeepBf16 && gy.dtype() == DType::kBF16);
    return TensorList{keep ? gy : gy.to(src)};
  };
}

}  // namespace

Tensor cast_from_copy(const Tensor& x, const Tensor& copy, CastGrad grad) {
  Dispatch d(Op::kCast, {&x});
  Tensor y = copy.reshape(copy.shape());  // a fresh handle on the copy's bytes for this step's graph
  return d.finish(y, cast_backward(x.dtype(), grad));
}

Tensor cast(const Tensor& x, DType dtype, CastGrad grad) {
  if (x.dtype() == dtype) return x;
  Dispatch d(Op::kCast, {&x});
  Tensor y = x.to(dtype, /*copy=*/true);
  return d.finish(y, cast_backward(x.dtype(), grad));
}

}  // namespace demi::ops
