// What the oneDNN-backed kernels share: the engine, a stream per thread, dtype mapping, tracked scratch
// memory, and the operand plumbing that moves between demi's plain tensors (NCHW / row-major, any of
// f32|bf16|f16) and the memory a primitive wants (its compute dtype, possibly a blocked layout).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "demi/core/dtype.h"
#include "demi/core/memory.h"

namespace demi::kernels::onednn::internal {

dnnl::engine& cpu_engine();
// The ISA oneDNN's kernels use here (capped by DEMI_CPU_LEVEL: see onednn_util.cc), and whether it has bf16
// kernels (avx512_core and above; an AVX2 CPU has none, and a bf16 primitive cannot be created there).
dnnl::cpu_isa effective_isa();
bool has_bf16_kernels();
// oneDNN CPU streams execute synchronously; one per thread keeps concurrent callers independent.
dnnl::stream& thread_stream();

// f32 and bf16 map to oneDNN's types. oneDNN 2.6 has no f16 CPU kernels (primitive creation fails even
// on a CPU with AVX512-FP16), so f16 never reaches a primitive: callers convert it to f32 first.
dnnl::memory::data_type to_dnnl(DType t);

// The dtype a primitive computes in for two input operands: bf16 when both are bf16 and oneDNN has bf16
// kernels here (AMX / AVX512-BF16 / AVX-512), f32 otherwise (mixed inputs are promoted, f16 is converted,
// bf16 widened where oneDNN has no bf16 kernel).
DType compute_dtype(DType a, DType b);
// The dtype a primitive computing in `compute` writes for a caller that wants `want`: `want` itself when
// oneDNN writes it directly (f32 always, bf16 from bf16 compute), f32 otherwise (converted afterwards).
DType primitive_out_dtype(DType compute, DType want);

// Scratch memory from demi's tracker (MemCategory::kWorkspace), returned when the object dies, so the
// caching allocator reuses it across calls and peak memory counts it.
class Workspace {
 public:
  Workspace() = default;
  explicit Workspace(size_t bytes)
      : ptr_(bytes ? mem_allocate(bytes, MemCategory::kWorkspace) : nullptr), bytes_(bytes) {}
  ~Workspace() { reset(); }
  Workspace(Workspace&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  Workspace& operator=(Workspace&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void reset() {
    if (ptr_) mem_free(ptr_, bytes_, MemCategory::kWorkspace);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A memory object over a caller's pointer (oneDNN never frees it).
inline dnnl::memory make_memory(const dnnl::memory::desc& md, const void* p) {
  return dnnl::memory(md, cpu_engine(), const_cast<void*>(p));
}

// An attribute with a user-managed scratchpad (demi allocates it from the tracker per call).
dnnl::primitive_attr user_scratchpad_attr();

// One tensor a primitive reads: the caller's plain memory is converted (f16 -> f32, by demi::convert)
// and/or reordered (dtype and layout, by a cached oneDNN reorder) into what the primitive wants.
struct InputPlan {
  dnnl::memory::desc user_md;  // plain layout; dtype f32 or bf16 (an f16 caller is converted to f32 first)
  dnnl::memory::desc prim_md;  // what the primitive reads
  bool from_f16 = false;
  std::optional<dnnl::reorder> reorder;  // user_md -> prim_md, when they differ
  size_t scratch_bytes = 0;
};

// One tensor a primitive writes: straight into the caller's memory when the layout and dtype match and
// nothing is accumulated; else into a workspace, then reordered (with a sum post-op to accumulate) into
// the caller's plain memory, through an f32 buffer and demi::convert for an f16 caller.
struct OutputPlan {
  dnnl::memory::desc plain_md;  // plain layout in the caller's dtype, f32 for an f16 caller
  dnnl::memory::desc prim_md;   // what the primitive writes
  bool to_f16 = false;
  bool accumulate = false;
  std::optional<dnnl::reorder> reorder;  // prim_md -> plain_md, when they differ or to accumulate
  size_t scratch_bytes = 0;
  bool direct() const { return !to_f16 && !reorder; }
};

// plain_md: the caller's layout (its dtype is replaced by `user`'s, f32 for an f16 caller).
InputPlan plan_input(const dnnl::memory::desc& plain_md, DType user, const dnnl::memory::desc& prim_md);
OutputPlan plan_output(const dnnl::memory::desc& plain_md, DType user, const dnnl::memory::desc& prim_md,
                       bool accumulate);

// The plain memory descriptor `md` with its dtype replaced.
dnnl::memory::desc with_dtype(const dnnl::memory::desc& md, dnnl::memory::data_type t);

// Per-call state: keeps every workspace alive until the call ends and runs the plans.
class CallContext {
 public:
  explicit CallContext(size_t scratch_bytes) : scratch_(scratch_bytes) {}

  // Returns a pointer to `user`'s data in plan.prim_md (the caller's pointer itself when nothing changes).
  const void* input(const InputPlan& plan, const void* user, int64_t numel);
  // Returns where the primitive must write; finish_output() then moves it into `user`.
  void* output(const OutputPlan& plan, void* user, int64_t numel);
  void finish_output(const OutputPlan& plan, void* prim_dst, void* user, int64_t numel);
  // A workspace of `bytes` that lives until the call ends (or release_to() a mark taken before it).
  void* scratch_buffer(size_t bytes);
  // The buffers made so far; release_to(mark) frees every one made after it (a chunked call reuses its
  // memory from chunk to chunk).
  size_t mark() const { return buffers_.size(); }
  void release_to(size_t mark) { buffers_.erase(buffers_.begin() + static_cast<std::ptrdiff_t>(mark), buffers_.end()); }
  // Grows the primitive scratchpad to at least `bytes` (a later primitive of the call needs more).
  void ensure_scratch(size_t bytes) {
    if (bytes > scratch_.bytes()) scratch_ = Workspace(bytes);
  }

  // Runs `prim` with `args` plus the call's scratchpad.
  void execute(const dnnl::primitive& prim, std::unordered_map<int, dnnl::memory> args);

 private:
  Workspace scratch_;
  std::vector<Workspace> buffers_;
};

// A caller's f16 or bf16 operand widened to f32 in a workspace of ctx (demi::convert: F16C / AVX-512
// variants, parallel on demi's pool); f32 comes back as is.
const float* to_f32(CallContext& ctx, const void* src, DType t, int64_t n);

// A zeroed scratch operand, for the diagnostics that measure a choice without operands of their own.
Workspace zeroed(size_t bytes);

// 1 where run(true) (demi's way of making a call) is preferred to run(false) (oneDNN's) by
// demi_kernel_preferred (conv.h), each time priced by the workspace it holds against the call's footprint
// (the bytes its operands and results occupy): what the per-shape choices between the two measure.
int demi_measures_faster(const std::function<void(bool)>& run, int64_t footprint);

}  // namespace demi::kernels::onednn::internal
