// The short-K GEMM's kernel (../gemm_outer.h) written once against the vector traits V; instantiated by
// gemm_outer.cc (VecScalar) and per ISA from the registry (cmake/demi_kernel_variants.cmake).
//
// c's columns [j0, j1), every row: per two vectors of columns and group of 12 rows (6 on AVX2), 24 (12)
// accumulators summed over k ascending, fmadd(a[r][k], b[k][j..], acc) from +0 (a's value broadcast, b's
// row loaded once per group: converted, or rounded to b_round and widened back), then the epilogue — + c
// (accumulate), + bias, ReLU — and one rounding into c's dtype. Each output's sum is one chain in a fixed
// order, so the thread count and the column blocking change no bit.
#pragma once

#include <algorithm>
#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/half.h"

namespace demi::kernels::cpu_internal {

inline constexpr int kOuterRows = 12;     // accumulators per column vector (rows of c at a time)
inline constexpr int64_t kOuterCols = 256;  // columns per block: K x 256 of b stays in L1 across the row groups

// One product as the kernel reads it.
struct OuterProduct {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;  // op(a) as f32 in groups of kOuterRows rows, each (K, kOuterRows): a[i][k] at
                             // (i / kOuterRows * K + k) * kOuterRows + i % kOuterRows; rows past M zero
  const void* b = nullptr;   // (K, N) row-major in b_dtype; an f32 b read as b_round (bf16|f16) where set
  DType b_dtype = DType::kF32, b_round = DType::kF32;
  void* c = nullptr;  // (M, N) row-major in c_dtype
  DType c_dtype = DType::kF32;
  const float* bias = nullptr;  // N values, or null
  bool accumulate = false, relu = false;
};

struct GemmOuterKernels {
  const char* name = nullptr;
  // c's columns [j0, j1) of q, every row (j0 a multiple of 16, or j1 == N).
  void (*columns)(const OuterProduct& q, int64_t j0, int64_t j1) = nullptr;
};

const GemmOuterKernels& gemm_outer_kernels_scalar();
const GemmOuterKernels& gemm_outer_kernels_avx2();
const GemmOuterKernels& gemm_outer_kernels_avx512();

namespace outer_impl {

// n (1 <= n, the first min(n, kWidth)) values of b at p as f32; with kRound, rounded to it first (through its storage: the bits
// the cast b would hold) and widened back.
template <class V, class B, DType kRound>
inline typename V::F load_b(const B* p, int64_t n) {
  typename V::F v = n >= V::kWidth ? V::load(p) : V::load_n(p, n);
  if constexpr (kRound == DType::kF16) {
    alignas(64) Half t[V::kWidth];
    V::store(t, v);
    v = V::load(t);
  } else if constexpr (kRound == DType::kBF16) {
    alignas(64) BFloat16 t[V::kWidth];
    V::store(t, v);
    v = V::load(t);
  }
  return v;
}

template <class V, class T>
inline typename V::F load(const T* p, int64_t n) {
  return n >= V::kWidth ? V::load(p) : V::load_n(p, n);
}

// The register tile per vector width: rows of c (a half of kOuterRows on AVX2's 16 registers) x vectors of
// columns, each broadcast of a serving every vector.
template <class V>
inline constexpr int kTileRows = V::kWidth == 8 ? kOuterRows / 2 : kOuterRows;
template <class V>
inline constexpr int kTileVecs = V::kWidth == 1 ? 1 : 2;

// c's rows [i0 + h, i0 + h + kTileRows) (those below M) at the columns [j, j + n): a is the row group's block
// (K x kOuterRows, from column h), n <= kTileVecs vectors.
template <class V, class B, DType kRound, class C>
inline void tile(const OuterProduct& q, const float* a, int64_t i0, int h, int64_t j, int64_t n) {
  using F = typename V::F;
  constexpr int W = V::kWidth, R = kTileRows<V>, NV = kTileVecs<V>;
  const B* b = static_cast<const B*>(q.b) + j;
  F acc[R][NV];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[r][v] = V::zero();
  for (int64_t kk = 0; kk < q.k; ++kk, a += kOuterRows, b += q.n) {
    F bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = n > v * W ? load_b<V, B, kRound>(b + v * W, n - v * W) : V::zero();
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const F x = V::set1(a[h + r]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] = V::fmadd(x, bv[v], acc[r][v]);
    }
  }
  C* c = static_cast<C*>(q.c);
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    if (i0 + h + r >= q.m) break;
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      const int64_t nv = n - v * W;
      if (nv <= 0) break;
      C* out = c + (i0 + h + r) * q.n + j + v * W;
      F x = acc[r][v];
      if (q.accumulate) x = V::add(x, load<V>(out, nv));
      if (q.bias) x = V::add(x, load<V>(q.bias + j + v * W, nv));
      if (q.relu) x = V::max(V::zero(), x);  // (zero first: -0 and NaN pass, as relu(v) = v < 0 ? 0 : v)
      if (nv >= W)
        V::store(out, x);
      else
        V::store_n(out, x, nv);
    }
  }
}

template <class V, class B, DType kRound, class C>
void columns_t(const OuterProduct& q, int64_t j0, int64_t j1) {
  constexpr int64_t step = V::kWidth * kTileVecs<V>;
  for (int64_t jb = j0; jb < j1; jb += kOuterCols) {
    const int64_t jb1 = std::min(j1, jb + kOuterCols);
    for (int64_t i0 = 0; i0 < q.m; i0 += kOuterRows) {
      const float* a = q.a + i0 * q.k;  // the row group's block
      for (int h = 0; h < kOuterRows && i0 + h < q.m; h += kTileRows<V>)
        for (int64_t j = jb; j < jb1; j += step) tile<V, B, kRound, C>(q, a, i0, h, j, std::min(step, jb1 - j));
    }
  }
}

template <class V, class B, DType kRound>
void columns_b(const OuterProduct& q, int64_t j0, int64_t j1) {
  switch (q.c_dtype) {
    case DType::kBF16: return columns_t<V, B, kRound, BFloat16>(q, j0, j1);
    case DType::kF16: return columns_t<V, B, kRound, Half>(q, j0, j1);
    default: return columns_t<V, B, kRound, float>(q, j0, j1);
  }
}

template <class V>
void columns(const OuterProduct& q, int64_t j0, int64_t j1) {
  if (q.b_dtype == DType::kBF16) return columns_b<V, BFloat16, DType::kF32>(q, j0, j1);
  if (q.b_dtype == DType::kF16) return columns_b<V, Half, DType::kF32>(q, j0, j1);
  if (q.b_round == DType::kF16) return columns_b<V, float, DType::kF16>(q, j0, j1);
  if (q.b_round == DType::kBF16) return columns_b<V, float, DType::kBF16>(q, j0, j1);
  columns_b<V, float, DType::kF32>(q, j0, j1);
}

}  // namespace outer_impl

template <class V>
GemmOuterKernels make_gemm_outer_kernels() {
  GemmOuterKernels k;
  k.name = V::kWidth == 16 ? "avx512" : V::kWidth == 8 ? "avx2" : "scalar";
  k.columns = outer_impl::columns<V>;
  return k;
}

}  // namespace demi::kernels::cpu_internal
