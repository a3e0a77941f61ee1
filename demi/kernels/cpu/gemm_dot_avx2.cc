// The AVX2 + FMA tile of the few-column dot-product GEMM (internal/gemm_dot_kernels.h): each output's 16 lane
// sums (lane l takes k = l, l + 16, ...) held as two 8-lane halves, so the lanes' partial sums are the
// AVX-512 tile's, FMA for FMA; the 16 lanes are then added in this file's own order. MR (1|2) rows x up to 3
// columns a pass (2 x 3 x 2 accumulators + 2 rows + 1 column = 15 of the 16 ymm registers); the K tail by
// masked loads (b, an f32 a) or VecAvx2::load_n (a bf16|f16 a, widened as it is loaded).
#include <algorithm>

#include "demi/kernels/cpu/internal/vec_avx2.h"  // first: immintrin.h under its warning pragmas
#include "demi/kernels/cpu/internal/gemm_dot_kernels.h"

namespace demi::kernels::cpu_internal {
namespace {

// Lanes below n (0 <= n <= 8) set, as _mm256_maskload_ps takes them.
inline __m256i lanes_below(int64_t n) { return _mm256_castps_si256(VecAvx2::lanes_below(n)); }

// The 16 lanes of (lo, hi): lo + hi lane by lane, then 8 -> 4 -> 2 -> 1.
inline float lane_sum(__m256 lo, __m256 hi) {
  const __m256 v = _mm256_add_ps(lo, hi);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// a's 8 values at p as f32 (the first n, the rest +0, for the tail).
inline __m256 load_a(const float* p) { return _mm256_loadu_ps(p); }
template <typename A>
inline __m256 load_a(const A* p) { return VecAvx2::load(p); }
inline __m256 load_a_n(const float* p, int64_t n) { return _mm256_maskload_ps(p, lanes_below(n)); }
template <typename A>
inline __m256 load_a_n(const A* p, int64_t n) { return VecAvx2::load_n(p, n); }

// out[r * ldo + j] for r < MR, j < NC (or with `lanes`, GemmDotKernels::tile's: (r, j)'s 16 lane sums at
// lanes + (r * ldo + j) * 16, the low half lo's).
template <int MR, int NC, typename A>
void tile_t(const A* a, int64_t lda, const float* b, int64_t ldb, int64_t k, float* lanes, bool first, float* out,
            int64_t ldo) {
  __m256 lo[MR][NC], hi[MR][NC];
#pragma GCC unroll 2
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < NC; ++j) {
      if (lanes && !first) {
        lo[r][j] = _mm256_loadu_ps(lanes + (r * ldo + j) * 16);
        hi[r][j] = _mm256_loadu_ps(lanes + (r * ldo + j) * 16 + 8);
      } else {
        lo[r][j] = hi[r][j] = _mm256_setzero_ps();
      }
    }
  // One half (lanes 0-7 or 8-15 of the 16) of 16 k's: n (<= 8) of them, the others +0 in both operands.
  const auto half = [&](__m256(&acc)[MR][NC], int64_t at, int64_t n) {
    __m256 x[MR];
#pragma GCC unroll 2
    for (int r = 0; r < MR; ++r) x[r] = n == 8 ? load_a(a + r * lda + at) : load_a_n(a + r * lda + at, n);
    const __m256i m = lanes_below(n);
#pragma GCC unroll 3
    for (int j = 0; j < NC; ++j) {
      const __m256 w = n == 8 ? _mm256_loadu_ps(b + j * ldb + at) : _mm256_maskload_ps(b + j * ldb + at, m);
#pragma GCC unroll 2
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm256_fmadd_ps(x[r], w, acc[r][j]);
    }
  };
  int64_t kk = 0;
  for (; kk + 16 <= k; kk += 16) {
    half(lo, kk, 8);
    half(hi, kk + 8, 8);
  }
  if (kk < k) {  // the tail
    half(lo, kk, std::min<int64_t>(k - kk, 8));
    if (k - kk > 8) half(hi, kk + 8, k - kk - 8);
  }
#pragma GCC unroll 2
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < NC; ++j) {
      if (out) {
        out[r * ldo + j] = lane_sum(lo[r][j], hi[r][j]);
      } else {
        _mm256_storeu_ps(lanes + (r * ldo + j) * 16, lo[r][j]);
        _mm256_storeu_ps(lanes + (r * ldo + j) * 16 + 8, hi[r][j]);
      }
    }
}

template <int MR, typename A>
void tile_rows(const A* a, int64_t lda, const float* b, int64_t ldb, int64_t k, int nc, float* lanes, bool first,
               float* out) {
  for (int j0 = 0; j0 < nc; j0 += 3) {
    const float* bj = b + j0 * ldb;
    float* l = lanes ? lanes + j0 * 16 : nullptr;
    float* o = out ? out + j0 : nullptr;
    switch (std::min(3, nc - j0)) {
      case 1: tile_t<MR, 1>(a, lda, bj, ldb, k, l, first, o, nc); break;
      case 2: tile_t<MR, 2>(a, lda, bj, ldb, k, l, first, o, nc); break;
      default: tile_t<MR, 3>(a, lda, bj, ldb, k, l, first, o, nc); break;
    }
  }
}

// The tiles for an a of type A (f32, or bf16|f16 widened as loaded): dot_kernels_of's Tiles.
struct Tiles {
  template <typename A>
  static void of(const A* a, int64_t lda, const float* b, int64_t ldb, int64_t k, int mr, int nc, float* lanes,
                 bool first, float* out) {
    if (mr == 2)
      tile_rows<2>(a, lda, b, ldb, k, nc, lanes, first, out);
    else
      tile_rows<1>(a, lda, b, ldb, k, nc, lanes, first, out);
  }
};

}  // namespace

const GemmDotKernels& gemm_dot_kernels_avx2() {
  static const GemmDotKernels k = dot_kernels_of<Tiles>("avx2");
  return k;
}

}  // namespace demi::kernels::cpu_internal
