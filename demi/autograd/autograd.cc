#include "demi/autograd/autograd.h"

#include <atomic>
#include <chrono>
#include <queue>
#include <unordered_map>

#include "demi/core/convert.h"
#include "demi/ops/ops.h"

namespace demi::autograd {
namespace {

thread_local bool t_grad_enabled = true;
thread_local LeafReadyHook t_leaf_ready;
std::atomic<uint64_t> g_sequence{0};

// a + b in the wider of their dtypes (gradients reaching one tensor along several paths), through the
// vectorised elementwise kernel.
Tensor accumulate(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  DEMI_ASSERT(a.numel() == b.numel(), "gradient shapes ", a.shape(), " and ", b.shape(), " differ");
  DType t = promote_types(a.dtype(), b.dtype());
  Tensor aa = a.dtype() == t ? a : a.to(t);
  Tensor bb = b.dtype() == t ? b : b.to(t);
  return ops::accumulate(aa, bb);
}

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  AutogradMeta& meta = leaf.autograd_meta();
  if (auto node = meta.grad_accumulator.lock()) return node;
  auto node = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
  // Runs as soon as its last gradient has arrived (the ready queue takes the highest number first): the
  // leaf's .grad is final then, and data parallelism can start reducing it while backward goes on.
  node->sequence_nr = UINT64_MAX;
  meta.grad_accumulator = node;
  return node;
}

class Recorder : public ops::GradRecorder {
 public:
  bool needs_grad(std::span<const Tensor* const> inputs) const override {
    if (!t_grad_enabled) return false;
    for (const Tensor* t : inputs)
      if (t != nullptr && t->defined() && t->requires_grad()) return true;
    return false;
  }

  void record(ops::Op op, std::span<const Tensor* const> inputs, std::span<Tensor> outputs,
              ops::BackwardFn backward) override {
    auto node = std::make_shared<OpNode>(op, std::move(backward), ops::current_layer());
    node->sequence_nr = g_sequence.fetch_add(1, std::memory_order_relaxed);
    node->num_outputs = static_cast<int>(outputs.size());
    node->next_edges.reserve(inputs.size());
    for (const Tensor* t : inputs) {
      Edge e;
      if (t != nullptr && t->defined() && t->requires_grad()) {
        const AutogradMeta& m = *t->impl().autograd;
        if (m.grad_fn) {
          e.node = m.grad_fn;
          e.input_nr = m.output_nr;
        } else {
          e.node = grad_accumulator(*t);
        }
      }
      node->next_edges.push_back(std::move(e));
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      Tensor& o = outputs[i];
      if (!o.defined() || !is_floating(o.dtype())) continue;
      // Always a fresh handle on the same storage: an output may share its impl with an input (a no-op
      // reshape), and a backward rule may have captured the output itself — were that impl to carry this
      // node, node and tensor would keep each other alive when backward never runs.
      auto fresh = std::make_shared<TensorImpl>(o.impl());
      fresh->autograd = nullptr;
      o = Tensor(std::move(fresh));
      AutogradMeta& m = o.autograd_meta();
      m.requires_grad = true;
      m.grad_fn = node;
      m.output_nr = static_cast<int>(i);
      m.grad.reset();
      m.grad_accumulator.reset();
    }
  }
};

Recorder g_recorder_instance;

}  // namespace

void install() {
  static const bool once = [] {
    ops::set_grad_recorder(&g_recorder_instance);
    return true;
  }();
  (void)once;
}

namespace {
// Recording must be on before the first op in any program that links the engine.
const bool g_installed = (install(), true);
}  // namespace

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : saved_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = saved_; }
EnableGradGuard::EnableGradGuard() : saved_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = saved_; }

LeafReadyScope::LeafReadyScope(LeafReadyHook hook) : saved_(std::move(t_leaf_ready)) { t_leaf_ready = std::move(hook); }
LeafReadyScope::~LeafReadyScope() { t_leaf_ready = std::move(saved_); }

ops::TensorList OpNode::apply(const ops::TensorList& grad_outputs) {
  DEMI_ASSERT(fn_ != nullptr, "backward through the graph a second time (op ", ops::op_name(op_),
              "): its saved tensors were already freed");
  if (!ops::observing()) return fn_(grad_outputs);
  const bool timed = ops::timing_wanted();
  auto start = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  ops::TensorList grads = fn_(grad_outputs);
  std::vector<const Tensor*> incoming;
  incoming.reserve(grad_outputs.size());
  for (const Tensor& g : grad_outputs) incoming.push_back(&g);
  ops::OpEvent e{.op = op_, .backward = true, .layer = layer_,
                 .inputs = incoming, .outputs = grads};
  e.compute_dtype = DType::kF32;
  for (const Tensor& g : grad_outputs)
    if (g.defined()) {
      e.compute_dtype = g.dtype();
      break;
    }
  if (timed) e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ops::notify(e);
  return grads;
}

ops::TensorList AccumulateGrad::apply(const ops::TensorList& grad_outputs) {
  auto impl = leaf_.lock();
  if (!impl || grad_outputs.empty() || !grad_outputs[0].defined()) return {};
  Tensor leaf(impl);
  const Tensor& g = grad_outputs[0];
  DEMI_CHECK(g.numel() == leaf.numel(), "gradient of ", leaf.describe(), " has shape ", g.shape());
  AutogradMeta& meta = leaf.autograd_meta();
  MemCategoryScope cat(MemCategory::kGradient);
  // An FP32 leaf's gradient that arrives in FP16/BF16 (a parameter cast with ops::CastGrad::kKeepBf16:
  // AMP O2/O3's low-precision parameter gradients) stays in that dtype; any other arrives in, or is
  // converted to, the leaf's dtype.
  const bool low = leaf.dtype() == DType::kF32 && is_low_precision(g.dtype());
  const DType dtype = low ? g.dtype() : leaf.dtype();
  if (!meta.grad || !meta.grad->defined()) {
    // A gradient nothing else refers to (the engine handed over its only handle, and no other tensor
    // shares its storage) becomes .grad as it is: no copy, no second buffer. Anything shared is copied,
    // because optimizers and the loss-scale unscale write .grad in place.
    bool owned = g.dtype() == dtype && g.impl_ptr().use_count() == 1 && g.impl().storage &&
                 g.impl().storage.use_count() == 1 && g.impl().offset == 0 && g.category() == MemCategory::kGradient;
    if (owned) {
      meta.grad = std::make_shared<Tensor>(g.reshape(leaf.shape()));
    } else {
      Tensor fresh = empty(leaf.shape(), dtype, MemCategory::kGradient);
      fresh.copy_(g);
      meta.grad = std::make_shared<Tensor>(fresh);
    }
  } else {
    // Adding into a gradient already there (micro-batches, or backward called twice): an FP32 leaf
    // accumulates in FP32, whatever dtype its gradients arrive in.
    Tensor& acc = *meta.grad;
    const DType sum = leaf.dtype() == DType::kF32 ? DType::kF32 : acc.dtype();
    Tensor a = acc.dtype() == sum ? acc : acc.to(sum);
    Tensor gg = g.dtype() == sum ? g : g.to(sum);
    acc = ops::accumulate(a, gg);
  }
  return {};
}

void backward(const Tensor& root, const Tensor& grad) {
  install();
  DEMI_CHECK(root.defined(), "backward() on an undefined tensor");
  DEMI_CHECK(root.requires_grad(), "backward(): ", root.describe(),
             " does not require grad (no parameter or input that requires grad was used to compute it)");
  Tensor seed = grad;
  if (!seed.defined()) {
    DEMI_CHECK(root.numel() == 1, "backward(): ", root.describe(),
               " is not a scalar; pass the gradient of the output explicitly");
    seed = ones(root.shape(), root.dtype());
  } else {
    DEMI_CHECK(seed.shape() == root.shape(), "backward(): gradient shape ", seed.shape(),
               " does not match the output's ", root.shape());
  }
  NoGradGuard no_grad;
  MemCategoryScope cat(MemCategory::kGradient);

  const AutogradMeta& rm = *root.impl().autograd;
  std::shared_ptr<Node> root_node = rm.grad_fn ? rm.grad_fn : grad_accumulator(root);
  int root_nr = rm.grad_fn ? rm.output_nr : 0;

  // Count how many edges reach each node, so a node runs once all its gradients have arrived.
  std::unordered_map<Node*, int> pending;
  {
    std::vector<Node*> stack{root_node.get()};
    pending[root_node.get()] = 0;
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges) {
        if (!e.node) continue;
        auto [it, inserted] = pending.try_emplace(e.node.get(), 0);
        ++it->second;
        if (inserted) stack.push_back(e.node.get());
      }
    }
  }

  struct Later {
    bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
      return a->sequence_nr < b->sequence_nr;
    }
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, Later> ready;
  std::unordered_map<Node*, ops::TensorList> buffers;
  buffers[root_node.get()].resize(static_cast<size_t>(root_node->num_outputs));
  buffers[root_node.get()][static_cast<size_t>(root_nr)] = seed;
  ready.push(root_node);

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    ops::TensorList grads_in = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    grads_in.resize(static_cast<size_t>(node->num_outputs));
    bool any = false;
    for (const auto& g : grads_in) any = any || g.defined();
    // A node that no gradient reached still runs its bookkeeping, so the nodes below it get their counts.
    ops::TensorList grads_out = any ? node->apply(grads_in) : ops::TensorList();
    grads_in.clear();
    node->release();
    if (node->is_accumulator() && t_leaf_ready) {
      if (auto leaf = static_cast<AccumulateGrad&>(*node).leaf()) t_leaf_ready(Tensor(std::move(leaf)));
    }
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.node) continue;
      Node* next = e.node.get();
      if (i < grads_out.size() && grads_out[i].defined()) {
        auto& buf = buffers[next];
        buf.resize(static_cast<size_t>(next->num_outputs));
        Tensor& slot = buf[static_cast<size_t>(e.input_nr)];
        slot = slot.defined() ? accumulate(slot, grads_out[i]) : grads_out[i];
      }
      if (--pending[next] == 0) ready.push(e.node);
    }
    if (!node->is_accumulator()) node->next_edges.clear();  // drop references: the graph frees as it runs
  }
}

}  // namespace demi::autograd
