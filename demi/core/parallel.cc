#include "demi/core/parallel.h"

#include <omp.h>
#include <sched.h>

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "demi/core/error.h"

namespace demi {
namespace {

std::atomic<int>& thread_slot() {
  static std::atomic<int> n{[] {
    int hw = hardware_threads();
    omp_set_num_threads(hw);
    return hw;
  }()};
  return n;
}

}  // namespace

int hardware_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  int n = omp_get_num_procs();
  return n > 0 ? n : 1;
}

int num_threads() { return thread_slot().load(std::memory_order_relaxed); }

void set_num_threads(int n) {
  DEMI_CHECK(n >= 1, "set_num_threads: expected a thread count >= 1, got ", n);
  thread_slot().store(n, std::memory_order_relaxed);
  omp_set_num_threads(n);
}

#ifdef DEMI_STD_THREAD_POOL
// The ThreadSanitizer build's pool (cmake/sanitizer_subsets.cmake): each parallel loop runs its chunks on
// std::threads started for it, the caller taking chunk 0, so that every synchronization is one TSan sees
// (it cannot see libgomp's barriers). Chunking is the same as the OpenMP pool's.
namespace {
thread_local bool t_in_parallel = false;
}  // namespace

bool in_parallel_region() { return t_in_parallel; }
#else
bool in_parallel_region() { return omp_in_parallel() != 0; }
#endif

namespace internal {

void parallel_run(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* ctx) {
  int64_t threads = num_threads();
  if (grain < 1) grain = 1;
  int64_t max_chunks = (n + grain - 1) / grain;
  if (max_chunks < threads) threads = max_chunks;
  if (threads <= 1) {
    fn(ctx, 0, n);
    return;
  }
  // An exception must not leave a parallel region (out of an OpenMP one it would terminate the process):
  // keep the first and rethrow it on the calling thread.
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run_chunk = [&](int64_t t, int64_t nt) {
    int64_t chunk = (n + nt - 1) / nt;
    int64_t b = t * chunk;
    int64_t e = b + chunk < n ? b + chunk : n;
    if (b < e) {
      try {
        fn(ctx, b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
#ifdef DEMI_STD_THREAD_POOL
  std::vector<std::thread> team;
  for (int64_t t = 1; t < threads; ++t)
    team.emplace_back([&, t] {
      t_in_parallel = true;
      run_chunk(t, threads);
    });
  t_in_parallel = true;
  run_chunk(0, threads);
  t_in_parallel = false;
  for (std::thread& th : team) th.join();
#else
#pragma omp parallel num_threads(static_cast<int>(threads))
  run_chunk(omp_get_thread_num(), omp_get_num_threads());
#endif
  if (error) std::rethrow_exception(error);
}

}  // namespace internal
}  // namespace demi
