// The AVX-512 pieces of demi's GEMM (internal/gemm_kernels.h): a 6 x 64 f32 micro-kernel (24 zmm
// accumulators, 4 vector loads of packed b and 6 broadcasts of a per k: FMA-bound, as AOCL's 6x64 f32
// kernel), its fused store, and packing that converts bf16/f16 to f32 on the way in.
#include <algorithm>
#include <cstring>

#include "demi/kernels/cpu/internal/gemm_avx512_impl.h"

namespace demi::kernels::cpu_internal {
namespace {

using namespace gemm512;
using V = VecAvx512;

// One k of the tile: the first kV (of 4) vectors of packed b (the next ones prefetched), a broadcast of
// a[off[r]] per row.
template <int kV = kVecs>
[[gnu::always_inline]] inline void fma_step(Acc& acc, const float* a, const int64_t (&off)[kMr], const float* b) {
  __m512 bv[kV];
#pragma GCC unroll 4
  for (int v = 0; v < kV; ++v) bv[v] = _mm512_load_ps(b + 16 * v);
  _mm_prefetch(reinterpret_cast<const char*>(b + 8 * kNr), _MM_HINT_T0);
  if constexpr (kV > 2) _mm_prefetch(reinterpret_cast<const char*>(b + 8 * kNr + 32), _MM_HINT_T0);
#pragma GCC unroll 6
  for (int r = 0; r < kMr; ++r) {
    const __m512 x = _mm512_set1_ps(a[off[r]]);
#pragma GCC unroll 4
    for (int v = 0; v < kV; ++v) acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]);
  }
}

// The k loop over the tile's first kV vectors of columns (the rest of the accumulators stay zero).
template <int kV>
[[gnu::always_inline]] inline void fma_loop(Acc& acc, int64_t kc, const float* a, int64_t cs,
                                            const int64_t (&off)[kMr], const float* b) {
  for (int64_t k = 0; k < kc; ++k, b += kNr, a += cs) fma_step<kV>(acc, a, off, b);
}

void ukr_f32(int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b, const GemmTile& t) {
  fill_and_store(t, [&](Acc& acc) __attribute__((always_inline)) {
    int64_t off[kMr];
    start_tile(acc, off, t, rs);
    with_vectors(t.n, [&](auto v) __attribute__((always_inline)) { fma_loop<v()>(acc, kc, a, cs, off, b); });
  });
}

template <typename T>
void store_transposed(const float* src, int64_t sld, const GemmTile& t) {
  T* c = static_cast<T*>(t.c);
  const T* in = static_cast<const T*>(load_source(t));
  const __m512 zero = _mm512_setzero_ps();
  __m512 r[16];
  // 16 rows of c at a time, each written left to right (c's rows are often 4 KiB apart: one cache set).
  for (int r0 = 0; r0 < t.m; r0 += 16) {  // 16 rows of c: 16 columns of src
    const int h = std::min(16, t.m - r0);
    for (int j0 = 0; j0 < t.n; j0 += 16) {  // 16 columns of c: 16 rows of src
      const int w = std::min(16, t.n - j0);
      const __m512 col_bias = t.bias && !t.bias_rows ? V::load_n(t.bias + j0, w) : zero;
      // (Every r[i] indexed at compile time, so that r stays in registers.)
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const float* s = src + (j0 + i) * sld + r0;
        r[i] = i >= w ? zero : h == 16 ? _mm512_loadu_ps(s) : V::load_n(s, h);
      }
      VecAvx512::transpose16(r);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        if (i == h) break;
        T* dst = c + (r0 + i) * t.ldc + j0;
        __m512 x = r[i];
        const T* old = in + (r0 + i) * t.ldc + j0;
        if (t.load_c) x = _mm512_add_ps(x, w == 16 ? V::load(old) : V::load_n(old, w));
        if (t.bias) x = _mm512_add_ps(x, t.bias_rows ? _mm512_set1_ps(t.bias[r0 + i]) : col_bias);
        if (t.relu) x = _mm512_max_ps(x, zero);
        if (w == 16)
          V::store(dst, x);
        else
          V::store_n(dst, x, w);
      }
    }
  }
}

void store_f32_transposed(const float* src, int64_t sld, const GemmTile& t) {
  switch (t.c_dtype) {
    case DType::kBF16: return store_transposed<BFloat16>(src, sld, t);
    case DType::kF16: return store_transposed<Half>(src, sld, t);
    default: return store_transposed<float>(src, sld, t);
  }
}

// The indirect tile (GemmKernels::f32_indirect): row r at base + roff[r], its k-th value koff[k] further.
void ukr_f32_indirect(int64_t kc, const float* base, const int64_t* roff, const int64_t* koff, const float* b,
                      const GemmTile& t) {
  fill_and_store(t, [&](Acc& acc) __attribute__((always_inline)) {
    int64_t off[kMr];
    start_tile(acc, off, t, 0);
    for (int r = 0; r < kMr; ++r) off[r] = roff[std::min(r, t.m - 1)];
    const float* bk = b;
    for (int64_t k = 0; k < kc; ++k, bk += kNr) fma_step(acc, base + koff[k], off, bk);
  });
}

// The narrow indirect tile: 12 rows, b's first 32 columns (2 vectors of the 64-wide panel row).
void ukr_f32_indirect_narrow(int64_t kc, const float* base, const int64_t* roff, const int64_t* koff, const float* b,
                             const GemmTile& t) {
  NarrowAcc acc;
  int64_t off[kNarrowMr];
  start_narrow(acc, off, roff, t);
  for (int64_t k = 0; k < kc; ++k, b += kNr) {
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
    _mm_prefetch(reinterpret_cast<const char*>(b + 8 * kNr), _MM_HINT_T0);
    const float* a = base + koff[k];
#pragma GCC unroll 12
    for (int r = 0; r < kNarrowMr; ++r) {
      const __m512 x = _mm512_set1_ps(a[off[r]]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
    }
  }
  store_narrow(acc, t);
}

// What a packer stores for a loaded vector: the value, or (kRoundF16: an f32 b read as f16) the value
// rounded to f16 and back by vcvtps2ph (to nearest even) and vcvtph2ps, the instructions of demi's own
// f32 -> f16 -> f32 conversions (core/convert_avx512.cc), so bit for bit a product of the cast b.
template <bool kRoundF16>
inline __m512 stored(__m512 x) {
  if constexpr (kRoundF16) return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  return x;
}

template <typename T, bool kRoundF16 = false>
void pack_b_plain(const T* b, int64_t ld, int64_t k0, int64_t kc, int64_t j0, int64_t nc, float* dst, int64_t stride) {
  const int64_t panels = (nc + kNr - 1) / kNr;
  for (int64_t k = 0; k < kc; ++k) {
    const T* row = b + (k0 + k) * ld + j0;
    for (int64_t pn = 0; pn < panels; ++pn) {
      float* out = dst + pn * stride + k * kNr;
      const int64_t base = pn * kNr;
      for (int v = 0; v < kVecs; ++v) {
        const int64_t j = base + v * 16, w = std::clamp<int64_t>(nc - j, 0, 16);
        _mm512_store_ps(out + v * 16, w == 16  ? stored<kRoundF16>(V::load(row + j))
                                      : w > 0  ? stored<kRoundF16>(V::load_n(row + j, w))
                                               : _mm512_setzero_ps());
      }
    }
  }
}

// b stored (N, K): 16 columns x 16 k at a time, loaded as 16 rows of k and transposed in registers.
template <typename T, bool kRoundF16 = false>
void pack_b_trans(const T* b, int64_t ld, int64_t k0, int64_t kc, int64_t j0, int64_t nc, float* dst, int64_t stride) {
  __m512 r[16];
  for (int64_t jg = 0; jg < nc; jg += 16) {  // 16 columns: a quarter of a panel
    float* panel = dst + (jg / kNr) * stride + jg % kNr;
    const int64_t cols = std::min<int64_t>(16, nc - jg);
    for (int64_t k = 0; k < kc; k += 16) {
      const int64_t w = std::min<int64_t>(16, kc - k);
      for (int i = 0; i < 16; ++i) {
        const T* src = b + (j0 + jg + i) * ld + k0 + k;
        r[i] = i >= cols ? _mm512_setzero_ps() : stored<kRoundF16>(w == 16 ? V::load(src) : V::load_n(src, w));
      }
      VecAvx512::transpose16(r);
      for (int64_t i = 0; i < w; ++i) _mm512_store_ps(panel + (k + i) * kNr, r[i]);
    }
  }
  // The last panel's column groups past nc are zero.
  const int64_t end = (nc + kNr - 1) / kNr * kNr;
  for (int64_t jg = (nc + 15) / 16 * 16; jg < end; jg += 16) {
    float* panel = dst + (jg / kNr) * stride + jg % kNr;
    for (int64_t k = 0; k < kc; ++k) _mm512_store_ps(panel + k * kNr, _mm512_setzero_ps());
  }
}

void pack_b_f32(const void* b, DType t, bool trans, int64_t ld, int64_t k0, int64_t kc, int64_t j0, int64_t nc,
                float* dst, int64_t stride) {
  switch (t) {
    case DType::kBF16:
      return trans ? pack_b_trans(static_cast<const BFloat16*>(b), ld, k0, kc, j0, nc, dst, stride)
                   : pack_b_plain(static_cast<const BFloat16*>(b), ld, k0, kc, j0, nc, dst, stride);
    case DType::kF16:
      return trans ? pack_b_trans(static_cast<const Half*>(b), ld, k0, kc, j0, nc, dst, stride)
                   : pack_b_plain(static_cast<const Half*>(b), ld, k0, kc, j0, nc, dst, stride);
    default:
      return trans ? pack_b_trans(static_cast<const float*>(b), ld, k0, kc, j0, nc, dst, stride)
                   : pack_b_plain(static_cast<const float*>(b), ld, k0, kc, j0, nc, dst, stride);
  }
}

void pack_b_f32_as_f16(const float* b, bool trans, int64_t ld, int64_t k0, int64_t kc, int64_t j0, int64_t nc,
                       float* dst, int64_t stride) {
  return trans ? pack_b_trans<float, true>(b, ld, k0, kc, j0, nc, dst, stride)
               : pack_b_plain<float, true>(b, ld, k0, kc, j0, nc, dst, stride);
}

template <typename T>
void rows_to_f32(const T* src, int64_t sld, int64_t rows, int64_t cols, float* dst, int64_t dld) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* s = src + i * sld;
    float* d = dst + i * dld;
    int64_t j = 0;
    for (; j + 16 <= cols; j += 16) _mm512_storeu_ps(d + j, V::load(s + j));
    if (j < cols) V::store_n(d + j, V::load_n(s + j, cols - j), cols - j);
  }
}

void to_f32(const void* src, DType t, int64_t sld, int64_t rows, int64_t cols, float* dst, int64_t dld) {
  switch (t) {
    case DType::kBF16: return rows_to_f32(static_cast<const BFloat16*>(src), sld, rows, cols, dst, dld);
    case DType::kF16: return rows_to_f32(static_cast<const Half*>(src), sld, rows, cols, dst, dld);
    default: return rows_to_f32(static_cast<const float*>(src), sld, rows, cols, dst, dld);
  }
}

}  // namespace

const GemmKernels& gemm_kernels_avx512() {
  static const GemmKernels k = [] {
    GemmKernels g;
    g.name = "avx512";
    g.mr = kMr;
    g.nr = kNr;
    g.f32 = ukr_f32;
    g.f32_indirect = ukr_f32_indirect;
    g.narrow_mr = kNarrowMr;
    g.f32_indirect_narrow = ukr_f32_indirect_narrow;
    g.store_f32_transposed = store_f32_transposed;
    g.pack_b_f32 = pack_b_f32;
    g.pack_b_f32_as_f16 = pack_b_f32_as_f16;
    g.to_f32 = to_f32;
    return g;
  }();
  return k;
}

}  // namespace demi::kernels::cpu_internal
