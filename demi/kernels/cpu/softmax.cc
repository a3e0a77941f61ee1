#include "demi/kernels/cpu/softmax.h"

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/softmax_impl.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"
#include "demi/kernels/reference/softmax.h"

namespace demi::kernels {
namespace cpu_internal {

const SoftmaxKernels& softmax_kernels_scalar() {
  static const SoftmaxKernels k = make_softmax_kernels<VecScalar>();
  return k;
}

}  // namespace cpu_internal

namespace {

const cpu_internal::SoftmaxKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<SoftmaxKernels> table{DEMI_KERNEL_TABLE_ENTRIES(softmax)};
  return table.get();
}

// in: the input's dtype (x, or dx); out: the output's (y, or y/dy in backward).
void check(std::string_view op, DType in, DType out, AxisView v) {
  bool fast = in == DType::kF32 || in == DType::kBF16 || in == DType::kF16;
  DEMI_CHECK(fast || in == DType::kF64, op,
             ": expected logits of a floating dtype (float32, bfloat16, float16, float64), got ", dtype_name(in));
  DEMI_CHECK(out == in || (out == DType::kF32 && fast), op, ": the probabilities' dtype must be the logits' (",
             dtype_name(in), ") or float32, got ", dtype_name(out));
  DEMI_CHECK(v.outer >= 0 && v.axis >= 1 && v.inner >= 0, op, ": expected a non-empty axis, got outer ", v.outer,
             ", axis ", v.axis, ", inner ", v.inner);
}

}  // namespace

void softmax_forward(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype) {
  check("softmax", x_dtype, y_dtype, v);
  if (v.numel() == 0) return;
  if (x_dtype == DType::kF64)
    return ref::softmax_forward(static_cast<const double*>(x), v, static_cast<double*>(y));
  kernels().forward(x, x_dtype, v, y, y_dtype, false);
}

void log_softmax_forward(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype) {
  check("log_softmax", x_dtype, y_dtype, v);
  if (v.numel() == 0) return;
  if (x_dtype == DType::kF64)
    return ref::log_softmax_forward(static_cast<const double*>(x), v, static_cast<double*>(y));
  kernels().forward(x, x_dtype, v, y, y_dtype, true);
}

void softmax_backward(const void* y, const void* dy, DType y_dtype, AxisView v, void* dx, DType dx_dtype) {
  check("softmax_backward", dx_dtype, y_dtype, v);
  if (v.numel() == 0) return;
  if (dx_dtype == DType::kF64)
    return ref::softmax_backward(static_cast<const double*>(y), static_cast<const double*>(dy), v,
                                 static_cast<double*>(dx));
  kernels().backward(y, dy, y_dtype, v, dx, dx_dtype, false);
}

void log_softmax_backward(const void* y, const void* dy, DType y_dtype, AxisView v, void* dx, DType dx_dtype) {
  check("log_softmax_backward", dx_dtype, y_dtype, v);
  if (v.numel() == 0) return;
  if (dx_dtype == DType::kF64)
    return ref::log_softmax_backward(static_cast<const double*>(y), static_cast<const double*>(dy), v,
                                     static_cast<double*>(dx));
  kernels().backward(y, dy, y_dtype, v, dx, dx_dtype, true);
}

}  // namespace demi::kernels
