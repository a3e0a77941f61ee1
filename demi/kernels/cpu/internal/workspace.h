// Scratch memory for the portable kernel dispatchers: taken from the tracked, caching allocator under
// MemCategory::kWorkspace (never new/malloc, so the tracker sees it and steady-state steps reuse it); and
// element addressing in untyped buffers. Portable code only: an ISA file must not instantiate these
// inline functions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/memory.h"
#include "demi/core/parallel.h"

namespace demi::kernels::cpu_internal {

class Workspace {
 public:
  explicit Workspace(size_t bytes) : bytes_(bytes), ptr_(bytes ? mem_allocate(bytes, MemCategory::kWorkspace) : nullptr) {}
  ~Workspace() {
    if (ptr_) mem_free(ptr_, bytes_, MemCategory::kWorkspace);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  float* f32() const { return static_cast<float*>(ptr_); }

 private:
  size_t bytes_;
  void* ptr_;
};

// Element i of an untyped buffer of dtype t.
inline const char* element_at(const void* base, int64_t i, DType t) {
  return static_cast<const char*>(base) + i * static_cast<int64_t>(dtype_size(t));
}
inline char* element_at(void* base, int64_t i, DType t) {
  return static_cast<char*>(base) + i * static_cast<int64_t>(dtype_size(t));
}

// The storage dtypes the fast kernels take: f32, bf16, f16 (f64 runs the reference).
inline bool is_f32_or_low(DType t) { return t == DType::kF32 || is_low_precision(t); }

inline size_t bytes64(size_t b) { return (b + 63) / 64 * 64; }

// Every thread's scratch for one call, taken at once on the calling thread, for work split into one part per
// thread (for_each_part): scratch a worker took for itself would make the number of live blocks depend on
// whether the threads' parts happened to overlap in time, so that a later step could need a block no earlier
// one did (a system allocation in the steady state).
class PartScratch {
 public:
  PartScratch(int64_t parts, size_t bytes_each) : each_(bytes64(bytes_each)), ws_(static_cast<size_t>(parts) * each_) {}
  // Part t's scratch, carved by the caller in 64-byte multiples.
  char* part(int64_t t) const { return reinterpret_cast<char*>(ws_.f32()) + static_cast<size_t>(t) * each_; }

 private:
  size_t each_;
  Workspace ws_;
};

// As many parts as threads, at most n, at least 1.
inline int64_t parts_for(int64_t n) { return std::max<int64_t>(1, std::min<int64_t>(num_threads(), n)); }

// f(t, i0, i1) for each of `parts` contiguous parts of [0, n), one per thread.
template <class F>
void for_each_part(int64_t parts, int64_t n, F&& f) {
  parallel_for(0, parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) f(t, t * n / parts, (t + 1) * n / parts);
  });
}

}  // namespace demi::kernels::cpu_internal
