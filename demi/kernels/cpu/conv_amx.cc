// The tile body of the AMX convolution weight gradient (conv_amx.h). Compiled for AMX; reached only at the
// amx level.
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands, which -Wmaybe-uninitialized
// (and -Wuninitialized) report inside the intrinsic headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "demi/kernels/cpu/conv_amx.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "demi/kernels/cpu/internal/amx_tiles.h"

namespace demi::kernels::cpu {

using cpu_internal::configure_tiles;
using cpu_internal::transpose16;

void amx_conv_pack_dy(const AmxConvWeights& g, const BFloat16* dy, BFloat16* row, BFloat16* packed) {
  const int64_t kp = g.positions();
  // dy at the padded width: row o holds position y * wp + x = dy[o][y][x] for x < ow, 0 elsewhere.
  std::fill(row, row + g.oc * kp, BFloat16{});
  for (int64_t o = 0; o < g.oc; ++o)
    for (int64_t y = 0; y < g.oh; ++y)
      std::memcpy(static_cast<void*>(row + o * kp + y * g.wp), dy + (o * g.oh + y) * g.ow,
                  static_cast<size_t>(g.ow) * sizeof(BFloat16));
  // 16 channels x 32 positions: each channel's 32 values are its 16 words (position pairs); transposed,
  // the 16 VNNI rows of those pairs.
  for (int64_t t = 0; t < g.oc / 16; ++t)
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
      __m512i w[16];
      for (int r = 0; r < 16; ++r) w[r] = _mm512_loadu_si512(row + (t * 16 + r) * kp + k0);
      transpose16(w);
      BFloat16* dst = packed + (t * kp / 2 + k0 / 2) * 32;
      for (int q = 0; q < 16; ++q) _mm512_storeu_si512(dst + q * 32, w[q]);
    }
}

void amx_conv_weight_sums(const AmxConvWeights& g, const BFloat16* xpad, const BFloat16* dy, int64_t images,
                          float* sums, bool first) {
  const int64_t kp = g.positions(), steps = kp / 32, half = kp / 2;
  const int64_t stride = g.channel * static_cast<int64_t>(sizeof(BFloat16));  // a tile's rows: channels
  const int64_t srow = g.oc * static_cast<int64_t>(sizeof(float));  // sums' rows (channels), in bytes
  configure_tiles();
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j) {
      const int64_t tap = i * g.dilation_h * g.wp + j * g.dilation_w;
      for (int64_t cb = 0; cb < g.c; cb += 32)
        for (int64_t ob = 0; ob < g.oc; ob += 32) {
          float* s = sums + ((i * g.kw + j) * g.c + cb) * g.oc + ob;
          if (first) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
          } else {
            _tile_loadd(0, s, srow);
            _tile_loadd(1, s + 16, srow);
            _tile_loadd(2, s + 16 * g.oc, srow);
            _tile_loadd(3, s + 16 * g.oc + 16, srow);
          }
          for (int64_t n = 0; n < images; ++n) {
            const BFloat16* a0 = xpad + n * g.image + cb * g.channel + tap;  // channels cb .. cb + 15
            const BFloat16* a1 = a0 + 16 * g.channel;                        // cb + 16 .. cb + 31
            const BFloat16* b0 = dy + n * g.packed_dy() + (ob / 16) * half * 32;
            const BFloat16* b1 = b0 + half * 32;
            for (int64_t st = 0; st < steps; ++st) {
              _tile_loadd(4, a0 + st * 32, stride);
              _tile_loadd(6, b0 + st * 16 * 32, 64);
              _tile_dpbf16ps(0, 4, 6);
              _tile_loadd(7, b1 + st * 16 * 32, 64);
              _tile_dpbf16ps(1, 4, 7);
              _tile_loadd(5, a1 + st * 32, stride);
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
          }
          _tile_stored(0, s, srow);
          _tile_stored(1, s + 16, srow);
          _tile_stored(2, s + 16 * g.oc, srow);
          _tile_stored(3, s + 16 * g.oc + 16, srow);
        }
    }
  _tile_release();
}

}  // namespace demi::kernels::cpu

#pragma GCC diagnostic pop
