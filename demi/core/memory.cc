// The memory tracker and caching allocator (see memory.h for the contract).
//
// One mutex guards everything: a steady-state allocate/free is a size-class computation, a vector
// push/pop and a few counter updates (well under a microsecond), far below the cost of the tensor op
// that asked for the memory, so a lock-free design would buy nothing measurable.
//
// Blocks are rounded up to a size class and, once obtained from the system, are only ever returned by
// mem_empty_cache(): a training loop that frees and re-allocates the same sizes every step is served
// from the free lists with no system call and no first-touch page fault.
#include "demi/core/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "demi/core/error.h"
#include "demi/core/parallel.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define DEMI_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define DEMI_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define DEMI_POISON(p, n) ((void)(p), (void)(n))
#define DEMI_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace demi {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::kParameter: return "parameter";
    case MemCategory::kGradient: return "gradient";
    case MemCategory::kOptimizerState: return "optimizer state";
    case MemCategory::kActivation: return "activation";
    case MemCategory::kCastCache: return "cast cache";
    case MemCategory::kWorkspace: return "workspace";
    case MemCategory::kData: return "data";
    case MemCategory::kOther: return "other";
  }
  return "unknown";
}

namespace internal {

// Size classes. Up to 1 KiB: multiples of 64 (the alignment; waste < 64 bytes). Above: each power-of-two
// interval (2^e, 2^(e+1)] is split into 4 steps (waste < 25%, ~12% on average), and into 8 steps from
// 1 MiB on (waste < 12.5%), where a rounded-up block costs real megabytes of address space and, when
// reused by a larger request, resident memory. Every class from kLargeBlock on is a multiple of 128 KiB,
// hence of the page size.
inline constexpr size_t kSmallLimit = 1024;
inline constexpr size_t kLargeBlock = size_t{1} << 20;  // from here on: mmap, own pages
inline constexpr size_t kHugePage = size_t{2} << 20;
inline constexpr int kSlotsPerOctave = 8;
inline constexpr int kNumClasses = 16 + (64 - 10) * kSlotsPerOctave;

struct SizeClass {
  size_t bytes;
  int index;
};

// Steps per octave (2^e, 2^(e+1)].
constexpr int steps_for(int e) { return (size_t{1} << e) >= kLargeBlock ? 8 : 4; }

SizeClass size_class(size_t bytes) {
  if (bytes <= kSmallLimit) {
    size_t b = (bytes + 63) & ~size_t{63};
    if (b == 0) b = 64;
    return {b, static_cast<int>(b / 64) - 1};
  }
  int e = std::bit_width(bytes - 1) - 1;  // 2^e < bytes <= 2^(e+1), e >= 10
  int steps = steps_for(e);
  size_t step = (size_t{1} << e) / static_cast<size_t>(steps);
  size_t k = (bytes + step - 1) / step;  // steps+1 .. 2*steps
  return {k * step, 16 + (e - 10) * kSlotsPerOctave + static_cast<int>(k) - steps - 1};
}

size_t class_bytes_of_index(int index) {
  if (index < 16) return static_cast<size_t>(index + 1) * 64;
  int e = 10 + (index - 16) / kSlotsPerOctave;
  int steps = steps_for(e);
  size_t k = static_cast<size_t>((index - 16) % kSlotsPerOctave + steps + 1);
  return k * ((size_t{1} << e) / static_cast<size_t>(steps));
}

size_t mem_block_size(size_t bytes) { return bytes == 0 ? 0 : size_class(bytes).bytes; }

}  // namespace internal

namespace {

using internal::kHugePage;
using internal::kLargeBlock;
using internal::kNumClasses;

// The composition of the training's own memory: every category but the data set.
std::array<int64_t, kNumMemCategories> without_data(std::array<int64_t, kNumMemCategories> current) {
  current[static_cast<int>(MemCategory::kData)] = 0;
  return current;
}

struct ScopeEntry {
  int id;
  std::array<int64_t, kNumMemCategories> peak;
  int64_t total_peak;
  std::array<int64_t, kNumMemCategories> at_peak;
  int64_t train_peak;
  std::array<int64_t, kNumMemCategories> at_train_peak;
};

// Everything below is guarded by `mu`.
struct Allocator {
  std::mutex mu;
  MemStats stats;
  std::vector<void*> free_lists[kNumClasses];
  std::vector<ScopeEntry> scopes;  // active ScopedPeak windows, innermost last
  int next_scope_id = 1;

  // The recording of one step's allocations (mem_record_begin/end).
  struct Recording {
    bool active = false;
    int64_t clock = 0;
    std::vector<AllocationEvent> events;
    std::unordered_map<void*, int32_t> live;  // a recorded block still alive -> its event
  } rec;

  // The arena of the static plans, and the replay in progress (mem_replay_begin/end).
  struct Arena {
    char* base = nullptr;
    size_t bytes = 0;
    int64_t live_count = 0;  // arena blocks alive (all of the last plan replayed: see mem_replay_begin)
    int64_t live_bytes = 0;
    const ArenaPlan* plan = nullptr;  // the replay in progress; null between replays
    std::vector<uint8_t> alive;       // per allocation of the last plan replayed
    // The last plan's arena blocks by offset, (offset, allocation) sorted, so that a free finds its block
    // without a node allocated per block (a hash map's insert and erase were most of what a replay added to
    // a step's host work); `offsets` is the plan they were sorted for, reused while the plans' offsets agree.
    std::vector<std::pair<int64_t, int32_t>> by_offset;
    std::vector<int64_t> offsets;
    size_t next = 0;
    ReplayOutcome out;

    // Sorts the blocks of `p` by offset unless they are those of the plan sorted last (the same offsets).
    void index_blocks(const ArenaPlan& p) {
      if (p.offsets == offsets) return;
      offsets = p.offsets;
      by_offset.clear();
      for (size_t i = 0; i < p.offsets.size(); ++i)
        if (p.offsets[i] >= 0) by_offset.emplace_back(p.offsets[i], static_cast<int32_t>(i));
      std::sort(by_offset.begin(), by_offset.end());
    }
    // The allocation of the last plan alive at `offset` (one at most: a block shares its bytes only with
    // blocks freed before it was served), or -1.
    int32_t alive_at(int64_t offset) const {
      auto it = std::lower_bound(by_offset.begin(), by_offset.end(), std::pair<int64_t, int32_t>{offset, -1});
      for (; it != by_offset.end() && it->first == offset; ++it)
        if (alive[static_cast<size_t>(it->second)]) return it->second;
      return -1;
    }
  } arena;
  std::atomic<ReplayLocator> replay_locator{nullptr};

  void* system_alloc(size_t class_bytes) {
    void* p = nullptr;
    if (class_bytes < kLargeBlock) {
      p = std::aligned_alloc(kAlignment, class_bytes);  // class_bytes is a multiple of 64
    } else if (class_bytes < kHugePage) {
      p = mmap(nullptr, class_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) p = nullptr;
    } else {
      // Over-map by 2 MiB and trim, so the block starts on a huge-page boundary: only then can the
      // kernel back it with 2 MiB pages (one fault per 2 MiB on first touch instead of 512).
      size_t span = class_bytes + kHugePage;
      void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (raw != MAP_FAILED) {
        auto base = reinterpret_cast<uintptr_t>(raw);
        uintptr_t aligned = (base + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
        size_t head = aligned - base;
        size_t tail = span - head - class_bytes;
        if (head) munmap(raw, head);
        if (tail) munmap(reinterpret_cast<void*>(aligned + class_bytes), tail);
        p = reinterpret_cast<void*>(aligned);
        madvise(p, class_bytes, MADV_HUGEPAGE);  // a hint: harmless where THP is off
      }
    }
    if (p) {
      ++stats.system_allocs;
      stats.reserved += static_cast<int64_t>(class_bytes);
    }
    return p;
  }

  void system_free(void* p, size_t class_bytes) {
    if (class_bytes < kLargeBlock) {
      std::free(p);
    } else {
      munmap(p, class_bytes);
    }
    stats.reserved -= static_cast<int64_t>(class_bytes);
  }

  void note_alloc(size_t bytes, MemCategory cat) {
    int c = static_cast<int>(cat);
    auto b = static_cast<int64_t>(bytes);
    stats.current[c] += b;
    stats.total_current += b;
    if (tuning.depth > 0) tuning.high = std::max(tuning.high, stats.total_current);
    raise_peaks(c, c + 1);
  }

  // Raises every peak (the global window's and each ScopedPeak's) to what is held now: the per-category
  // peaks of categories [c0, c1) (the one an allocation changed, or all), and the totals.
  void raise_peaks(int c0, int c1) {
    const int64_t train = stats.total_current - stats.current[static_cast<int>(MemCategory::kData)];
    const auto raise = [&](std::array<int64_t, kNumMemCategories>& peak, int64_t& total_peak,
                           std::array<int64_t, kNumMemCategories>& at_peak, int64_t& train_peak,
                           std::array<int64_t, kNumMemCategories>& at_train_peak) {
      for (int k = c0; k < c1; ++k) peak[k] = std::max(peak[k], stats.current[k]);
      if (stats.total_current > total_peak) {
        total_peak = stats.total_current;
        at_peak = stats.current;
      }
      if (train > train_peak) {
        train_peak = train;
        at_train_peak = without_data(stats.current);
      }
    };
    raise(stats.peak, stats.total_peak, stats.at_peak, stats.train_peak, stats.at_train_peak);
    for (ScopeEntry& s : scopes) raise(s.peak, s.total_peak, s.at_peak, s.train_peak, s.at_train_peak);
  }

  // The outermost MemTuningScope open (on one thread): the peaks as they were when it began, put back when
  // it ends; ScopedPeak windows opened inside it see the trial runs' blocks.
  struct Tuning {
    int depth = 0;
    MemStats saved;                 // the global window's peaks
    std::vector<ScopeEntry> saved_scopes;  // the windows open then
    int64_t base = 0;               // total_current then
    int64_t high = 0;               // the most total_current since
  } tuning;

  // The next allocation of the replay in progress: its arena block, or nullptr for the caching allocator
  // (the plan says so, or the step has left the plan).
  void* replay_next(size_t bytes, MemCategory cat) {
    ReplayOutcome& out = arena.out;
    if (out.diverged) return nullptr;
    const ArenaPlan& plan = *arena.plan;
    const size_t i = arena.next++;
    auto diverge = [&](std::string why) -> void* {
      out.diverged = true;
      out.diverged_at = static_cast<int64_t>(i);
      out.why = std::move(why);
      if (ReplayLocator locate = replay_locator.load()) out.why += locate();
      return nullptr;
    };
    if (i >= plan.bytes.size()) {
      return diverge("the step made more allocations than the " + std::to_string(plan.bytes.size()) + " planned");
    }
    if (plan.bytes[i] != bytes || plan.categories[i] != cat) {
      return diverge("allocation " + std::to_string(i) + " asked for " + std::to_string(bytes) + " bytes of " +
                     mem_category_name(cat) + " where the plan has " + std::to_string(plan.bytes[i]) + " bytes of " +
                     mem_category_name(plan.categories[i]));
    }
    ++out.followed;
    const int64_t off = plan.offsets[i];
    if (off < 0) return nullptr;
    for (int32_t j : plan.must_be_free[i]) {
      if (arena.alive[static_cast<size_t>(j)]) {
        return diverge("allocation " + std::to_string(i) + " shares arena bytes with allocation " + std::to_string(j) +
                       ", which is still alive (the step holds it longer than the traced one did)");
      }
    }
    arena.alive[i] = 1;
    ++arena.live_count;
    arena.live_bytes += static_cast<int64_t>(bytes);
    ++out.served;
    ++stats.arena_allocs;
    return arena.base + off;
  }

  bool in_arena(const void* p) const {
    auto c = static_cast<const char*>(p);
    return arena.base != nullptr && c >= arena.base && c < arena.base + arena.bytes;
  }

  void release_arena() {
    if (arena.base == nullptr) return;
    DEMI_UNPOISON(arena.base, arena.bytes);
    system_free(arena.base, arena.bytes);
    stats.arena = 0;
    arena.base = nullptr;
    arena.bytes = 0;
  }

  void empty_cache() {
    for (int i = 0; i < kNumClasses; ++i) {
      if (free_lists[i].empty()) continue;
      size_t class_bytes = internal::class_bytes_of_index(i);
      for (void* p : free_lists[i]) {
        DEMI_UNPOISON(p, class_bytes);
        system_free(p, class_bytes);
      }
      stats.cached_free -= static_cast<int64_t>(class_bytes * free_lists[i].size());
      free_lists[i].clear();
      free_lists[i].shrink_to_fit();
    }
  }

};

Allocator& allocator() {
  // Never destroyed: tensors in static objects may be freed after main returns.
  static Allocator* a = new Allocator;
  return *a;
}

thread_local MemCategory t_category = MemCategory::kOther;
thread_local bool t_recording = false;  // this thread's allocations are recorded
thread_local bool t_replaying = false;  // this thread's allocations follow the arena plan
thread_local int t_tuning = 0;           // MemTuningScopes open on this thread

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b < 0 ? -b : b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%s%" PRId64 " B", b < 0 ? "-" : "", b < 0 ? -b : b);
  } else {
    std::snprintf(buf, sizeof buf, "%s%.2f %s", b < 0 ? "-" : "", v, units[u]);
  }
  return buf;
}

// A "Key:   1234 kB" line of /proc/self/status, in bytes; -1 when unavailable (not Linux).
int64_t proc_status_kb(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  size_t klen = std::strlen(key);
  int64_t result = -1;
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, key, klen) == 0 && line[klen] == ':') {
      long long kb = 0;
      if (std::sscanf(line + klen + 1, "%lld", &kb) == 1) result = static_cast<int64_t>(kb) * 1024;
      break;
    }
  }
  std::fclose(f);
  return result;
}

}  // namespace

void* mem_allocate(size_t bytes, MemCategory cat) {
  if (bytes == 0) return nullptr;
  DEMI_ASSERT(static_cast<int>(cat) < kNumMemCategories, "bad memory category ", static_cast<int>(cat));
  // Far beyond any machine, and it keeps the size-class arithmetic from overflowing.
  DEMI_CHECK(bytes <= (size_t{1} << 48), "out of memory: cannot allocate ", bytes, " bytes for ",
             mem_category_name(cat), " (the limit is 256 TiB)");
  internal::SizeClass sc = internal::size_class(bytes);
  Allocator& a = allocator();
  void* p = nullptr;
  bool from_arena = false;
  const bool in_parallel = in_parallel_region();
  {
    std::lock_guard<std::mutex> lock(a.mu);
    ++a.stats.allocs;
    if (in_parallel) ++a.stats.parallel_allocs;
    auto& list = a.free_lists[sc.index];
    if (t_replaying && (p = a.replay_next(bytes, cat)) != nullptr) {
      from_arena = true;  // its block is exactly `bytes` long
    } else if (!list.empty()) {
      p = list.back();
      list.pop_back();
      ++a.stats.cache_hits;
      a.stats.cached_free -= static_cast<int64_t>(sc.bytes);
    } else {
      p = a.system_alloc(sc.bytes);
      if (!p) {
        // Memory pressure: give the cache back and try once more before failing.
        a.empty_cache();
        p = a.system_alloc(sc.bytes);
      }
      DEMI_CHECK(p != nullptr, "out of memory: could not allocate ", human_bytes(static_cast<int64_t>(bytes)),
                 " for ", mem_category_name(cat), " (tracked in use: ", human_bytes(a.stats.total_current),
                 ", reserved: ", human_bytes(a.stats.reserved), ")");
    }
    a.note_alloc(bytes, cat);
    if (t_recording) {
      a.rec.live[p] = static_cast<int32_t>(a.rec.events.size());
      a.rec.events.push_back({bytes, cat, a.rec.clock++, -1});
    }
  }
  // Under AddressSanitizer, the rounding slack of the block stays poisoned: overruns are caught.
  if (!from_arena) DEMI_POISON(p, sc.bytes);
  DEMI_UNPOISON(p, bytes);
  return p;
}

void mem_free(void* ptr, size_t bytes, MemCategory cat) {
  if (ptr == nullptr) return;
  DEMI_ASSERT(bytes > 0 && reinterpret_cast<uintptr_t>(ptr) % kAlignment == 0,
              "mem_free of a block that mem_allocate did not return (", ptr, ", ", bytes, " bytes)");
  internal::SizeClass sc = internal::size_class(bytes);
  Allocator& a = allocator();
  int c = static_cast<int>(cat);
  std::lock_guard<std::mutex> lock(a.mu);
  a.stats.current[c] -= static_cast<int64_t>(bytes);
  a.stats.total_current -= static_cast<int64_t>(bytes);
  DEMI_ASSERT(a.stats.current[c] >= 0, "memory category ", mem_category_name(cat),
              " freed more than it allocated (mem_free with a wrong size or category)");
  if (a.rec.active) {
    auto it = a.rec.live.find(ptr);
    if (it != a.rec.live.end()) {
      a.rec.events[static_cast<size_t>(it->second)].end = a.rec.clock++;
      a.rec.live.erase(it);
    }
  }
  if (a.in_arena(ptr)) {
    const int32_t i = a.arena.alive_at(static_cast<char*>(ptr) - a.arena.base);
    DEMI_ASSERT(i >= 0, "mem_free of an arena block that is not alive (", ptr, ")");
    a.arena.alive[static_cast<size_t>(i)] = 0;
    --a.arena.live_count;
    a.arena.live_bytes -= static_cast<int64_t>(bytes);
    DEMI_POISON(ptr, bytes);
    return;
  }
  DEMI_POISON(ptr, sc.bytes);
  try {
    a.free_lists[sc.index].push_back(ptr);
  } catch (const std::bad_alloc&) {
    // Out of memory for the free list itself (mem_free runs in destructors, where a throw would abort the
    // process): the block goes back to the system instead of into the cache.
    DEMI_UNPOISON(ptr, sc.bytes);
    a.system_free(ptr, sc.bytes);
    return;
  }
  a.stats.cached_free += static_cast<int64_t>(sc.bytes);
}

bool mem_record_begin() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  DEMI_CHECK(!t_recording && !t_replaying, "mem_record_begin: this thread is already ",
             t_recording ? "recording" : "replaying a plan");
  if (a.rec.active) return false;  // another thread's recording
  a.rec = {};
  a.rec.active = true;
  t_recording = true;
  return true;
}

std::vector<AllocationEvent> mem_record_end() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  DEMI_CHECK(a.rec.active && t_recording, "mem_record_end: this thread has no recording in progress");
  std::vector<AllocationEvent> events = std::move(a.rec.events);
  a.rec = {};
  t_recording = false;
  return events;
}

void mem_set_replay_locator(ReplayLocator locate) { allocator().replay_locator.store(locate); }

bool mem_replay_begin(const ArenaPlan& plan) {
  const size_t n = plan.bytes.size();
  DEMI_CHECK(plan.categories.size() == n && plan.offsets.size() == n && plan.must_be_free.size() == n &&
                 plan.arena_bytes >= 0,
             "mem_replay_begin: an inconsistent plan (", n, " sizes, ", plan.categories.size(), " categories, ",
             plan.offsets.size(), " offsets, ", plan.must_be_free.size(), " conflict lists, arena ",
             plan.arena_bytes, " bytes)");
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  DEMI_CHECK(!t_replaying && !t_recording, "mem_replay_begin: this thread is already ",
             t_replaying ? "replaying a plan" : "recording");
  if (a.arena.live_count > 0 || a.arena.plan != nullptr) return false;  // in use, or another thread's replay
  const auto need = static_cast<size_t>(plan.arena_bytes);
  if (need > a.arena.bytes) {
    a.release_arena();
    // Whole 64 KiB units (aligned_alloc wants a multiple of the alignment; large ones are mmapped).
    const size_t bytes = (need + 65535) & ~size_t{65535};
    void* p = a.system_alloc(bytes);
    if (!p) {
      a.empty_cache();
      p = a.system_alloc(bytes);
    }
    DEMI_CHECK(p != nullptr, "out of memory: could not reserve the ", human_bytes(static_cast<int64_t>(bytes)),
               " arena of a static memory plan (tracked in use: ", human_bytes(a.stats.total_current), ")");
    a.arena.base = static_cast<char*>(p);
    a.arena.bytes = bytes;
    a.stats.arena = static_cast<int64_t>(bytes);
    DEMI_POISON(p, bytes);
  }
  a.arena.plan = &plan;
  a.arena.alive.assign(n, 0);
  a.arena.index_blocks(plan);
  a.arena.next = 0;
  a.arena.out = {};
  t_replaying = true;
  return true;
}

ReplayOutcome mem_replay_end() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  DEMI_CHECK(t_replaying && a.arena.plan != nullptr, "mem_replay_end: this thread is not replaying a plan");
  ReplayOutcome out = std::move(a.arena.out);
  if (!out.diverged && a.arena.next < a.arena.plan->bytes.size()) out.incomplete = true;
  a.arena.plan = nullptr;
  a.arena.out = {};
  t_replaying = false;
  return out;
}

int64_t mem_arena_live_bytes() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  return a.arena.live_bytes;
}

MemStats mem_stats() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  return a.stats;
}

void mem_reset_peak() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  a.stats.peak = a.stats.current;
  a.stats.total_peak = a.stats.total_current;
  a.stats.at_peak = a.stats.current;
  a.stats.train_peak = a.stats.total_current - a.stats.cur(MemCategory::kData);
  a.stats.at_train_peak = without_data(a.stats.current);
  a.stats.tuning_peak = 0;
}

void mem_empty_cache() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  a.empty_cache();
}

void mem_release_arena() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  if (a.arena.live_count == 0 && a.arena.plan == nullptr) a.release_arena();
}

int64_t process_rss_bytes() { return proc_status_kb("VmRSS"); }
int64_t process_peak_rss_bytes() { return proc_status_kb("VmHWM"); }

std::string mem_report() {
  MemStats s = mem_stats();
  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "%-16s %14s %14s\n", "memory", "current", "peak");
  out += line;
  for (int c = 0; c < kNumMemCategories; ++c) {
    std::snprintf(line, sizeof line, "%-16s %14s %14s\n", mem_category_name(static_cast<MemCategory>(c)),
                  human_bytes(s.current[c]).c_str(), human_bytes(s.peak[c]).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "%-16s %14s %14s\n", "total", human_bytes(s.total_current).c_str(),
                human_bytes(s.total_peak).c_str());
  out += line;
  std::snprintf(line, sizeof line, "cache: %s free of %s reserved; %" PRId64 " system allocations, %" PRId64
                " allocations (%" PRId64 " from the cache)\n",
                human_bytes(s.cached_free).c_str(), human_bytes(s.reserved).c_str(), s.system_allocs, s.allocs,
                s.cache_hits);
  out += line;
  if (s.arena > 0) {
    std::snprintf(line, sizeof line, "graph arena: %s reserved; %" PRId64 " allocations served from it\n",
                  human_bytes(s.arena).c_str(), s.arena_allocs);
    out += line;
  }
  int64_t rss = process_rss_bytes();
  int64_t hwm = process_peak_rss_bytes();
  std::snprintf(line, sizeof line, "process RSS: %s (peak %s)\n", rss < 0 ? "n/a" : human_bytes(rss).c_str(),
                hwm < 0 ? "n/a" : human_bytes(hwm).c_str());
  out += line;
  return out;
}

ScopedPeak::ScopedPeak() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  id_ = a.next_scope_id++;
  const int64_t train = a.stats.total_current - a.stats.cur(MemCategory::kData);
  a.scopes.push_back({id_, a.stats.current, a.stats.total_current, a.stats.current, train, a.stats.current});
}

ScopedPeak::~ScopedPeak() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  for (size_t i = 0; i < a.scopes.size(); ++i) {
    if (a.scopes[i].id == id_) {
      a.scopes.erase(a.scopes.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
}

MemStats ScopedPeak::peak() const {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  MemStats s = a.stats;
  for (const ScopeEntry& e : a.scopes) {
    if (e.id == id_) {
      s.peak = e.peak;
      s.total_peak = e.total_peak;
      s.at_peak = e.at_peak;
      s.train_peak = e.train_peak;
      s.at_train_peak = e.at_train_peak;
      return s;
    }
  }
  DEMI_ASSERT(false, "ScopedPeak ", id_, " is not registered");
  return s;
}

MemTuningScope::MemTuningScope() {
  if (t_tuning++ > 0) return;
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  if (a.tuning.depth++ > 0) return;  // another thread's trial runs began first: theirs is the snapshot
  a.tuning.saved = a.stats;
  a.tuning.saved_scopes = a.scopes;
  a.tuning.base = a.tuning.high = a.stats.total_current;
}

MemTuningScope::~MemTuningScope() {
  if (--t_tuning > 0) return;
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  if (--a.tuning.depth > 0) return;
  a.stats.tuning_peak = std::max(a.stats.tuning_peak, a.tuning.high - a.tuning.base);
  const MemStats& s = a.tuning.saved;
  a.stats.peak = s.peak;
  a.stats.total_peak = s.total_peak;
  a.stats.at_peak = s.at_peak;
  a.stats.train_peak = s.train_peak;
  a.stats.at_train_peak = s.at_train_peak;
  for (ScopeEntry& e : a.scopes)  // windows opened inside the scope keep what they saw
    for (const ScopeEntry& before : a.tuning.saved_scopes)
      if (before.id == e.id) e = before;
  a.tuning.saved_scopes.clear();
  a.raise_peaks(0, kNumMemCategories);  // blocks that outlived the trial runs count from now on
}

MemCategory current_mem_category() { return t_category; }

MemCategoryScope::MemCategoryScope(MemCategory c) : saved_(t_category) { t_category = c; }
MemCategoryScope::~MemCategoryScope() { t_category = saved_; }

}  // namespace demi
