// The memory tracker and caching allocator. Every tensor byte is allocated here, 64-byte aligned and
// tagged with a category, so that "how much memory does O2 save, and where" is measured, not guessed.
//
// Freed blocks are kept in size-class free lists and reused, so that a steady-state training loop takes
// no fresh page faults and makes no system allocations (a first touch of a 4 KiB page is a costly fault, and
// frameworks that return memory to the OS pay it again every step: bench/memory_bench counts the faults).
// Large blocks are hinted MADV_HUGEPAGE.
// The tracker counts bytes requested by live tensors (current and peak, per category and in total);
// cached-but-free bytes are reported separately.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace demi {

enum class MemCategory : uint8_t {
  kParameter,
  kGradient,
  kOptimizerState,
  kActivation,
  kCastCache,
  kWorkspace,
  kData,
  kOther,
  kLast = kOther,
};
inline constexpr int kNumMemCategories = static_cast<int>(MemCategory::kLast) + 1;  // derived, never typed
const char* mem_category_name(MemCategory c);  // "parameter", "gradient", ...

struct MemStats {
  std::array<int64_t, kNumMemCategories> current{};  // bytes held by live allocations
  std::array<int64_t, kNumMemCategories> peak{};     // highest `current` per category since reset
  int64_t total_current = 0;
  int64_t total_peak = 0;       // highest sum over categories (not the sum of per-category peaks)
  std::array<int64_t, kNumMemCategories> at_peak{};  // `current` per category when total_peak was reached
  // The same over every category but kData: the training's own memory, without the data set and its
  // batches (which do not depend on the AMP level: a data set loaded whole is tens of MiB). Its
  // composition leaves kData at 0, so at_train_peak sums to train_peak.
  int64_t train_peak = 0;
  std::array<int64_t, kNumMemCategories> at_train_peak{};
  int64_t cached_free = 0;      // bytes the caching allocator holds for reuse
  int64_t reserved = 0;         // bytes obtained from the system and not yet returned
  int64_t system_allocs = 0;    // calls into the system allocator (mmap / aligned_alloc) so far
  int64_t allocs = 0;           // allocate() calls so far
  int64_t cache_hits = 0;       // allocate() calls served from the cache
  int64_t arena = 0;            // bytes reserved for graph mode's static plans (part of `reserved`)
  int64_t arena_allocs = 0;     // allocate() calls served from that arena
  // allocate() calls made inside a parallel region (by the threads of a parallel loop). demi's kernels make
  // none: they take every thread's scratch before the threads start, so that graph mode's recording of a
  // step (the stepping thread's allocations) sees all of it, and the blocks alive at once do not depend on
  // how the threads' parts overlap in time.
  int64_t parallel_allocs = 0;
  // The most bytes kernel tuning's trial runs held at once (MemTuningScope), counted in no peak above.
  int64_t tuning_peak = 0;

  int64_t cur(MemCategory c) const { return current[static_cast<int>(c)]; }
  int64_t pk(MemCategory c) const { return peak[static_cast<int>(c)]; }
  int64_t at_pk(MemCategory c) const { return at_peak[static_cast<int>(c)]; }
};

inline constexpr size_t kAlignment = 64;

// Returns a 64-byte-aligned block of at least `bytes` bytes (nullptr for 0 bytes), counted under `cat`.
void* mem_allocate(size_t bytes, MemCategory cat);
// Returns a block from mem_allocate with the same `bytes` and `cat`.
void mem_free(void* ptr, size_t bytes, MemCategory cat);

MemStats mem_stats();
// Starts a new peak window: every peak becomes the current value.
void mem_reset_peak();
// Returns cached free blocks to the system.
void mem_empty_cache();
// A readable table: per category current and peak, the total, the cache, and the process RSS.
std::string mem_report();
// The process's resident set size and its peak (VmHWM), in bytes, from /proc/self/status.
int64_t process_rss_bytes();
int64_t process_peak_rss_bytes();

// Measures the peak of tracked memory within a scope: the scope's own peak window starts at the current
// values on entry; peak() reads the peak since then. Each scope keeps its own window (the global one of
// mem_stats()/mem_reset_peak() is untouched), so nested scopes are allowed and an outer scope's peak stays
// correct. The tracker is process-wide: allocations from every thread count.
class ScopedPeak {
 public:
  ScopedPeak();
  ~ScopedPeak();
  MemStats peak() const;  // per-category and total peaks since this scope began
  ScopedPeak(const ScopedPeak&) = delete;
  ScopedPeak& operator=(const ScopedPeak&) = delete;

 private:
  int id_;
};

// Kernel tuning's trial runs on the calling thread (kernels::internal::ChoiceCache times each candidate
// on a shape's first call): the blocks held inside this scope raise no peak that was open when it began
// (MemStats' peaks, every ScopedPeak opened before it), and the most they held at once is
// MemStats::tuning_peak. They are a one-time cost of a shape's first call, freed before it returns:
// counted, a run's training peak would depend on what the kernel-choice cache held when it started, and a
// forecast made on a warm cache would not hold on a cold one. A ScopedPeak opened inside the scope sees
// them (a tuner measures each candidate's workspace so). A block still alive when the scope ends counts
// from then on.
class MemTuningScope {
 public:
  MemTuningScope();
  ~MemTuningScope();
  MemTuningScope(const MemTuningScope&) = delete;
  MemTuningScope& operator=(const MemTuningScope&) = delete;
};

// The category that tensors created in this thread are tagged with, for a scope: the autograd engine
// tags backward's outputs kGradient, optimizers their state kOptimizerState, and so on.
MemCategory current_mem_category();
class MemCategoryScope {
 public:
  explicit MemCategoryScope(MemCategory c);
  ~MemCategoryScope();
  MemCategoryScope(const MemCategoryScope&) = delete;
  MemCategoryScope& operator=(const MemCategoryScope&) = delete;

 private:
  MemCategory saved_;
};

// Static memory plans: graph mode (demi/graph) records the allocations of one train step, plans them
// into one arena by liveness, and serves every later step's allocations from that arena in the same
// order. The recording and the arena live here because every tensor byte passes through this file.
//
// One allocation of a recorded step: its size, its category, and when it began and ended on the
// recording's clock (one tick per allocation and per free of a recorded block).
struct AllocationEvent {
  size_t bytes = 0;
  MemCategory category = MemCategory::kOther;
  int64_t begin = 0;
  int64_t end = -1;  // -1: still alive when the recording ended (it outlives the step)
};
// Records the allocations the calling thread makes until mem_record_end (frees are seen from every
// thread). Other threads' allocations are not recorded: their order is not the program's. One recording
// at a time in the process: returns false, recording nothing, while another thread records. A thread
// that is already recording or replaying may not begin (an error).
bool mem_record_begin();
std::vector<AllocationEvent> mem_record_end();

// A plan: for the i-th allocation of a step, the size it must request and where it lives.
struct ArenaPlan {
  std::vector<size_t> bytes;
  std::vector<MemCategory> categories;
  std::vector<int64_t> offsets;  // 64-byte-aligned offset in the arena; -1: from the caching allocator
  // For each allocation, earlier ones whose arena bytes it shares: each must be freed before it is served,
  // else the replay stops serving from the arena (a block still in use is never handed out twice). Blocks
  // are served in order and a freed one stays free, so a plan need list each earlier block only once, at
  // the first allocation that shares its bytes (graph::plan_arena does).
  std::vector<std::vector<int32_t>> must_be_free;
  int64_t arena_bytes = 0;
};
// What a replay did: how many allocations it served from the arena, and whether (and where, and why) the
// step's allocations left the plan, after which everything came from the caching allocator.
struct ReplayOutcome {
  int64_t served = 0;
  int64_t followed = 0;        // allocations that matched the plan (arena or not)
  bool diverged = false;
  int64_t diverged_at = -1;    // the index of the first allocation that did not match
  std::string why;             // what differed, and where (the replay locator's answer)
  bool incomplete = false;     // the step made fewer allocations than the plan
};
// Says where the program is when a replay leaves its plan, for the message (demi/graph installs one that
// names the layer being called); it runs under the allocator's lock and must not allocate tensors.
using ReplayLocator = std::string (*)();
void mem_set_replay_locator(ReplayLocator locate);
// Serves the calling thread's allocations from `plan` (which must outlive the replay) in order, until
// mem_replay_end. The one arena is shared by every plan and grows to the largest; it is reserved from the
// system when a replay needs more than it has. Returns false, and serves nothing, while a block of an
// earlier replay is still alive (a caller holds a tensor of that step): its bytes may not be reused; and
// while another thread replays (one replay at a time in the process).
bool mem_replay_begin(const ArenaPlan& plan);
ReplayOutcome mem_replay_end();
// Returns the arena to the system when no block of it is alive and no replay is in progress (else it
// does nothing); the next replay reserves it again. mem_empty_cache() leaves the arena alone.
void mem_release_arena();
// Bytes of arena blocks alive now (0 between replays unless a step's tensor is still held).
int64_t mem_arena_live_bytes();

namespace internal {
// The block size a request of `bytes` is rounded up to (its size class); for tests and benchmarks.
size_t mem_block_size(size_t bytes);
}  // namespace internal

}  // namespace demi
