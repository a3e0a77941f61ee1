// The one thread pool for all of demi's parallel loops: OpenMP, the same runtime (GNU libgomp) that
// Debian's oneDNN uses, so demi's loops and oneDNN's primitives share one set of worker threads and never
// oversubscribe the cores. The thread count defaults to every core and is set by set_num_threads (the
// execution context calls it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace demi {

int num_threads();
void set_num_threads(int n);  // n >= 1; also sets OpenMP's count, which oneDNN uses
int hardware_threads();       // cores available to this process (affinity mask)
bool in_parallel_region();

namespace internal {
// Runs fn(begin, end) over [0, n) split into at most num_threads() contiguous chunks.
void parallel_run(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* ctx);
}  // namespace internal

// Calls f(begin, end) on disjoint chunks covering [begin, end). Runs inline when the range is smaller
// than `grain` elements, when one thread is configured, or when already inside a parallel region.
// Chunks are contiguous and their boundaries depend only on the range and the thread count.
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) {
  int64_t n = end - begin;
  if (n <= 0) return;
  if (n <= grain || num_threads() == 1 || in_parallel_region()) {
    f(begin, end);
    return;
  }
  struct Ctx {
    std::remove_reference_t<F>* f;
    int64_t base;
  } ctx{&f, begin};
  internal::parallel_run(
      n, grain,
      [](void* p, int64_t b, int64_t e) {
        auto* c = static_cast<Ctx*>(p);
        (*c->f)(c->base + b, c->base + e);
      },
      &ctx);
}

}  // namespace demi
