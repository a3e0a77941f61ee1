#include "demi/core/parallel.h"

#include <omp.h>
#include <sched.h>

#include <atomic>
#include <exception>
#include <mutex>

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

bool in_parallel_region() { return omp_in_parallel() != 0; }

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
  // An exception must not leave an OpenMP region (it would terminate the process): keep the first and
  // rethrow it on the calling thread.
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    int64_t t = omp_get_thread_num();
    int64_t nt = omp_get_num_threads();
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
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace internal
}  // namespace demi
