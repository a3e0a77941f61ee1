// The AMX tile configuration demi's tile kernels use, and the word transpose their VNNI-2 packing shares
// (include only from *_amx.cc files, compiled for AMX):
// palette 1, all eight tiles 16 rows of 64 bytes — a C tile of 16 x 16 f32, an A tile of 16 rows of 32 bf16,
// a B tile of 16 VNNI-2 rows (32 k x 16 columns). Loaded once per thread per parallel region (LDTILECFG
// costs a few hundred cycles), released at its end so that context switches stop saving the tiles.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "demi/core/half.h"

namespace demi::kernels::cpu_internal {

// LDTILECFG's 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// The configuration as a constant in memory: built on the stack, GCC 12 may drop or sink the stores that
// LDTILECFG reads (its builtin does not tell it that the memory is read), leaving colsb 0 beside rows 16,
// which faults (#GP, seen as SIGSEGV) in the first tile instruction.
inline constexpr TileConfig kTileConfig = [] {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}();

inline void configure_tiles() { _tile_loadconfig(&kTileConfig); }

// The first n (clamped to 0..16) of 16 lanes: a row's tail of masked loads and stores.
inline __attribute__((always_inline)) __mmask16 lanes(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : n <= 0 ? __mmask16{0} : static_cast<__mmask16>((1u << n) - 1);
}

// The first n (clamped to 0..32) of 32 words: a row's tail of 16-bit values.
inline __attribute__((always_inline)) __mmask32 words(int64_t n) {
  return n >= 32 ? ~__mmask32{0} : n <= 0 ? __mmask32{0} : static_cast<__mmask32>((1u << n) - 1u);
}

// A 2 x 2 block of C tiles, 32 x 32 f32 in tiles 0-3 (rows 0-15 | 16-31 x columns 0-15 | 16-31), held in
// memory as rows `ld` floats apart: zeroed, loaded, stored; and one 32-k step of its product, a's tiles
// (rows 0-15 at a0, 16-31 at a1, rows a_stride bytes apart) in 4, 5 and b's (columns 0-15 at b0, 16-31 at
// b1, VNNI rows b_stride bytes apart) in 6, 7: four tile loads for four products.
inline __attribute__((always_inline)) void zero_c_tiles() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

inline __attribute__((always_inline)) void load_c_tiles(const float* c, int64_t ld) {
  const int64_t stride = ld * static_cast<int64_t>(sizeof(float));
  _tile_loadd(0, c, stride);
  _tile_loadd(1, c + 16, stride);
  _tile_loadd(2, c + 16 * ld, stride);
  _tile_loadd(3, c + 16 * ld + 16, stride);
}

inline __attribute__((always_inline)) void store_c_tiles(float* c, int64_t ld) {
  const int64_t stride = ld * static_cast<int64_t>(sizeof(float));
  _tile_stored(0, c, stride);
  _tile_stored(1, c + 16, stride);
  _tile_stored(2, c + 16 * ld, stride);
  _tile_stored(3, c + 16 * ld + 16, stride);
}

inline __attribute__((always_inline)) void multiply_c_tiles(const void* a0, const void* a1, int64_t a_stride,
                                                            const void* b0, const void* b1, int64_t b_stride) {
  _tile_loadd(4, a0, a_stride);
  _tile_loadd(6, b0, b_stride);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, b1, b_stride);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(5, a1, a_stride);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// multiply_c_tiles for a block whose second column of C tiles is past the product's columns: tiles 0 and 2
// only (1 and 3 keep what they hold).
inline __attribute__((always_inline)) void multiply_c_column(const void* a0, const void* a1, int64_t a_stride,
                                                             const void* b0, int64_t b_stride) {
  _tile_loadd(4, a0, a_stride);
  _tile_loadd(6, b0, b_stride);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(5, a1, a_stride);
  _tile_dpbf16ps(2, 5, 6);
}

// r (16 rows of 16 32-bit words) transposed in place.
inline __attribute__((always_inline)) void transpose16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // within 128-bit lanes: (r_i[0], r_i+1[0], r_i[1], r_i+1[1]) ...
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // u[g + e], lane L: rows g..g+3 of column 4L + e
    r[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    r[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    r[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    r[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int e = 0; e < 4; ++e) {  // column 4L + e: lane L of r[e], r[4 + e], r[8 + e], r[12 + e]
    const __m512i x0 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x88), x1 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xdd);
    const __m512i y0 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x88);
    const __m512i y1 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xdd);
    t[e] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    t[4 + e] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    t[8 + e] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
    t[12 + e] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// 16 rows of bf16 values as B tiles of VNNI-2 pairs of consecutive values: rows [0, rows) at src + r * ld,
// n values each (0 past n, and in rows >= rows); for each 32 values from 0 on to `padded` (a multiple of
// 32), 16 rows of 16 words (word (q, r) = row r's values 2q, 2q + 1) at dst + p0 * 16. (A tile row of
// one 32-value step: 64 bytes; the step's 16 rows one B tile.)
inline void pack_value_pairs(const BFloat16* src, int64_t rows, int64_t ld, int64_t n, int64_t padded,
                             BFloat16* dst) {
  for (int64_t p0 = 0; p0 < padded; p0 += 32) {
    const __mmask32 m = words(n - p0);
    __m512i w[16];
    for (int r = 0; r < 16; ++r)
      w[r] = r < rows ? _mm512_maskz_loadu_epi16(m, src + r * ld + p0) : _mm512_setzero_si512();
    transpose16(w);  // each row's 32 values are 16 words (pairs); transposed, the 16 VNNI rows of those pairs
    for (int r = 0; r < 16; ++r) _mm512_storeu_si512(dst + p0 * 16 + r * 32, w[r]);
  }
}

}  // namespace demi::kernels::cpu_internal
