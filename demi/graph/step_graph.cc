#include "demi/graph/step_graph.h"

#include <chrono>
#include <cstdio>

#include "demi/core/error.h"
#include "demi/ops/observer.h"

namespace demi::graph {

namespace {

// Where a replay left its plan: the layer being called (forward), else the step's other parts.
std::string where_now() {
  const char* layer = ops::current_layer();
  if (layer == nullptr) return ", outside any layer's forward (backward, the loss or the update)";
  return std::string(", in the forward of layer '") + (*layer ? layer : "(the network)") + "'";
}

// Runs the step; when it throws, ends the recording or replay it ran under (end_on_throw) first.
bool run_step(const std::function<bool()>& step, void (*end_on_throw)()) {
  try {
    return step();
  } catch (...) {
    end_on_throw();
    throw;
  }
}

bool same_signature(const std::optional<std::pair<Shape, DType>>& last, const Tensor* t) {
  return last.has_value() == (t != nullptr) && (t == nullptr || (last->first == t->shape() && last->second == t->dtype()));
}

}  // namespace

const std::string& SignatureKey::get(std::string_view kind, const Tensor* data, const Tensor* label,
                                     std::initializer_list<Flag> flags) {
  uint32_t mask = 0;
  int bit = 0;
  for (const Flag& f : flags) mask |= (f.on ? 1u : 0u) << bit++;
  if (!key_.empty() && mask == flags_ && kind == kind_ && same_signature(data_, data) && same_signature(label_, label))
    return key_;
  kind_ = kind;
  data_.reset();
  label_.reset();
  if (data) data_.emplace(data->shape(), data->dtype());
  if (label) label_.emplace(label->shape(), label->dtype());
  flags_ = mask;
  key_ = kind_;
  if (data) key_ += str_cat(", data ", data->shape(), " ", dtype_name(data->dtype()));
  if (label) key_ += str_cat(", label ", label->shape(), " ", dtype_name(label->dtype()));
  for (const Flag& f : flags)
    if (f.on) key_ += str_cat(", ", f.name);
  return key_;
}

StepGraphs::StepGraphs(std::string what, size_t max_plans) : what_(std::move(what)), max_plans_(max_plans) {
  DEMI_CHECK(max_plans_ >= 1, "StepGraphs: max_plans must be at least 1, got ", max_plans_);
  mem_set_replay_locator(&where_now);
}

StepGraphs::~StepGraphs() { mem_release_arena(); }

void StepGraphs::warn(const std::string& message) {
  if (warn_) {
    warn_(message);
  } else {
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
  }
}

void StepGraphs::clear() { entries_.clear(); }

std::vector<std::pair<std::string, PlanSummary>> StepGraphs::plans() const {
  std::vector<std::pair<std::string, PlanSummary>> out;
  for (const auto& [key, e] : entries_) {
    if (!e.planned) continue;
    out.emplace_back(key, e.summary);
    if (e.rewrite != nullptr) out.back().second.rewrites = e.rewrite->describe();  // as it stands now
  }
  return out;
}

bool StepGraphs::run_rewritten(Entry& e, const std::function<bool()>& step) {
  StepRewrite* r = e.rewrite.get();
  if (r == nullptr) return step();
  r->begin_applying();
  struct End {
    StepRewrite* r;
    ~End() { r->end_applying(); }
  } end{r};
  return step();
}

void StepGraphs::run(const std::string& key, const std::function<bool()>& step, const std::function<void()>& learn) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (entries_.size() >= max_plans_) {
      if (!warned_full_) {
        warned_full_ = true;
        warn(str_cat("graph mode: ", what_, "s with ", entries_.size() + 1, " different input signatures, more than ",
                     "the ", max_plans_, " plans kept; the ", what_, "s of ", key, " and of any other new signature ",
                     "run in PYNATIVE mode"));
      }
      ++stats_.eager_steps;
      (void)step();
      return;
    }
    it = entries_.emplace(key, Entry{}).first;
    if (make_rewrite_ && learn) {
      std::unique_ptr<StepRewrite> r = make_rewrite_();
      r->begin_learning();
      try {
        learn();
        r->end_learning(true);
        it->second.rewrite = std::move(r);
      } catch (const InternalError&) {
        r->end_learning(false);
        entries_.erase(it);
        throw;
      } catch (const Error& e) {  // (a network the learning run cannot run, on a part of the batch, say)
        r->end_learning(false);
        warn(str_cat("graph mode: the ", what_, "s of ", key, " run their layer calls as written: the run that ",
                     "learns which to fuse failed (", e.what(), ")"));
      } catch (...) {
        r->end_learning(false);
        entries_.erase(it);
        throw;
      }
    }
  }
  Entry& e = it->second;
  switch (e.phase) {
    case Phase::kWarmup:
    case Phase::kEager:
      ++stats_.eager_steps;
      (void)run_rewritten(e, step);
      if (e.phase == Phase::kWarmup) e.phase = Phase::kTrace;
      return;
    case Phase::kTrace: {
      if (!mem_record_begin()) {  // another thread is recording its step: trace the next call
        ++stats_.eager_steps;
        (void)run_rewritten(e, step);
        return;
      }
      const auto start = std::chrono::steady_clock::now();
      const bool typical = run_step([&] { return run_rewritten(e, step); }, [] { mem_record_end(); });
      std::vector<AllocationEvent> events = mem_record_end();
      if (!typical) {  // not a step to plan from: trace the next one
        ++stats_.eager_steps;
        return;
      }
      const auto t0 = std::chrono::steady_clock::now();
      e.plan = plan_arena(events, &e.summary);
      e.summary.plan_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      e.summary.trace_seconds = std::chrono::duration<double>(t0 - start).count();
      // The traced step's blocks, cached for reuse, are what the arena replaces: give them back.
      mem_empty_cache();
      e.planned = true;
      ++e.traces;
      e.diverged_in_a_row = 0;
      e.phase = Phase::kReplay;
      ++stats_.traced_steps;
      return;
    }
    case Phase::kReplay: {
      if (!mem_replay_begin(e.plan)) {
        // A block of the last step still alive (a step that left its plan may keep one until the next
        // step frees it), or another thread replaying its own plan: this step runs on the caching
        // allocator. Said once, when it lasts.
        if (++busy_in_a_row_ >= 3 && !warned_busy_) {
          warned_busy_ = true;
          warn(str_cat("graph mode: the arena is in use (", mem_arena_live_bytes(), " bytes of it held by a tensor ",
                       "made inside an earlier step, or another thread replaying its plan), so ", what_,
                       "s run on the caching allocator until it is free"));
        }
        ++stats_.eager_steps;
        (void)run_rewritten(e, step);
        return;
      }
      busy_in_a_row_ = 0;
      ++stats_.replayed_steps;
      const bool typical = run_step([&] { return run_rewritten(e, step); }, [] { mem_replay_end(); });
      const ReplayOutcome out = mem_replay_end();
      stats_.arena_allocations += out.served;
      if (!out.diverged && !out.incomplete) {
        e.diverged_in_a_row = 0;
        return;
      }
      ++stats_.diverged_steps;
      if (!typical || ++e.diverged_in_a_row < 2) return;
      if (e.traces <= kMaxRetraces) {
        e.phase = Phase::kTrace;
        return;
      }
      e.phase = Phase::kEager;
      const std::string why = out.diverged ? out.why : "the step made fewer allocations than its plan";
      e.summary.fallback = str_cat("PYNATIVE from step ", stats_.eager_steps + stats_.traced_steps +
                                   stats_.replayed_steps + 1, ": the steps allocate differently from step to step (",
                                   why, ") after ", e.traces, " traces");
      warn(str_cat("graph mode: the ", what_, "s of ", key, " allocate differently from step to step (", why,
                   "), after ", e.traces, " traces; they run in PYNATIVE mode from now on"));
      return;
    }
  }
}

}  // namespace demi::graph
