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

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/kernels/cpu/internal/amx_tiles.h"
#include "demi/kernels/cpu/internal/f16_split_avx512.h"

namespace demi::kernels::cpu {

using cpu_internal::configure_tiles;
using cpu_internal::lanes;
using cpu_internal::load_c_tiles;
using cpu_internal::multiply_c_tiles;
using cpu_internal::store_c_tiles;
using cpu_internal::zero_c_tiles;
using cpu_internal::pack_value_pairs;

namespace {

// 16 f16 values (mask lanes; the others 0): their hi (part 0) or lo (part 1) parts (f16_split.h's split).
__m256i split_part(const Half* src, __mmask16 m, int part) {
  __m256i hi, lo;
  cpu_internal::split_f16x16(src, m, &hi, &lo);
  return part == 0 ? hi : lo;
}

}  // namespace

void amx_conv_pad_pairs(const AmxConvGeometry& g, int64_t h, int64_t w, int64_t pad_top, int64_t pad_left,
                        const void* x, bool split, BFloat16* dst) {
  const int64_t ic = g.image_channels(), c_of_x = split ? ic / 2 : ic, hp = g.channel / g.wp;
  std::fill(dst, dst + ic / 2 * g.channel * 2, BFloat16{});
  for (int64_t cp = 0; cp < ic / 2; ++cp) {
    const int64_t c = (2 * cp) % c_of_x;  // channels c, c + 1 of x (of one part where split)
    const int part = split ? static_cast<int>((2 * cp) / c_of_x) : 0;  // hi, lo
    for (int64_t iy = 0; iy < h; ++iy) {
      BFloat16* out = dst + ((cp * hp + iy + pad_top) * g.wp + pad_left) * 2;
      const int64_t at = (c * h + iy) * w;
      for (int64_t ix = 0; ix < w; ix += 16) {
        const __mmask16 m = lanes(w - ix);
        __m256i even, odd;  // channel c's and c + 1's 16 values as bf16
        if (split) {
          even = split_part(static_cast<const Half*>(x) + at + ix, m, part);
          odd = split_part(static_cast<const Half*>(x) + at + h * w + ix, m, part);
        } else {
          even = _mm256_maskz_loadu_epi16(m, static_cast<const BFloat16*>(x) + at + ix);
          odd = _mm256_maskz_loadu_epi16(m, static_cast<const BFloat16*>(x) + at + h * w + ix);
        }
        const __m512i v = _mm512_or_si512(_mm512_cvtepu16_epi32(even), _mm512_slli_epi32(_mm512_cvtepu16_epi32(odd), 16));
        _mm512_mask_storeu_epi32(out + 2 * ix, m, v);
      }
    }
  }
}

void amx_conv_pack_dy(const AmxConvGeometry& g, const BFloat16* dy, BFloat16* row, BFloat16* packed) {
  const int64_t kp = g.positions();
  // dy at the padded width: row o holds position y * wp + x = dy[o][y][x] for x < ow, 0 elsewhere.
  std::fill(row, row + g.oc * kp, BFloat16{});
  for (int64_t o = 0; o < g.oc; ++o)
    for (int64_t y = 0; y < g.oh; ++y)
      std::memcpy(static_cast<void*>(row + o * kp + y * g.wp), dy + (o * g.oh + y) * g.ow,
                  static_cast<size_t>(g.ow) * sizeof(BFloat16));
  for (int64_t t = 0; t < g.oc / 16; ++t)  // 16 channels at a time: a B tile column
    pack_value_pairs(row + t * 16 * kp, 16, kp, kp, kp, packed + t * kp / 2 * 32);
}

// The most steps (a tap's block of 32 channels) of one output-channel block whose weights stay in L1 across
// the position blocks (24 KiB: 12 steps of two 1 KiB tiles; a 3 x 3 layer of 32 channels has 9). Where a block
// has more (more channels, or f16 split into 4C), they run in runs of even length over every position block,
// the sums stored into `out` and loaded back between runs (exactly: the same sums in the same order as one
// pass); in one pass, a 128-channel block streamed its 72 KiB of weights from L2 once per 32 positions.
constexpr int64_t kForwardRunSteps = 12;

void amx_conv_forward_image(const AmxConvGeometry& g, const BFloat16* wt, const BFloat16* pairs, float* out) {
  const int64_t kp = g.positions(), blocks = g.c / 32, steps = g.kh * g.kw * blocks, ic = g.image_channels();
  const int64_t runs = (steps + kForwardRunSteps - 1) / kForwardRunSteps, run = (steps + runs - 1) / runs;
  const int64_t a_stride = g.c * static_cast<int64_t>(sizeof(BFloat16));       // wt's rows: output channels
  const int64_t b_stride = 2 * g.channel * static_cast<int64_t>(sizeof(BFloat16));  // pair planes
  configure_tiles();
  for (int64_t ob = 0; ob < g.oc; ob += 32)
    for (int64_t s0 = 0; s0 < steps; s0 += run) {
      const int64_t s1 = std::min(steps, s0 + run);
      for (int64_t pb = 0; pb < kp; pb += 32) {
        float* sums = out + ob * kp + pb;
        if (s0 == 0)
          zero_c_tiles();
        else
          load_c_tiles(sums, kp);
        for (int64_t st = s0; st < s1; ++st) {  // step st: tap st / blocks, channels 32 (st % blocks) on
          const int64_t tap = st / blocks, cb = (st % blocks) * 32, i = tap / g.kw, j = tap % g.kw;
          const int64_t off = i * g.dilation_h * g.wp + j * g.dilation_w;
          const BFloat16* a0 = wt + (tap * g.oc + ob) * g.c + cb;  // output channels ob .. ob + 15
          const BFloat16* a1 = a0 + 16 * g.c;                      // ob + 16 .. ob + 31
          const BFloat16* b0 = pairs + (((cb % ic) / 2) * g.channel + pb + off) * 2;  // positions pb .. pb + 15
          const BFloat16* b1 = b0 + 32;                                        // pb + 16 .. pb + 31
          multiply_c_tiles(a0, a1, a_stride, b0, b1, b_stride);
        }
        store_c_tiles(sums, kp);
      }
    }
  _tile_release();
}

void amx_conv_store(const AmxConvGeometry& g, const float* out, const float* bias, bool relu, bool accumulate,
                    void* y, DType y_dtype, float* plane) {
  const demi::internal::ConvertKernels& cvt = demi::internal::convert_kernels(CpuLevel::kAvx512Bf16);
  const int64_t kp = g.positions(), P = g.oh * g.ow;
  const bool narrow = y_dtype != DType::kF32;
  for (int64_t o = 0; o < g.oc; ++o) {
    const __m512 b = _mm512_set1_ps(bias != nullptr ? bias[o] : 0.0f);
    // Channel o's plane in f32 (in y itself where y is f32), then rounded once, whole, into bf16 or f16.
    float* dst = narrow ? plane : static_cast<float*>(y) + o * P;
    if (accumulate && y_dtype == DType::kBF16) cvt.bf16_to_f32(static_cast<const BFloat16*>(y) + o * P, plane, P);
    if (accumulate && y_dtype == DType::kF16) cvt.f16_to_f32(static_cast<const Half*>(y) + o * P, plane, P);
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      const float* src = out + o * kp + oy * g.wp;
      float* d = dst + oy * g.ow;
      for (int64_t x0 = 0; x0 < g.ow; x0 += 16) {
        const __mmask16 m = static_cast<__mmask16>(g.ow - x0 >= 16 ? 0xffff : (1u << (g.ow - x0)) - 1);
        __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, src + x0), b);
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, d + x0));
        if (relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
        _mm512_mask_storeu_ps(d + x0, m, v);
      }
    }
    if (y_dtype == DType::kBF16) cvt.f32_to_bf16(plane, static_cast<BFloat16*>(y) + o * P, P);
    if (y_dtype == DType::kF16) cvt.f32_to_f16(plane, static_cast<Half*>(y) + o * P, P);
  }
}

void amx_conv_weight_sums(const AmxConvGeometry& g, const BFloat16* xpad, const BFloat16* dy, int64_t images,
                          float* sums, bool first) {
  const int64_t kp = g.positions(), steps = kp / 32, half = kp / 2;
  const int64_t stride = g.channel * static_cast<int64_t>(sizeof(BFloat16));  // a tile's rows: channels
  configure_tiles();
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j) {
      const int64_t tap = i * g.dilation_h * g.wp + j * g.dilation_w;
      for (int64_t cb = 0; cb < g.c; cb += 32)
        for (int64_t ob = 0; ob < g.oc; ob += 32) {
          float* s = sums + ((i * g.kw + j) * g.c + cb) * g.oc + ob;
          if (first)
            zero_c_tiles();
          else
            load_c_tiles(s, g.oc);
          for (int64_t n = 0; n < images; ++n) {
            const BFloat16* a0 = xpad + n * g.image + cb * g.channel + tap;  // channels cb .. cb + 15
            const BFloat16* a1 = a0 + 16 * g.channel;                        // cb + 16 .. cb + 31
            const BFloat16* b0 = dy + n * g.packed_dy() + (ob / 16) * half * 32;
            const BFloat16* b1 = b0 + half * 32;
            for (int64_t st = 0; st < steps; ++st) {
              multiply_c_tiles(a0 + st * 32, a1 + st * 32, stride, b0 + st * 16 * 32, b1 + st * 16 * 32, 64);
            }
          }
          store_c_tiles(s, g.oc);
        }
    }
  _tile_release();
}

}  // namespace demi::kernels::cpu

#pragma GCC diagnostic pop
