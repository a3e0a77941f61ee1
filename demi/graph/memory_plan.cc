#include "demi/graph/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>

#include "demi/core/error.h"

namespace demi::graph {

namespace {

constexpr int64_t kSearchWork = 6'000'000;
constexpr int64_t kMaxSearchSteps = 4000;

int64_t aligned(size_t bytes) {
  return static_cast<int64_t>((bytes + kAlignment - 1) / kAlignment * kAlignment);
}

// Whether two recorded blocks are alive at the same moment (lifetimes [begin, end) on the clock).
bool live_together(const AllocationEvent& x, const AllocationEvent& y) { return x.begin < y.end && y.begin < x.end; }

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

// Places the blocks in `order`, each into the smallest gap between the placed blocks it lives together
// with (or above them all); writes their offsets and returns the arena's size.
int64_t place_best_fit(const std::vector<AllocationEvent>& events, const std::vector<size_t>& order,
                       std::vector<int64_t>& offsets) {
  int64_t arena = 0;
  std::vector<size_t> placed;  // by offset
  for (size_t b : order) {
    const int64_t size = aligned(events[b].bytes);
    int64_t best = -1;
    int64_t best_gap = std::numeric_limits<int64_t>::max();
    int64_t prev_end = 0;
    for (size_t p : placed) {
      if (!live_together(events[p], events[b])) continue;
      const int64_t gap = offsets[p] - prev_end;
      if (gap >= size && gap < best_gap) {
        best = prev_end;
        best_gap = gap;
      }
      prev_end = std::max(prev_end, offsets[p] + aligned(events[p].bytes));
    }
    if (best < 0) best = prev_end;
    offsets[b] = best;
    arena = std::max(arena, best + size);
    auto at = std::lower_bound(placed.begin(), placed.end(), b,
                               [&](size_t x, size_t y) { return offsets[x] < offsets[y]; });
    placed.insert(at, b);
  }
  return arena;
}

}  // namespace

std::string PlanSummary::describe() const {
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.3f",
                lower_bound > 0 ? static_cast<double>(arena_bytes) / static_cast<double>(lower_bound) : 1.0);
  char ms[32], trace[48] = "";
  std::snprintf(ms, sizeof ms, "%.1f", plan_seconds * 1e3);
  if (trace_seconds > 0) std::snprintf(trace, sizeof trace, "traced in a step of %.1f ms, ", trace_seconds * 1e3);
  return str_cat("arena ", mib(arena_bytes), " = ", ratio, " x the lower bound ", mib(lower_bound), " (upper bound ",
                 mib(upper_bound), "; ", planned, " of ", allocations, " allocations planned, ",
                 mib(outliving_bytes), " outlive the step; ", trace, "planned in ", ms, " ms)",
                 rewrites.empty() ? "" : "; ", rewrites, fallback.empty() ? "" : "; ", fallback);
}

ArenaPlan plan_arena(const std::vector<AllocationEvent>& events, PlanSummary* summary) {
  const size_t n = events.size();
  ArenaPlan plan;
  plan.bytes.resize(n);
  plan.categories.resize(n);
  plan.offsets.assign(n, -1);
  plan.must_be_free.resize(n);
  std::vector<size_t> planned;
  PlanSummary s;
  s.allocations = static_cast<int64_t>(n);
  for (size_t i = 0; i < n; ++i) {
    const AllocationEvent& e = events[i];
    DEMI_CHECK(e.end < 0 || e.end > e.begin, "plan_arena: allocation ", i, " ends (", e.end, ") before it begins (",
               e.begin, ")");
    plan.bytes[i] = e.bytes;
    plan.categories[i] = e.category;
    if (e.end >= 0) {
      planned.push_back(i);
      s.upper_bound += aligned(e.bytes);
    } else {
      s.outliving_bytes += static_cast<int64_t>(e.bytes);
    }
  }
  s.planned = static_cast<int64_t>(planned.size());

  // The lower bound: the most bytes of planned blocks alive at one tick.
  std::vector<std::pair<int64_t, int64_t>> deltas;  // (tick, +bytes at a begin / -bytes at an end)
  deltas.reserve(2 * planned.size());
  for (size_t i : planned) {
    deltas.emplace_back(events[i].begin, aligned(events[i].bytes));
    deltas.emplace_back(events[i].end, -aligned(events[i].bytes));
  }
  std::sort(deltas.begin(), deltas.end());
  int64_t live = 0;
  for (const auto& [tick, d] : deltas) {
    live += d;
    s.lower_bound = std::max(s.lower_bound, live);
  }

  // Best fit in three orders, the smallest arena kept: by size (the largest first; the usual winner),
  // by allocation order, and by size x lifetime. No one order is best on every step (a greedy
  // placement is a heuristic: the exact problem is NP-hard); trying three costs little.
  auto by = [&](auto key) {
    std::vector<size_t> order = planned;  // allocation order; the earlier first among equal keys
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return key(x) > key(y); });
    return order;
  };
  std::vector<size_t> orders[] = {
      by([&](size_t b) { return aligned(events[b].bytes); }),
      planned,
      by([&](size_t b) { return static_cast<double>(aligned(events[b].bytes)) *
                                static_cast<double>(events[b].end - events[b].begin); }),
  };
  std::vector<int64_t> offsets(n, -1);
  int64_t best_arena = -1;
  std::vector<size_t> order;  // the best so far
  for (std::vector<size_t>& candidate : orders) {
    const int64_t arena = place_best_fit(events, candidate, offsets);
    if (best_arena < 0 || arena < best_arena) {
      best_arena = arena;
      plan.offsets = offsets;
      order = std::move(candidate);
    }
  }
  // Above the lower bound, a local search over the order: swap two blocks' places in it, keep the swap
  // when the arena grows no larger (so the search walks across equal arenas), until the lower bound or
  // the budget. Model A's O2-fp16 step (24 blocks) was 1.152 x the bound in all three orders and
  // reaches it in a few dozen swaps. The budget is work, not time (plans do not depend on the machine's
  // speed): about kSearchWork block pairs visited, at most kMaxSearchSteps swaps.
  const int64_t m = static_cast<int64_t>(order.size());
  const int64_t steps = m < 2 ? 0 : std::min(kMaxSearchSteps, kSearchWork / (m * m));
  std::mt19937_64 rng(m);  // the sequence is the standard's: the same plan on every platform
  int64_t current = best_arena;
  for (int64_t step = 0; step < steps && best_arena > s.lower_bound; ++step) {
    const size_t i = static_cast<size_t>(rng() % static_cast<uint64_t>(m));
    const size_t j = static_cast<size_t>(rng() % static_cast<uint64_t>(m));
    if (i == j) continue;
    std::swap(order[i], order[j]);
    const int64_t arena = place_best_fit(events, order, offsets);
    if (arena > current) {
      std::swap(order[i], order[j]);
      continue;
    }
    current = arena;
    if (arena < best_arena) {
      best_arena = arena;
      plan.offsets = offsets;
    }
  }
  plan.arena_bytes = best_arena;
  s.arena_bytes = plan.arena_bytes;

  // The replay's checks: each block lists the earlier blocks sharing its bytes (all dead before it, in
  // the recorded step) that no earlier block lists. A replay serves the blocks in order and stops serving
  // at the first one whose listed blocks are not all free, and a block freed stays free (each is served
  // once), so the first check of a block is the only one needed: each block is checked once per step, not
  // once per later block sharing its bytes (which made the checks grow with the square of a step's
  // blocks, and were a third of what a replay's allocation cost in step_overhead_bench).
  std::vector<char> listed(n, 0);
  for (size_t x = 0; x < planned.size(); ++x) {
    const size_t i = planned[x];
    const int64_t lo = plan.offsets[i], hi = lo + aligned(events[i].bytes);
    for (size_t y = 0; y < x; ++y) {
      const size_t j = planned[y];
      const int64_t jlo = plan.offsets[j], jhi = jlo + aligned(events[j].bytes);
      if (jlo < hi && lo < jhi && !listed[j]) {
        plan.must_be_free[i].push_back(static_cast<int32_t>(j));
        listed[j] = 1;
      }
    }
  }

  if (summary) *summary = s;
  return plan;
}

bool plan_is_valid(const std::vector<AllocationEvent>& events, const ArenaPlan& plan, std::string* why) {
  auto fail = [&](std::string m) {
    if (why) *why = std::move(m);
    return false;
  };
  if (plan.offsets.size() != events.size()) return fail("the plan has another number of allocations");
  for (size_t i = 0; i < events.size(); ++i) {
    const int64_t oi = plan.offsets[i];
    if (oi < 0) {
      if (events[i].end >= 0) return fail(str_cat("allocation ", i, " ends within the step but is not planned"));
      continue;
    }
    if (oi % static_cast<int64_t>(kAlignment) != 0) return fail(str_cat("allocation ", i, " is not aligned"));
    if (oi + static_cast<int64_t>(events[i].bytes) > plan.arena_bytes) {
      return fail(str_cat("allocation ", i, " ends past the arena"));
    }
    for (size_t j = 0; j < i; ++j) {
      const int64_t oj = plan.offsets[j];
      if (oj < 0 || !live_together(events[i], events[j])) continue;
      if (oj < oi + static_cast<int64_t>(events[i].bytes) && oi < oj + static_cast<int64_t>(events[j].bytes)) {
        return fail(str_cat("allocations ", j, " and ", i, " are alive together and share bytes"));
      }
    }
  }
  return true;
}

}  // namespace demi::graph
