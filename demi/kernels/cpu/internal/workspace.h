// Scratch memory for the portable kernel dispatchers: taken from the tracked, caching allocator under
// MemCategory::kWorkspace (never new/malloc, so the tracker sees it and steady-state steps reuse it).
// Portable code only: an ISA file must not instantiate this class's inline members.
#pragma once

#include <cstddef>

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

}  // namespace demi::kernels::cpu_internal
