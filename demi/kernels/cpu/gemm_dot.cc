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
void tile_scalar(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, int mr, int nc, float* lanes,
                 bool first, float* out) {
  for (int r = 0; r < mr; ++r)
    for (int j = 0; j < nc; ++j) {
      float own[16] = {};
      float* l = lanes ? lanes + (r * nc + j) * 16 : own;
      if (lanes && first) std::fill(l, l + 16, 0.0f);
      for (int64_t kk = 0; kk < k; ++kk) l[kk % 16] += a[r * lda + kk] * b[j * ldb + kk];
      if (!out) continue;
      float s = 0.0f;
      for (int i = 0; i < 16; ++i) s += l[i];
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

// Row pairs whose lane sums a part keeps while it takes K in chunks (product()).
constexpr int64_t kDotGroup = 8;
// K per chunk for N columns of b: about 24 KiB of b (a multiple of 16), or all of K where that is little more.
int64_t chunk_of(int64_t n, int64_t k) {
  const int64_t kc = std::max<int64_t>(256, (int64_t{24} << 10) / (4 * n) / 16 * 16);
  return k <= 2 * kc ? k : kc;
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
  // Where K is taken in chunks (below), each part converts each chunk of b it multiplies (N x kc, in L1)
  // just before it does: no copy of all of b, and no half of it in the other core's cache.
  const int64_t kc = chunk_of(N, K);
  const bool chunk_b = convert_b && kc < K;
  const size_t b_bytes = static_cast<size_t>(N * K) * sizeof(float);
  const bool private_b = copies == DotCopies::kPerThread && gemm_dot_copies_per_thread(p);
  // b's elements [e0, e1) (flat, N x K) converted into dst + e0 - at.
  const auto convert_b_into = [&](float* dst, int64_t e0, int64_t e1, int64_t at = 0) {
    float* d = dst + e0 - at;
    if (rounded)
      round_f32(static_cast<const float*>(b) + e0, d, e1 - e0, p.b_round);
    else
      convert(element_at(b, e0, p.b_dtype), p.b_dtype, d, DType::kF32, e1 - e0);
    if (b_to_bf16) round_f32(d, d, e1 - e0, DType::kBF16);
  };
  Workspace b32(convert_b && !private_b && !chunk_b ? b_bytes : 0);
  if (convert_b && !private_b && !chunk_b)
    parallel_for(0, N * K, int64_t{1} << 15, [&](int64_t e0, int64_t e1) { convert_b_into(b32.f32(), e0, e1); });
  // Each part's a rows as f32 and its b (cpu_internal::PartScratch: taken here, not by the workers). A low a
  // is widened as the tile loads it where the variant can (a_to_bf16 needs its rounding first).
  const bool a_in_place = p.a_dtype == DType::kF32 || (kern.tile_low_a != nullptr && !a_to_bf16);
  // Row pair q's outputs (vals) finished: + c (accumulate), + bias, ReLU, one rounding into c's dtype.
  const auto epilogue = [&](int64_t q, int mr, float (&vals)[2][kDotMaxN], float* old) {
    const int64_t i0 = 2 * q;
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
  };
  // K in chunks: each chunk of b (N x kc, ~24 KiB) is read (or converted) once for kDotGroup row pairs while
  // it sits in L1, their lane sums kept between chunks (GemmDotKernels::tile's lanes: the bits of one pass);
  // one pass over b per row pair made model A's 32 x 10 x 7200 forward stream its 288 KB b from L2 sixteen
  // times a thread.
  const size_t a_bytes = a_in_place ? 0 : static_cast<size_t>(2 * kc) * sizeof(float);
  const size_t lane_bytes = kc < K ? static_cast<size_t>(kDotGroup * 2 * N * 16) * sizeof(float) : 0;
  const size_t own_b = private_b ? b_bytes : chunk_b ? static_cast<size_t>(N * kc) * sizeof(float) : 0;
  cpu_internal::PartScratch scratch(parts, bytes64(a_bytes) + bytes64(lane_bytes) + own_b);
  cpu_internal::for_each_part(parts, pairs, [&](int64_t t, int64_t q0, int64_t q1) {
    float out[2 * kDotTileN], vals[2][kDotMaxN], old[kDotMaxN];
    const float* bf = static_cast<const float*>(b);
    if (private_b) {
      float* own = reinterpret_cast<float*>(scratch.part(t) + bytes64(a_bytes) + bytes64(lane_bytes));
      convert_b_into(own, 0, N * K);
      bf = own;
    } else if (convert_b && !chunk_b) {
      bf = b32.f32();
    }
    float* bchunk = chunk_b ? reinterpret_cast<float*>(scratch.part(t) + bytes64(a_bytes) + bytes64(lane_bytes)) : nullptr;
    auto* rows = reinterpret_cast<float*>(scratch.part(t));
    auto* lanes = lane_bytes ? reinterpret_cast<float*>(scratch.part(t) + bytes64(a_bytes)) : nullptr;
    for (int64_t g0 = q0; g0 < q1; g0 += kDotGroup) {
      const int64_t g1 = std::min(q1, g0 + kDotGroup);
      for (int64_t k0 = 0; k0 < K; k0 += kc) {
        const int64_t kn = std::min(kc, K - k0);
        const bool first = k0 == 0, last = k0 + kn == K;
        // b's rows at [k0, k0 + kn): in place (ldb K), or this chunk converted (ldb kn)
        const float* bk = bf + k0;
        int64_t ldb = K;
        if (chunk_b) {
          for (int64_t j = 0; j < N; ++j) convert_b_into(bchunk, j * K + k0, j * K + k0 + kn, j * K + k0 - j * kn);
          bk = bchunk;
          ldb = kn;
        }
        for (int64_t q = g0; q < g1; ++q) {
          const int64_t i0 = 2 * q;
          const int mr = static_cast<int>(std::min<int64_t>(2, M - i0));
          const float* af = p.a_dtype == DType::kF32 ? static_cast<const float*>(a) + i0 * K + k0 : nullptr;
          int64_t lda = K;
          if (!a_in_place) {  // (the chunk of the pair's rows)
            for (int r = 0; r < mr; ++r)
              convert(element_at(a, (i0 + r) * K + k0, p.a_dtype), p.a_dtype, rows + r * kn, DType::kF32, kn);
            if (a_to_bf16) round_f32(rows, rows, mr * kn, DType::kBF16);
            af = rows;
            lda = kn;
          }
          float* pair_lanes = lanes ? lanes + (q - g0) * 2 * N * 16 : nullptr;
          for (int64_t j0 = 0; j0 < N; j0 += kDotTileN) {
            const int nc = static_cast<int>(std::min<int64_t>(kDotTileN, N - j0));
            float* l = pair_lanes ? pair_lanes + j0 * 2 * 16 : nullptr;
            float* o = last ? out : nullptr;
            if (af == nullptr)
              kern.tile_low_a(element_at(a, i0 * K + k0, p.a_dtype), p.a_dtype, K, bk + j0 * ldb, ldb, kn, mr, nc, l,
                              first, o);
            else
              kern.tile(af, lda, bk + j0 * ldb, ldb, kn, mr, nc, l, first, o);
            if (last)
              for (int r = 0; r < mr; ++r)
                for (int j = 0; j < nc; ++j) vals[r][j0 + j] = out[r * nc + j];
          }
          if (last) epilogue(q, mr, vals, old);
        }
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
  return converts_b(p) && parts_of(p) > 1 && static_cast<size_t>(p.n * p.k) * sizeof(float) <= kPrivateB &&
         chunk_of(p.n, p.k) == p.k;  // (a b taken in chunks is converted a chunk at a time by each part)
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
