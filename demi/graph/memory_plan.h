// The static memory plan of graph mode: one step's allocations, recorded with their lifetimes
// (core/memory.h: mem_record_begin/end), placed into one arena so that no two blocks alive at the same
// time share a byte, and the arena as small as the placement finds.
//
// The placement is greedy with best fit, the algorithm of TFLite's arena planner, MindSpore's SOMAS and
// XLA's heap simulator (../shared/research/graph-mode.md): blocks taken one by one, each put into the
// smallest gap between the blocks already placed that live at the same time as it, or above them all;
// in three orders (decreasing size, allocation order, decreasing size x lifetime), the smallest arena
// kept; above the lower bound, a local search over the order (swaps kept when the arena grows no larger),
// within a budget of work, so that a plan depends on the recording only. Blocks that outlive the step (the optimizer state a first update creates, a loss the caller
// keeps) are not planned: the caching allocator serves them as in eager mode.
//
//   std::vector<AllocationEvent> events = ...;   // one recorded step
//   PlanSummary summary;
//   ArenaPlan plan = graph::plan_arena(events, &summary);
//   // summary.arena_bytes <= about 1.05 x summary.lower_bound on the reference models
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "demi/core/memory.h"

namespace demi::graph {

struct PlanSummary {
  int64_t allocations = 0;  // the step's allocations in the recording thread
  int64_t planned = 0;      // those freed within the step: they live in the arena
  int64_t upper_bound = 0;  // bytes of the planned blocks summed: every block its own memory
  int64_t lower_bound = 0;  // most bytes of planned blocks alive at one moment: no plan can use less
  int64_t arena_bytes = 0;  // the plan's arena
  int64_t outliving_bytes = 0;  // bytes of blocks that outlive the step (served as in eager mode)
  double plan_seconds = 0;      // the placement's time (StepGraphs fills it in)
  double trace_seconds = 0;     // the traced step's time, recording included (StepGraphs fills it in)
  std::string rewrites;         // what the step's rewrite changed (StepRewrite::describe; StepGraphs)
  std::string fallback;         // why the steps of this plan's key went back to PYNATIVE mode ("": they did not)
  // "arena 12.30 MiB = 1.010 x the lower bound 12.18 MiB (upper bound 80.10 MiB; 412 of 415 allocations
  // planned, 0.50 MiB outlive the step; traced in a step of 35.2 ms, planned in 0.4 ms)", then the
  // rewrites ("; fused 1 chain of layer calls: ...") when any, and "; PYNATIVE from step 12: <why>" when the
  // key's steps fell back
  std::string describe() const;
};

// The plan for a recorded step (64-byte-aligned offsets; must_be_free filled in for the replay's checks).
ArenaPlan plan_arena(const std::vector<AllocationEvent>& events, PlanSummary* summary = nullptr);

// Whether no two blocks of `plan` alive at the same time in `events` overlap, and each lies inside the
// arena: the invariant plan_arena keeps (for tests, and checked after every planning in debug builds).
bool plan_is_valid(const std::vector<AllocationEvent>& events, const ArenaPlan& plan, std::string* why = nullptr);

}  // namespace demi::graph
