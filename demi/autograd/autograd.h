// The define-by-run autograd engine.
//
// Every op call that has an input requiring grad is recorded (through demi/ops' GradRecorder) as a Node
// holding the op's backward rule and the tensors it saved. backward(loss) walks the recorded graph once,
// in reverse creation order, sums the gradients reaching each tensor, accumulates the leaves' gradients
// into their .grad (FP32 for FP32 parameters, whatever dtype the op ran in, except where AMP O2/O3 casts
// a parameter with ops::CastGrad::kKeepBf16: then .grad is bfloat16 until a second gradient is added into
// it, which accumulates in FP32), and frees each node's saved tensors as soon as its backward rule has run.
//
//   Tensor w = demi::uniform({10, 5}, -1, 1, gen).set_requires_grad(true);
//   Tensor loss = ops::sum(ops::dense(x, w));
//   autograd::backward(loss);        // w.grad() now holds d loss / d w
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "demi/core/rng.h"
#include "demi/core/tensor.h"
#include "demi/ops/dispatch.h"

namespace demi::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: this input needs no gradient
  int input_nr = 0;            // which of node's outputs the gradient belongs to
};

class Node {
 public:
  virtual ~Node() = default;
  // Gradients of this node's outputs -> gradients of its inputs (one per next edge).
  virtual ops::TensorList apply(const ops::TensorList& grad_outputs) = 0;
  // Drops the tensors the backward rule saved (called right after apply).
  virtual void release() {}
  virtual ops::Op op() const { return ops::Op::kCast; }
  virtual bool is_accumulator() const { return false; }

  std::vector<Edge> next_edges;
  int num_outputs = 1;
  uint64_t sequence_nr = 0;  // creation order: later nodes run first
};

// The node of a recorded op: runs its backward rule once.
class OpNode : public Node {
 public:
  OpNode(ops::Op op, ops::BackwardFn fn, const char* layer = nullptr) : op_(op), layer_(layer), fn_(std::move(fn)) {}
  ops::TensorList apply(const ops::TensorList& grad_outputs) override;
  void release() override { fn_ = nullptr; }
  ops::Op op() const override { return op_; }
  const char* layer() const { return layer_; }  // the layer its forward call ran in (ops::current_layer)

 private:
  ops::Op op_;
  const char* layer_;
  ops::BackwardFn fn_;
};

// Accumulates the gradient of a leaf tensor into its .grad (in the leaf's dtype, or as it arrives for a
// low-precision gradient of an FP32 leaf; see the top of this file).
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) { num_outputs = 1; }
  ops::TensorList apply(const ops::TensorList& grad_outputs) override;
  bool is_accumulator() const override { return true; }
  std::shared_ptr<TensorImpl> leaf() const { return leaf_.lock(); }

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

// Runs backward from `root` (a scalar unless `grad` is given, which must match root's shape).
// Gradients accumulate into leaves' .grad; the graph is freed as it runs (call forward again to
// backward again).
void backward(const Tensor& root, const Tensor& grad = Tensor());

// Called during backward() on this thread once per leaf the graph reaches, as soon as the leaf's .grad
// is complete for this backward (data parallelism starts reducing a bucket of gradients while backward
// goes on). Installed for a scope; scopes nest, the innermost hook is the one called.
using LeafReadyHook = std::function<void(const Tensor& leaf)>;
class LeafReadyScope {
 public:
  explicit LeafReadyScope(LeafReadyHook hook);
  ~LeafReadyScope();
  LeafReadyScope(const LeafReadyScope&) = delete;
  LeafReadyScope& operator=(const LeafReadyScope&) = delete;

 private:
  LeafReadyHook saved_;
};

// Grad mode: when off, no op is recorded (inference, optimizer updates).
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool saved_;
};

// Turns grad mode on for a scope (recomputation records the forward it re-runs inside backward).
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool saved_;
};

// Recomputation (MindSpore's Cell.recompute(), PyTorch's checkpoint): y = fn(x) runs without recording
// (its activations are not kept) and is recorded as one Recompute node whose backward runs fn again,
// recording, from the same inputs and then backward through it. The re-run sees what the first run saw:
// the precision policy, dtype pin, layer and fusion setting in force at the call, the generators in
// `generators` at their positions then (dropout draws the same mask), and `buffers` (running
// statistics) are put back afterwards, so they are updated once. Gradients are those of the plain call,
// bit for bit. Parameters used inside fn get their gradients from the re-run's backward (they are not
// inputs of the node); a parameter also used outside fn then gets its gradient in two parts.
struct RecomputeState {
  std::vector<Generator*> generators;
  std::vector<Tensor> buffers;
};
Tensor recompute(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, RecomputeState state = {});

// Installs the engine as demi/ops' GradRecorder; idempotent. Called by backward() and by the layers'
// constructors, so recording is on in any program that can call backward.
void install();

}  // namespace demi::autograd
