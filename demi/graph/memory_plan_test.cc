// The static memory plan: greedy by size with best fit over recorded lifetimes. Every plan is checked
// for the invariant (no two blocks alive together share a byte), against the bounds, and on cases whose
// optimum is known.
#include "demi/graph/memory_plan.h"

#include <gtest/gtest.h>

#include <random>

#include "demi/core/error.h"

namespace demi::graph {
namespace {

AllocationEvent ev(size_t bytes, int64_t begin, int64_t end) {
  return {bytes, MemCategory::kActivation, begin, end};
}

TEST(MemoryPlan, AChainOfTemporariesTakesTwoBlocks) {
  // x0 -> x1 -> x2 -> x3: each is alive with the next only, as in a chain of ops.
  std::vector<AllocationEvent> events = {ev(4096, 0, 2), ev(4096, 1, 4), ev(4096, 3, 6), ev(4096, 5, 7)};
  PlanSummary s;
  ArenaPlan plan = plan_arena(events, &s);
  EXPECT_EQ(s.arena_bytes, 8192);
  EXPECT_EQ(s.lower_bound, 8192);
  EXPECT_EQ(s.upper_bound, 4 * 4096);
  EXPECT_EQ(plan.offsets[0], plan.offsets[2]);
  EXPECT_EQ(plan.offsets[1], plan.offsets[3]);
  EXPECT_NE(plan.offsets[0], plan.offsets[1]);
  // The replay's checks: x2 reuses x0's bytes, x3 x1's.
  EXPECT_TRUE(plan.must_be_free[0].empty());
  EXPECT_TRUE(plan.must_be_free[1].empty());
  EXPECT_EQ(plan.must_be_free[2], std::vector<int32_t>{0});
  EXPECT_EQ(plan.must_be_free[3], std::vector<int32_t>{1});
  std::string why;
  EXPECT_TRUE(plan_is_valid(events, plan, &why)) << why;
  EXPECT_NE(s.describe().find("1.000 x the lower bound"), std::string::npos) << s.describe();
}

TEST(MemoryPlan, BlocksThatOutliveTheStepAreNotPlanned) {
  std::vector<AllocationEvent> events = {ev(100, 0, 1), ev(200, 2, -1), ev(100, 3, 4)};
  PlanSummary s;
  ArenaPlan plan = plan_arena(events, &s);
  EXPECT_EQ(plan.offsets[1], -1);
  EXPECT_EQ(s.planned, 2);
  EXPECT_EQ(s.allocations, 3);
  EXPECT_EQ(s.outliving_bytes, 200);
  EXPECT_EQ(s.arena_bytes, 128);  // sizes round up to 64 bytes; the two planned ones share their bytes
  EXPECT_EQ(plan.bytes, (std::vector<size_t>{100, 200, 100}));
  EXPECT_TRUE(plan_is_valid(events, plan));
}

TEST(MemoryPlan, ASmallBlockGoesIntoTheBestFittingGap) {
  // Two long-lived blocks with a 64-byte and a 4096-byte gap between them (made by blocks that died);
  // a 64-byte block fits the smaller gap.
  std::vector<AllocationEvent> events = {ev(8192, 0, 10), ev(4096, 1, 2), ev(8192, 0, 10), ev(64, 3, 4)};
  ArenaPlan plan = plan_arena(events);
  EXPECT_TRUE(plan_is_valid(events, plan));
  EXPECT_LE(plan.arena_bytes, 8192 * 2 + 4096);
}

TEST(MemoryPlan, AnotherOrderWinsWhereGreedyBySizeDoesNot) {
  // Found by search: by size the 4-block goes first and the two 3-blocks cannot share a side, arena 9
  // units; in allocation order (or by size x lifetime) they stack to the lower bound, 8.
  const size_t u = 64;
  std::vector<AllocationEvent> events = {ev(2 * u, 4, 7), ev(3 * u, 4, 5), ev(3 * u, 3, 6), ev(4 * u, 3, 4)};
  PlanSummary s;
  ArenaPlan plan = plan_arena(events, &s);
  EXPECT_EQ(s.lower_bound, static_cast<int64_t>(8 * u));
  EXPECT_EQ(s.arena_bytes, static_cast<int64_t>(8 * u));
  EXPECT_TRUE(plan_is_valid(events, plan));
}

TEST(MemoryPlan, TheSearchReachesTheLowerBoundWhereNoGreedyOrderDoes) {
  // Model A's O2-fp16 train step as graph mode recorded it (bytes, begin, end; -1: outlives the step).
  // Greedy best fit placed its 24 step temporaries at 1.152 x the lower bound in each of the three
  // orders (1348800 bytes against 1170752); the swaps of the search reach the bound.
  const std::vector<AllocationEvent> events = {
      ev(1728, 0, 7),       ev(196608, 1, 6),   ev(460800, 2, 39), ev(230400, 3, 46), ev(82688, 4, 5),
      ev(640, 8, 14),       ev(288000, 9, 12),  ev(115200, 10, 11), ev(1280, 13, -1), ev(4, 15, 49),
      ev(128, 16, 24),      ev(128, 17, 18),    ev(4, 19, 48),     ev(4, 20, 47),     ev(4, 21, 23),
      ev(1280, 22, 26),     ev(640, 25, 38),    ev(460800, 27, 45), ev(5120, 28, 31), ev(1440, 29, 30),
      ev(144000, 32, -1),   ev(20, 33, -1),     ev(16384, 34, 37), ev(1536, 35, 36),  ev(1728, 40, -1),
      ev(196608, 41, 44),   ev(276736, 42, 43), ev(165, 50, 51)};
  PlanSummary s;
  ArenaPlan plan = plan_arena(events, &s);
  std::string why;
  ASSERT_TRUE(plan_is_valid(events, plan, &why)) << why;
  EXPECT_EQ(s.planned, 24);
  EXPECT_EQ(s.lower_bound, 1170752);
  EXPECT_EQ(s.arena_bytes, s.lower_bound) << s.describe();
  // The plan depends on the recording only.
  EXPECT_EQ(plan_arena(events).offsets, plan.offsets);
}

TEST(MemoryPlan, RandomStepsGiveValidPlansWithinTheBounds) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 60);
    std::vector<AllocationEvent> events;
    int64_t tick = 0;
    std::vector<int> open;
    for (int i = 0; i < n; ++i) {
      // Frees in between, in any order.
      while (!open.empty() && rng() % 3 == 0) {
        size_t k = rng() % open.size();
        events[static_cast<size_t>(open[k])].end = tick++;
        open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
      }
      const size_t bytes = (trial % 4 == 0) ? 1024 : 1 + rng() % 100000;
      events.push_back(ev(bytes, tick++, -1));
      open.push_back(i);
    }
    for (int i : open)
      if (rng() % 4 != 0) events[static_cast<size_t>(i)].end = tick++;
    PlanSummary s;
    ArenaPlan plan = plan_arena(events, &s);
    std::string why;
    ASSERT_TRUE(plan_is_valid(events, plan, &why)) << "trial " << trial << ": " << why;
    EXPECT_GE(s.arena_bytes, s.lower_bound);
    EXPECT_LE(s.arena_bytes, s.upper_bound);
    // Blocks of one size on intervals: the greedy placement is an interval colouring, which is optimal.
    if (trial % 4 == 0) {
      EXPECT_EQ(s.arena_bytes, s.lower_bound) << "trial " << trial;
    }
    // Each block is in the replay's list of the first later block sharing its bytes, and in no other (a
    // replay stops serving at the first check that fails, and a freed block stays free).
    auto share = [&](size_t i, size_t j) {
      const int64_t ei = plan.offsets[i] + static_cast<int64_t>((events[i].bytes + 63) / 64 * 64);
      const int64_t ej = plan.offsets[j] + static_cast<int64_t>((events[j].bytes + 63) / 64 * 64);
      return plan.offsets[i] >= 0 && plan.offsets[j] >= 0 && plan.offsets[j] < ei && plan.offsets[i] < ej;
    };
    for (size_t i = 0; i < events.size(); ++i) {
      if (plan.offsets[i] < 0) continue;
      std::vector<int32_t> expected;
      for (size_t j = 0; j < i; ++j) {
        bool first = share(i, j);
        for (size_t k = j + 1; k < i && first; ++k) first = !share(k, j);
        if (first) expected.push_back(static_cast<int32_t>(j));
      }
      ASSERT_EQ(plan.must_be_free[i], expected) << "trial " << trial << " allocation " << i;
    }
  }
}

TEST(MemoryPlan, ABrokenPlanIsCaughtAndABadRecordingRefused) {
  std::vector<AllocationEvent> events = {ev(100, 0, 3), ev(100, 1, 2)};
  ArenaPlan plan = plan_arena(events);
  ASSERT_TRUE(plan_is_valid(events, plan));
  plan.offsets[1] = plan.offsets[0];
  std::string why;
  EXPECT_FALSE(plan_is_valid(events, plan, &why));
  EXPECT_NE(why.find("alive together"), std::string::npos) << why;
  EXPECT_THROW(plan_arena({ev(100, 5, 5)}), Error);  // ends before it begins
}

}  // namespace
}  // namespace demi::graph
