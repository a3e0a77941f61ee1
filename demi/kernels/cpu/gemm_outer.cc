#include "demi/kernels/cpu/gemm_outer.h"

#include <algorithm>

#include "demi/core/convert.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/gemm_outer_impl.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"
#include "demi/kernels/cpu/internal/workspace.h"

namespace demi::kernels {
namespace cpu_internal {

const GemmOuterKernels& gemm_outer_kernels_scalar() {
  static const GemmOuterKernels k = make_gemm_outer_kernels<VecScalar>();
  return k;
}

}  // namespace cpu_internal

namespace cpu {
namespace {

using cpu_internal::element_at;
using cpu_internal::is_f32_or_low;
using cpu_internal::kOuterRows;

const cpu_internal::GemmOuterKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<GemmOuterKernels> table{DEMI_KERNEL_TABLE_ENTRIES(gemm_outer)};
  return table.get();
}

// Columns a thread takes at a time: a multiple of every variant's vector width.
constexpr int64_t kColumnUnit = 16;

// Rows of op(a)'s f32 copy: M rounded up to whole groups of kOuterRows.
int64_t rows_of(const MatmulParams& p) { return (p.m + kOuterRows - 1) / kOuterRows * kOuterRows; }

// One (batch-1) product. a32: room for op(a) in f32 (rows_of(p) x K) and for a's values as stored, widened (M
// x K); bias32: N values or null.
void product(const MatmulParams& p, const void* a, const void* b, void* c, const float* bias32, float* a32,
             float* row_sums) {
  const int64_t M = p.m, N = p.n, K = p.k, rows = rows_of(p);
  // op(a) as f32 in groups of kOuterRows rows, each group (K, kOuterRows) (OuterProduct::a; zero past M).
  float* t = a32 + rows * K;
  convert(a, p.a_dtype, t, DType::kF32, M * K);
  std::fill(a32, a32 + rows * K, 0.0f);
  const auto at = [&](int64_t i, int64_t k) { return t[p.trans_a ? k * M + i : i * K + k]; };
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) a32[(i / kOuterRows * K + k) * kOuterRows + i % kOuterRows] = at(i, k);
  if (row_sums)  // (k ascending, in f32)
    for (int64_t i = 0; i < M; ++i) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += at(i, k);
      row_sums[i] = s;
    }
  cpu_internal::OuterProduct q;
  q.m = M;
  q.n = N;
  q.k = K;
  q.a = a32;
  q.b = b;
  q.b_dtype = p.b_dtype;
  q.b_round = p.b_round;
  q.c = c;
  q.c_dtype = p.c_dtype;
  q.bias = bias32;
  q.accumulate = p.accumulate;
  q.relu = p.relu;
  const cpu_internal::GemmOuterKernels& kern = kernels();
  const int64_t units = (N + kColumnUnit - 1) / kColumnUnit;
  const int64_t parts = M * N * K >= (int64_t{1} << 16) ? cpu_internal::parts_for(units) : 1;
  cpu_internal::for_each_part(parts, units, [&](int64_t, int64_t u0, int64_t u1) {
    kern.columns(q, u0 * kColumnUnit, std::min(N, u1 * kColumnUnit));
  });
}

}  // namespace

bool gemm_outer_supported(const MatmulParams& p) {
  return !p.trans_b && p.k >= 1 && p.k <= kOuterMaxK && p.m >= 1 && p.n >= 1 && p.m * p.k <= kOuterMaxA &&
         is_f32_or_low(p.a_dtype) && is_f32_or_low(p.b_dtype) && is_f32_or_low(p.c_dtype) &&
         (p.bias == nullptr || is_f32_or_low(p.bias_dtype)) && p.a_round == DType::kF32 &&
         (p.b_round == DType::kF32 || p.b_dtype == DType::kF32) && p.residual == nullptr && !p.bf16_products &&
         (p.a_row_sums == nullptr || p.batch == 1);
}

void gemm_outer(const MatmulParams& p, const void* a, const void* b, void* c) {
  check_matmul_params(p, "gemm_outer");
  DEMI_CHECK(gemm_outer_supported(p), "gemm_outer: takes c = op(a) . b (b not transposed) with K <= ", kOuterMaxK,
             ", M x K <= ", kOuterMaxA,
             ", f32|bf16|f16 tensors, a as stored, no residual and exact products, got ", describe(p));
  // One block: op(a)'s f32 copy and a's widened values (product()), then the bias in f32.
  const int64_t a_floats = (rows_of(p) + p.m) * p.k;
  const cpu_internal::Workspace scratch(static_cast<size_t>(a_floats + (p.bias ? p.n : 0)) * sizeof(float));
  float* bias32 = p.bias ? scratch.f32() + a_floats : nullptr;
  if (p.bias) convert(p.bias, p.bias_dtype, bias32, DType::kF32, p.n);
  const int64_t sa = p.m * p.k, sb = p.k * p.n, sc = p.m * p.n;
  for (int64_t i = 0; i < p.batch; ++i)
    product(p, element_at(a, i * sa, p.a_dtype), element_at(b, i * sb, p.b_dtype), element_at(c, i * sc, p.c_dtype),
            bias32, scratch.f32(), p.a_row_sums);
}

std::string gemm_outer_implementation() { return str_cat("demi-outer:", kernels().name); }

}  // namespace cpu
}  // namespace demi::kernels
