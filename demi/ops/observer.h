// The observer seam: everything that wants to see op calls — the op trace, the profiler, the numerics
// report, overflow attribution, the dtype trace — sees them through one interface, so that a new AMP
// diagnostic is one observer, not a change to dispatch, autograd and every op.
//
//   class CountConvs : public ops::OpObserver {
//     void on_op(const ops::OpEvent& e) override { if (e.op == ops::Op::kConv2d && !e.backward) ++n; }
//    public:
//     int n = 0;
//   };
//   CountConvs counter;
//   { ops::OpObserverScope observe(&counter); net.call(x); }      // this thread, for a scope
//
// Every forward call (Dispatch::finish) and every backward rule (the autograd engine) notifies the
// observers of its thread, then the process-wide ones, in the order they were installed. With none
// installed, a call costs one thread-local and one atomic load. Observers must not run ops of their own
// that they would then observe (OpObserverScope suspends the thread's observers while one runs).
//
// Each event names the layer it ran in: the innermost Cell being called (LayerScope, set by nn::Cell),
// as its dotted path ("features.0", "" for the root; nullptr outside any cell). Backward events carry the
// layer their forward call ran in.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "demi/core/tensor.h"
#include "demi/ops/op.h"

namespace demi::ops {

struct OpEvent {
  Op op;
  bool backward = false;
  DType compute_dtype = DType::kF32;  // forward: the dtype the policy chose; backward: the gradients'
  const char* layer = nullptr;        // innermost cell's path, nullptr outside any cell
  // Forward: the caller's inputs, before any cast (nullptr for an absent optional input).
  // Backward: the gradients of the forward outputs (undefined where an output got none).
  std::span<const Tensor* const> inputs;
  // Forward: the outputs (before an O1 cast back to FP32). Backward: the gradients of the inputs.
  std::span<const Tensor> outputs;
  double seconds = 0;  // the call's time when an installed observer wants timing, else 0
  int64_t flops = -1;  // forward: the op's FLOPs when it said (Dispatch::set_flops), else -1
};

class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void on_op(const OpEvent& event) = 0;
  // Whether events must carry their time (a profiler): the calls are then timed.
  virtual bool wants_timing() const { return false; }
};

// Installs `observer` in this thread for a scope; scopes nest, and every installed one is notified.
class OpObserverScope {
 public:
  explicit OpObserverScope(OpObserver* observer);
  ~OpObserverScope();
  OpObserverScope(const OpObserverScope&) = delete;
  OpObserverScope& operator=(const OpObserverScope&) = delete;

 private:
  OpObserver* observer_;
};

// Hides this thread's observers for a scope (the process-wide ones still see everything): a diagnostic
// re-run of a step (overflow attribution, the dtype trace) installs only its own observer inside one,
// so that a trace the user holds around the step records the step once.
class ObserverIsolationScope {
 public:
  ObserverIsolationScope();
  ~ObserverIsolationScope();
  ObserverIsolationScope(const ObserverIsolationScope&) = delete;
  ObserverIsolationScope& operator=(const ObserverIsolationScope&) = delete;

 private:
  std::vector<OpObserver*> saved_;
};

// Process-wide observers (every thread), until removed. The observer must be thread-safe.
void add_global_observer(OpObserver* observer);
void remove_global_observer(OpObserver* observer);

// Whether any observer would see a call in this thread now, and whether one wants timing.
bool observing();
bool timing_wanted();

// Notifies the observers (Dispatch and the autograd engine call this; nothing else needs to).
void notify(const OpEvent& event);

// The innermost layer being called in this thread (nn::Cell sets it): an interned path, alive for the
// whole process, so events and graph nodes can keep the pointer.
class LayerScope {
 public:
  explicit LayerScope(const char* layer);
  ~LayerScope();
  LayerScope(const LayerScope&) = delete;
  LayerScope& operator=(const LayerScope&) = delete;

 private:
  const char* saved_;
};
const char* current_layer();
// The one stable copy of `path` (the same pointer for equal paths).
const char* intern_layer_path(std::string_view path);
// Whether `layer` is `path` or below it ("features.0" is within "features"; everything is within the
// root, "").
bool layer_within(std::string_view layer, std::string_view path);

// Whether layers may run as one fused op (Conv2d + ReLU + MaxPool2d, ReLU + MaxPool2d, Dense + ReLU), and
// whether an op may read its data batch rounded to its compute dtype with no Cast op (the convolutions' and
// Dense's x_round). On by default; a diagnostic that must see each layer's own output (the numerics report)
// turns it off for a scope.
class FusionScope {
 public:
  explicit FusionScope(bool enabled);
  ~FusionScope();
  FusionScope(const FusionScope&) = delete;
  FusionScope& operator=(const FusionScope&) = delete;

 private:
  bool saved_;
};
bool fusion_enabled();


}  // namespace demi::ops
