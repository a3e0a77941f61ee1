// The AVX-512 tile of the few-column dot-product GEMM (internal/gemm_dot_kernels.h): MR rows x NC columns in
// MR * NC zmm accumulators, per 16 k: MR + NC loads for MR * NC FMAs; masked loads for the K tail.
#include <algorithm>
#include <array>
#include <utility>

#include "demi/kernels/cpu/internal/vec_avx512.h"  // first: immintrin.h under its warning pragmas
#include "demi/kernels/cpu/internal/gemm_dot_kernels.h"

namespace demi::kernels::cpu_internal {
namespace {

// a's 16 (masked: the first lanes of m) values at p as f32.
inline __m512 load_a(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_a(const Half* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
inline __m512 load_a(const BFloat16* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

template <int MR, int NC, typename A>
void tile_t(const A* a, int64_t lda, const float* b, int64_t ldb, int64_t k, float* lanes, bool first, float* out) {
  __m512 acc[MR][NC];
#pragma GCC unroll 2
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 12
    for (int j = 0; j < NC; ++j)
      acc[r][j] = lanes && !first ? _mm512_loadu_ps(lanes + (r * NC + j) * 16) : _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; kk += 16) {
    const __mmask16 m = k - kk >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (k - kk)) - 1u);
    __m512 x[MR];
#pragma GCC unroll 2
    for (int r = 0; r < MR; ++r) x[r] = load_a(a + r * lda + kk, m);
#pragma GCC unroll 12
    for (int j = 0; j < NC; ++j) {
      const __m512 w = _mm512_maskz_loadu_ps(m, b + j * ldb + kk);
#pragma GCC unroll 2
      for (int r = 0; r < MR; ++r) acc[r][j] = _mm512_fmadd_ps(x[r], w, acc[r][j]);
    }
  }
#pragma GCC unroll 2
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 12
    for (int j = 0; j < NC; ++j) {
      if (out)
        out[r * NC + j] = _mm512_reduce_add_ps(acc[r][j]);
      else
        _mm512_storeu_ps(lanes + (r * NC + j) * 16, acc[r][j]);
    }
}

template <typename A>
using Tile = void (*)(const A*, int64_t, const float*, int64_t, int64_t, float*, bool, float*);

template <int MR, typename A, int... NC>
constexpr std::array<Tile<A>, kDotTileN + 1> tiles(std::integer_sequence<int, NC...>) {
  return {nullptr, tile_t<MR, NC + 1, A>...};
}

// The tiles for an a of type A (f32, or bf16|f16 widened as loaded): dot_kernels_of's Tiles.
struct Tiles {
  template <typename A>
  static void of(const A* a, int64_t lda, const float* b, int64_t ldb, int64_t k, int mr, int nc, float* lanes,
                 bool first, float* out) {
    static constexpr auto kTiles1 = tiles<1, A>(std::make_integer_sequence<int, kDotTileN>{});
    static constexpr auto kTiles2 = tiles<2, A>(std::make_integer_sequence<int, kDotTileN>{});
    (mr == 2 ? kTiles2 : kTiles1)[static_cast<size_t>(nc)](a, lda, b, ldb, k, lanes, first, out);
  }
};

}  // namespace

const GemmDotKernels& gemm_dot_kernels_avx512() {
  static const GemmDotKernels k = dot_kernels_of<Tiles>("avx512");
  return k;
}

}  // namespace demi::kernels::cpu_internal
