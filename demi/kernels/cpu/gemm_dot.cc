#include "demi/kernels/cpu/gemm_dot.h"

#include <algorithm>
#include <cstring>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/gemm_dot_kernels.h"
#include "demi/kernels/cpu/internal/workspace.h"

namespace demi::kernels {
namespace cpu_internal {
namespace {

// The portable tile: the same sums one lane at a time (16 lane partials over k, then the lanes in order).
void tile_scalar(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, int mr, int nc, float* out) {
  for (int r = 0; r < mr; ++r)
    for (int j = 0; j < nc; ++j) {
      float lanes[16] = {};
      for (int64_t kk = 0; kk < k; ++kk) lanes[kk % 16] += a[r * lda + kk] * b[j * ldb + kk];
      float s = 0.0f;
      for (float l : lanes) s += l;
      out[r * nc + j] = s;
    }
}

}  // namespace

const GemmDotKernels& gemm_dot_kernels_scalar() {
  static const GemmDotKernels k{"scalar", tile_scalar};
  return k;
}

}  // namespace cpu_internal

namespace cpu {
namespace {

using cpu_internal::element_at;
using cpu_internal::is_f32_or_low;
using cpu_internal::kDotTileN;
using cpu_internal::bytes64;
using cpu_internal::Workspace;

const cpu_internal::GemmDotKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<GemmDotKernels> table{DEMI_KERNEL_TABLE_ENTRIES(gemm_dot)};
  return table.get();
}

constexpr size_t kPrivateB = size_t{512} << 10;  // (a core's L2 holds a copy per thread below this)

// The threads a product of p takes (its row pairs split among them).
int64_t parts_of(const MatmulParams& p) {
  return p.m * p.n * p.k >= (int64_t{1} << 16) ? cpu_internal::parts_for((p.m + 1) / 2) : 1;
}

// Whether p's b is converted to f32 rows before the products (see below).
bool converts_b(const MatmulParams& p) { return p.b_round != DType::kF32 || p.b_dtype != DType::kF32; }

// One (batch-1) product; bias32: N f32 values or null.
void product(const MatmulParams& p, const void* a, const void* b, void* c, const float* bias32, DotCopies copies) {
  const cpu_internal::GemmDotKernels& kern = kernels();
  const int64_t M = p.m, N = p.n, K = p.k;
  // b as f32 rows (N x K: few by construction), converted once — or an f32 b read as b_round, rounded once.
  // MatmulParams::bf16_products: f16 values (exact in f32) are then rounded once more, to bf16; the sums of
  // their products run in f32 as any other's.
  const bool rounded = p.b_round != DType::kF32;
  const bool convert_b = converts_b(p);
  const bool b_to_bf16 = p.bf16_products && b_value_dtype(p) == DType::kF16;
  const bool a_to_bf16 = p.bf16_products && p.a_dtype == DType::kF16;
  const int64_t pairs = (M + 1) / 2;
  const int64_t parts = parts_of(p);
  // Every tile reads all of b. Converted by the threads together, half of it sits in the other core's cache
  // and every row pair fetches it from there: model A's 32 x 7200 x 10 f16 forward on its FP32 master ran
  // far below the f32 product's speed on two threads, though close to it on one; with its own copy, much
  // closer on two (gemm_bench's model A rows, with --threads 1 and 2, measure it). So while a copy fits in
  // a core's L2, each part may convert all of b for itself (DotCopies::kPerThread: a few microseconds, and
  // a copy per thread: model A's 10 x 7200 f32 copies were 0.55 of its 1.77 MiB O2 training peak).
  const size_t b_bytes = static_cast<size_t>(N * K) * sizeof(float);
  const bool private_b = copies == DotCopies::kPerThread && gemm_dot_copies_per_thread(p);
  const auto convert_b_into = [&](float* dst, int64_t e0, int64_t e1) {
    if (rounded)
      round_f32(static_cast<const float*>(b) + e0, dst + e0, e1 - e0, p.b_round);
    else
      convert(element_at(b, e0, p.b_dtype), p.b_dtype, dst + e0, DType::kF32, e1 - e0);
    if (b_to_bf16) round_f32(dst + e0, dst + e0, e1 - e0, DType::kBF16);
  };
  Workspace b32(convert_b && !private_b ? b_bytes : 0);
  if (convert_b && !private_b)
    parallel_for(0, N * K, int64_t{1} << 15, [&](int64_t e0, int64_t e1) { convert_b_into(b32.f32(), e0, e1); });
  // Each part's a rows as f32 and its b (cpu_internal::PartScratch: taken here, not by the workers). A low a
  // is widened as the tile loads it where the variant can (a_to_bf16 needs its rounding first).
  const bool a_in_place = p.a_dtype == DType::kF32 || (kern.tile_low_a != nullptr && !a_to_bf16);
  const size_t a_bytes = a_in_place ? 0 : static_cast<size_t>(2 * K) * sizeof(float);
  cpu_internal::PartScratch scratch(parts, bytes64(a_bytes) + (private_b ? b_bytes : 0));
  cpu_internal::for_each_part(parts, pairs, [&](int64_t t, int64_t q0, int64_t q1) {
    float out[2 * kDotTileN], vals[2][kDotMaxN], old[kDotMaxN];
    const float* bf = static_cast<const float*>(b);
    if (private_b) {
      float* own = reinterpret_cast<float*>(scratch.part(t) + bytes64(a_bytes));
      convert_b_into(own, 0, N * K);
      bf = own;
    } else if (convert_b) {
      bf = b32.f32();
    }
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t i0 = 2 * q;
      const int mr = static_cast<int>(std::min<int64_t>(2, M - i0));
      const float* af = p.a_dtype == DType::kF32 ? static_cast<const float*>(a) + i0 * K : nullptr;
      if (!a_in_place) {
        auto* rows = reinterpret_cast<float*>(scratch.part(t));
        convert(element_at(a, i0 * K, p.a_dtype), p.a_dtype, rows, DType::kF32, mr * K);
        if (a_to_bf16) round_f32(rows, rows, mr * K, DType::kBF16);
        af = rows;
      }
      for (int64_t j0 = 0; j0 < N; j0 += kDotTileN) {
        const int nc = static_cast<int>(std::min<int64_t>(kDotTileN, N - j0));
        if (af == nullptr)
          kern.tile_low_a(element_at(a, i0 * K, p.a_dtype), p.a_dtype, K, bf + j0 * K, K, K, mr, nc, out);
        else
          kern.tile(af, K, bf + j0 * K, K, K, mr, nc, out);
        for (int r = 0; r < mr; ++r)
          for (int j = 0; j < nc; ++j) vals[r][j0 + j] = out[r * nc + j];
      }
      // The epilogue: + c (accumulate), + bias, ReLU, one rounding into c's dtype.
      for (int r = 0; r < mr; ++r) {
        void* crow = element_at(c, (i0 + r) * N, p.c_dtype);
        if (p.accumulate) convert(crow, p.c_dtype, old, DType::kF32, N);
        for (int64_t j = 0; j < N; ++j) {
          float x = vals[r][j];
          if (p.accumulate) x += old[j];
          if (bias32) x += bias32[j];
          if (p.relu) x = x < 0.0f ? 0.0f : x;
          vals[r][j] = x;
        }
        convert(vals[r], DType::kF32, crow, p.c_dtype, N);
      }
    }
  });
}

}  // namespace

bool gemm_dot_supported(const MatmulParams& p) {
  return p.trans_b && !p.trans_a && p.n >= 1 && p.n <= kDotMaxN && is_f32_or_low(p.a_dtype) &&
         is_f32_or_low(p.b_dtype) && is_f32_or_low(p.c_dtype) && (p.bias == nullptr || is_f32_or_low(p.bias_dtype));
}

bool gemm_dot_copies_per_thread(const MatmulParams& p) {
  return converts_b(p) && parts_of(p) > 1 && static_cast<size_t>(p.n * p.k) * sizeof(float) <= kPrivateB;
}

void gemm_dot(const MatmulParams& p, const void* a, const void* b, void* c, DotCopies copies) {
  check_matmul_params(p, "gemm_dot");
  DEMI_CHECK(p.a_round == DType::kF32, "gemm_dot: reads a as stored; ", describe(p),
             " gets a rounded copy of a from kernels::matmul");
  DEMI_CHECK(p.residual == nullptr, "gemm_dot: adds no residual; ", describe(p),
             " is accumulated onto a copy of it by kernels::matmul");
  DEMI_CHECK(gemm_dot_supported(p), "gemm_dot: takes c = a . b^T (trans_b, not trans_a) with N <= ", kDotMaxN,
             " and f32|bf16|f16 tensors, got ", describe(p));
  float bias32[kDotMaxN];
  if (p.bias) convert(p.bias, p.bias_dtype, bias32, DType::kF32, p.n);
  const int64_t sa = p.m * p.k, sb = p.n * p.k, sc = p.m * p.n;
  for (int64_t i = 0; i < p.batch; ++i)
    product(p, element_at(a, i * sa, p.a_dtype), element_at(b, i * sb, p.b_dtype), element_at(c, i * sc, p.c_dtype),
            p.bias ? bias32 : nullptr, copies);
}

std::string gemm_dot_implementation() { return str_cat("demi-dot:", kernels().name); }

}  // namespace cpu
}  // namespace demi::kernels
