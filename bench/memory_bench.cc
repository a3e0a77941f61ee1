// Page faults and system allocations of a training-like allocate/free loop: demi's caching allocator
// against plain malloc/free.
//
// One iteration allocates the buffers of one training step (activations, gradients and workspaces of
// reference models A and B, from a few bytes to 20 MiB, ~90 MiB in all), touches every page of each, and
// frees them all, as a step does. After warm-up, demi serves every block from its cache: 0 faults and 0
// system allocations per iteration.
//
// glibc's malloc faults on the same pages every step: blocks above its mmap threshold (128 KiB at
// first) are fresh mmaps, unmapped at free; freeing such a block raises the threshold (up to 32 MiB), so
// after warm-up the big blocks come from the heap instead — and when a step frees them all, the free top
// of the heap exceeds the trim threshold (twice the mmap threshold) and is returned to the OS, to be
// grown back (brk) and faulted in again next step. BM_MallocTuned sets the environment that
// BENCHMARKS.md uses for PyTorch's best (MALLOC_MMAP_THRESHOLD_=32 MiB, MALLOC_TRIM_THRESHOLD_=1 GiB,
// MALLOC_TOP_PAD_=256 MiB) through mallopt; it runs last because mallopt is process-wide.
//
// Counters: faults/iter (getrusage minor faults), sys_allocs/iter (demi: its calls into mmap and
// aligned_alloc; malloc: the heap growing (brk) plus blocks glibc served with their own mmap), MiB/iter,
// and the time per iteration.
//
// Run: build/release/bench/memory_bench   (or `make bench`)
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "demi/core/memory.h"

namespace {

// One training step's buffers, in bytes: model A (batch 32) then model B (batch 128), f32 and bf16.
const std::vector<size_t> kStepSizes = {
    // A: input, conv out, relu out (+ bf16 copies), pool out + argmax, dense weight/grad, logits, grads
    393216, 3686400, 3686400, 1843200, 921600, 921600, 288000, 288000, 3456, 3456, 1280, 1280, 128, 40,
    // B: conv1/relu1 (f32 and bf16), pool1, conv2/relu2, pool2, dense1 in/out, im2col workspaces
    401408, 12845056, 12845056, 6422528, 3211264, 6422528, 6422528, 3211264, 1605632, 1605632, 1605632,
    65536, 1605632, 802816, 65536, 5120, 20971520, 1806336, 73728, 1152, 36864, 512,
};
constexpr size_t kPage = 4096;

int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

void touch(void* p, size_t n) {
  auto* c = static_cast<volatile char*>(p);
  for (size_t off = 0; off < n; off += kPage) c[off] = 1;
  c[n - 1] = 1;
}

// glibc marks a chunk that it obtained with its own mmap by bit 1 (IS_MMAPPED) of the size word just
// before the user pointer: each such chunk is one mmap now and one munmap at free.
bool glibc_mmapped(void* p) {
#if defined(__GLIBC__)
  size_t size_word;
  // Through an integer, so the compiler does not take it for an out-of-bounds access of p's block.
  std::memcpy(&size_word, reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) - sizeof(size_t)),
              sizeof(size_t));
  return (size_word & 2) != 0;
#else
  (void)p;
  return false;
#endif
}

struct Loop {
  std::vector<void*> ptrs = std::vector<void*>(kStepSizes.size());
  int64_t sys_allocs = 0;  // malloc only: mmapped chunks seen

  void demi_step() {
    for (size_t i = 0; i < kStepSizes.size(); ++i) {
      ptrs[i] = demi::mem_allocate(kStepSizes[i], demi::MemCategory::kActivation);
      touch(ptrs[i], kStepSizes[i]);
    }
    for (size_t i = 0; i < kStepSizes.size(); ++i) {
      demi::mem_free(ptrs[i], kStepSizes[i], demi::MemCategory::kActivation);
    }
  }

  void malloc_step() {
    for (size_t i = 0; i < kStepSizes.size(); ++i) {
      // 64-byte alignment, as demi gives (and as the kernels want).
      void* top = sbrk(0);  // glibc caches the break: no system call
      ptrs[i] = std::aligned_alloc(64, (kStepSizes[i] + 63) & ~size_t{63});
      if (glibc_mmapped(ptrs[i]) || sbrk(0) != top) ++sys_allocs;
      touch(ptrs[i], kStepSizes[i]);
    }
    for (void* p : ptrs) std::free(p);
  }
};

constexpr int kWarmup = 3;

void report(benchmark::State& state, int64_t faults, int64_t sys_allocs) {
  auto iters = static_cast<double>(state.iterations());
  state.counters["faults/iter"] = static_cast<double>(faults) / iters;
  state.counters["sys_allocs/iter"] = static_cast<double>(sys_allocs) / iters;
  size_t bytes = 0;
  for (size_t n : kStepSizes) bytes += n;
  state.counters["MiB/iter"] = static_cast<double>(bytes) / (1 << 20);
}

void BM_DemiAllocator(benchmark::State& state) {
  Loop loop;
  for (int i = 0; i < kWarmup; ++i) loop.demi_step();
  int64_t sys0 = demi::mem_stats().system_allocs;
  int64_t f0 = minor_faults();
  for (auto _ : state) loop.demi_step();
  report(state, minor_faults() - f0, demi::mem_stats().system_allocs - sys0);
}

void BM_Malloc(benchmark::State& state) {
  Loop loop;
  for (int i = 0; i < kWarmup; ++i) loop.malloc_step();
  loop.sys_allocs = 0;
  int64_t f0 = minor_faults();
  for (auto _ : state) loop.malloc_step();
  report(state, minor_faults() - f0, loop.sys_allocs);
}

void BM_MallocTuned(benchmark::State& state) {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 256 << 20);
  BM_Malloc(state);
}

BENCHMARK(BM_DemiAllocator)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Malloc)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_MallocTuned)->Unit(benchmark::kMicrosecond)->UseRealTime();  // last: mallopt is global

}  // namespace

BENCHMARK_MAIN();
