// The AMX level's ceilings: AVX-512's FMA loop, vdpbf16ps, the tile unit's TDPBF16PS (four independent
// 16 x 16 f32 accumulator tiles, 16 x 16 x 32 multiply-adds each), and AVX512-FP16's vfmaddph where the
// CPU has it (fp16 sums: what a product that accumulated in fp16 would run at; demi's never do).
#include <immintrin.h>

#include <cstdint>

#include "demi/core/cpu.h"
#include "demi/kernels/cpu/internal/amx_tiles.h"
#include "demi/kernels/cpu/internal/peak_kernels.h"

namespace demi::kernels::cpu_internal {
namespace {

double amx_loop(int64_t iters, float* sink) {
  configure_tiles();
  alignas(64) static const uint16_t zeros[16 * 32] = {};  // the rate does not depend on the values
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, zeros, 64);
  _tile_loadd(5, zeros, 64);
  _tile_loadd(6, zeros, 64);
  _tile_loadd(7, zeros, 64);
  for (int64_t it = 0; it < iters / 16; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float c[16 * 16];
  _tile_stored(0, c, 64);
  _tile_release();
  *sink += c[0];
  return static_cast<double>(iters / 16) * 4 * 16 * 16 * 32 * 2;
}

__attribute__((target("avx512fp16"))) double fp16_loop(int64_t iters, float* sink) {
  __m512h acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ph(static_cast<_Float16>(i) * static_cast<_Float16>(1e-3f));
  const __m512h x = _mm512_set1_ph(static_cast<_Float16>(1.0f)), y = _mm512_set1_ph(static_cast<_Float16>(1e-4f));
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ph(x, y, acc[i]);
  __m512h s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ph(s, acc[i]);
  alignas(64) _Float16 lanes[32];
  _mm512_store_ph(lanes, s);
  for (_Float16 lane : lanes) *sink += static_cast<float>(lane);
  return static_cast<double>(iters) * 16 * 32 * 2;
}

}  // namespace

const PeakKernels& peak_kernels_amx() {
  static const PeakKernels k{fma_loop_avx512, bf16_loop_avx512bf16, amx_loop,
                             cpu_features().avx512_fp16 ? fp16_loop : nullptr};
  return k;
}

}  // namespace demi::kernels::cpu_internal
