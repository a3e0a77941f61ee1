// Tests of the memory tracker and caching allocator: alignment, size classes, per-category accounting,
// peaks (global and nested scoped), reuse without system allocations, the category scope, the report,
// empty_cache, and the headline property: a warmed-up training-like loop takes zero page faults.
#include "demi/core/memory.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "demi/core/error.h"
#include "demi/core/parallel.h"

namespace demi {
namespace {

constexpr auto kAct = MemCategory::kActivation;
constexpr auto kGrad = MemCategory::kGradient;

int64_t cur(MemCategory c) { return mem_stats().cur(c); }

int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

TEST(Memory, ZeroBytesIsNullAndAbsurdSizesAreAnError) {
  EXPECT_EQ(mem_allocate(0, kAct), nullptr);
  mem_free(nullptr, 0, kAct);  // a no-op
  EXPECT_THROW(mem_allocate(size_t{1} << 60, kAct), Error);
}

TEST(Memory, BlocksAre64ByteAlignedAndHugePageAlignedWhenLarge) {
  const size_t sizes[] = {1, 7, 63, 64, 65, 1000, 1025, 4097, 100000, (1 << 20) - 1, 1 << 20, (3 << 20) + 5};
  for (size_t n : sizes) {
    void* p = mem_allocate(n, kAct);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kAlignment, 0u) << n << " bytes";
    // Blocks of 2 MiB and more start on a 2 MiB boundary so that transparent huge pages can back them.
    if (internal::mem_block_size(n) >= (size_t{2} << 20)) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (size_t{2} << 20), 0u) << n << " bytes";
    }
    std::memset(p, 0xab, n);  // the whole request is usable
    mem_free(p, n, kAct);
  }
}

TEST(Memory, SizeClassWasteIsBounded) {
  size_t prev = 0;
  for (size_t n = 1; n < (size_t{64} << 20); n = n < 4096 ? n + 1 : n + n / 61 + 1) {
    size_t b = internal::mem_block_size(n);
    ASSERT_GE(b, n);
    ASSERT_GE(b, prev) << "size classes must grow with the request";
    ASSERT_EQ(b % kAlignment, 0u);
    if (n <= 1024) {
      ASSERT_LT(b - n, 64u) << n;
    } else if (n <= (size_t{1} << 20)) {
      ASSERT_LT(static_cast<double>(b - n), 0.25 * static_cast<double>(n)) << n;
    } else {
      ASSERT_LT(static_cast<double>(b - n), 0.125 * static_cast<double>(n)) << n;
      ASSERT_EQ(b % 4096, 0u) << "mmap blocks are whole pages";
    }
    prev = b;
  }
  EXPECT_EQ(internal::mem_block_size(0), 0u);
  EXPECT_EQ(internal::mem_block_size(20 << 20), size_t{20} << 20);  // exact classes stay exact
}

TEST(Memory, CountsRequestedBytesPerCategory) {
  MemStats before = mem_stats();
  void* a = mem_allocate(1000, kAct);
  void* g = mem_allocate(3000, kGrad);
  MemStats mid = mem_stats();
  EXPECT_EQ(mid.cur(kAct) - before.cur(kAct), 1000);
  EXPECT_EQ(mid.cur(kGrad) - before.cur(kGrad), 3000);
  EXPECT_EQ(mid.total_current - before.total_current, 4000);
  EXPECT_EQ(mid.allocs - before.allocs, 2);
  mem_free(a, 1000, kAct);
  mem_free(g, 3000, kGrad);
  MemStats after = mem_stats();
  EXPECT_EQ(after.cur(kAct), before.cur(kAct));
  EXPECT_EQ(after.cur(kGrad), before.cur(kGrad));
  EXPECT_EQ(after.total_current, before.total_current);
}

// Kernel tuning's trial runs (MemTuningScope) raise no peak that was open when they began, while a window
// opened inside sees them (a tuner measures each candidate's workspace so); what they held at most is
// tuning_peak; a block allocated inside and alive at the end counts from then on.
TEST(Memory, TuningTrialRunsRaiseNoPeakOpenBeforeThem) {
  mem_reset_peak();
  const int64_t base = mem_stats().total_current;
  ScopedPeak outer;
  void* kept = nullptr;
  int64_t seen_inside = 0;
  {
    MemTuningScope trials;
    void* scratch = mem_allocate(size_t{4} << 20, MemCategory::kWorkspace);
    {
      ScopedPeak inner;
      void* more = mem_allocate(size_t{1} << 20, MemCategory::kWorkspace);
      seen_inside = inner.peak().pk(MemCategory::kWorkspace);
      mem_free(more, size_t{1} << 20, MemCategory::kWorkspace);
    }
    mem_free(scratch, size_t{4} << 20, MemCategory::kWorkspace);
    kept = mem_allocate(size_t{2} << 20, MemCategory::kActivation);  // outlives the trial runs
  }
  EXPECT_GE(seen_inside, int64_t{5} << 20);
  const MemStats s = mem_stats();
  EXPECT_EQ(s.tuning_peak, int64_t{5} << 20);
  EXPECT_EQ(s.total_peak, base + (int64_t{2} << 20)) << "only the block that outlived the scope";
  EXPECT_EQ(outer.peak().total_peak, base + (int64_t{2} << 20));
  EXPECT_EQ(outer.peak().pk(MemCategory::kWorkspace), s.cur(MemCategory::kWorkspace));
  mem_free(kept, size_t{2} << 20, MemCategory::kActivation);
  mem_reset_peak();
  EXPECT_EQ(mem_stats().tuning_peak, 0);
}

TEST(Memory, TotalPeakIsThePeakOfTheSum) {
  mem_reset_peak();
  MemStats base = mem_stats();
  void* a = mem_allocate(10000, kAct);
  mem_free(a, 10000, kAct);
  void* g = mem_allocate(6000, kGrad);
  MemStats s = mem_stats();
  EXPECT_EQ(s.pk(kAct) - base.cur(kAct), 10000);
  EXPECT_EQ(s.pk(kGrad) - base.cur(kGrad), 6000);
  EXPECT_EQ(s.total_peak - base.total_current, 10000);  // not 16000: they never coexisted
  mem_free(g, 6000, kGrad);
  mem_reset_peak();
  s = mem_stats();
  EXPECT_EQ(s.total_peak, s.total_current);
  EXPECT_EQ(s.pk(kAct), s.cur(kAct));
}

TEST(Memory, PeakCompositionAndTheTrainingPeakWithoutData) {
  constexpr MemCategory kData = MemCategory::kData;
  ScopedPeak scope;
  MemStats base = mem_stats();
  void* d = mem_allocate(50000, kData);   // a loaded data set: the highest total...
  void* a = mem_allocate(8000, kAct);
  mem_free(d, 50000, kData);
  void* g = mem_allocate(20000, kGrad);   // ...but the training's own peak is activations + gradients
  MemStats s = scope.peak();
  EXPECT_EQ(s.total_peak - base.total_current, 58000);
  EXPECT_EQ(s.at_pk(kData) - base.cur(kData), 50000);
  EXPECT_EQ(s.at_pk(kAct) - base.cur(kAct), 8000);
  EXPECT_EQ(s.at_pk(kGrad), base.cur(kGrad));
  const int64_t base_train = base.total_current - base.cur(kData);
  EXPECT_EQ(s.train_peak - base_train, 28000);
  EXPECT_EQ(s.at_train_peak[static_cast<int>(kGrad)] - base.cur(kGrad), 20000);
  EXPECT_EQ(s.at_train_peak[static_cast<int>(kData)], 0) << "the training peak excludes the data set";
  int64_t sum = 0;
  for (int64_t v : s.at_train_peak) sum += v;
  EXPECT_EQ(sum, s.train_peak);
  mem_free(a, 8000, kAct);
  mem_free(g, 20000, kGrad);
}

TEST(Memory, NestedScopedPeaksStayCorrect) {
  mem_reset_peak();
  int64_t base = mem_stats().total_current;
  ScopedPeak outer;
  void* big = mem_allocate(40000, kAct);
  mem_free(big, 40000, kAct);
  {
    ScopedPeak inner;  // starts its own window: the outer one must keep its 40000
    int64_t g0 = cur(kGrad);
    void* small = mem_allocate(1000, kGrad);
    EXPECT_EQ(inner.peak().total_peak - base, 1000);
    EXPECT_EQ(inner.peak().pk(kGrad) - g0, 1000);
    EXPECT_EQ(inner.peak().pk(kAct), cur(kAct));  // the 40000 came before this window
    mem_free(small, 1000, kGrad);
  }
  EXPECT_EQ(outer.peak().total_peak - base, 40000);
  EXPECT_EQ(outer.peak().pk(kAct) - cur(kAct), 40000);
  EXPECT_EQ(mem_stats().total_peak - base, 40000);  // scopes leave the global window alone
  {
    ScopedPeak later;
    EXPECT_EQ(later.peak().total_peak, base);  // a fresh scope starts at the current value
  }
}

TEST(Memory, SecondIdenticalCycleMakesNoSystemAllocation) {
  const size_t sizes[] = {333, 5000, 70000, 1500000, 9000000};
  for (size_t n : sizes) mem_free(mem_allocate(n, kAct), n, kAct);  // warm-up
  MemStats before = mem_stats();
  std::vector<void*> first;
  for (size_t n : sizes) first.push_back(mem_allocate(n, kAct));
  for (size_t i = 0; i < std::size(sizes); ++i) mem_free(first[i], sizes[i], kAct);
  std::vector<void*> second;
  for (size_t n : sizes) second.push_back(mem_allocate(n, kAct));
  MemStats after = mem_stats();
  EXPECT_EQ(after.system_allocs, before.system_allocs);
  EXPECT_EQ(after.cache_hits - before.cache_hits, 2 * static_cast<int64_t>(std::size(sizes)));
  EXPECT_EQ(first, second);  // the same blocks come back
  for (size_t i = 0; i < std::size(sizes); ++i) mem_free(second[i], sizes[i], kAct);
}

TEST(Memory, CategoryScopeIsNestedAndThreadLocal) {
  EXPECT_EQ(current_mem_category(), MemCategory::kOther);
  {
    MemCategoryScope a(MemCategory::kParameter);
    EXPECT_EQ(current_mem_category(), MemCategory::kParameter);
    {
      MemCategoryScope b(MemCategory::kOptimizerState);
      EXPECT_EQ(current_mem_category(), MemCategory::kOptimizerState);
      MemCategory seen = MemCategory::kParameter;
      std::thread([&] { seen = current_mem_category(); }).join();
      EXPECT_EQ(seen, MemCategory::kOther);  // another thread keeps its own default
    }
    EXPECT_EQ(current_mem_category(), MemCategory::kParameter);
  }
  EXPECT_EQ(current_mem_category(), MemCategory::kOther);
}

TEST(Memory, ReportNamesEveryCategoryAndTheProcess) {
  void* p = mem_allocate(3 << 20, MemCategory::kCastCache);
  std::string r = mem_report();
  for (int c = 0; c < kNumMemCategories; ++c) {
    EXPECT_NE(r.find(mem_category_name(static_cast<MemCategory>(c))), std::string::npos) << r;
  }
  EXPECT_NE(r.find("total"), std::string::npos) << r;
  EXPECT_NE(r.find("MiB"), std::string::npos) << r;
  EXPECT_NE(r.find("RSS"), std::string::npos) << r;
  EXPECT_NE(r.find("system allocations"), std::string::npos) << r;
  mem_free(p, 3 << 20, MemCategory::kCastCache);
  EXPECT_GT(process_rss_bytes(), 0);
  EXPECT_GE(process_peak_rss_bytes(), process_rss_bytes());
}

TEST(Memory, EmptyCacheReturnsFreeBlocks) {
  void* held = mem_allocate(5000, kAct);  // live blocks are untouched by empty_cache
  for (size_t n : {100, 20000, 4 << 20}) mem_free(mem_allocate(n, kAct), n, kAct);
  MemStats before = mem_stats();
  ASSERT_GT(before.cached_free, 0);
  mem_empty_cache();
  MemStats after = mem_stats();
  EXPECT_EQ(after.cached_free, 0);
  EXPECT_EQ(after.reserved, before.reserved - before.cached_free);
  EXPECT_EQ(after.total_current, before.total_current);
  std::memset(held, 1, 5000);
  mem_free(held, 5000, kAct);
  // After emptying, the next allocation of a size goes to the system again.
  int64_t sys = mem_stats().system_allocs;
  mem_free(mem_allocate(20000, kAct), 20000, kAct);
  EXPECT_EQ(mem_stats().system_allocs, sys + 1);
}

TEST(Memory, ConcurrentAllocFreeKeepsCountsExact) {
  MemStats before = mem_stats();
  auto work = [](int seed) {
    std::vector<std::pair<void*, size_t>> live;
    uint32_t x = static_cast<uint32_t>(seed) * 2654435761u + 1;
    for (int i = 0; i < 20000; ++i) {
      x = x * 1664525u + 1013904223u;
      if (live.size() < 16 && (x >> 31)) {
        size_t n = 1 + (x >> 8) % 200000;
        void* p = mem_allocate(n, kAct);
        static_cast<char*>(p)[0] = 1;
        live.emplace_back(p, n);
      } else if (!live.empty()) {
        mem_free(live.back().first, live.back().second, kAct);
        live.pop_back();
      }
    }
    for (auto [p, n] : live) mem_free(p, n, kAct);
  };
  std::thread t1(work, 1), t2(work, 2);
  t1.join();
  t2.join();
  MemStats after = mem_stats();
  EXPECT_EQ(after.cur(kAct), before.cur(kAct));
  EXPECT_EQ(after.total_current, before.total_current);
  EXPECT_EQ(after.reserved - after.cached_free, before.reserved - before.cached_free);
}

// Allocations made by the threads of a parallel loop are counted apart (MemStats::parallel_allocs), so that
// tests can hold every kernel to taking its threads' scratch before the threads start.
TEST(Memory, AllocationsInsideAParallelRegionAreCounted) {
  const int saved_threads = num_threads();
  set_num_threads(2);
  const MemStats before = mem_stats();
  void* outside = mem_allocate(1000, kAct);
  mem_free(outside, 1000, kAct);
  EXPECT_EQ(mem_stats().parallel_allocs, before.parallel_allocs);
  parallel_for(0, 2, 1, [](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      void* p = mem_allocate(1000, kAct);
      mem_free(p, 1000, kAct);
    }
  });
  EXPECT_EQ(mem_stats().parallel_allocs - before.parallel_allocs, 2);
  EXPECT_EQ(mem_stats().allocs - before.allocs, 3);
  set_num_threads(saved_threads);
}

// The reason the allocator exists: after warm-up, a step that allocates, touches and frees the same
// sizes (here model A and B's activations, gradients and workspaces, a few KiB to ~20 MiB) takes no
// page fault and no system allocation. Exactly 0 is expected: every block stays mapped and resident
// (there is no swap to page it out, and nothing in the loop calls into the kernel).
TEST(Memory, WarmTrainingLoopTakesNoPageFaults) {
  const size_t sizes[] = {3456,    1280,    40960,   393216,  3686400, 3686400, 921600,  921600,
                          288000,  288000,  1280,    1152,    12845056, 3211264, 6422528, 1605632,
                          1605632, 1605632, 65536,   5120,    20971520, 1048576, 4194304, 73728};
  constexpr size_t kPage = 4096;
  std::vector<void*> ptrs(std::size(sizes));
  auto step = [&] {
    for (size_t i = 0; i < std::size(sizes); ++i) {
      ptrs[i] = mem_allocate(sizes[i], kAct);
      auto* c = static_cast<volatile char*>(ptrs[i]);
      for (size_t off = 0; off < sizes[i]; off += kPage) c[off] = 1;
      c[sizes[i] - 1] = 1;
    }
    for (size_t i = 0; i < std::size(sizes); ++i) mem_free(ptrs[i], sizes[i], kAct);
  };
  step();
  step();  // warm-up: blocks obtained and every page touched once
  int64_t faults = 0;
  int64_t sys = 0;
  // One retry: a fault caused by the kernel itself (page migration by compaction) is not ours to count.
  for (int attempt = 0; attempt < 2; ++attempt) {
    int64_t sys0 = mem_stats().system_allocs;
    int64_t f0 = minor_faults();
    for (int i = 0; i < 20; ++i) step();
    faults = minor_faults() - f0;
    sys = mem_stats().system_allocs - sys0;
    if (faults == 0) break;
  }
  EXPECT_EQ(faults, 0) << "page faults in 20 warm steps";
  EXPECT_EQ(sys, 0) << "system allocations in 20 warm steps";
}

// --- Static memory plans: the recording of one step and its replay from the arena (graph mode). ---

TEST(MemoryPlan, RecordingSeesThisThreadsAllocationsAndEveryThreadsFrees) {
  ASSERT_TRUE(mem_record_begin());
  void* a = mem_allocate(100, kAct);
  void* b = mem_allocate(200, kGrad);
  void* kept = mem_allocate(300, kAct);
  std::thread other([&] {
    void* c = mem_allocate(400, kAct);  // another thread's: not recorded
    mem_free(c, 400, kAct);
    mem_free(b, 200, kGrad);            // a recorded block freed here: its end is recorded
  });
  other.join();
  mem_free(a, 100, kAct);
  std::vector<AllocationEvent> events = mem_record_end();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].bytes, 100u);
  EXPECT_EQ(events[1].bytes, 200u);
  EXPECT_EQ(events[1].category, kGrad);
  EXPECT_EQ(events[0].begin, 0);
  EXPECT_EQ(events[1].begin, 1);
  EXPECT_EQ(events[2].begin, 2);
  EXPECT_EQ(events[1].end, 3);   // freed by the other thread first
  EXPECT_EQ(events[0].end, 4);
  EXPECT_EQ(events[2].end, -1);  // outlives the recording
  mem_free(kept, 300, kAct);
  EXPECT_THROW(mem_record_end(), Error);  // none in progress
}

TEST(MemoryPlan, OneRecordingAndOneReplayAtATimeInTheProcess) {
  ASSERT_TRUE(mem_record_begin());
  EXPECT_THROW(mem_record_begin(), Error);  // this thread already records: a bug
  bool other_recorded = true, other_replayed = true;
  ArenaPlan plan;
  std::thread([&] { other_recorded = mem_record_begin(); }).join();
  EXPECT_FALSE(other_recorded);  // another thread's recording: not now
  mem_record_end();
  plan.arena_bytes = 64;
  ASSERT_TRUE(mem_replay_begin(plan));
  std::thread([&] { other_replayed = mem_replay_begin(plan); }).join();
  EXPECT_FALSE(other_replayed);
  mem_replay_end();
  mem_release_arena();
}

// Three allocations: the first in the arena, the second from the caching allocator, the third in the
// first one's bytes (so the first must be freed before it).
ArenaPlan three_allocation_plan() {
  ArenaPlan plan;
  plan.bytes = {1000, 1000, 500};
  plan.categories = {kAct, kAct, kGrad};
  plan.offsets = {0, -1, 0};
  plan.must_be_free = {{}, {}, {0}};
  plan.arena_bytes = 1024;
  return plan;
}

TEST(MemoryPlan, ReplayServesThePlannedOffsetsAndCountsThem) {
  const ArenaPlan plan = three_allocation_plan();
  const MemStats before = mem_stats();
  ASSERT_TRUE(mem_replay_begin(plan));
  void* p0 = mem_allocate(1000, kAct);
  void* p1 = mem_allocate(1000, kAct);
  EXPECT_EQ(cur(kAct), before.cur(kAct) + 2000);  // arena blocks are tracked like any other
  EXPECT_EQ(mem_arena_live_bytes(), 1000);
  std::memset(p0, 1, 1000);
  mem_free(p0, 1000, kAct);
  void* p2 = mem_allocate(500, kGrad);
  EXPECT_EQ(p2, p0);  // the same arena bytes
  EXPECT_NE(p1, p0);
  mem_free(p2, 500, kGrad);
  mem_free(p1, 1000, kAct);
  ReplayOutcome out = mem_replay_end();
  EXPECT_FALSE(out.diverged) << out.why;
  EXPECT_FALSE(out.incomplete);
  EXPECT_EQ(out.served, 2);
  EXPECT_EQ(out.followed, 3);
  const MemStats after = mem_stats();
  EXPECT_GE(after.arena, 1024);
  EXPECT_EQ(after.arena_allocs, before.arena_allocs + 2);
  EXPECT_EQ(after.cur(kAct), before.cur(kAct));
  EXPECT_EQ(mem_arena_live_bytes(), 0);
  mem_release_arena();
  EXPECT_EQ(mem_stats().arena, 0);
}

TEST(MemoryPlan, ReplayNeverHandsOutABlockStillAlive) {
  const ArenaPlan plan = three_allocation_plan();
  ASSERT_TRUE(mem_replay_begin(plan));
  auto* p0 = static_cast<unsigned char*>(mem_allocate(1000, kAct));
  void* p1 = mem_allocate(1000, kAct);
  std::memset(p0, 7, 1000);
  // The step holds p0 longer than the traced one: the third allocation must not get its bytes.
  void* p2 = mem_allocate(500, kGrad);
  EXPECT_NE(p2, static_cast<void*>(p0));
  std::memset(p2, 9, 500);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(p0[i], 7) << i;
  ReplayOutcome out = mem_replay_end();
  EXPECT_TRUE(out.diverged);
  EXPECT_EQ(out.diverged_at, 2);
  EXPECT_NE(out.why.find("still alive"), std::string::npos) << out.why;
  // While an arena block is alive, no replay may begin: its bytes are not free.
  EXPECT_FALSE(mem_replay_begin(plan));
  mem_free(p0, 1000, kAct);
  mem_free(p1, 1000, kAct);
  mem_free(p2, 500, kGrad);
  ASSERT_TRUE(mem_replay_begin(plan));
  EXPECT_TRUE(mem_replay_end().incomplete);  // no allocation at all: fewer than planned
}

// A step's tensor may outlive its replay and its plan (a caller keeps the loss; graph mode forgets its
// plans when the program changes): its block is still found by its offset when it is freed, and the next
// plan, with other offsets, is served and freed as its own.
TEST(MemoryPlan, AnArenaBlockIsFreedByItsOffsetAfterItsPlanIsGone) {
  auto plan = std::make_unique<ArenaPlan>();
  plan->bytes = {256, 256, 128};
  plan->categories = {kAct, kAct, kAct};
  plan->offsets = {0, 256, 0};
  plan->must_be_free = {{}, {}, {0}};
  plan->arena_bytes = 512;
  ASSERT_TRUE(mem_replay_begin(*plan));
  void* p0 = mem_allocate(256, kAct);
  void* p1 = mem_allocate(256, kAct);
  mem_free(p0, 256, kAct);
  void* p2 = mem_allocate(128, kAct);  // p0's bytes: the block at offset 0 is now the third allocation
  EXPECT_EQ(p2, p0);
  EXPECT_FALSE(mem_replay_end().diverged);
  plan.reset();
  EXPECT_EQ(mem_arena_live_bytes(), 384);
  mem_free(p2, 128, kAct);
  EXPECT_EQ(mem_arena_live_bytes(), 256);
  mem_free(p1, 256, kAct);
  EXPECT_EQ(mem_arena_live_bytes(), 0);

  ArenaPlan other;
  other.bytes = {64, 64};
  other.categories = {kGrad, kGrad};
  other.offsets = {64, 0};
  other.must_be_free = {{}, {}};
  other.arena_bytes = 128;
  ASSERT_TRUE(mem_replay_begin(other));
  void* q0 = mem_allocate(64, kGrad);
  void* q1 = mem_allocate(64, kGrad);
  EXPECT_EQ(static_cast<char*>(q0) - static_cast<char*>(q1), 64);
  mem_free(q1, 64, kGrad);
  EXPECT_EQ(mem_arena_live_bytes(), 64);
  mem_free(q0, 64, kGrad);
  EXPECT_EQ(mem_arena_live_bytes(), 0);
  EXPECT_EQ(mem_replay_end().served, 2);
  mem_release_arena();
  EXPECT_EQ(mem_stats().arena, 0);
}

TEST(MemoryPlan, AnAllocationUnlikeThePlanEndsTheReplayOnTheCachingAllocator) {
  const ArenaPlan plan = three_allocation_plan();
  ASSERT_TRUE(mem_replay_begin(plan));
  void* p0 = mem_allocate(999, kAct);  // the plan says 1000
  void* p1 = mem_allocate(1000, kAct);
  mem_free(p0, 999, kAct);
  void* p2 = mem_allocate(500, kGrad);
  ReplayOutcome out = mem_replay_end();
  EXPECT_TRUE(out.diverged);
  EXPECT_EQ(out.diverged_at, 0);
  EXPECT_EQ(out.served, 0);  // everything after the first difference came from the caching allocator
  EXPECT_NE(out.why.find("999 bytes"), std::string::npos) << out.why;
  EXPECT_EQ(mem_arena_live_bytes(), 0);
  mem_free(p1, 1000, kAct);
  mem_free(p2, 500, kGrad);
  // A recording and a replay do not nest in one thread; an inconsistent plan is refused.
  ASSERT_TRUE(mem_replay_begin(plan));
  EXPECT_THROW(mem_record_begin(), Error);
  EXPECT_THROW(mem_replay_begin(plan), Error);
  mem_replay_end();
  ArenaPlan bad = plan;
  bad.offsets.pop_back();
  EXPECT_THROW(mem_replay_begin(bad), Error);
  mem_release_arena();
}

}  // namespace
}  // namespace demi
