#include "demi/kernels/cpu/reduce.h"

#include <cstring>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/cpu/elementwise.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/checks.h"
#include "demi/kernels/cpu/internal/reduce_impl.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"

namespace demi::kernels {
namespace cpu_internal {

const ReduceKernels& reduce_kernels_scalar() {
  static const ReduceKernels k = make_reduce_kernels<VecScalar>();
  return k;
}

}  // namespace cpu_internal

namespace {

using cpu_internal::SumPlan;

const cpu_internal::ReduceKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<ReduceKernels> table{DEMI_KERNEL_TABLE_ENTRIES(reduce)};
  return table.get();
}

using cpu_internal::is_fast_float;

void check_dtypes(std::string_view op, DType x, DType y) {
  DEMI_CHECK(is_fast_float(x) || x == DType::kF64, op,
             ": expected x of a floating dtype (float32, bfloat16, float16, float64), got ", dtype_name(x));
  DEMI_CHECK(y == x || (y == DType::kF32 && x != DType::kF64), op, ": the result's dtype must be x's (",
             dtype_name(x), ") or float32, got ", dtype_name(y));
}

void check_view(std::string_view op, AxisView v) {
  DEMI_CHECK(v.outer >= 0 && v.axis >= 0 && v.inner >= 0, op, ": negative size in the view (outer ", v.outer,
             ", axis ", v.axis, ", inner ", v.inner, ")");
}

// dims (outermost first, contiguous) with flags -> coalesced plan without size-1 dims.
SumPlan make_plan(const int64_t* dims, const bool* reduced, int rank) {
  SumPlan plan;
  int64_t stride = 1;
  int n = 0;
  int64_t sz[cpu_internal::kMaxPlanRank], st[cpu_internal::kMaxPlanRank];
  bool rd[cpu_internal::kMaxPlanRank];
  for (int i = rank - 1; i >= 0; --i) {  // innermost first; contiguous, so equal flags always merge
    if (dims[i] != 1) {
      if (n > 0 && rd[n - 1] == reduced[i]) {
        sz[n - 1] *= dims[i];
      } else {
        sz[n] = dims[i];
        st[n] = stride;
        rd[n] = reduced[i];
        ++n;
      }
    }
    stride *= dims[i];
  }
  plan.rank = n;
  for (int k = 0; k < n; ++k) {
    plan.size[n - 1 - k] = sz[k];
    plan.stride[n - 1 - k] = st[k];
    plan.reduced[n - 1 - k] = rd[k];
  }
  return plan;
}

SumPlan view_plan(AxisView v) {
  int64_t dims[3] = {v.outer, v.axis, v.inner};
  bool reduced[3] = {false, true, false};
  return make_plan(dims, reduced, 3);
}

void fill_zero(void* y, DType t, int64_t n) {
  if (n > 0) std::memset(y, 0, static_cast<size_t>(n) * dtype_size(t));  // +0.0 is all-zero bits in every float
}

}  // namespace

void reduce_sum(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype) {
  check_dtypes("reduce_sum", x_dtype, y_dtype);
  check_view("reduce_sum", v);
  if (v.outer * v.inner == 0) return;
  if (v.axis == 0) return fill_zero(y, y_dtype, v.outer * v.inner);
  if (x_dtype == DType::kF64)
    return ref::reduce_sum(static_cast<const double*>(x), v, static_cast<double*>(y));
  kernels().sum(view_plan(v), x, x_dtype, y, y_dtype, 1.0f);
}

void reduce_mean(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype) {
  check_dtypes("reduce_mean", x_dtype, y_dtype);
  check_view("reduce_mean", v);
  DEMI_CHECK(v.axis > 0, "reduce_mean: the reduced axis is empty (outer ", v.outer, ", axis 0, inner ", v.inner, ")");
  if (v.outer * v.inner == 0) return;
  if (x_dtype == DType::kF64)
    return ref::reduce_mean(static_cast<const double*>(x), v, static_cast<double*>(y));
  kernels().sum(view_plan(v), x, x_dtype, y, y_dtype, 1.0f / static_cast<float>(v.axis));
}

void reduce_max(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype, int64_t* argmax) {
  check_dtypes("reduce_max", x_dtype, y_dtype);
  check_view("reduce_max", v);
  DEMI_CHECK(v.axis > 0, "reduce_max: the reduced axis is empty (outer ", v.outer, ", axis 0, inner ", v.inner, ")");
  DEMI_CHECK(v.axis <= INT32_MAX, "reduce_max: the axis has ", v.axis, " elements; at most ", INT32_MAX,
             " are supported");
  if (v.outer * v.inner == 0) return;
  if (x_dtype == DType::kF64)
    return ref::reduce_max(static_cast<const double*>(x), v, static_cast<double*>(y), argmax);
  kernels().max(x, x_dtype, v, y, y_dtype, argmax);
}

void sum_to_shape(DType dtype, const void* grad, std::span<const int64_t> grad_shape, void* out,
                  std::span<const int64_t> out_shape) {
  check_dtypes("sum_to_shape", dtype, dtype);
  DEMI_CHECK(grad_shape.size() <= static_cast<size_t>(cpu_internal::kMaxPlanRank) && broadcasts_to(out_shape, grad_shape),
             "sum_to_shape: shape ", shape_string(out_shape), " does not broadcast to the gradient's shape ",
             shape_string(grad_shape));
  int64_t out_n = 1, grad_n = 1;
  for (int64_t d : out_shape) out_n *= d;
  for (int64_t d : grad_shape) grad_n *= d;
  if (out_n == 0) return;
  if (grad_n == 0) return fill_zero(out, dtype, out_n);
  if (dtype == DType::kF64)
    return ref::sum_to_shape(static_cast<const double*>(grad), grad_shape, static_cast<double*>(out), out_shape);
  const int rank = static_cast<int>(grad_shape.size());
  const int lead = rank - static_cast<int>(out_shape.size());
  bool reduced[cpu_internal::kMaxPlanRank];
  for (int i = 0; i < rank; ++i) reduced[i] = i < lead || out_shape[static_cast<size_t>(i - lead)] == 1;
  kernels().sum(make_plan(grad_shape.data(), reduced, rank), grad, dtype, out, dtype, 1.0f);
}

}  // namespace demi::kernels
