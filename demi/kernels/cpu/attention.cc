#include "demi/kernels/cpu/attention.h"

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/attention_impl.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"

namespace demi::kernels {
namespace cpu_internal {

const AttentionKernels& attention_kernels_scalar() {
  static const AttentionKernels k = make_attention_kernels<VecScalar>();
  return k;
}

}  // namespace cpu_internal

namespace {

const cpu_internal::AttentionKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<AttentionKernels> table{DEMI_KERNEL_TABLE_ENTRIES(attention)};
  return table.get();
}

void check(const char* op, DType s_dtype, DType p_dtype, const AttentionSoftmaxParams& p) {
  DEMI_CHECK(p.batch >= 0 && p.heads >= 1 && p.rows >= 0 && p.cols >= 1, op,
             ": expected (N, Sq, Sk) scores with Sk >= 1 and heads >= 1, got (", p.batch, ", ", p.rows, ", ", p.cols,
             ") with heads = ", p.heads);
  DEMI_CHECK(p.scale > 0.0f, op, ": scale must be positive, got ", p.scale);
  if (s_dtype == DType::kF64)
    DEMI_CHECK(p_dtype == DType::kF64, op, ": float64 scores give float64 probabilities, got ", dtype_name(p_dtype));
  else
    DEMI_CHECK(s_dtype == DType::kF32 &&
                   (p_dtype == DType::kF32 || p_dtype == DType::kBF16 || p_dtype == DType::kF16),
               op, ": expected float32 scores and float32, bfloat16 or float16 probabilities, got ",
               dtype_name(s_dtype), " -> ", dtype_name(p_dtype));
}

}  // namespace

void attention_softmax_forward(const void* s, DType s_dtype, const void* mask, const AttentionSoftmaxParams& p,
                               void* probs, DType p_dtype) {
  check("attention_softmax", s_dtype, p_dtype, p);
  if (s_dtype == DType::kF64)
    return ref::attention_softmax_forward(static_cast<const double*>(s), static_cast<const double*>(mask), p,
                                          static_cast<double*>(probs));
  kernels().forward(static_cast<const float*>(s), static_cast<const float*>(mask), p, probs, p_dtype);
}

void attention_softmax_backward(const void* probs, DType p_dtype, const void* dprobs, DType s_dtype,
                                const AttentionSoftmaxParams& p, void* ds) {
  check("attention_softmax_backward", s_dtype, p_dtype, p);
  if (s_dtype == DType::kF64)
    return ref::attention_softmax_backward(static_cast<const double*>(probs), static_cast<const double*>(dprobs), p,
                                           static_cast<double*>(ds));
  kernels().backward(probs, p_dtype, static_cast<const float*>(dprobs), p, ds);
}

}  // namespace demi::kernels
