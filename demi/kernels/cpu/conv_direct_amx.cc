// The tile-unit (AMX) pieces of the direct convolution (internal/conv_direct_kernels.h): a network's first
// layer, K = C * KH * KW taps (model A's 27, B's 9), multiplied as one (or two) 32-k steps of the tile unit
// instead of K FMAs per output. The forward multiplies the weights (A: output channels x tap slots) by the
// image's taps (B: tap pairs x positions at the padded width, each tap one run of the padded image) into
// 2 x 2 blocks of C tiles; the weight gradient multiplies the image's columns (A: tap slots x positions, a
// row of ones for the bias) by dz packed in VNNI pairs of positions (B). Both build their B (and the
// gradient's A) per image in vector registers from the f32-padded image, whose values are widened bf16:
// the top halves, exactly. An f16 weight gradient (image and dz f16) splits each value into bf16 hi + lo
// (f16_split_avx512.h) and takes the four products of the parts (weight_sums_tiles_f16). Everything else is
// the AVX512-BF16 table's.
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands, which -Wmaybe-uninitialized
// (and -Wuninitialized) report inside the intrinsic headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <algorithm>
#include <cstring>

#include "demi/kernels/cpu/internal/vec_avx512.h"  // first: immintrin.h under its warning pragmas
#include "demi/kernels/cpu/internal/conv_direct_avx512_impl.h"
#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/kernels/cpu/internal/amx_tiles.h"
#include "demi/kernels/cpu/internal/conv_direct_kernels.h"
#include "demi/kernels/cpu/internal/f16_split_avx512.h"

#if !defined(__AMX_BF16__)
#error "conv_direct_amx.cc needs -mamx-bf16 (files named *_amx.cc get it)"
#endif

namespace demi::kernels::cpu_internal {
namespace {

// y (oc, OH, OW) from the sums at the padded width, out (OCP, Q): + bias, ReLU, the positions inside the output
// only, a channel's plane at a time; in bf16 (y_bf16) rounded once from the f32 plane, built in `plane`
// (OH * OW floats), by demi's converter (subnormals kept, as Tensor::to rounds).
void store_planes(const DirectGeom& g, const TileGeom& t, const float* out, const float* bias, bool relu, void* y,
                  bool y_bf16, float* plane, int64_t oc) {
  const demi::internal::ConvertKernels& cvt = demi::internal::convert_kernels(CpuLevel::kAvx512Bf16);
  const __m512 zero = _mm512_setzero_ps();
  const int64_t positions = g.oh * g.ow;
  for (int64_t o = 0; o < oc; ++o) {
    const __m512 b = _mm512_set1_ps(bias[o]);
    float* dst = y_bf16 ? plane : static_cast<float*>(y) + o * positions;
    for (int64_t oy = 0; oy < g.oh; ++oy, dst += g.ow) {
      const float* src = out + o * t.q + oy * g.wp;
      for (int64_t ox = 0; ox < g.ow; ox += 16) {
        const __mmask16 m = static_cast<__mmask16>(g.ow - ox >= 16 ? 0xFFFF : (1u << (g.ow - ox)) - 1u);
        __m512 r = _mm512_add_ps(_mm512_maskz_loadu_ps(m, src + ox), b);
        if (relu) r = _mm512_max_ps(zero, r);  // zero first: -0 and NaN pass, as relu(v) = v < 0 ? 0 : v keeps them
        _mm512_mask_storeu_ps(dst + ox, m, r);
      }
    }
    if (y_bf16) cvt.f32_to_bf16(plane, static_cast<BFloat16*>(y) + o * positions, positions);
  }
}

// taps (fwd_slots / 2, Q) from the padded image xp.
void build_taps(const DirectGeom& g, const TileGeom& t, const float* xp, uint32_t* taps) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t s = 0; s < t.fwd_slots / 2; ++s) {
    uint32_t* row = taps + s * t.q;
    const int64_t t0 = 2 * s, t1 = 2 * s + 1;
    if (t0 >= g.k) {
      std::memset(row, 0, static_cast<size_t>(t.q) * sizeof(uint32_t));
      continue;
    }
    const float* x0 = xp + tap_offset(g, t0);
    const float* x1 = t1 < g.k ? xp + tap_offset(g, t1) : nullptr;
    for (int64_t q = 0; q < t.q; q += 16) {
      const __m512i lo = _mm512_srli_epi32(_mm512_loadu_si512(x0 + q), 16);
      const __m512i hi = x1 ? _mm512_and_si512(_mm512_loadu_si512(x1 + q), high) : _mm512_setzero_si512();
      _mm512_storeu_si512(row + q, _mm512_or_si512(lo, hi));
    }
  }
}

// out (OCP, q1 - q0) f32, rows ld floats apart = wt . taps at the positions [q0, q1) (multiples of 32). With
// the tiles configured.
void block_sums(const TileGeom& t, const BFloat16* wt, const uint32_t* taps, int64_t q0, int64_t q1, float* out,
                int64_t ld) {
  const int64_t a_stride = t.fwd_slots * static_cast<int64_t>(sizeof(BFloat16));
  const int64_t b_stride = t.q * static_cast<int64_t>(sizeof(uint32_t));
  for (int64_t ob = 0; ob < t.ocp; ob += 32)
    for (int64_t pb = q0; pb < q1; pb += 32) {
      zero_c_tiles();
      for (int64_t kb = 0; kb < t.fwd_slots; kb += 32) {
        const BFloat16* a0 = wt + ob * t.fwd_slots + kb;  // output channels ob .. ob + 15
        const uint32_t* b0 = taps + (kb / 2) * t.q + pb;   // positions pb .. pb + 15
        multiply_c_tiles(a0, a0 + 16 * t.fwd_slots, a_stride, b0, b0 + 16, b_stride);
      }
      store_c_tiles(out + ob * ld + (pb - q0), ld);
    }
}

void forward_tiles(const DirectGeom& g, const TileGeom& t, const float* xp, const BFloat16* wt, const float* bias,
                   bool relu, uint32_t* taps, void* y, bool y_bf16, int64_t oc) {
  build_taps(g, t, xp, taps);
  float* out = reinterpret_cast<float*>(taps + t.fwd_slots / 2 * t.q);
  configure_tiles();
  block_sums(t, wt, taps, 0, t.q, out, t.q);
  _tile_release();
  store_planes(g, t, out, bias, relu, y, y_bf16, out + t.ocp * t.q, oc);
}

// The sums' 2 x 2 windows pooled by the FMA tiles' epilogue (conv_direct_avx512_impl.h), 6 channels at a
// time: its accumulators loaded from the sums (rows 2 py and 2 py + 1, 32 columns from 2 px0; the columns
// past OW hold other sums, which the epilogue drops). A few pooled rows at a time (tile_pool_chunk), their
// sums computed into an L1-sized block just before they are pooled: the image's sums never pass through L2.
template <bool kRoundBf16>
void forward_pool2x2_tiles_t(const DirectGeom& g, const TileGeom& t, const float* xp, const BFloat16* wt,
                             const float* bias, uint32_t* taps, float* pooled, uint8_t* argmax, int64_t oc, int64_t ph,
                             int64_t pw) {
  constexpr int kOcb = kDirectPoolOcb;
  build_taps(g, t, xp, taps);
  float* out = reinterpret_cast<float*>(taps + t.fwd_slots / 2 * t.q);
  const int64_t rows = tile_pool_chunk(g, t).rows;
  const int64_t last_px0 = (pw - 1) / 16 * 16;  // the epilogue's last group of 16 pooled columns
  configure_tiles();
  for (int64_t py0 = 0; py0 < ph; py0 += rows) {
    const int64_t py1 = std::min(ph, py0 + rows);
    // The positions the pool reads: from row 2 py0 to 32 columns from 2 last_px0 in row 2 py1 - 1, in whole
    // blocks of 32 (within Q, whose last block is slack: 2 last_px0 < OW <= WP).
    const int64_t q0 = 2 * py0 * g.wp / 32 * 32;
    const int64_t q1 = ((2 * py1 - 1) * g.wp + 2 * last_px0 + 32 + 31) / 32 * 32, ld = q1 - q0;
    block_sums(t, wt, taps, q0, q1, out, ld);
    for (int64_t o0 = 0; o0 < oc; o0 += kOcb) {
      const int ocn = static_cast<int>(std::min<int64_t>(kOcb, oc - o0));
      direct_avx512::forward_pool2x2_rows<kRoundBf16>(
          bias + o0, pooled + o0 * ph * pw, argmax ? argmax + o0 * ph * pw : nullptr, ocn, py0, py1, ph, pw,
          [&](__m512 (&acc)[kOcb][2][2], int64_t py, int64_t px0) {
#pragma GCC unroll 6
            for (int o = 0; o < kOcb; ++o) {
              if (o >= ocn) break;
              const float* row = out + (o0 + o) * ld + 2 * py * g.wp - q0 + 2 * px0;
              acc[o][0][0] = _mm512_loadu_ps(row);
              acc[o][0][1] = _mm512_loadu_ps(row + 16);
              acc[o][1][0] = _mm512_loadu_ps(row + g.wp);
              acc[o][1][1] = _mm512_loadu_ps(row + g.wp + 16);
            }
          });
    }
  }
  _tile_release();
}

void forward_pool2x2_tiles(const DirectGeom& g, const TileGeom& t, const float* xp, const BFloat16* wt,
                           const float* bias, bool round_bf16, uint32_t* taps, float* pooled, uint8_t* argmax,
                           int64_t oc, int64_t ph, int64_t pw) {
  if (round_bf16) return forward_pool2x2_tiles_t<true>(g, t, xp, wt, bias, taps, pooled, argmax, oc, ph, pw);
  forward_pool2x2_tiles_t<false>(g, t, xp, wt, bias, taps, pooled, argmax, oc, ph, pw);
}

void columns_tiles(const DirectGeom& g, const TileGeom& t, const float* xp, int64_t p0, BFloat16* tcol) {
  const int64_t positions = g.oh * g.ow, np = std::min(t.cp, t.pp - p0), end = std::min(p0 + np, positions);
  const int64_t oy0 = p0 / g.ow, ox0 = p0 % g.ow;  // (once: a division per row run made it 1.4x slower)
  for (int64_t k = 0; k < g.k; ++k) {
    const float* src = xp + tap_offset(g, k);
    BFloat16* dst = tcol + k * t.cp;
    for (int64_t p = p0, oy = oy0, ox = ox0; p < end; ++oy, ox = 0) {  // the chunk's runs of output rows
      const int64_t run = std::min(g.ow - ox, end - p);
      direct_avx512::narrow_row_bf16(src + oy * g.wp + ox, dst + (p - p0), run);
      p += run;
    }
    std::fill(dst + std::max<int64_t>(end - p0, 0), dst + np, BFloat16{});
  }
  // The bias's row: 1.0 (bf16 0x3F80) at the positions, 0 past them; the slots after it 0.
  BFloat16* ones = tcol + g.k * t.cp;
  std::fill(ones, ones + std::max<int64_t>(end - p0, 0), BFloat16(1.0f));
  std::fill(ones + std::max<int64_t>(end - p0, 0), ones + np, BFloat16{});
  for (int64_t k = g.k + 1; k < t.grad_slots; ++k) std::fill(tcol + k * t.cp, tcol + k * t.cp + np, BFloat16{});
}

void pack_dz_tiles(const BFloat16* dz, int64_t on, int64_t positions, int64_t pp, BFloat16* dzt) {
  cpu_internal::pack_value_pairs(dz, on, positions, positions, pp, dzt);
}

void weight_sums_tiles(const DirectGeom& g, const TileGeom& t, const float* xp, const BFloat16* dzt, BFloat16* tcol,
                       float* sums) {
  const int64_t a_stride = t.cp * static_cast<int64_t>(sizeof(BFloat16)), block = (t.pp / 2) * 32;
  configure_tiles();  // (once per image, not per chunk)
  for (int64_t p0 = 0; p0 < t.pp; p0 += t.cp) {
    columns_tiles(g, t, xp, p0, tcol);
    const int64_t np = std::min(t.cp, t.pp - p0);
    for (int64_t kb = 0; kb < t.grad_slots; kb += 32)
      for (int64_t ob = 0; ob < t.ocp; ob += 32) {
        float* s = sums + kb * t.ocp + ob;
        load_c_tiles(s, t.ocp);
        const BFloat16* a0 = tcol + kb * t.cp;  // slots kb .. kb + 15
        const BFloat16* b0 = dzt + (ob / 16) * block + p0 * 16;  // output channels ob .. ob + 15, from p0
        for (int64_t q = 0; q < np; q += 32)
          multiply_c_tiles(a0 + q, a0 + 16 * t.cp + q, a_stride, b0 + q * 16, b0 + block + q * 16, 64);
        store_c_tiles(s, t.ocp);
      }
  }
  _tile_release();
}

// The padded image's values (xp's C * HP * WP, rounded up to 32: into its slack) split into bf16 hi and lo
// parts (f16_split_avx512.h).
void split_image(const DirectGeom& g, const float* xp, BFloat16* hi, BFloat16* lo) {
  const int64_t n = image_split_values(g);
  for (int64_t i = 0; i < n; i += 32) {
    __m512i h, l;
    split_f32x32(_mm512_loadu_ps(xp + i), _mm512_loadu_ps(xp + i + 16), &h, &l);
    _mm512_storeu_si512(hi + i, h);
    _mm512_storeu_si512(lo + i, l);
  }
}

// The columns' rows that are the same in every chunk (TileGeom::sr rows of TileGeom::wq positions): the
// bias's, 1.0 in hi at each row's OW positions, 0 in lo, and the slots past it, 0.
void constant_columns(const DirectGeom& g, const TileGeom& t, BFloat16* hi, BFloat16* lo) {
  const __m512i one = _mm512_set1_epi16(static_cast<short>(BFloat16(1.0f).bits));
  for (int64_t r = 0; r < t.sr; ++r)
    for (int64_t b = 0; b < t.wq; b += 32)
      _mm512_storeu_si512(hi + g.k * t.sp + r * t.wq + b, _mm512_maskz_mov_epi16(words(g.ow - b), one));
  std::fill(lo + g.k * t.sp, lo + (g.k + 1) * t.sp, BFloat16{});
  std::fill(hi + (g.k + 1) * t.sp, hi + t.grad_slots * t.sp, BFloat16{});
  std::fill(lo + (g.k + 1) * t.sp, lo + t.grad_slots * t.sp, BFloat16{});
}

// The taps' columns of output rows [oy0, oy0 + rows) from the split image (xh, xl): row k of hi and lo holds
// tap k at positions r * WQ + ox (0 past OW: a pad position's pixel would meet dz's 0 there, and an Inf or
// NaN would make it NaN).
void columns_split(const DirectGeom& g, const TileGeom& t, const BFloat16* xh, const BFloat16* xl, int64_t oy0,
                   int64_t rows, BFloat16* hi, BFloat16* lo) {
  for (int64_t k = 0; k < g.k; ++k) {
    const int64_t off = tap_offset(g, k);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < t.wq; b += 32) {
        const __mmask32 m = words(g.ow - b);
        const int64_t at = off + (oy0 + r) * g.wp + b, to = k * t.sp + r * t.wq + b;
        _mm512_storeu_si512(hi + to, _mm512_maskz_loadu_epi16(m, xh + at));
        _mm512_storeu_si512(lo + to, _mm512_maskz_loadu_epi16(m, xl + at));
      }
  }
}

// dz's 32 values of channel c at output row y from column x0 (a multiple of 32) as f16 bits, 0 past OW:
// from its dense rows (`rows`: the channels' rows, OH * OW apart) or from the 2x2 pool's gradient (dy and
// argmax of the channel's pooled plane, PH x PW), as max_pool2d_backward builds them.
inline __m512i dz_block(const DirectGeom& g, const F16Dz& dz, const Half* rows, int64_t c, int64_t y, int64_t x0) {
  if (dz.rows != nullptr) return _mm512_maskz_loadu_epi16(words(g.ow - x0), rows + c * g.oh * g.ow + y * g.ow + x0);
  if (y / 2 >= dz.ph) return _mm512_setzero_si512();
  const int64_t at = (c * dz.ph + y / 2) * dz.pw + x0 / 2;
  const __mmask16 m = lanes(dz.pw - x0 / 2);
  const __m512i d = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, dz.dy + at));
  const __m512i i = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, dz.argmax + at));
  const int first = static_cast<int>(2 * (y % 2));  // the window's index of (y, even x); + 1: odd x
  return _mm512_or_si512(_mm512_maskz_mov_epi32(_mm512_cmpeq_epi32_mask(i, _mm512_set1_epi32(first)), d),
                         _mm512_maskz_slli_epi32(_mm512_cmpeq_epi32_mask(i, _mm512_set1_epi32(first + 1)), d, 16));
}

// dz's channels [o0, o0 + on) (on <= 16) at output rows [oy0, oy0 + rows) split and packed as B tiles: per
// 32 positions (r * WQ + b), 16 VNNI-2 rows of the 16 channels' pairs, hi parts to hi and lo parts to lo (0
// past OW and past `on`). The f16 pairs are transposed first (a pair's two values stay together), then each
// VNNI row is split.
void pack_dz_split(const DirectGeom& g, const TileGeom& t, const F16Dz& dz, int64_t o0, int64_t on, int64_t oy0,
                   int64_t rows, BFloat16* hi, BFloat16* lo) {
  const Half* block = dz.rows != nullptr ? dz.rows[o0 / 16] : nullptr;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < t.wq; b += 32) {
      __m512i w[16];
      for (int c = 0; c < 16; ++c)
        w[c] = c < on ? dz_block(g, dz, block, dz.rows != nullptr ? c : o0 + c, oy0 + r, b) : _mm512_setzero_si512();
      transpose16(w);
      const int64_t to = (r * t.wq + b) * 16;
      for (int q = 0; q < 16; ++q) {
        __m512i h, l;
        split_f16x32(w[q], &h, &l);
        _mm512_storeu_si512(hi + to + q * 32, h);
        _mm512_storeu_si512(lo + to + q * 32, l);
      }
    }
}

// One 32-k step of a 2 x 1 block of C tiles (tiles 0, 1: rows 0-15, 16-31 of 16 columns) taking the four
// products of split operands, hi hi, hi lo, lo hi, lo lo: a's rows 0-15 and 16-31 (hi at ah0, ah1, lo at
// al0, al1) in tiles 2, 3 and 4, 5, b's hi and lo (bh, bl) in 6, 7, each loaded once. (A 2 x 2 block has
// eight input tiles for six registers: with its parts reloaded product by product it measured no faster.)
inline __attribute__((always_inline)) void multiply_c_pair_split(const BFloat16* ah0, const BFloat16* ah1,
                                                                 const BFloat16* al0, const BFloat16* al1,
                                                                 int64_t a_stride, const BFloat16* bh,
                                                                 const BFloat16* bl) {
  _tile_loadd(2, ah0, a_stride);
  _tile_loadd(6, bh, 64);
  _tile_dpbf16ps(0, 2, 6);
  _tile_loadd(3, ah1, a_stride);
  _tile_dpbf16ps(1, 3, 6);
  _tile_loadd(7, bl, 64);
  _tile_dpbf16ps(0, 2, 7);
  _tile_dpbf16ps(1, 3, 7);
  _tile_loadd(4, al0, a_stride);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(5, al1, a_stride);
  _tile_dpbf16ps(1, 5, 6);
  _tile_dpbf16ps(0, 4, 7);
  _tile_dpbf16ps(1, 5, 7);
}

void weight_sums_tiles_f16(const DirectGeom& g, const TileGeom& t, const float* xp, const F16Dz& dz, int64_t oc,
                           BFloat16* split, float* sums) {
  const int64_t a_stride = t.sp * static_cast<int64_t>(sizeof(BFloat16));
  const int64_t image = image_split_values(g), ld = t.ocp * static_cast<int64_t>(sizeof(float));
  BFloat16 *x_hi = split, *x_lo = x_hi + image, *col_hi = x_lo + image, *col_lo = col_hi + t.grad_slots * t.sp;
  BFloat16 *dz_hi = col_lo + t.grad_slots * t.sp, *dz_lo = dz_hi + t.ocp * t.sp;
  split_image(g, xp, x_hi, x_lo);
  constant_columns(g, t, col_hi, col_lo);
  configure_tiles();  // (once per image, not per chunk)
  for (int64_t oy0 = 0; oy0 < g.oh; oy0 += t.sr) {
    const int64_t rows = std::min(t.sr, g.oh - oy0), np = rows * t.wq, block = np * 16;  // (a channel block's words)
    columns_split(g, t, x_hi, x_lo, oy0, rows, col_hi, col_lo);
    for (int64_t o0 = 0; o0 < oc; o0 += 16)
      pack_dz_split(g, t, dz, o0, std::min<int64_t>(16, oc - o0), oy0, rows, dz_hi + o0 * np, dz_lo + o0 * np);
    for (int64_t kb = 0; kb < t.grad_slots; kb += 32)
      for (int64_t ob = 0; ob < oc; ob += 16) {  // (the blocks past OC: dz 0, their sums stay 0)
        float* s = sums + kb * t.ocp + ob;
        _tile_loadd(0, s, ld);
        _tile_loadd(1, s + 16 * t.ocp, ld);
        const BFloat16 *ah = col_hi + kb * t.sp, *al = col_lo + kb * t.sp;  // slots kb .. kb + 31
        const BFloat16 *bh = dz_hi + (ob / 16) * block, *bl = dz_lo + (ob / 16) * block;
        for (int64_t q = 0; q < np; q += 32)
          multiply_c_pair_split(ah + q, ah + 16 * t.sp + q, al + q, al + 16 * t.sp + q, a_stride, bh + q * 16,
                                bl + q * 16);
        _tile_stored(0, s, ld);
        _tile_stored(1, s + 16 * t.ocp, ld);
      }
  }
  _tile_release();
}

}  // namespace

const DirectConvKernels& direct_conv_kernels_amx() {
  static const DirectConvKernels k = [] {
    DirectConvKernels t = direct_conv_kernels_avx512bf16();
    t.name = "amx";
    t.forward_tiles = forward_tiles;
    t.forward_pool2x2_tiles = forward_pool2x2_tiles;
    t.pack_dz_tiles = pack_dz_tiles;
    t.weight_sums_tiles = weight_sums_tiles;
    t.weight_sums_tiles_f16 = weight_sums_tiles_f16;
    return t;
  }();
  return k;
}

}  // namespace demi::kernels::cpu_internal

#pragma GCC diagnostic pop
