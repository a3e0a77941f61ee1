#include "demi/nn/call_fusion.h"

#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "demi/autograd/autograd.h"
#include "demi/core/context.h"
#include "demi/nn/layers.h"
#include "demi/ops/observer.h"

namespace demi::nn {

namespace {

enum class Kind { kConvReluPool, kDenseRelu, kReluPool };

// What a fused op depends on besides its cells and input, as in force at a call; and grad mode, which a
// pending value is computed in (the learning run has none: it is not compared).
struct Context {
  const ops::PrecisionPolicy* policy = nullptr;
  std::optional<DType> pin;
  bool fusion = false;
  const char* layer = nullptr;  // interned: compared by address
  bool grad = false;

  static Context now() {
    return {ops::current_precision_policy(), ops::current_dtype_pin(), ops::fusion_enabled(), ops::current_layer(),
            autograd::grad_enabled()};
  }
  bool same_program(const Context& o) const {
    return policy == o.policy && pin == o.pin && fusion == o.fusion && layer == o.layer;
  }
};

// Puts a context back in force (a pending value computed elsewhere than where it was made).
class ContextScope {
 public:
  explicit ContextScope(const Context& c)
      : policy_(c.policy), pin_(c.pin), fusion_(c.fusion), layer_(c.layer) {
    if (c.grad && !autograd::grad_enabled()) enable_.emplace();
    if (!c.grad && autograd::grad_enabled()) disable_.emplace();
  }

 private:
  ops::PrecisionScope policy_;
  ops::DTypePinScope pin_;
  ops::FusionScope fusion_;
  ops::LayerScope layer_;
  std::optional<autograd::EnableGradGuard> enable_;
  std::optional<autograd::NoGradGuard> disable_;
};

// A layer a chain may hold: of a fusable type, and not inside a recomputed cell (whose calls run again in
// backward, where the step's calls would be matched out of order).
bool is_fusable(const Cell& c) {
  if (dynamic_cast<const Conv2d*>(&c) == nullptr && dynamic_cast<const Dense*>(&c) == nullptr &&
      dynamic_cast<const ReLU*>(&c) == nullptr && dynamic_cast<const MaxPool2d*>(&c) == nullptr)
    return false;
  for (const Cell* p = &c; p != nullptr; p = p->parent())
    if (p->recomputed()) return false;
  return true;
}

template <typename T>
bool is_a(const Cell* c) {
  return dynamic_cast<const T*>(c) != nullptr;
}

}  // namespace

struct CallFusions::State {
  // One call of a fusable layer in the learning run. Its output is held as a weak reference only, so that
  // the address `out` names is not reused within the run while its storage is freed as in eager mode.
  struct Call {
    Cell* cell;
    const void* in;
    const void* out;
    std::weak_ptr<TensorImpl> out_held;
    Shape in_shape, out_shape;
    DType in_dtype, out_dtype;
    Context context;
    uint64_t made_at;  // the op events seen before `out` existed (reads before it were of other tensors)
  };
  // The learning run's op calls, each input they read with the layer they ran in: a layer output that an
  // op outside the next layer of its chain reads (a second consumer, whose gradient eager mode would add to
  // the chain's before the first layer's backward) is not fused.
  struct Read {
    const void* tensor;
    const char* layer;
    uint64_t at;
  };
  class ReadRecorder final : public ops::OpObserver {
   public:
    void on_op(const ops::OpEvent& e) override {
      if (e.backward) return;
      ++events;
      for (const Tensor* t : e.inputs)
        if (t != nullptr && t->defined()) reads.push_back({t->impl_ptr().get(), e.layer, events});
    }
    std::vector<Read> reads;
    uint64_t events = 0;
  };
  // Shapes are the learning run's, whose first dimension (the learning batch's) each layer of a chain keeps
  // from its input: a step's pending values take it from the step's input.
  struct Link {
    Cell* cell;
    Shape out_shape;
    DType out_dtype;
  };
  struct Chain {
    Kind kind;
    size_t first;  // the place of its first call among the step's fusable calls
    Shape in_shape;
    DType in_dtype;
    Context context;
    std::vector<Link> links;
    bool given_up = false;  // a pending value of it was read
    int64_t fused = 0;      // times it ran as its fused op
    std::string describe() const;
  };
  // The chain being applied in this step: its next link, the first call's input, the last value given.
  struct Open {
    Chain* chain = nullptr;
    size_t next = 0;
    Tensor input;
    Tensor last;
  };
  // Whether `x` has the shape the chain was learnt with, its first dimension aside.
  static bool same_but_first(const Shape& learnt, const Shape& x) {
    if (learnt.rank() != x.rank() || x.rank() == 0) return false;
    for (int d = 1; d < x.rank(); ++d)
      if (learnt[d] != x[d]) return false;
    return true;
  }

  enum class Mode { kOff, kLearning, kApplying };
  std::weak_ptr<State> self;
  Mode mode = Mode::kOff;
  std::vector<Call> calls;
  ReadRecorder recorder;
  // While learning: the thread's own observers hidden (a trace the user holds sees the step, not the
  // learning run), the recorder installed.
  std::optional<ops::ObserverIsolationScope> isolated;
  std::optional<ops::OpObserverScope> observing;
  std::vector<Chain> chains;
  uint64_t generation = 0;  // bumped at each learning: a pending value of older chains names none
  uint64_t structure_version = 0;
  // The applying step's place: fusable calls so far, the first chain not yet passed, the open chain.
  size_t ordinal = 0;
  size_t next_chain = 0;
  // No chain, a cell's structure changed since learning, or graph_fusion off: nothing is applied.
  bool inert = false;
  Open open;
  std::vector<std::weak_ptr<TensorImpl>> pending_made;  // this step's; computed at its end if still held

  void find_chains();
  // Matches the chains from the step's first call again (a step's start, or a forward run again).
  void restart() {
    ordinal = 0;
    next_chain = 0;
    open = {};
  }
  Tensor learn(Cell& cell, const Tensor& x);
  Tensor apply(Cell& cell, const Tensor& x);
  Tensor make_pending(size_t chain, size_t link, const Tensor& input, const Tensor& x, const Context& context);
  static bool applies(const Chain& chain, const Tensor& x);
  static Tensor run_fused(const Chain& chain, const Tensor& x);
};

namespace {

thread_local CallFusions::State* t_active = nullptr;

// A layer's output not made yet: computed, when read, by the call as written, in the call's context.
class PendingOutput final : public PendingValue {
 public:
  PendingOutput(std::weak_ptr<CallFusions::State> state, uint64_t generation, size_t chain, Cell* cell,
                Tensor input, const Context& context)
      : state_(std::move(state)), generation_(generation), chain_(chain), cell_(cell), input_(std::move(input)),
        context_(context) {}

  Tensor compute() override {
    // Read: the chain runs as written from the next step on.
    if (auto s = state_.lock(); s != nullptr && s->generation == generation_) s->chains[chain_].given_up = true;
    CallFusions::State* active = t_active;
    t_active = nullptr;  // the call as written, not rewritten again
    struct Restore {
      CallFusions::State* s;
      ~Restore() { t_active = s; }
    } restore{active};
    ContextScope in_context(context_);
    return cell_->call_as_written(input_);
  }

 private:
  std::weak_ptr<CallFusions::State> state_;
  uint64_t generation_;
  size_t chain_;
  Cell* cell_;
  Tensor input_;
  Context context_;
};

}  // namespace

std::string CallFusions::State::Chain::describe() const {
  std::string paths, types;
  for (const Link& l : links) {
    const std::string p = l.cell->path();
    paths += str_cat(paths.empty() ? "" : " -> ", p.empty() ? l.cell->type_name() : p);
    types += str_cat(types.empty() ? "" : " -> ", l.cell->type_name());
  }
  return str_cat(paths, " (", types, ")");
}

Tensor CallFusions::State::learn(Cell& cell, const Tensor& x) {
  // (Calls made with fusion off, as overflow attribution's re-run of the batch, are never rewritten.)
  if (!is_fusable(cell) || !ops::fusion_enabled()) return cell.call_as_written(x);
  const Context context = Context::now();
  const void* in = x.impl_ptr().get();
  Tensor out = cell.call_as_written(x);
  if (out.defined())
    calls.push_back({&cell, in, out.impl_ptr().get(), out.impl_ptr(), x.shape(), out.shape(), x.dtype(), out.dtype(),
                     context, recorder.events});
  return out;
}

void CallFusions::State::find_chains() {
  chains.clear();
  ++generation;
  // Call `to` takes call `from`'s output, in the same context, and no op outside `to`'s layer reads it, nor
  // any other of the recorded calls.
  auto feeds = [&](size_t from, size_t to) {
    if (to >= calls.size() || calls[to].in != calls[from].out || !calls[to].context.same_program(calls[from].context))
      return false;
    const char* consumer = calls[to].cell->layer_id();
    for (const Read& r : recorder.reads)
      if (r.tensor == calls[from].out && r.at > calls[from].made_at && r.layer != consumer) return false;
    for (size_t k = from + 1; k < calls.size(); ++k)
      if (k != to && calls[k].in == calls[from].out) return false;
    return true;
  };
  auto at = [&](size_t i) { return i < calls.size() ? calls[i].cell : nullptr; };
  for (size_t i = 0; i < calls.size();) {
    Kind kind;
    size_t length;
    if (is_a<Conv2d>(at(i)) && is_a<ReLU>(at(i + 1)) && is_a<MaxPool2d>(at(i + 2)) && feeds(i, i + 1) &&
        feeds(i + 1, i + 2)) {
      kind = Kind::kConvReluPool, length = 3;
    } else if (is_a<Dense>(at(i)) && is_a<ReLU>(at(i + 1)) && feeds(i, i + 1)) {
      kind = Kind::kDenseRelu, length = 2;
    } else if (is_a<ReLU>(at(i)) && is_a<MaxPool2d>(at(i + 1)) && feeds(i, i + 1)) {
      kind = Kind::kReluPool, length = 2;
    } else {
      ++i;
      continue;
    }
    Chain chain{kind, i, calls[i].in_shape, calls[i].in_dtype, calls[i].context, {}};
    bool keeps_first = calls[i].in_shape.rank() > 0;
    for (size_t k = i; k < i + length; ++k) {
      chain.links.push_back({calls[k].cell, calls[k].out_shape, calls[k].out_dtype});
      keeps_first = keeps_first && calls[k].out_shape.rank() > 0 && calls[k].out_shape[0] == calls[i].in_shape[0];
    }
    if (keeps_first) chains.push_back(std::move(chain));
    i += length;
  }
  calls.clear();
}

bool CallFusions::State::applies(const Chain& chain, const Tensor& x) {
  if (!same_but_first(chain.in_shape, x.shape()) || x.dtype() != chain.in_dtype) return false;
  switch (chain.kind) {
    case Kind::kConvReluPool:
      return fusion::conv_relu_max_pool_applies(static_cast<const ReLU&>(*chain.links[1].cell),
                                                static_cast<const MaxPool2d&>(*chain.links[2].cell), x);
    case Kind::kDenseRelu:
      return fusion::dense_relu_applies(static_cast<const ReLU&>(*chain.links[1].cell));
    case Kind::kReluPool:
      return fusion::relu_max_pool_applies(static_cast<const ReLU&>(*chain.links[0].cell),
                                           static_cast<const MaxPool2d&>(*chain.links[1].cell), x);
  }
  return false;
}

Tensor CallFusions::State::run_fused(const Chain& chain, const Tensor& x) {
  switch (chain.kind) {
    case Kind::kConvReluPool:
      return fusion::conv_relu_max_pool(static_cast<Conv2d&>(*chain.links[0].cell),
                                        static_cast<const MaxPool2d&>(*chain.links[2].cell), x);
    case Kind::kDenseRelu:
      return fusion::dense_relu(static_cast<Dense&>(*chain.links[0].cell), x);
    case Kind::kReluPool:
      return fusion::relu_max_pool(static_cast<ReLU&>(*chain.links[0].cell),
                                   static_cast<const MaxPool2d&>(*chain.links[1].cell), x);
  }
  DEMI_ASSERT(false, "a chain of an unknown kind");
  return {};
}

// The pending output of link `link` of chain `chain`, called on `x`; `input` is the chain's (its first
// dimension is every link's).
Tensor CallFusions::State::make_pending(size_t chain, size_t link, const Tensor& input, const Tensor& x,
                                        const Context& context) {
  const Link& l = chains[chain].links[link];
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = l.out_shape;
  impl->shape[0] = input.dim(0);
  impl->dtype = l.out_dtype;
  impl->pending = std::make_shared<PendingOutput>(self, generation, chain, l.cell, x, context);
  pending_made.push_back(impl);
  return Tensor(std::move(impl));
}

Tensor CallFusions::State::apply(Cell& cell, const Tensor& x) {
  if (!is_fusable(cell)) return cell.call_as_written(x);
  const size_t n = ordinal++;
  // The next link of the open chain: called on the value its previous link gave, still pending.
  if (open.chain != nullptr) {
    Chain& c = *open.chain;
    const Context now = Context::now();
    const bool continues = n == c.first + open.next && &cell == c.links[open.next].cell && x.is_same(open.last) &&
                           x.is_pending() && now.same_program(c.context);
    if (continues) {
      if (open.next + 1 < c.links.size()) {
        const auto index = static_cast<size_t>(open.chain - chains.data());
        open.last = make_pending(index, open.next, open.input, open.last, now);
        ++open.next;
        return open.last;
      }
      Tensor input = std::move(open.input);
      open = {};
      ++c.fused;
      return run_fused(c, input);
    }
    open = {};  // left: its pending values are computed if they are read
  }
  while (next_chain < chains.size() && chains[next_chain].first < n) ++next_chain;
  if (next_chain < chains.size() && chains[next_chain].first == n) {
    Chain& c = chains[next_chain];
    const Context now = Context::now();
    if (!c.given_up && &cell == c.links[0].cell && now.same_program(c.context) && applies(c, x)) {
      open = {&c, 1, x, make_pending(next_chain, 0, x, x, now)};
      return open.last;
    }
  }
  return cell.call_as_written(x);
}

// ---- CallFusions ----

CallFusions::CallFusions() : state_(std::make_shared<State>()) { state_->self = state_; }

CallFusions::~CallFusions() {
  if (t_active == state_.get()) t_active = nullptr;
}

void CallFusions::begin_learning() {
  DEMI_ASSERT(t_active == nullptr, "a CallFusions scope is already open in this thread");
  state_->calls.clear();
  state_->recorder.reads.clear();
  state_->recorder.events = 0;
  state_->mode = State::Mode::kLearning;
  state_->isolated.emplace();
  state_->observing.emplace(&state_->recorder);
  t_active = state_.get();
}

void CallFusions::end_learning(bool learnt) {
  t_active = nullptr;
  state_->observing.reset();
  state_->isolated.reset();
  state_->mode = State::Mode::kOff;
  if (learnt) {
    state_->find_chains();
    state_->structure_version = Cell::structure_version();
  }
  state_->calls.clear();
  state_->recorder.reads.clear();
}

void CallFusions::begin_applying() {
  DEMI_ASSERT(t_active == nullptr, "a CallFusions scope is already open in this thread");
  State& s = *state_;
  s.mode = State::Mode::kApplying;
  s.restart();
  s.pending_made.clear();
  s.inert = s.chains.empty() || s.structure_version != Cell::structure_version() || !get_context().graph_fusion;
  if (!s.inert) t_active = state_.get();  // nothing to apply: the calls take their plain path
}

void CallFusions::end_applying() {
  State& s = *state_;
  s.open = {};
  t_active = nullptr;
  s.mode = State::Mode::kOff;
  // A pending value still held after the step (kept by the caller): computed now, while its cells surely live.
  for (std::weak_ptr<TensorImpl>& w : s.pending_made) {
    if (std::shared_ptr<TensorImpl> impl = w.lock(); impl != nullptr && impl->pending != nullptr) {
      try {
        (void)Tensor(impl).impl();
      } catch (...) {
        // It computes again when read, and throws there, where the caller can see it.
      }
    }
  }
  s.pending_made.clear();
}

std::string CallFusions::describe() const {
  const State& s = *state_;
  std::string fused, given_up;
  int64_t n_fused = 0, n_given_up = 0;
  for (const State::Chain& c : s.chains) {
    if (c.fused == 0 && !c.given_up) continue;  // learnt, never applied (a pinned ReLU, fusion off, ...)
    std::string& out = c.given_up ? given_up : fused;
    out += str_cat(out.empty() ? "" : ", ", c.describe());
    ++(c.given_up ? n_given_up : n_fused);
  }
  std::string d;
  if (n_fused > 0) d = str_cat("fused ", n_fused, n_fused == 1 ? " chain" : " chains", " of layer calls: ", fused);
  if (n_given_up > 0)
    d += str_cat(d.empty() ? "" : "; ", "ran ", n_given_up, n_given_up == 1 ? " chain" : " chains",
                 " as written (an output read elsewhere): ", given_up);
  return d;
}

Tensor CallFusions::learning_batch(const Tensor& batch) {
  if (batch.rank() == 0 || batch.dim(0) <= kLearningSamples) return batch;
  Shape shape = batch.shape();
  shape[0] = kLearningSamples;
  Tensor head = empty(shape, batch.dtype());
  std::memcpy(head.raw_data(), batch.raw_data(), head.nbytes());
  return head;
}

void CallFusions::begin_forward() {
  State* s = t_active;
  if (s != nullptr && s->mode == State::Mode::kApplying) s->restart();
}

bool CallFusions::could_fuse(Cell& net) {
  if (!get_context().graph_fusion) return false;
  for (const auto& [path, cell] : net.cells_and_names())
    if (is_a<ReLU>(cell) || is_a<MaxPool2d>(cell)) return true;
  return false;
}

namespace internal {

bool call_fusions_active() { return t_active != nullptr; }

Tensor call_through_fusions(Cell& cell, const Tensor& x) {
  CallFusions::State* s = t_active;
  return s->mode == CallFusions::State::Mode::kLearning ? s->learn(cell, x) : s->apply(cell, x);
}

}  // namespace internal

}  // namespace demi::nn
