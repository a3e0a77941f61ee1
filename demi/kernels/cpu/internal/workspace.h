// Scratch memory for the portable kernel dispatchers: taken from the tracked, caching allocator under
// MemCategory::kWorkspace (never new/malloc, so the tracker sees it and steady-state steps reuse it); and
// element addressing in untyped buffers. Portable code only: an ISA file must not instantiate these
// inline functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/memory.h"

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

}  // namespace demi::kernels::cpu_internal
