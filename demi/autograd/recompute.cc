// Recomputation: a function run without keeping its activations, recorded as one node whose backward
// runs it again (recording) and backward through the re-run. See autograd.h.
#include <optional>
#include <utility>

#include "demi/autograd/autograd.h"
#include "demi/ops/observer.h"

namespace demi::autograd {
namespace {

// A leaf over x's bytes, without x's graph: the re-run's input, whose gradient is x's.
Tensor detached_leaf(const Tensor& x) {
  auto impl = std::make_shared<TensorImpl>(x.impl());
  impl->autograd = nullptr;
  Tensor leaf(std::move(impl));
  leaf.set_requires_grad(true);
  return leaf;
}

// What the call saw, for the re-run to see the same.
struct CallContext {
  const ops::PrecisionPolicy* policy = nullptr;
  std::optional<DType> pin;
  const char* layer = nullptr;
  bool fusion = true;
  std::vector<std::pair<uint64_t, uint64_t>> generators;  // (seed, offset) of state.generators at the call
};

}  // namespace

Tensor recompute(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, RecomputeState state) {
  install();
  if (!grad_enabled()) return fn(x);
  CallContext ctx;
  ctx.policy = ops::current_precision_policy();
  ctx.pin = ops::current_dtype_pin();
  ctx.layer = ops::current_layer();
  ctx.fusion = ops::fusion_enabled();
  for (Generator* g : state.generators) ctx.generators.emplace_back(g->seed(), g->offset());
  Tensor y;
  {
    NoGradGuard no_grad;  // nothing recorded: no activation inside fn is kept
    y = fn(x);
  }
  DEMI_CHECK(y.defined() && is_floating(y.dtype()), "recompute: the function must return a floating tensor, got ",
             y.defined() ? y.describe() : std::string("an undefined tensor"));
  auto rerun = [fn, x, ctx = std::move(ctx), state = std::move(state)](const ops::TensorList& g) -> ops::TensorList {
    const Tensor& gy = g[0];
    if (!gy.defined()) return {Tensor()};
    // The generators where the call found them (the same dropout masks), then back where they are now.
    std::vector<std::pair<uint64_t, uint64_t>> now;
    for (Generator* gen : state.generators) now.emplace_back(gen->seed(), gen->offset());
    for (size_t i = 0; i < state.generators.size(); ++i)
      state.generators[i]->set_state(ctx.generators[i].first, ctx.generators[i].second);
    std::vector<Tensor> kept;
    {
      NoGradGuard no_grad;
      for (const Tensor& b : state.buffers) kept.push_back(b.clone());
    }
    auto restore = [&] {
      for (size_t i = 0; i < state.generators.size(); ++i) state.generators[i]->set_state(now[i].first, now[i].second);
      NoGradGuard no_grad;
      for (size_t i = 0; i < kept.size(); ++i) {
        Tensor b = state.buffers[i];  // a handle on the buffer: updated once, by the call
        b.copy_(kept[i]);
      }
    };
    const Tensor xin = x.requires_grad() ? detached_leaf(x) : x;
    Tensor y2;
    try {
      EnableGradGuard record;
      ops::PrecisionScope policy(ctx.policy);
      ops::DTypePinScope pin(ctx.pin);
      ops::LayerScope layer(ctx.layer);
      ops::FusionScope fusion(ctx.fusion);
      MemCategoryScope activations(MemCategory::kActivation);
      y2 = fn(xin);
    } catch (...) {
      restore();
      throw;
    }
    restore();
    if (!y2.requires_grad()) return {Tensor()};  // nothing inside needs a gradient
    backward(y2, gy);  // the parameters' gradients go to their .grad
    return {x.requires_grad() ? xin.grad() : Tensor()};
  };
  const Tensor* inputs[] = {&x};
  ops::TensorList outputs{y};
  ops::grad_recorder()->record(ops::Op::kRecompute, std::span<const Tensor* const>(inputs, 1), outputs,
                               std::move(rerun));
  return outputs[0];
}

}  // namespace demi::autograd
