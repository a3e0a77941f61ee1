// The AVX2 + FMA pieces of demi's GEMM (internal/gemm_kernels.h): a 6 x 16 f32 micro-kernel (12 ymm
// accumulators, 2 loads of packed b and 6 broadcasts of a per k). Conversions (packing a plain b or a
// low-precision a, rounding a bf16|f16 tile) go through core's AVX2 bulk conversions, which are
// bit-identical to half.h; a transposed b is packed by the portable table's routine (the same 16-column
// panel layout).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/kernels/cpu/internal/gemm_kernels.h"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "gemm_avx2.cc needs -mavx2 -mfma (files named *_avx2.cc get them)"
#endif

namespace demi::kernels::cpu_internal {
namespace {

constexpr int kMr = 6, kNr = 16;

const demi::internal::ConvertKernels& cvt() {
  static const demi::internal::ConvertKernels& k = demi::internal::convert_kernels(CpuLevel::kAvx2);
  return k;
}

// n f32 values of a row in dtype t -> f32.
void row_to_f32(const void* src, DType t, float* dst, int64_t n) {
  switch (t) {
    case DType::kBF16: return cvt().bf16_to_f32(static_cast<const BFloat16*>(src), dst, n);
    case DType::kF16: return cvt().f16_to_f32(static_cast<const Half*>(src), dst, n);
    default: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
}

void row_from_f32(const float* src, void* dst, DType t, int64_t n) {
  switch (t) {
    case DType::kBF16: return cvt().f32_to_bf16(src, static_cast<BFloat16*>(dst), n);
    case DType::kF16: return cvt().f32_to_f16(src, static_cast<Half*>(dst), n);
    default: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
}

void ukr_f32(int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b, const GemmTile& t) {
  __m256 acc[kMr][2];
#pragma GCC unroll 6
  for (int r = 0; r < kMr; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  int64_t off[kMr];
  for (int r = 0; r < kMr; ++r) off[r] = std::min(r, t.m - 1) * rs;
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    b += kNr;
#pragma GCC unroll 6
    for (int r = 0; r < kMr; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + off[r]);
      acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
    }
    a += cs;
  }
  const size_t esize = dtype_size(t.c_dtype);
  alignas(32) float v[kNr], old[kNr];
  if (t.transposed) {  // column j of the tile is t.m values of c's row j
    alignas(32) float tile[kMr][kNr];
    for (int r = 0; r < kMr; ++r) {
      _mm256_store_ps(tile[r], acc[r][0]);
      _mm256_store_ps(tile[r] + 8, acc[r][1]);
    }
    for (int j = 0; j < t.n; ++j) {
      char* row = static_cast<char*>(t.c) + j * t.ldc * static_cast<int64_t>(esize);
      for (int r = 0; r < t.m; ++r) v[r] = tile[r][j];
      if (t.load_c) {
        row_to_f32(static_cast<const char*>(load_source(t)) + j * t.ldc * static_cast<int64_t>(esize), t.c_dtype, old,
                   t.m);
        for (int r = 0; r < t.m; ++r) v[r] += old[r];
      }
      if (t.bias)
        for (int r = 0; r < t.m; ++r) v[r] += t.bias[t.bias_rows ? r : j];
      if (t.relu)
        for (int r = 0; r < t.m; ++r) v[r] = std::max(v[r], 0.0f);
      row_from_f32(v, row, t.c_dtype, t.m);
    }
    return;
  }
  for (int r = 0; r < t.m; ++r) {
    char* row = static_cast<char*>(t.c) + r * t.ldc * static_cast<int64_t>(esize);
    _mm256_store_ps(v, acc[r][0]);
    _mm256_store_ps(v + 8, acc[r][1]);
    if (t.load_c) {
      row_to_f32(static_cast<const char*>(load_source(t)) + r * t.ldc * static_cast<int64_t>(esize), t.c_dtype, old,
                 t.n);
      for (int j = 0; j < t.n; ++j) v[j] += old[j];
    }
    if (t.bias)
      for (int j = 0; j < t.n; ++j) v[j] += t.bias[t.bias_rows ? r : j];
    if (t.relu)
      for (int j = 0; j < t.n; ++j) v[j] = std::max(v[j], 0.0f);
    row_from_f32(v, row, t.c_dtype, t.n);
  }
}

void pack_b_f32(const void* b, DType t, bool trans, int64_t ld, int64_t k0, int64_t kc, int64_t j0, int64_t nc,
                float* dst, int64_t stride) {
  if (trans) return gemm_kernels_scalar().pack_b_f32(b, t, trans, ld, k0, kc, j0, nc, dst, stride);
  const size_t esize = dtype_size(t);
  const int64_t panels = (nc + kNr - 1) / kNr;
  for (int64_t k = 0; k < kc; ++k) {
    const char* row = static_cast<const char*>(b) + ((k0 + k) * ld + j0) * static_cast<int64_t>(esize);
    for (int64_t pn = 0; pn < panels; ++pn) {
      float* out = dst + pn * stride + k * kNr;
      const int64_t w = std::min<int64_t>(kNr, nc - pn * kNr);
      row_to_f32(row + pn * kNr * static_cast<int64_t>(esize), t, out, w);
      std::fill(out + w, out + kNr, 0.0f);
    }
  }
}

void to_f32(const void* src, DType t, int64_t sld, int64_t rows, int64_t cols, float* dst, int64_t dld) {
  const size_t esize = dtype_size(t);
  for (int64_t i = 0; i < rows; ++i)
    row_to_f32(static_cast<const char*>(src) + i * sld * static_cast<int64_t>(esize), t, dst + i * dld, cols);
}

}  // namespace

const GemmKernels& gemm_kernels_avx2() {
  static const GemmKernels k = [] {
    GemmKernels g;
    g.name = "avx2";
    g.mr = kMr;
    g.nr = kNr;
    g.f32 = ukr_f32;
    g.pack_b_f32 = pack_b_f32;
    g.to_f32 = to_f32;
    return g;
  }();
  return k;
}

}  // namespace demi::kernels::cpu_internal
