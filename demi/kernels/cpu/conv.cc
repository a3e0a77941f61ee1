#include "demi/kernels/cpu/conv.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/conv_amx.h"
#include "demi/kernels/cpu/f16_split.h"
#include "demi/kernels/cpu/gemm.h"
#include "demi/kernels/cpu/internal/gemm_kernels.h"
#include "demi/kernels/cpu/internal/workspace.h"
#include "demi/kernels/matmul_params.h"

namespace demi::kernels::cpu {
namespace {

using cpu_internal::element_at;
using cpu_internal::PartScratch;
using cpu_internal::Workspace;
using cpu_internal::for_each_part;

struct Geometry {
  int64_t c, h, w, oc, kh, kw, oh, ow;
  int64_t rows() const { return c * kh * kw; }  // the column matrix's rows (the GEMM's K)
  int64_t cols() const { return oh * ow; }      // and columns (output positions)
};

Geometry geometry(const Conv2dParams& p) { return {p.c, p.h, p.w, p.oc, p.kh, p.kw, p.out_h(), p.out_w()}; }

// The output columns ow whose input column ow * stride - pad + kw * dilation lies in [0, w): [lo, hi).
void valid_range(int64_t ow_count, int64_t stride, int64_t pad, int64_t offset, int64_t w, int64_t* lo,
                 int64_t* hi) {
  // iw = ow * stride + (offset - pad) >= 0  <=>  ow >= ceil((pad - offset) / stride)
  const int64_t shift = offset - pad;
  *lo = shift >= 0 ? 0 : (-shift + stride - 1) / stride;
  // iw <= w - 1  <=>  ow <= (w - 1 - shift) / stride
  *hi = w - 1 - shift < 0 ? 0 : std::min(ow_count, (w - 1 - shift) / stride + 1);
  *lo = std::min(*lo, *hi);
}

// n contiguous values of dtype t -> f32, through the level's bulk kernel directly (im2col converts many
// short row segments: demi::convert's dispatch and thread split would cost more than the conversion).
void to_f32(const demi::internal::ConvertKernels& k, DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::kBF16: return k.bf16_to_f32(static_cast<const BFloat16*>(src), dst, n);
    case DType::kF16: return k.f16_to_f32(static_cast<const Half*>(src), dst, n);
    default: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
}

// col (C*KH*KW, OH*OW) f32 <- image x (C, H, W) in dtype t: zero where a window reaches padding.
void im2col(const Conv2dParams& p, const Geometry& g, const void* x, DType t, float* col) {
  const demi::internal::ConvertKernels& cvt = demi::internal::convert_kernels(cpu_level());
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        float* row = col + ((c * g.kh + i) * g.kw + j) * g.cols();
        int64_t lo, hi;
        valid_range(g.ow, p.stride_w, p.pad_left, j * p.dilation_w, g.w, &lo, &hi);
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          float* out = row + oy * g.ow;
          const int64_t iy = oy * p.stride_h - p.pad_top + i * p.dilation_h;
          if (iy < 0 || iy >= g.h || lo >= hi) {
            std::fill(out, out + g.ow, 0.0f);
            continue;
          }
          std::fill(out, out + lo, 0.0f);
          std::fill(out + hi, out + g.ow, 0.0f);
          const int64_t ix0 = lo * p.stride_w - p.pad_left + j * p.dilation_w;
          const int64_t base = (c * g.h + iy) * g.w;
          if (p.stride_w == 1) {
            to_f32(cvt, t, element_at(x, base + ix0, t), out + lo, hi - lo);
          } else {
            for (int64_t ox = lo; ox < hi; ++ox)
              to_f32(cvt, t, element_at(x, base + ix0 + (ox - lo) * p.stride_w, t), out + ox, 1);
          }
        }
      }
}

// image dx (C, H, W) f32 += col2im(col): each column entry added where its window read the input.
void col2im_add(const Conv2dParams& p, const Geometry& g, const float* col, float* dx) {
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const float* row = col + ((c * g.kh + i) * g.kw + j) * g.cols();
        int64_t lo, hi;
        valid_range(g.ow, p.stride_w, p.pad_left, j * p.dilation_w, g.w, &lo, &hi);
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * p.stride_h - p.pad_top + i * p.dilation_h;
          if (iy < 0 || iy >= g.h) continue;
          float* dst = dx + (c * g.h + iy) * g.w + lo * p.stride_w - p.pad_left + j * p.dilation_w;
          const float* src = row + oy * g.ow;
          for (int64_t ox = lo; ox < hi; ++ox) dst[(ox - lo) * p.stride_w] += src[ox];
        }
      }
}

// ---- The forward as an indirect product: no column matrix ----
// y[n] (OC, P) is computed transposed, c^T (P, OC) = col^T (P, K) . W^T (K, OC): the output positions are
// the GEMM's rows and the channels its columns, so the weights are packed once per call (a 64-channel
// layer is one panel). col^T is never formed: each image is converted once into a zero-padded f32 copy,
// and the micro-kernel reads position q's k-th value at roff[q] + koff[k] in it (XNNPACK's indirection
// buffer, as offsets: roff from the position and the stride, koff from the channel, tap and dilation).
// The tiles are summed into a (positions x 64) block and stored into y transposed, with the bias, ReLU and
// the rounding into y's dtype (GemmKernels::store_f32_transposed). Each sum runs over k in order, in one
// block.
constexpr int64_t kMaxBlockPositions = 240;                 // the tiles' sums: 240 x 64 f32
constexpr size_t kMaxPackedWeightBytes = size_t{2} << 20;  // W^T packed whole, or the per-image path
constexpr size_t kMaxPaddedImageBytes = size_t{4} << 20;   // one padded f32 image per thread, or the same

// image x (C, H, W) in dtype t -> dst (C, Hp, Wp) f32 with p's padding, zero around.
void pad_image(const Conv2dParams& p, const Geometry& g, const void* x, DType t, int64_t hp, int64_t wp,
               float* dst) {
  const demi::internal::ConvertKernels& cvt = demi::internal::convert_kernels(cpu_level());
  std::fill(dst, dst + g.c * hp * wp, 0.0f);
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t iy = 0; iy < g.h; ++iy)
      to_f32(cvt, t, element_at(x, (c * g.h + iy) * g.w, t), dst + (c * hp + iy + p.pad_top) * wp + p.pad_left, g.w);
}

// The sum of row[0 .. n): 16 partial sums (value i into partial i % 16, independent chains the compiler
// vectorizes at any level), then added in order. One serial chain of adds, 3-4 cycles each, was a
// measurable share of model B's step (its second layer's bias gradient: 64 channels x 196 positions per
// image; bench/ab.py measures a step). The order is fixed, so the bits do not depend on the CPU level or
// the threads.
float row_sum(const float* row, int64_t n) {
  constexpr int kLanes = 16;
  float part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) part[l] += row[i + l];
  for (int l = 0; i < n; ++i, ++l) part[l] += row[i];
  float s = 0;
  for (float v : part) s += v;
  return s;
}

// Image n (`elems` values in dtype t) of `src`: where it is stored, or made into `buffer`
// (src.make_bytes, one per thread).
const void* image_of(const Images& src, int64_t n, int64_t elems, DType t, void* buffer) {
  if (src.data != nullptr) return element_at(src.data, n * elems, t);
  src.make(n, buffer);
  return buffer;
}

// The bytes a thread's buffer for src's images takes (none where they are stored).
size_t image_buffer_bytes(const Images& src) {
  return src.data != nullptr ? 0 : cpu_internal::bytes64(src.make_bytes);
}

// The geometries the tile convolutions take (conv_amx.h): the amx level, groups 1, stride 1, channels and
// output channels in multiples of 32; and such a layer's geometry as they read it.
bool tile_geometry(const Conv2dParams& p) {
  return cpu_level() >= CpuLevel::kAmx && p.groups == 1 && p.stride_h == 1 && p.stride_w == 1 && p.c % 32 == 0 &&
         p.oc % 32 == 0;
}

AmxConvGeometry amx_geometry(const Conv2dParams& p, const Geometry& g) {
  AmxConvGeometry a;
  a.c = g.c, a.oc = g.oc, a.kh = g.kh, a.kw = g.kw, a.dilation_h = p.dilation_h, a.dilation_w = p.dilation_w;
  a.oh = g.oh, a.ow = g.ow;
  a.wp = g.w + p.pad_left + p.pad_right;
  a.channel = (g.h + p.pad_top + p.pad_bottom) * a.wp;
  return a;
}

// Whether a forward on the tile unit (and so a stride-1 data gradient: dy's f16 values against the flipped
// f16 weights) takes f16 image and weights, split exactly (f16_split.h's split): each f16 value the
// sum of two bf16 parts, each product of two f16 values the sum of the four products of the parts, exact in
// f32 and summed in f32 — the f32 FMA kernels' sums in another order, as demi's AMX GEMM takes f16 products
// (gemm_amx.h). The fused Conv2d -> ReLU -> MaxPool2d backward of an f16 layer holds its dense gradient in
// f16, as the separate convolution (f16 storage) gets it, and so takes the same kernels.
bool split_f16(const Conv2dParams& p) { return p.x_dtype == DType::kF16 && p.w_dtype == DType::kF16; }

// The forward on the tile unit: bf16 image and weights, output bf16 or f32; or f16 ones split (split_f16),
// output f16 or f32.
bool forward_amx(const Conv2dParams& p) {
  const bool bf16 = p.x_dtype == DType::kBF16 && p.w_dtype == DType::kBF16, f16 = split_f16(p);
  return tile_geometry(p) && (bf16 || f16) &&
         (p.y_dtype == DType::kF32 || p.y_dtype == (f16 ? DType::kF16 : DType::kBF16));
}

bool indirect_fits(const Conv2dParams& p, const Geometry& g) {
  if (forward_amx(p)) return true;
  const cpu_internal::GemmKernels& gk = cpu_internal::gemm_kernels();
  if (gk.f32_indirect == nullptr || gk.store_f32_transposed == nullptr) return false;
  const int64_t panels = (g.oc + gk.nr - 1) / gk.nr;
  const int64_t hp = g.h + p.pad_top + p.pad_bottom, wp = g.w + p.pad_left + p.pad_right;
  return static_cast<size_t>(panels * g.rows() * gk.nr) * sizeof(float) <= kMaxPackedWeightBytes &&
         static_cast<size_t>(g.c * hp * wp) * sizeof(float) <= kMaxPaddedImageBytes;
}

// bf16 image and weights, where the level has the pair kernel (AVX512-BF16): the product runs vdpbf16ps on
// pairs of channels (two channels' values at one tap are one k pair), twice the FMA kernel's rate, instead
// of f32 FMAs on widened values. The pairs' sums are exact products of the bf16 values accumulated in f32,
// as demi's bf16 GEMM (denormal bf16 inputs read as zero, as vdpbf16ps does).
bool uses_pairs(const Conv2dParams& p) {
  return p.x_dtype == DType::kBF16 && p.w_dtype == DType::kBF16 && cpu_internal::gemm_kernels().bf16_indirect;
}

// The indirect micro-kernel for a product of oc columns, f32 or bf16 pairs, and its rows per tile: the
// narrow tile where at most half of a panel's columns would be filled (the data gradient of a 32 -> 64
// layer), else the full one.
struct IndirectKernel {
  int64_t mr;
  decltype(cpu_internal::GemmKernels::f32_indirect) f32;
  decltype(cpu_internal::GemmKernels::bf16_indirect) bf16;
};

IndirectKernel indirect_kernel(const cpu_internal::GemmKernels& gk, int64_t oc, bool pairs) {
  const bool has_narrow = pairs ? gk.bf16_indirect_narrow != nullptr : gk.f32_indirect_narrow != nullptr;
  if (has_narrow && oc <= gk.nr / 2) return {gk.narrow_mr, gk.f32_indirect_narrow, gk.bf16_indirect_narrow};
  return {gk.mr, gk.f32_indirect, gk.bf16_indirect};
}

// image x (C, H, W) bf16 -> dst (ceil(C / 2), Hp, Wp, 2) bf16 with p's padding: channels 2cp and 2cp + 1
// side by side (an odd C's last partner +0), zero around.
void pad_image_pairs(const Conv2dParams& p, const Geometry& g, const BFloat16* x, int64_t hp, int64_t wp,
                     BFloat16* dst) {
  const int64_t cp = (g.c + 1) / 2;
  std::fill(dst, dst + cp * hp * wp * 2, BFloat16{});
  for (int64_t c = 0; c < g.c; c += 2)
    for (int64_t iy = 0; iy < g.h; ++iy) {
      const BFloat16* lo = x + (c * g.h + iy) * g.w;
      const BFloat16* hi = c + 1 < g.c ? lo + g.h * g.w : nullptr;
      BFloat16* out = dst + (((c / 2) * hp + iy + p.pad_top) * wp + p.pad_left) * 2;
      for (int64_t ix = 0; ix < g.w; ++ix) {  // one 32-bit pair per column
        const uint32_t v = uint32_t{lo[ix].bits} | (hi ? uint32_t{hi[ix].bits} << 16 : 0u);
        std::memcpy(static_cast<void*>(out + 2 * ix), &v, sizeof v);
      }
    }
}

// image x (C, H, W) bf16 -> dst (C, Hp, Wp) bf16 with p's padding, zero around.
void pad_image_bf16(const Conv2dParams& p, const Geometry& g, const BFloat16* x, int64_t hp, int64_t wp,
                    BFloat16* dst) {
  std::fill(dst, dst + g.c * hp * wp, BFloat16{});
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t iy = 0; iy < g.h; ++iy)
      std::memcpy(dst + (c * hp + iy + p.pad_top) * wp + p.pad_left, x + (c * g.h + iy) * g.w,
                  static_cast<size_t>(g.w) * sizeof(BFloat16));
}

// The forward on the tile unit: the weights as [tap][oc][c] once per call; the images to the threads, each
// padded in channel pairs (with the slack the tiles read past it), multiplied into (OC, positions at the
// padded width) f32 sums, and stored a channel plane at a time at the output width with the bias, ReLU,
// the sum already in y (accumulate) and one rounding into y's dtype.
// f16 values (split_f16) run as a convolution of 4C channels: the weights' hi, hi, lo, lo parts against the
// image's hi, lo parts read twice (AmxConvGeometry::image_c: 2C), so that the sum over the channels takes
// each of the four products of the parts once (in the tile unit's order: four times the products of a bf16
// layer, its image twice as large).
void amx_forward(const Conv2dParams& p, const Geometry& g, const Images& x, const void* w, const float* bias32,
                 void* y, bool accumulate) {
  const bool split = split_f16(p);
  const int64_t c4 = (split ? 4 : 1) * g.c;  // the channels the tiles take
  AmxConvGeometry a = amx_geometry(p, g);
  a.c = c4;
  a.image_c = split ? 2 * g.c : 0;
  const int64_t taps = g.kh * g.kw, P = g.cols(), kp = a.positions(), ic = a.image_channels();
  Workspace wt(static_cast<size_t>(taps * g.oc * c4) * sizeof(BFloat16));
  auto* wt16 = reinterpret_cast<BFloat16*>(wt.f32());
  if (split) {  // [tap][oc][c] f16, then each row of C split into [hi, hi, lo, lo] (f16_split.h's A')
    Workspace by_tap(static_cast<size_t>(g.oc * g.rows()) * sizeof(Half));
    auto* wh = reinterpret_cast<Half*>(by_tap.f32());
    const auto* wf = static_cast<const Half*>(w);
    for (int64_t o = 0; o < g.oc; ++o)
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t t = 0; t < taps; ++t) wh[(t * g.oc + o) * g.c + c] = wf[(o * g.c + c) * taps + t];
    split_f16_bf16(wh, taps * g.oc, g.c, wt16, c4, g.c, kSplitLhs);
  } else {
    const auto* wb = static_cast<const BFloat16*>(w);
    for (int64_t o = 0; o < g.oc; ++o)
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t t = 0; t < taps; ++t) wt16[(t * g.oc + o) * g.c + c] = wb[(o * g.c + c) * taps + t];
  }
  const int64_t pair_elems = (ic / 2 * a.channel + a.slack()) * 2;
  // (Each part's pair image, sums, f32 plane and made x image taken at once, before the threads start.)
  const size_t image_bytes = cpu_internal::bytes64(static_cast<size_t>(pair_elems) * sizeof(BFloat16));
  const size_t sums_bytes = cpu_internal::bytes64(static_cast<size_t>(g.oc * kp) * sizeof(float));
  const size_t row_bytes = cpu_internal::bytes64(static_cast<size_t>(P) * sizeof(float));  // a channel's plane
  const int64_t parts = cpu_internal::parts_for(p.n);
  PartScratch scratch(parts, image_bytes + sums_bytes + row_bytes + image_buffer_bytes(x));
  for_each_part(parts, p.n, [&](int64_t part, int64_t n0, int64_t n1) {
    auto* pairs = reinterpret_cast<BFloat16*>(scratch.part(part));
    auto* sums = reinterpret_cast<float*>(scratch.part(part) + image_bytes);
    auto* row = reinterpret_cast<float*>(scratch.part(part) + image_bytes + sums_bytes);
    void* made = scratch.part(part) + image_bytes + sums_bytes + row_bytes;  // x's image n, where x makes it
    std::fill(pairs + ic / 2 * a.channel * 2, pairs + pair_elems, BFloat16{});  // the slack: never written
    for (int64_t n = n0; n < n1; ++n) {
      amx_conv_pad_pairs(a, g.h, g.w, p.pad_top, p.pad_left, image_of(x, n, g.c * g.h * g.w, p.x_dtype, made), split,
                         pairs);
      amx_conv_forward_image(a, wt16, pairs, sums);
      amx_conv_store(a, sums, bias32, p.relu, accumulate, element_at(y, n * g.oc * P, p.y_dtype), p.y_dtype, row);
    }
  });
}

// The indirect forward where indirect_fits; false (nothing done) otherwise.
bool indirect_forward(const Conv2dParams& p, const Geometry& g, const Images& x, const void* w, const float* bias32,
                      void* y, bool accumulate = false) {
  if (forward_amx(p)) {
    amx_forward(p, g, x, w, bias32, y, accumulate);
    return true;
  }
  if (!indirect_fits(p, g)) return false;
  const cpu_internal::GemmKernels& gk = cpu_internal::gemm_kernels();
  const bool pairs = uses_pairs(p);
  // K: the product's k steps, f32 values or (pairs) channel pairs at a tap, in (channel, tap) order.
  const int64_t taps = g.kh * g.kw, cp = (g.c + 1) / 2, K = pairs ? cp * taps : g.rows();
  const int64_t P = g.cols(), OC = g.oc, NR = gk.nr;
  const IndirectKernel ik = indirect_kernel(gk, OC, pairs);
  const int64_t MR = ik.mr;
  const int64_t hp = g.h + p.pad_top + p.pad_bottom, wp = g.w + p.pad_left + p.pad_right;
  const int64_t panels = (OC + NR - 1) / NR;
  const int64_t panel_elems = pairs ? 2 * K * NR : K * NR;  // f32 [K][NR] or bf16 [K][NR][2]
  const size_t value_bytes = pairs ? sizeof(BFloat16) : sizeof(float);
  const size_t ibytes = static_cast<size_t>(pairs ? cp * hp * wp * 2 : g.c * hp * wp) * value_bytes;
  Workspace wpack(static_cast<size_t>(panels * panel_elems) * value_bytes);
  Workspace koff(static_cast<size_t>(K) * sizeof(int64_t));
  auto* ko = reinterpret_cast<int64_t*>(koff.f32());
  auto* wpairs = reinterpret_cast<BFloat16*>(wpack.f32());
  if (pairs) {  // W (OC, C, KH, KW) -> (OC, cp, KH, KW, 2): each k pair two channels at one tap; then packed
    Workspace wp2(static_cast<size_t>(OC * 2 * K) * sizeof(BFloat16));
    auto* v = reinterpret_cast<BFloat16*>(wp2.f32());
    const auto* wb = static_cast<const BFloat16*>(w);
    std::fill(v, v + OC * 2 * K, BFloat16{});
    for (int64_t o = 0; o < OC; ++o)
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t t = 0; t < taps; ++t)
          v[(o * cp + c / 2) * taps * 2 + t * 2 + c % 2] = wb[(o * g.c + c) * taps + t];
    gk.pack_b_bf16(v, /*trans=*/true, /*ld=*/2 * K, 0, 2 * K, 0, OC, wpairs, panel_elems);
  } else {
    gk.pack_b_f32(w, p.w_dtype, /*trans=*/true, /*ld=*/K, 0, K, 0, OC, wpack.f32(), panel_elems);
  }
  // Offsets in the padded image's values (the pair image (cp, Hp, Wp, 2): twice its pair offsets).
  const int64_t unit = pairs ? 2 : 1;
  for (int64_t c = 0; c < (pairs ? cp : g.c); ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j)
        ko[(c * g.kh + i) * g.kw + j] = unit * ((c * hp + i * p.dilation_h) * wp + j * p.dilation_w);
  const int64_t blocks = (P + kMaxBlockPositions - 1) / kMaxBlockPositions;
  const int64_t mb = (P + blocks - 1) / blocks;
  // (Each part's padded image and sums taken at once, before the threads start: PartScratch.)
  const int64_t tasks = p.n * blocks, parts = cpu_internal::parts_for(tasks);
  const size_t image_bytes = cpu_internal::bytes64(ibytes);
  const size_t sums_bytes = cpu_internal::bytes64(static_cast<size_t>(mb * NR) * sizeof(float));
  PartScratch scratch(parts, image_bytes + sums_bytes + image_buffer_bytes(x));
  for_each_part(parts, tasks, [&](int64_t part, int64_t t0, int64_t t1) {
    auto* image = reinterpret_cast<float*>(scratch.part(part));
    auto* sums = reinterpret_cast<float*>(scratch.part(part) + image_bytes);
    void* made = scratch.part(part) + image_bytes + sums_bytes;  // x's image n, where x makes it
    int64_t padded = -1;  // the image in `image` (a thread's tasks run in order: an image's blocks in a row)
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t n = task / blocks, p0 = task % blocks * mb, count = std::min(mb, P - p0);
      if (padded != n) {
        const void* xn = image_of(x, n, g.c * g.h * g.w, p.x_dtype, made);
        if (pairs)
          pad_image_pairs(p, g, static_cast<const BFloat16*>(xn), hp, wp, reinterpret_cast<BFloat16*>(image));
        else
          pad_image(p, g, xn, p.x_dtype, hp, wp, image);
        padded = n;
      }
      for (int64_t pn = 0; pn < panels; ++pn) {
        cpu_internal::GemmTile s;  // a tile's sums, stored as they are: rows = positions
        s.ldc = NR;
        s.n = static_cast<int>(std::min(NR, OC - pn * NR));
        for (int64_t ir = 0; ir < count; ir += MR) {
          s.m = static_cast<int>(std::min(MR, count - ir));
          int64_t roff[16];
          for (int r = 0; r < s.m; ++r) {
            const int64_t q = p0 + ir + r, oy = q / g.ow, ox = q % g.ow;
            roff[r] = unit * (oy * p.stride_h * wp + ox * p.stride_w);
          }
          s.c = sums + ir * NR;
          const auto* bimage = reinterpret_cast<const BFloat16*>(image);
          const int64_t at = pn * panel_elems;  // this panel's packed weights
          if (pairs)
            ik.bf16(K, bimage, roff, ko, wpairs + at, s);
          else
            ik.f32(K, image, roff, ko, wpack.f32() + at, s);
        }
        cpu_internal::GemmTile o;  // into y[n]: rows = this panel's channels, columns = the positions
        o.c = element_at(y, (n * OC + pn * NR) * P + p0, p.y_dtype);
        o.ldc = P;
        o.c_dtype = p.y_dtype;
        o.m = s.n;
        o.n = static_cast<int>(count);
        o.bias = bias32 ? bias32 + pn * NR : nullptr;
        o.bias_rows = true;
        o.relu = p.relu;
        o.load_c = accumulate;
        gk.store_f32_transposed(sums, NR, o);
      }
    }
  });
  return true;
}

// ---- The data gradient of a stride-1 convolution as a forward one ----
// With stride 1, dx = conv(dy, W') with W'[c][oc][i][j] = W[oc][c][KH-1-i][KW-1-j] (the weights flipped and
// their channels swapped) and padding (KH-1)*dilation - pad on each side: the same indirect product, each
// dx element one sum over (oc, i, j) in order, rounded once (added to dx with accumulate).
Conv2dParams data_gradient_as_forward(const Conv2dParams& p) {
  Conv2dParams q = p;
  q.c = p.oc;
  q.h = p.out_h();
  q.w = p.out_w();
  q.oc = p.c;
  q.pad_top = (p.kh - 1) * p.dilation_h - p.pad_top;
  q.pad_bottom = (p.kh - 1) * p.dilation_h - p.pad_bottom;
  q.pad_left = (p.kw - 1) * p.dilation_w - p.pad_left;
  q.pad_right = (p.kw - 1) * p.dilation_w - p.pad_right;
  q.x_dtype = p.y_dtype;
  // The flipped copy in the weights' own dtype: the pair kernel reads it where it and dy are bf16, the f32
  // kernel's packing widens it (an f16 or bf16 copy half an f32 one's bytes: model B's second layer at
  // O2-fp16 held a 74 KB f32 copy at its training peak).
  q.w_dtype = p.w_dtype;
  q.y_dtype = p.x_dtype;
  q.bias_dtype = DType::kF32;
  q.relu = q.accumulate = false;
  return q;
}

bool data_gradient_indirect(const Conv2dParams& p) {
  if (p.stride_h != 1 || p.stride_w != 1 || p.groups != 1) return false;
  const Conv2dParams q = data_gradient_as_forward(p);
  return q.pad_top >= 0 && q.pad_bottom >= 0 && q.pad_left >= 0 && q.pad_right >= 0 && indirect_fits(q, geometry(q));
}

// f32 sums -> dst in dtype t (added to dst's values, rounded once, with accumulate): a weight gradient's end.
void store_sum(const float* sum, void* dst, DType t, int64_t count, bool accumulate) {
  if (!accumulate) return convert(sum, DType::kF32, dst, t, count);
  Workspace old(static_cast<size_t>(count) * sizeof(float));
  convert(dst, t, old.f32(), DType::kF32, count);
  for (int64_t i = 0; i < count; ++i) old.f32()[i] += sum[i];
  convert(old.f32(), DType::kF32, dst, t, count);
}

// ---- The weight gradient as an indirect product ----
// dW^T (K, OC) = sum over images of col (K, P) . dy[n]^T (P, OC): the same micro-kernel with the roles of
// its offsets swapped (a tile's rows are 6 of the K (channel, tap) offsets, its k runs over the output
// positions), dy[n]^T packed per image (f16|bf16 converted as it is packed), each thread summing its run of
// images into its own f32 partial; the partials are added in thread order (the sum depends on the thread
// count only, as the per-image path's). With bf16 x and dy, stride 1 across and an even output width, the
// k pairs are two neighbouring positions of an output row, whose inputs sit side by side in a plain bf16
// padded image: the pair kernel runs it (dy^T packed as VNNI-2 pairs of positions).
constexpr size_t kMaxPartialBytes = size_t{2} << 20;  // a thread's K x OC f32 partial sums
constexpr int64_t kMaxPositionBlock = 1024;           // positions per packed panel of dy^T

bool weight_gradient_indirect(const Conv2dParams& p, const Geometry& g) {
  const cpu_internal::GemmKernels& gk = cpu_internal::gemm_kernels();
  if (gk.f32_indirect == nullptr || p.groups != 1) return false;
  const int64_t hp = g.h + p.pad_top + p.pad_bottom, wp = g.w + p.pad_left + p.pad_right;
  const int64_t oc_pad = (g.oc + gk.nr - 1) / gk.nr * gk.nr;
  return static_cast<size_t>(g.c * hp * wp) * sizeof(float) <= kMaxPaddedImageBytes &&
         static_cast<size_t>(g.rows() * oc_pad) * sizeof(float) <= kMaxPartialBytes;
}

void indirect_backward_weights(const Conv2dParams& p, const Geometry& g, const void* x, const Images& dy, void* dw,
                               void* db) {
  const cpu_internal::GemmKernels& gk = cpu_internal::gemm_kernels();
  const int64_t K = g.rows(), P = g.cols(), OC = g.oc, NR = gk.nr;
  const int64_t hp = g.h + p.pad_top + p.pad_bottom, wp = g.w + p.pad_left + p.pad_right;
  const int64_t panels = (OC + NR - 1) / NR, oc_pad = panels * NR, pb = std::min(P, kMaxPositionBlock);
  const bool pairs = p.x_dtype == DType::kBF16 && p.y_dtype == DType::kBF16 && gk.bf16_indirect != nullptr &&
                     p.stride_w == 1 && g.ow % 2 == 0;  // (then P and pb are even)
  const IndirectKernel ik = indirect_kernel(gk, OC, pairs);
  const int64_t MR = ik.mr;
  const size_t value_bytes = pairs ? sizeof(BFloat16) : sizeof(float);
  Workspace offsets(static_cast<size_t>(K + P) * sizeof(int64_t));
  auto* ko = reinterpret_cast<int64_t*>(offsets.f32());  // (channel, tap) -> offset in the padded image
  int64_t* po = ko + K;                                  // position -> offset
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j)
        ko[(c * g.kh + i) * g.kw + j] = (c * hp + i * p.dilation_h) * wp + j * p.dilation_w;
  for (int64_t q = 0; q < P; ++q) po[q] = q / g.ow * p.stride_h * wp + q % g.ow * p.stride_w;
  if (pairs)  // a pair's offset is its first position's
    for (int64_t q = 0; q < P / 2; ++q) po[q] = po[2 * q];
  const int threads = std::max(1, std::min<int>(num_threads(), static_cast<int>(p.n)));
  const int64_t part = K * oc_pad + OC;  // a thread's dW^T sums, then its bias sums
  Workspace partial(static_cast<size_t>(threads * part) * sizeof(float));
  std::fill(partial.f32(), partial.f32() + threads * part, 0.0f);
  const demi::internal::ConvertKernels& cvt = demi::internal::convert_kernels(cpu_level());
  // (Each thread's padded image, packed panel and bias row taken at once, before the threads start.)
  const size_t image_bytes = cpu_internal::bytes64(static_cast<size_t>(g.c * hp * wp) * value_bytes);
  const size_t panel_bytes = cpu_internal::bytes64(static_cast<size_t>(pb * NR) * value_bytes);
  const size_t row_bytes = cpu_internal::bytes64(db ? static_cast<size_t>(P) * sizeof(float) : 0);
  PartScratch scratch(threads, image_bytes + panel_bytes + row_bytes + image_buffer_bytes(dy));
  parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      auto* image = reinterpret_cast<float*>(scratch.part(t));
      auto* panel = reinterpret_cast<float*>(scratch.part(t) + image_bytes);
      auto* row = reinterpret_cast<float*>(scratch.part(t) + image_bytes + panel_bytes);
      void* made = scratch.part(t) + image_bytes + panel_bytes + row_bytes;  // dy's image n, where dy makes it
      float* sums = partial.f32() + t * part;
      float* bsums = sums + K * oc_pad;
      for (int64_t n = t * p.n / threads; n < (t + 1) * p.n / threads; ++n) {
        const void* xn = element_at(x, n * g.c * g.h * g.w, p.x_dtype);
        if (pairs)
          pad_image_bf16(p, g, static_cast<const BFloat16*>(xn), hp, wp, reinterpret_cast<BFloat16*>(image));
        else
          pad_image(p, g, xn, p.x_dtype, hp, wp, image);
        const void* dyn = image_of(dy, n, OC * P, p.y_dtype, made);
        for (int64_t q0 = 0; q0 < P; q0 += pb) {
          const int64_t qc = std::min(pb, P - q0);
          for (int64_t pn = 0; pn < panels; ++pn) {
            // dy[n]^T rows q0 .. q0 + qc, channels pn * NR ...: b stored (OC, P), read transposed
            const int64_t nc = std::min(NR, OC - pn * NR);
            auto* bpairs = reinterpret_cast<BFloat16*>(panel);
            if (pairs)
              gk.pack_b_bf16(static_cast<const BFloat16*>(dyn), /*trans=*/true, /*ld=*/P, q0, qc, pn * NR, nc, bpairs,
                             qc * NR);
            else
              gk.pack_b_f32(dyn, p.y_dtype, /*trans=*/true, /*ld=*/P, q0, qc, pn * NR, nc, panel, qc * NR);
            cpu_internal::GemmTile s;
            s.ldc = oc_pad;
            s.n = static_cast<int>(std::min(NR, OC - pn * NR));
            s.load_c = true;
            for (int64_t k0 = 0; k0 < K; k0 += MR) {
              s.m = static_cast<int>(std::min(MR, K - k0));
              s.c = sums + k0 * oc_pad + pn * NR;
              if (pairs)
                ik.bf16(qc / 2, reinterpret_cast<const BFloat16*>(image), ko + k0, po + q0 / 2, bpairs, s);
              else
                ik.f32(qc, image, ko + k0, po + q0, panel, s);
            }
          }
        }
        if (db)
          for (int64_t o = 0; o < OC; ++o) {
            to_f32(cvt, p.y_dtype, element_at(dyn, o * P, p.y_dtype), row, P);
            bsums[o] += row_sum(row, P);
          }
      }
    }
  });
  float* total = partial.f32();
  for (int t = 1; t < threads; ++t)
    for (int64_t i = 0; i < part; ++i) total[i] += total[t * part + i];
  // dW (OC, K) <- the sums transposed; then into dw's dtype (added to dw with accumulate).
  Workspace out(static_cast<size_t>(OC * K + OC) * sizeof(float));
  float* o = out.f32();
  for (int64_t oc = 0; oc < OC; ++oc)
    for (int64_t k = 0; k < K; ++k) o[oc * K + k] = total[k * oc_pad + oc];
  store_sum(o, dw, p.w_dtype, OC * K, p.accumulate);
  if (db) store_sum(total + K * oc_pad, db, p.bias_dtype, OC, p.accumulate);
}

// ---- The weight gradient on the tile unit (AMX: bf16 activations and gradients; conv_amx.h) ----
// Stride 1, channels and output channels in multiples of 32. The images go to the threads, each with its
// own f32 partial ([tap][c][oc] and db) and a chunk of kAmxImages images at a time: padded (bf16, zero
// around and the slack the tiles read past the last channel) and their dy packed, then the chunk's sums on
// the tile unit; the partials are added in thread order (the sum depends on the thread count only, as the
// other paths') and rearranged into dW (OC, C, KH, KW). Where the tile unit runs, this replaces the
// indirect product, whose pair kernel (vdpbf16ps) runs at half the f32 FMA rate on the Xeons that have
// AMX. Not for f16: a layer stored in f16 computes its output, and so its gradient, in f32 (the indirect
// product's sums are the same whether dy is stored f16 or f32, as the fused layer's backward relies on).
constexpr int64_t kAmxImages = 4;

bool weight_gradient_amx(const Conv2dParams& p) {
  return tile_geometry(p) && p.x_dtype == DType::kBF16 && p.y_dtype == DType::kBF16;
}

void amx_backward_weights(const Conv2dParams& p, const Geometry& g, const void* x, const Images& dy, void* dw,
                          void* db) {
  AmxConvGeometry a = amx_geometry(p, g);
  a.image = (g.c * a.channel + a.slack() + 31) / 32 * 32;
  const int64_t hp = g.h + p.pad_top + p.pad_bottom;
  const int64_t taps = g.kh * g.kw, wn = g.oc * g.rows(), P = g.cols();
  const int64_t threads = cpu_internal::parts_for(p.n);
  const int64_t part = wn + g.oc;  // a thread's [tap][c][oc] sums, then its bias sums
  Workspace partial(static_cast<size_t>(threads * part) * sizeof(float));
  float* parts = partial.f32();
  const demi::internal::ConvertKernels& cvt = demi::internal::convert_kernels(cpu_level());
  // (Each thread's padded images, packed dy, dy row, f32 row and made dy image taken at once, before the
  // threads start.)
  const size_t x_bytes = cpu_internal::bytes64(static_cast<size_t>(kAmxImages * a.image) * sizeof(BFloat16));
  const size_t dy_bytes = cpu_internal::bytes64(static_cast<size_t>(kAmxImages * a.packed_dy()) * sizeof(BFloat16));
  const size_t wide_bytes = cpu_internal::bytes64(static_cast<size_t>(a.packed_dy()) * sizeof(BFloat16));
  const size_t row_bytes = cpu_internal::bytes64(db ? static_cast<size_t>(P) * sizeof(float) : 0);
  PartScratch scratch(threads, x_bytes + dy_bytes + wide_bytes + row_bytes + image_buffer_bytes(dy));
  for_each_part(threads, p.n, [&](int64_t t, int64_t n0, int64_t n1) {
    char* at = scratch.part(t);
    auto* xs = reinterpret_cast<BFloat16*>(at);
    auto* dys = reinterpret_cast<BFloat16*>(at + x_bytes);
    auto* wide = reinterpret_cast<BFloat16*>(at + x_bytes + dy_bytes);
    auto* row = reinterpret_cast<float*>(at + x_bytes + dy_bytes + wide_bytes);
    void* made = at + x_bytes + dy_bytes + wide_bytes + row_bytes;  // dy's image n, where dy makes it
    float* sums = parts + t * part;
    float* bsums = sums + wn;
    std::fill(sums, sums + part, 0.0f);
    for (int64_t i = 0; i < kAmxImages; ++i)  // each image's slack: never written
      std::fill(xs + i * a.image + g.c * a.channel, xs + (i + 1) * a.image, BFloat16{});
    for (int64_t c0 = n0; c0 < n1; c0 += kAmxImages) {
      const int64_t count = std::min(kAmxImages, n1 - c0);
      for (int64_t i = 0; i < count; ++i) {
        const int64_t n = c0 + i;
        BFloat16* xp = xs + i * a.image;
        const auto* xn = reinterpret_cast<const BFloat16*>(element_at(x, n * g.c * g.h * g.w, p.x_dtype));
        pad_image_bf16(p, g, xn, hp, a.wp, xp);
        const auto* dyn = static_cast<const BFloat16*>(image_of(dy, n, g.oc * P, p.y_dtype, made));
        amx_conv_pack_dy(a, dyn, wide, dys + i * a.packed_dy());
        if (db)
          for (int64_t o = 0; o < g.oc; ++o) {
            to_f32(cvt, p.y_dtype, dyn + o * P, row, P);
            bsums[o] += row_sum(row, P);
          }
      }
      amx_conv_weight_sums(a, xs, dys, count, sums, /*first=*/c0 == n0);
    }
  });
  for (int64_t t = 1; t < threads; ++t)
    for (int64_t i = 0; i < part; ++i) parts[i] += parts[t * part + i];
  Workspace out(static_cast<size_t>(wn) * sizeof(float));  // dW (OC, C, KH, KW) <- [tap][c][oc]
  for (int64_t o = 0; o < g.oc; ++o)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t k = 0; k < taps; ++k) out.f32()[(o * g.c + c) * taps + k] = parts[(k * g.c + c) * g.oc + o];
  store_sum(out.f32(), dw, p.w_dtype, wn, p.accumulate);
  if (db) store_sum(parts + wn, db, p.bias_dtype, g.oc, p.accumulate);
}

void check(const Conv2dParams& p, const char* op) {
  check_conv2d_params(p, op);
  DEMI_CHECK(conv2d_supported(p), op, ": demi's convolution takes groups = 1 and f32|bf16|f16 tensors, got ",
             describe(p));
  DEMI_CHECK(p.x_round == DType::kF32, op, ": demi's indirect convolution reads x as stored; ", describe(p),
             " gets a rounded copy of x from kernels::onednn");
}

}  // namespace

bool conv2d_supported(const Conv2dParams& p) {
  return p.groups == 1 && cpu_internal::is_f32_or_low(p.x_dtype) && cpu_internal::is_f32_or_low(p.w_dtype) &&
         cpu_internal::is_f32_or_low(p.y_dtype) && cpu_internal::is_f32_or_low(p.bias_dtype);
}

bool conv2d_indirect_supported(const Conv2dParams& p) {
  return conv2d_supported(p) && indirect_fits(p, geometry(p));
}

void conv2d_forward(const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  check(p, "conv2d_forward");
  const Geometry g = geometry(p);
  MatmulParams mp;  // y[n] (OC, P) = W (OC, CKK) . col (CKK, P)
  mp.m = g.oc;
  mp.n = g.cols();
  mp.k = g.rows();
  mp.a_dtype = p.w_dtype;
  mp.b_dtype = DType::kF32;
  mp.c_dtype = p.y_dtype;
  mp.relu = p.relu;
  Workspace bias32(bias ? static_cast<size_t>(g.oc) * sizeof(float) : 0);  // per output channel: a row bias
  if (bias) convert(bias, p.bias_dtype, bias32.f32(), DType::kF32, g.oc);
  if (indirect_forward(p, g, Images{.data = x}, w, bias ? bias32.f32() : nullptr, y)) return;
  const int64_t parts = cpu_internal::parts_for(p.n);  // images over the threads
  PartScratch scratch(parts, static_cast<size_t>(g.rows() * g.cols()) * sizeof(float));
  for_each_part(parts, p.n, [&](int64_t t, int64_t n0, int64_t n1) {
    auto* col = reinterpret_cast<float*>(scratch.part(t));
    for (int64_t n = n0; n < n1; ++n) {
      im2col(p, g, element_at(x, n * g.c * g.h * g.w, p.x_dtype), p.x_dtype, col);
      gemm_row_bias(mp, w, col, element_at(y, n * g.oc * g.cols(), p.y_dtype),
                    bias ? bias32.f32() : nullptr, GemmPath::kF32);
    }
  });
}

bool conv2d_forward_on_tiles(const Conv2dParams& p) { return conv2d_supported(p) && forward_amx(p); }

bool conv2d_backward_data_indirect_supported(const Conv2dParams& p) {
  return conv2d_supported(p) && data_gradient_indirect(p);
}

void conv2d_backward_data(const Conv2dParams& p, const Images& dy, const void* w, void* dx) {
  check(p, "conv2d_backward_data");
  const Geometry g = geometry(p);
  if (data_gradient_indirect(p)) {
    const Conv2dParams q = data_gradient_as_forward(p);
    // (the weights' own dtype: values copied as they are, as 16- or 32-bit words)
    Workspace flipped(static_cast<size_t>(p.w_numel()) * dtype_size(q.w_dtype));
    const int64_t taps = p.kh * p.kw;
    auto flip = [&](const auto* from, auto* to) {
      for (int64_t o = 0; o < p.oc; ++o)
        for (int64_t c = 0; c < p.c; ++c)
          for (int64_t t = 0; t < taps; ++t)
            to[(c * p.oc + o) * taps + (taps - 1 - t)] = from[o * g.rows() + c * taps + t];
    };
    if (dtype_size(q.w_dtype) == sizeof(uint16_t))
      flip(static_cast<const uint16_t*>(w), reinterpret_cast<uint16_t*>(flipped.f32()));
    else
      flip(static_cast<const uint32_t*>(w), reinterpret_cast<uint32_t*>(flipped.f32()));
    const void* wf = flipped.f32();
    if (indirect_forward(q, geometry(q), dy, wf, nullptr, dx, p.accumulate)) return;
  }
  MatmulParams mp;  // col (CKK, P) = W^T (CKK, OC) . dy[n] (OC, P)
  mp.m = g.rows();
  mp.n = g.cols();
  mp.k = g.oc;
  mp.trans_a = true;
  mp.a_dtype = p.w_dtype;
  mp.b_dtype = p.y_dtype;
  mp.c_dtype = DType::kF32;
  const int64_t image = g.c * g.h * g.w;
  const int64_t parts = cpu_internal::parts_for(p.n);  // images over the threads
  const size_t col_bytes = cpu_internal::bytes64(static_cast<size_t>(g.rows() * g.cols()) * sizeof(float));
  const size_t img_bytes = cpu_internal::bytes64(static_cast<size_t>(image) * sizeof(float));
  PartScratch scratch(parts, col_bytes + img_bytes + image_buffer_bytes(dy));
  for_each_part(parts, p.n, [&](int64_t t, int64_t n0, int64_t n1) {
    auto* col = reinterpret_cast<float*>(scratch.part(t));
    auto* img = reinterpret_cast<float*>(scratch.part(t) + col_bytes);
    void* made = scratch.part(t) + col_bytes + img_bytes;  // dy's image n, where dy makes it
    for (int64_t n = n0; n < n1; ++n) {
      gemm(mp, w, image_of(dy, n, g.oc * g.cols(), p.y_dtype, made), col, GemmPath::kF32);
      void* out = element_at(dx, n * image, p.x_dtype);
      if (p.accumulate)
        convert(out, p.x_dtype, img, DType::kF32, image);
      else
        std::fill(img, img + image, 0.0f);
      col2im_add(p, g, col, img);
      convert(img, DType::kF32, out, p.x_dtype, image);
    }
  });
}

bool conv2d_backward_weights_indirect_supported(const Conv2dParams& p) {
  return conv2d_supported(p) && (weight_gradient_amx(p) || weight_gradient_indirect(p, geometry(p)));
}

void conv2d_backward_weights(const Conv2dParams& p, const void* x, const Images& dy, void* dw, void* db) {
  check(p, "conv2d_backward_weights");
  const Geometry g = geometry(p);
  if (weight_gradient_amx(p)) return amx_backward_weights(p, g, x, dy, dw, db);
  if (weight_gradient_indirect(p, g)) return indirect_backward_weights(p, g, x, dy, dw, db);
  const int64_t wn = g.oc * g.rows();
  MatmulParams mp;  // dW (OC, CKK) += dy[n] (OC, P) . col^T (P, CKK)
  mp.m = g.oc;
  mp.n = g.rows();
  mp.k = g.cols();
  mp.trans_b = true;
  mp.a_dtype = p.y_dtype;
  mp.b_dtype = DType::kF32;
  mp.c_dtype = DType::kF32;
  // One f32 partial (dW and db) per chunk of images, added in chunk order: the result does not depend on
  // which thread ran which chunk.
  const int threads = std::max(1, std::min<int>(num_threads(), static_cast<int>(p.n)));
  Workspace partial(static_cast<size_t>(threads * (wn + g.oc)) * sizeof(float));
  float* parts = partial.f32();
  std::fill(parts, parts + threads * (wn + g.oc), 0.0f);
  const demi::internal::ConvertKernels& cvt = demi::internal::convert_kernels(cpu_level());
  const size_t col_bytes = cpu_internal::bytes64(static_cast<size_t>(g.rows() * g.cols()) * sizeof(float));
  const size_t row_bytes = cpu_internal::bytes64(db ? static_cast<size_t>(g.cols()) * sizeof(float) : 0);
  PartScratch scratch(threads, col_bytes + row_bytes + image_buffer_bytes(dy));
  parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      auto* col = reinterpret_cast<float*>(scratch.part(t));
      auto* row = reinterpret_cast<float*>(scratch.part(t) + col_bytes);
      void* made = scratch.part(t) + col_bytes + row_bytes;  // dy's image n, where dy makes it
      float* pw = parts + t * (wn + g.oc);
      float* pb = pw + wn;
      const int64_t n0 = t * p.n / threads, n1 = (t + 1) * p.n / threads;
      for (int64_t n = n0; n < n1; ++n) {
        const void* dyn = image_of(dy, n, g.oc * g.cols(), p.y_dtype, made);
        im2col(p, g, element_at(x, n * g.c * g.h * g.w, p.x_dtype), p.x_dtype, col);
        MatmulParams q = mp;
        q.accumulate = n > n0;
        gemm(q, dyn, col, pw, GemmPath::kF32);
        if (db)
          for (int64_t o = 0; o < g.oc; ++o) {
            to_f32(cvt, p.y_dtype, element_at(dyn, o * g.cols(), p.y_dtype), row, g.cols());
            pb[o] += row_sum(row, g.cols());
          }
      }
    }
  });
  for (int t = 1; t < threads; ++t)
    for (int64_t i = 0; i < wn + g.oc; ++i) parts[i] += parts[t * (wn + g.oc) + i];
  store_sum(parts, dw, p.w_dtype, wn, p.accumulate);
  if (db) store_sum(parts + wn, db, p.bias_dtype, g.oc, p.accumulate);
}

}  // namespace demi::kernels::cpu
