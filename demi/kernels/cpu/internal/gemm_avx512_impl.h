// The AVX-512 pieces shared by gemm_avx512.cc and gemm_avx512bf16.cc: the 6 x 64 tile's fused store and
// the 16 x 16 transpose of 32-bit lanes that packs transposed operands. Included by AVX-512 files only.
#pragma once

#include <algorithm>
#include <type_traits>

#include "demi/kernels/cpu/internal/gemm_kernels.h"
#include "demi/kernels/cpu/internal/vec_avx512.h"

namespace demi::kernels::cpu_internal::gemm512 {

inline constexpr int kMr = 6;
inline constexpr int kNr = 64;  // four vectors of 16 f32
inline constexpr int kVecs = kNr / 16;

using Acc = __m512[kMr][kVecs];

// Zeroes the accumulators; off[r] = where row r starts (rows past the tile's last read the last valid row
// again: their results are dropped).
inline void start_tile(Acc& acc, int64_t (&off)[kMr], const GemmTile& t, int64_t rs) {
#pragma GCC unroll 6
  for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int r = 0; r < kMr; ++r) off[r] = std::min(r, t.m - 1) * rs;
}

// Any tile's rows (a full one goes through store_full, from fill_and_store).
template <typename T>
inline void store_rows(Acc& acc, const GemmTile& t) {
  using V = VecAvx512;
  T* c = static_cast<T*>(t.c);
  const T* in = static_cast<const T*>(load_source(t));
  const __m512 zero = _mm512_setzero_ps();
  for (int r = 0; r < t.m; ++r) {
    T* row = c + r * t.ldc;
    const T* in_row = in + r * t.ldc;
    for (int v = 0; v < kVecs; ++v) {
      const int j = v * 16;
      if (j >= t.n) break;
      const int w = std::min(16, t.n - j);
      __m512 x = acc[r][v];
      if (w == 16) {
        if (t.load_c) x = _mm512_add_ps(x, V::load(in_row + j));
        if (t.bias) x = _mm512_add_ps(x, t.bias_rows ? _mm512_set1_ps(t.bias[r]) : _mm512_loadu_ps(t.bias + j));
        if (t.relu) x = _mm512_max_ps(x, zero);
        V::store(row + j, x);
      } else {
        if (t.load_c) x = _mm512_add_ps(x, V::load_n(in_row + j, w));
        if (t.bias) x = _mm512_add_ps(x, t.bias_rows ? _mm512_set1_ps(t.bias[r]) : V::load_n(t.bias + j, w));
        if (t.relu) x = _mm512_max_ps(x, zero);
        V::store_n(row + j, x, w);
      }
    }
  }
}


// The transposed tile: each 16 columns transposed in registers into 16 rows of c of t.m (<= 6) values.
template <typename T>
inline void store_columns(Acc& acc, const GemmTile& t) {
  using V = VecAvx512;
  T* c = static_cast<T*>(t.c);
  const T* in = static_cast<const T*>(load_source(t));
  const __m512 zero = _mm512_setzero_ps();
  const __m512 row_bias = t.bias && t.bias_rows ? V::load_n(t.bias, t.m) : zero;
  __m512 r[16];
  for (int v = 0; v < kVecs && v * 16 < t.n; ++v) {
    for (int i = 0; i < 16; ++i) r[i] = i < kMr ? acc[i][v] : zero;
    VecAvx512::transpose16(r);
    const int cols = std::min(16, t.n - v * 16);
    for (int jj = 0; jj < cols; ++jj) {
      T* dst = c + (v * 16 + jj) * t.ldc;
      __m512 x = r[jj];
      if (t.load_c) x = _mm512_add_ps(x, V::load_n(in + (v * 16 + jj) * t.ldc, t.m));
      if (t.bias) x = _mm512_add_ps(x, t.bias_rows ? row_bias : _mm512_set1_ps(t.bias[v * 16 + jj]));
      if (t.relu) x = _mm512_max_ps(x, zero);
      V::store_n(dst, x, t.m);
    }
  }
}

// The epilogue at the micro-kernel's store, for every output dtype.
inline void store_tile(Acc& acc, const GemmTile& t) {
  switch (t.c_dtype) {
    case DType::kBF16: return t.transposed ? store_columns<BFloat16>(acc, t) : store_rows<BFloat16>(acc, t);
    case DType::kF16: return t.transposed ? store_columns<Half>(acc, t) : store_rows<Half>(acc, t);
    default: return t.transposed ? store_columns<float>(acc, t) : store_rows<float>(acc, t);
  }
}

// A full tile's store with every index known at compile time, so that the accumulators are stored from
// registers (store_tile indexes them at run time: the compiler spills all 24 to the stack first).
template <typename T>
[[gnu::always_inline]] inline void store_full(Acc& acc, const GemmTile& t) {
  using V = VecAvx512;
  T* c = static_cast<T*>(t.c);
  if (!t.load_c && !t.bias && !t.relu) {  // the plain store, without the epilogue's tests per vector
#pragma GCC unroll 6
    for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) V::store(c + r * t.ldc + v * 16, acc[r][v]);
    return;
  }
  const T* in = static_cast<const T*>(load_source(t));
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 6
  for (int r = 0; r < kMr; ++r) {
    T* row = c + r * t.ldc;
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      __m512 x = acc[r][v];
      if (t.load_c) x = _mm512_add_ps(x, V::load(in + r * t.ldc + v * 16));
      if (t.bias) x = _mm512_add_ps(x, t.bias_rows ? _mm512_set1_ps(t.bias[r]) : _mm512_loadu_ps(t.bias + v * 16));
      if (t.relu) x = _mm512_max_ps(x, zero);
      V::store(row + v * 16, x);
    }
  }
}

// run(std::integral_constant<int, V>{}) with V the 16-column vectors (1 to 4) a tile of n columns has in:
// a panel's last tile of a product whose N is not a multiple of 64 (model C's 784) multiplies only those
// (its last 16 columns took the FMAs of 64).
template <typename Run>
[[gnu::always_inline]] inline void with_vectors(int n, Run run) {
  if (n > 48) return run(std::integral_constant<int, 4>{});
  if (n > 32) return run(std::integral_constant<int, 3>{});
  if (n > 16) return run(std::integral_constant<int, 2>{});
  run(std::integral_constant<int, 1>{});
}

// A micro-kernel's body: fill(acc) runs its k loop into zeroed accumulators, then the tile is stored. A
// full tile stored as rows runs a copy of the loop specialised to c's dtype, whose store keeps the
// accumulators in registers (on short K, as model A's K = 10 and 32 products, the spills and reloads of
// the general store took about a fifth of the time); any other tile the general store.
template <typename Fill>
[[gnu::always_inline]] inline void fill_and_store(const GemmTile& t, Fill fill) {
  if (!t.transposed && t.m == kMr && t.n == kNr) {
    Acc acc;
    fill(acc);
    switch (t.c_dtype) {
      case DType::kBF16: return store_full<BFloat16>(acc, t);
      case DType::kF16: return store_full<Half>(acc, t);
      default: return store_full<float>(acc, t);
    }
  }
  Acc acc;
  fill(acc);
  store_tile(acc, t);
}

// The narrow indirect tile (GemmKernels::*_indirect_narrow): 12 rows x 32 columns, the same 24 accumulators
// as the 6 x 64 tile, for products with at most 32 columns (half of a 64-wide panel would be zeros).
inline constexpr int kNarrowMr = 2 * kMr;
using NarrowAcc = __m512[kNarrowMr][2];

inline void start_narrow(NarrowAcc& acc, int64_t (&off)[kNarrowMr], const int64_t* roff, const GemmTile& t) {
#pragma GCC unroll 12
  for (int r = 0; r < kNarrowMr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int r = 0; r < kNarrowMr; ++r) off[r] = roff[std::min(r, t.m - 1)];
}

// The f32 sums of a narrow tile into t.c (f32; + c with load_c; no bias or ReLU).
inline void store_narrow(NarrowAcc& acc, const GemmTile& t) {
  using V = VecAvx512;
  auto* c = static_cast<float*>(t.c);
  for (int r = 0; r < t.m; ++r)
    for (int v = 0; v < 2 && v * 16 < t.n; ++v) {
      float* dst = c + r * t.ldc + v * 16;
      const int w = std::min(16, t.n - v * 16);
      __m512 x = acc[r][v];
      if (t.load_c) x = _mm512_add_ps(x, V::load_n(static_cast<const float*>(load_source(t)) + r * t.ldc + v * 16, w));
      V::store_n(dst, x, w);
    }
}

}  // namespace demi::kernels::cpu_internal::gemm512
