// Graph mode's step runner: the steps of one kind (the train steps of a TrainStep, the eval steps of a
// Model) run under static memory plans, one per input signature (the batch's shapes and dtypes and what
// else changes the program: the caller builds the key).
//
//   graph::StepGraphs graphs("train step");
//   graphs.set_rewrites(amp::make_call_fusions);   // optional: the eager fusions on any network
//   graphs.run(key, [&] { result = eager_step(data, label); return !result.overflow; },
//              [&] { forward_leaving_no_trace(data); });   // what the rewrite learns from
//
// For each key, the first step runs eagerly (it makes the kernel choices for its shapes and whatever state
// a first step creates); the second is recorded, every allocation the stepping thread makes with its
// lifetime, and planned into one arena (a step that says it was atypical is not planned from: the next one
// is traced instead) (memory_plan.h); every later step is replayed: the same code runs the same kernels,
// so results are bit for bit those of the first step's ops (PYNATIVE mode's where no rewrite), and every
// allocation it makes is served from the arena at its planned offset, checked against the plan as it
// goes (core/memory.h: a block still alive is never handed out twice). A step whose allocations leave
// the plan (an overflow step that skips its update, a tensor held longer than in the traced step)
// finishes on the caching allocator; two such steps in a row trace the key again, and a key traced
// more than kMaxRetraces times runs eagerly from then on, with one warning naming why. More than
// `max_plans` keys: the new ones run eagerly, with one warning.
//
// What graph mode changes in the step itself: the train step (amp/train_step.h) places each parameter's
// update in backward where nothing waits on every gradient, and a caller's StepRewrite (nn::CallFusions)
// runs the eager fusions on any network's calls. What it does not do yet (issue 14): replay without
// re-running the host code (autograd nodes and the cast cache are still built per step), passes on a
// recorded op list (cast elimination). DESIGN.md, "Graph mode", has the plan.
#pragma once

#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "demi/core/memory.h"
#include "demi/core/tensor.h"
#include "demi/graph/memory_plan.h"

namespace demi::graph {

// The key of a call's plan: its kind, its batch's shapes and dtypes, and the settings that change the
// program, as "update, data (32, 1, 28, 28) float32, label (32) int32, clipping". It is formatted only
// when the signature differs from the last call's: formatting shapes costs microseconds, a step's host
// work on a small network tens of them. Keep one per kind of call that alternates with others.
class SignatureKey {
 public:
  struct Flag {
    bool on;
    const char* name;  // ", <name>" in the key when on
  };
  const std::string& get(std::string_view kind, const Tensor* data, const Tensor* label,
                         std::initializer_list<Flag> flags = {});

 private:
  std::string kind_;
  std::optional<std::pair<Shape, DType>> data_, label_;
  uint32_t flags_ = 0;
  std::string key_;
};

// A rewrite of a kind of step's program (nn::CallFusions: the eager fusions applied to any network's
// calls): learnt, before the first step of a key, from a run of the step's forward that changes nothing
// (the caller's `learn` function), and applied to every step of that key, the first (eager) one included,
// so the plan is the rewritten step's. The caller brings one per key (StepGraphs::set_rewrites).
class StepRewrite {
 public:
  virtual ~StepRewrite() = default;
  // Scopes around the learning run and around each step (both thread-local). end_learning(false): the
  // learning run threw, and taught nothing.
  virtual void begin_learning() = 0;
  virtual void end_learning(bool learnt) = 0;
  virtual void begin_applying() = 0;
  virtual void end_applying() = 0;
  // What it rewrote, for the plan's summary ("fused 2 chains of layer calls: ..."); empty when nothing.
  virtual std::string describe() const = 0;
};

class StepGraphs {
 public:
  static constexpr int kMaxRetraces = 3;
  using WarningSink = std::function<void(const std::string&)>;

  struct Stats {
    int64_t eager_steps = 0;     // steps run without a plan (first steps of a key, keys given up, arena busy)
    int64_t traced_steps = 0;
    int64_t replayed_steps = 0;  // steps that began under a plan
    int64_t diverged_steps = 0;  // replayed steps whose allocations left their plan
    int64_t arena_allocations = 0;  // allocations served from the arena
    // The counts since `start` (an earlier copy of these counters).
    Stats since(const Stats& start) const {
      return {eager_steps - start.eager_steps, traced_steps - start.traced_steps,
              replayed_steps - start.replayed_steps, diverged_steps - start.diverged_steps,
              arena_allocations - start.arena_allocations};
    }
  };

  // `what` names the steps in warnings ("train step").
  explicit StepGraphs(std::string what, size_t max_plans = 8);
  ~StepGraphs();  // returns the arena to the system when nothing of it is alive (mem_release_arena)
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Runs `step` under the plan of `key` (see the top of this file). `step` returns whether it was a
  // typical step, one to plan from: a train step whose update was applied. An atypical one (an overflow
  // step that skipped its update and re-ran its batch for attribution) is never traced, and leaving the
  // plan does not count against it.
  // `learn` (optional): a run of the step's forward that leaves no trace (no gradient, running statistic or
  // generator changed), which the key's rewrite learns from before its first step (set_rewrites); without
  // it, or where it throws a demi::Error (said in a warning), the key's steps run as written.
  void run(const std::string& key, const std::function<bool()>& step, const std::function<void()>& learn = {});
  // Forgets every plan: the program has changed (a layer promoted to FP32, a setting changed).
  void clear();

  const Stats& stats() const { return stats_; }
  // The plans made so far, by key (the last trace of each).
  std::vector<std::pair<std::string, PlanSummary>> plans() const;
  // Where warnings go (default: standard error).
  void set_warning_sink(WarningSink sink) { warn_ = std::move(sink); }
  // Makes the rewrite of each new key (null: none). Keys seen before keep theirs until clear().
  void set_rewrites(std::function<std::unique_ptr<StepRewrite>()> make) { make_rewrite_ = std::move(make); }

 private:
  enum class Phase { kWarmup, kTrace, kReplay, kEager };
  struct Entry {
    Phase phase = Phase::kWarmup;
    ArenaPlan plan;
    PlanSummary summary;
    bool planned = false;
    int traces = 0;
    int diverged_in_a_row = 0;
    std::unique_ptr<StepRewrite> rewrite;  // learnt before the first step, applied to every step
  };

  // Runs the step of `e` with its rewrite applied.
  static bool run_rewritten(Entry& e, const std::function<bool()>& step);

  void warn(const std::string& message);

  std::string what_;
  size_t max_plans_;
  std::map<std::string, Entry> entries_;
  bool warned_full_ = false;
  bool warned_busy_ = false;
  int busy_in_a_row_ = 0;
  Stats stats_;
  WarningSink warn_;
  std::function<std::unique_ptr<StepRewrite>()> make_rewrite_;
};

}  // namespace demi::graph
