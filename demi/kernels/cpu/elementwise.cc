#include "demi/kernels/cpu/elementwise.h"

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/elementwise_impl.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"

namespace demi::kernels {
namespace cpu_internal {

const ElementwiseKernels& elementwise_kernels_scalar() {
  static const ElementwiseKernels k = make_elementwise_kernels<VecScalar>();
  return k;
}

}  // namespace cpu_internal

namespace {

using cpu_internal::BroadcastPlan;

const cpu_internal::ElementwiseKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<ElementwiseKernels> table{DEMI_KERNEL_TABLE_ENTRIES(elementwise)};
  return table.get();
}

void check_dtype(std::string_view op, DType dtype) {
  DEMI_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF64, op,
             ": expected a floating dtype (float32, bfloat16, float16, float64), got ", dtype_name(dtype));
}

// Drops size-1 output dims and merges neighbours that both inputs traverse contiguously (or both skip).
BroadcastPlan make_plan(std::span<const int64_t> a, std::span<const int64_t> b, const Shape& out) {
  const int rank = out.rank();
  int64_t a_pad[Shape::kMaxRank], b_pad[Shape::kMaxRank];
  for (int i = 0; i < rank; ++i) {
    int lead_a = rank - static_cast<int>(a.size()), lead_b = rank - static_cast<int>(b.size());
    a_pad[i] = i >= lead_a ? a[static_cast<size_t>(i - lead_a)] : 1;
    b_pad[i] = i >= lead_b ? b[static_cast<size_t>(i - lead_b)] : 1;
  }
  BroadcastPlan plan;
  int n = 0;
  int64_t sa = 1, sb = 1;  // contiguous strides of a and b at dim i
  int64_t dims[Shape::kMaxRank], as[Shape::kMaxRank], bs[Shape::kMaxRank];
  for (int i = rank - 1; i >= 0; --i) {  // innermost first
    if (out[i] != 1) {
      dims[n] = out[i];
      as[n] = a_pad[i] == 1 ? 0 : sa;
      bs[n] = b_pad[i] == 1 ? 0 : sb;
      ++n;
    }
    sa *= a_pad[i];
    sb *= b_pad[i];
  }
  if (n == 0) return plan;  // one element: {1}, strides {1}
  // Merge from the inside out: dim k (outer) joins the merged dim m (inner) when stride_k == stride_m * size_m.
  int m = 0;
  int64_t md[Shape::kMaxRank] = {dims[0]}, ma[Shape::kMaxRank] = {as[0]}, mb[Shape::kMaxRank] = {bs[0]};
  for (int k = 1; k < n; ++k) {
    if (as[k] == ma[m] * md[m] && bs[k] == mb[m] * md[m]) {
      md[m] *= dims[k];
    } else {
      ++m;
      md[m] = dims[k];
      ma[m] = as[k];
      mb[m] = bs[k];
    }
  }
  plan.rank = m + 1;
  for (int k = 0; k <= m; ++k) {  // back to outermost-first
    plan.dims[m - k] = md[k];
    plan.a_stride[m - k] = ma[k];
    plan.b_stride[m - k] = mb[k];
  }
  return plan;
}

}  // namespace

void binary(BinaryOp op, DType dtype, const void* a, std::span<const int64_t> a_shape, const void* b,
            std::span<const int64_t> b_shape, void* out) {
  check_dtype(binary_op_name(op), dtype);
  Shape out_shape = broadcast_shape(a_shape, b_shape, binary_op_name(op));
  if (out_shape.numel() == 0) return;
  if (dtype == DType::kF64)
    return ref::binary(op, static_cast<const double*>(a), a_shape, static_cast<const double*>(b), b_shape,
                       static_cast<double*>(out));
  kernels().binary(op, dtype, make_plan(a_shape, b_shape, out_shape), a, b, out);
}

void unary(UnaryOp op, DType dtype, const void* x, void* y, int64_t n) {
  check_dtype(unary_op_name(op), dtype);
  if (n <= 0) return;
  if (dtype == DType::kF64) return ref::unary(op, static_cast<const double*>(x), static_cast<double*>(y), n);
  kernels().unary(op, dtype, x, y, n);
}

void affine(DType dtype, const void* x, double alpha, double beta, void* y, int64_t n) {
  check_dtype("affine", dtype);
  if (n <= 0) return;
  if (dtype == DType::kF64)
    return ref::affine(static_cast<const double*>(x), alpha, beta, static_cast<double*>(y), n);
  kernels().affine(dtype, x, static_cast<float>(alpha), static_cast<float>(beta), y, n);
}

void axpy(DType dtype, int64_t n, double alpha, const void* x, void* y) {
  check_dtype("axpy", dtype);
  if (n <= 0) return;
  if (dtype == DType::kF64) return ref::axpy(n, alpha, static_cast<const double*>(x), static_cast<double*>(y));
  kernels().axpy(dtype, n, static_cast<float>(alpha), x, y);
}

}  // namespace demi::kernels
