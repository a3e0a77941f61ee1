// What the fused attention kernels (attention_amx.h) take, decided in portable code: any CPU may ask; only
// the amx level runs them (attention_amx.cc, compiled for AMX).
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/cpu/attention_amx.h"

namespace demi::kernels::cpu {

namespace cpu_internal_amx {
void attention_tiles_forward_body(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                                  const float* mask, void* probs, void* out);
void attention_tiles_backward_body(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                                   const void* probs, const void* dout, void* dq, void* dk, void* dv);
}  // namespace cpu_internal_amx

namespace {
// One matrix's f32 scores held by a thread: what stays in a core's L2 beside the operands.
constexpr int64_t kMaxScoreBytes = int64_t{256} << 10;
}  // namespace

bool attention_tiles_supported(const AttentionCoreParams& p) {
  const AttentionSoftmaxParams& s = p.softmax;
  return cpu_level() >= CpuLevel::kAmx && (p.dtype == DType::kBF16 || p.dtype == DType::kF16) && s.batch >= 1 && s.heads >= 1 && s.batch % s.heads == 0 && s.rows >= 1 &&
         s.cols >= 1 && p.dk >= 1 && p.dv >= 1 && s.scale > 0.0f && s.rows * s.cols * 4 <= kMaxScoreBytes &&
         (!p.packed_heads || (s.rows == s.cols && p.dk == p.dv));
}

void attention_tiles_forward(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                             const float* mask, void* probs, void* out) {
  DEMI_ASSERT(attention_tiles_supported(p), "attention_tiles_forward: not a fused attention here");
  cpu_internal_amx::attention_tiles_forward_body(p, q, k, v, mask, probs, out);
}

void attention_tiles_backward(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                              const void* probs, const void* dout, void* dq, void* dk, void* dv) {
  DEMI_ASSERT(attention_tiles_supported(p), "attention_tiles_backward: not a fused attention here");
  cpu_internal_amx::attention_tiles_backward_body(p, q, k, v, probs, dout, dq, dk, dv);
}

}  // namespace demi::kernels::cpu
