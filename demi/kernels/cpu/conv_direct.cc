#include "demi/kernels/cpu/conv_direct.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/conv_direct_kernels.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/workspace.h"
#include "demi/kernels/cpu/pool.h"
#include "demi/kernels/internal/choice_cache.h"

namespace demi::kernels {
namespace cpu_internal {
namespace {

// The portable variant: the same loops one lane at a time (fallback below AVX-512, and the twin the tests
// compare the vector kernels with).
void forward_scalar(const DirectGeom& g, const float* xp, const float* wp, const float* bias, bool relu, float* y,
                    int ocn) {
  for (int o = 0; o < ocn; ++o)
    for (int64_t oy = 0; oy < g.oh; ++oy)
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        float acc = 0.0f;
        int64_t k = 0;
        for (int64_t c = 0; c < g.c; ++c)
          for (int64_t i = 0; i < g.kh; ++i)
            for (int64_t j = 0; j < g.kw; ++j, ++k)
              acc = std::fma(wp[k * kDirectOcb + o], xp[(c * g.hp + oy + i) * g.wp + ox + j], acc);
        float v = acc + bias[o];
        if (relu) v = v < 0.0f ? 0.0f : v;
        y[(o * g.oh + oy) * g.ow + ox] = v;
      }
}

void columns_scalar(const DirectGeom& g, const float* xp, float* col) {
  cpu_internal::for_each_column_row(g, xp, col, [&](const float* src, float* out) {
    for (int64_t ox = 0; ox < g.ow; ++ox) out[ox] = src[ox];
  });
}

void dot_rows_scalar(const float* dz, const float* col, int64_t oc, int64_t k, int64_t positions, float* lanes,
                     int64_t lanes_k, float* db_lanes) {
  for (int64_t o = 0; o < oc; ++o) {
    const float* d = dz + o * positions;
    for (int64_t t = 0; t < k; ++t) {
      float* l = lanes + (o * lanes_k + t) * 16;
      const float* x = col + t * positions;
      for (int64_t p = 0; p < positions; ++p) l[p % 16] = std::fma(d[p], x[p], l[p % 16]);
    }
    if (db_lanes)
      for (int64_t p = 0; p < positions; ++p) db_lanes[o * 16 + p % 16] += d[p];
  }
}

}  // namespace

const DirectConvKernels& direct_conv_kernels_scalar() {
  // No fused pooling tile and no bf16 pair kernels here: the driver pools forward()'s output instead.
  static const DirectConvKernels k{"scalar", forward_scalar, columns_scalar, dot_rows_scalar};
  return k;
}

}  // namespace cpu_internal

namespace cpu {
namespace {

using cpu_internal::DirectConvKernels;
using cpu_internal::DirectGeom;
using cpu_internal::bytes64;
using cpu_internal::element_at;
using cpu_internal::for_each_part;
using cpu_internal::is_f32_or_low;
using cpu_internal::PartScratch;
using cpu_internal::parts_for;
using cpu_internal::kDirectOcb;
using cpu_internal::Workspace;

// Channels of the weight gradient's dz built and multiplied at a time (a multiple of the dot kernels' 4-row
// tiles): the dz a thread holds is kDzChannels rows, not OC.
constexpr int64_t kDzChannels = 8;
// The weight gradient's columns of every input channel are built at once, once per image, up to this many
// bytes per thread; past it one input channel's at a time, again for each chunk of output channels. On
// model A's first layer (27 taps x 900 positions) building them at once made the backward faster in every
// dtype: in bf16 (48.6 KB) at O2-bf16 and in f32 (97.2 KB) at O0 with both training peaks unchanged; in f16
// (48.6 KB; f32 columns held whole at O2-fp16 had raised its peak 6.6%) for a training peak 28 KB (1.5%)
// higher, the peak being that kernel's scratch there. `demi train --profile` times the backward,
// bench/memory.py measures the peaks.
constexpr size_t kAllColumnsBytes = size_t{100} << 10;

const DirectConvKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<DirectConvKernels> table{DEMI_KERNEL_TABLE_ENTRIES(direct_conv)};
  return table.get();
}

// How a layer's products run: FMAs on f32 (every level), vdpbf16ps pairs (DirectConvKernels::forward_pairs,
// dot_rows_bf16) or the tile unit (forward_tiles, weight_sums_tiles); the last two for a bf16 image with bf16
// weights (forward) or a bf16 dz (weight gradient) where the level has them.
enum class Products { kF32, kPairs, kTiles };

// ScopedDirectConvProducts' way (a Products), or -1: as measured.
std::atomic<int> g_forced_products{-1};

// The forced way where the level has its kernels (`pairs`, `tiles`: whether it has them), else `measured()`.
template <class Measured>
Products forced_or(bool pairs, bool tiles, Measured&& measured) {
  const int forced = g_forced_products.load();
  const auto way = static_cast<Products>(forced);
  if (forced >= 0 &&
      (way == Products::kF32 || (way == Products::kPairs && pairs) || (way == Products::kTiles && tiles)))
    return way;
  return measured();
}

DirectGeom geometry(const Conv2dParams& p) {
  DirectGeom g;
  g.c = p.c;
  g.kh = p.kh;
  g.kw = p.kw;
  g.hp = p.h + p.pad_top + p.pad_bottom;
  g.wp = p.w + p.pad_left + p.pad_right;
  g.oh = p.out_h();
  g.ow = p.out_w();
  g.k = p.c * p.kh * p.kw;
  return g;
}

size_t padded_floats(const DirectGeom& g) {
  return static_cast<size_t>(g.c * g.hp * g.wp + cpu_internal::kDirectSlack);
}

// Image n of x (dtype t) -> xp, zero-padded f32 (bf16 and f16 converted exactly on the way; an f32 x read as
// bf16 or f16 values, Conv2dParams::x_round, rounded on the way, bit for bit as Tensor::to rounds it).
void pad_image(const Conv2dParams& p, const DirectGeom& g, const void* x, int64_t n, float* xp) {
  const demi::internal::ConvertKernels& cvt = demi::internal::convert_kernels(cpu_level());
  std::memset(xp, 0, padded_floats(g) * sizeof(float));
  if (p.x_round != DType::kF32 && p.pad_left == 0 && p.pad_right == 0) {  // each plane's rows one run
    for (int64_t c = 0; c < p.c; ++c)
      round_f32(static_cast<const float*>(x) + (n * p.c + c) * p.h * p.w, xp + (c * g.hp + p.pad_top) * g.wp,
                p.h * p.w, p.x_round);
    return;
  }
  for (int64_t c = 0; c < p.c; ++c)
    for (int64_t iy = 0; iy < p.h; ++iy) {
      const char* src = element_at(x, ((n * p.c + c) * p.h + iy) * p.w, p.x_dtype);
      float* dst = xp + (c * g.hp + iy + p.pad_top) * g.wp + p.pad_left;
      switch (p.x_dtype) {
        case DType::kBF16: cvt.bf16_to_f32(reinterpret_cast<const BFloat16*>(src), dst, p.w); break;
        case DType::kF16: cvt.f16_to_f32(reinterpret_cast<const Half*>(src), dst, p.w); break;
        default:
          if (p.x_round != DType::kF32)
            round_f32(reinterpret_cast<const float*>(src), dst, p.w, p.x_round);
          else
            std::memcpy(dst, src, static_cast<size_t>(p.w) * sizeof(float));
          break;
      }
    }
}

// The scratch beside the padded image xp in a thread's scratch, xp_bytes on: the pair image
// (DirectConvKernels::pair_image, built here) when the forward runs in pairs, the room for the tile unit's taps
// on it, else none.
uint32_t* image_scratch_after(const DirectConvKernels& kern, const DirectGeom& g, float* xp, size_t xp_bytes,
                              Products taps) {
  if (taps == Products::kF32) return nullptr;
  auto* xq = reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(xp) + xp_bytes);
  if (taps == Products::kPairs) kern.pair_image(xp, static_cast<int64_t>(padded_floats(g)), xq);
  return xq;
}

// The forward tiles' weights [tile][K][ocb] and bias [tile][ocb], f32, zero past OC; in pairs instead, the
// weights as [tile][pairs][ocb] words of two bf16 in pair_plan's order (DirectConvKernels::forward_pairs); on
// the tile unit, one tile of every channel: wt (OCP, fwd_slots) bf16 and the bias's OCP floats.
struct PackedWeights {
  std::vector<float> w, bias;
  std::vector<uint32_t> pairs;
  std::vector<BFloat16> wt;
  cpu_internal::PairPlan plan;  // (in pairs)
  cpu_internal::TileGeom tg;    // (on the tile unit)
  int64_t tiles = 0, ocb = 0;
  const float* tile_w(int64_t t, const DirectGeom& g) const { return w.data() + t * g.k * ocb; }
  const uint32_t* tile_pairs(int64_t t) const { return pairs.data() + t * plan.n * ocb; }
};

PackedWeights pack_weights(const Conv2dParams& p, const DirectGeom& g, const void* w, const void* bias, int64_t ocb,
                           Products taps) {
  PackedWeights pw;
  if (taps == Products::kTiles) {
    pw.tg = cpu_internal::tile_geom(g, p.oc);
    ocb = pw.tg.ocp;
  }
  pw.ocb = ocb;
  pw.tiles = (p.oc + ocb - 1) / ocb;
  std::vector<float> w32(static_cast<size_t>(p.oc * g.k));
  convert(w, p.w_dtype, w32.data(), DType::kF32, p.oc * g.k);
  if (taps == Products::kTiles) {  // (bf16 weights: widened and narrowed exactly)
    pw.wt.assign(static_cast<size_t>(pw.tg.ocp * pw.tg.fwd_slots), BFloat16{});
    for (int64_t oc = 0; oc < p.oc; ++oc)
      for (int64_t k = 0; k < g.k; ++k)
        pw.wt[static_cast<size_t>(oc * pw.tg.fwd_slots + k)] = BFloat16(w32[static_cast<size_t>(oc * g.k + k)]);
  } else if (taps == Products::kPairs) {  // a widened bf16's top half is its bits
    pw.plan = cpu_internal::pair_plan(g);
    const cpu_internal::PairPlan& pp = pw.plan;
    pw.pairs.assign(static_cast<size_t>(pw.tiles * pp.n * ocb), 0u);
    const auto bits = [&](int64_t oc, int64_t k) {
      return k < 0 ? 0u : std::bit_cast<uint32_t>(w32[static_cast<size_t>(oc * g.k + k)]) >> 16;
    };
    for (int64_t oc = 0; oc < p.oc; ++oc)
      for (int s = 0; s < pp.n; ++s)
        pw.pairs[static_cast<size_t>(((oc / ocb) * pp.n + s) * ocb + oc % ocb)] =
            bits(oc, pp.tap0[s]) | bits(oc, pp.tap1[s]) << 16;
  } else {
    pw.w.assign(static_cast<size_t>(pw.tiles * g.k * ocb), 0.0f);
    for (int64_t oc = 0; oc < p.oc; ++oc)
      for (int64_t k = 0; k < g.k; ++k)
        pw.w[static_cast<size_t>(((oc / ocb) * g.k + k) * ocb + oc % ocb)] = w32[static_cast<size_t>(oc * g.k + k)];
  }
  pw.bias.assign(static_cast<size_t>(pw.tiles * ocb), 0.0f);
  if (bias) convert(bias, p.bias_dtype, pw.bias.data(), DType::kF32, p.oc);  // tile t's bias starts at t * ocb
  return pw;
}

// The scratch an image's forward takes beside its padded image: the pair image (in pairs) or the tile unit's
// taps, sums and plane (DirectConvKernels::forward_tiles; `pooled`: its taps and one chunk of sums,
// forward_pool2x2_tiles).
size_t image_scratch_bytes(const DirectGeom& g, int64_t oc, Products taps, bool pooled = false) {
  if (taps == Products::kPairs) return bytes64(padded_floats(g) * sizeof(float));
  if (taps != Products::kTiles) return 0;
  const cpu_internal::TileGeom t = cpu_internal::tile_geom(g, oc);
  const int64_t after = pooled ? cpu_internal::tile_pool_chunk(g, t).floats : t.ocp * t.q + g.oh * g.ow;
  return bytes64(static_cast<size_t>(t.fwd_slots / 2 * t.q + after) * sizeof(uint32_t));
}

// One image's convolution into y (OC, OH, OW) in y_dtype (f32, or rounded once from the f32 sums); pw packed
// for the forward tile (kDirectOcb channels). xq: the pair image (in pairs), or the scratch for the tile
// unit's (image_scratch_bytes); y32: scratch for the f32 output where y_dtype is another (the tile unit
// rounds to bf16 itself).
void forward_image(const DirectConvKernels& kern, const Conv2dParams& p, const DirectGeom& g, const PackedWeights& pw,
                   const float* xp, uint32_t* xq, bool relu, void* y, DType y_dtype, float* y32) {
  if (!pw.wt.empty() && (y_dtype == DType::kF32 || y_dtype == DType::kBF16))
    return kern.forward_tiles(g, pw.tg, xp, pw.wt.data(), pw.bias.data(), relu, xq, y, y_dtype == DType::kBF16,
                              p.oc);
  float* out = y_dtype == DType::kF32 ? static_cast<float*>(y) : y32;
  if (!pw.wt.empty()) {
    kern.forward_tiles(g, pw.tg, xp, pw.wt.data(), pw.bias.data(), relu, xq, out, false, p.oc);
  } else {
    for (int64_t t = 0; t < pw.tiles; ++t) {
      const int ocn = static_cast<int>(std::min<int64_t>(pw.ocb, p.oc - t * pw.ocb));
      float* yt = out + t * pw.ocb * g.oh * g.ow;
      if (!pw.pairs.empty())
        kern.forward_pairs(g, pw.plan, xp, xq, pw.tile_pairs(t), pw.bias.data() + t * pw.ocb, relu, yt, ocn);
      else
        kern.forward(g, xp, pw.tile_w(t, g), pw.bias.data() + t * pw.ocb, relu, yt, ocn);
    }
  }
  if (out != y) convert(out, DType::kF32, y, y_dtype, p.oc * g.oh * g.ow);
}

// Which of a few ways to the same result runs fastest (its index): each once (a warm-up, and how often to
// repeat each to about a millisecond), then five alternating rounds; the best of each decides. The direct
// kernels' measured choices (taps, dot products) are made by it.
size_t fastest(const std::vector<std::function<void()>>& runs) {
  const double once = internal::seconds_of([&] {
    for (const auto& r : runs) r();
  });
  const double share = 1e-3 * static_cast<double>(runs.size()) / 2;  // about a millisecond of each
  const int reps = std::clamp(static_cast<int>(share / std::max(once, 1e-9)), 1, 100);
  std::vector<double> best(runs.size(), 1e30);
  for (int r = 0; r < 5; ++r)
    for (size_t i = 0; i < runs.size(); ++i) best[i] = std::min(best[i], internal::seconds_of(runs[i], reps));
  return static_cast<size_t>(std::min_element(best.begin(), best.end()) - best.begin());
}

// A bf16 layer's geometry as the direct kernels' own choices (taps, dot products) key and name it: the
// level and the geometry, not the batch (both are measured on one image).
internal::ChoiceCache::Key geometry_key(const Conv2dParams& p) {
  return {static_cast<int64_t>(cpu_level()), p.c, p.h, p.w, p.oc, p.kh, p.kw,
          p.pad_top, p.pad_bottom, p.pad_left, p.pad_right};
}
std::string geometry_text(const Conv2dParams& p) {
  return str_cat(cpu_level_name(cpu_level()), " c", p.c, " ", p.h, "x", p.w, " oc", p.oc, " k", p.kh, "x", p.kw, " p",
                 p.pad_top, ",", p.pad_bottom, ",", p.pad_left, ",", p.pad_right);
}

// How a bf16 forward of p's geometry takes its taps: in f32 on the widened taps, in bf16 pairs (vdpbf16ps) or
// on the tile unit (AMX), where the level has them. The products are exact in f32 every way (the sums in
// another order), and which is fastest depends on the CPU — vdpbf16ps issues at half the FMA rate on Intel
// Xeons, at the full one on Zen 4/5; the tile unit exists only on the Xeons — so it is measured per geometry
// (one image, each way, best of alternating rounds) and kept like the other choices
// (conv-direct-taps-v2-<cpu>.txt): the separate and the fused forwards read the same choice, so they keep
// giving the same bits.
Products taps_measured(const DirectConvKernels& kern, const Conv2dParams& p, const DirectGeom& g) {
  // (never destroyed)
  static auto& choices = *new internal::ChoiceCache("conv-direct-taps-v2", {"f32", "pairs", "tiles"});
  return static_cast<Products>(choices.choose(geometry_key(p), [&] { return geometry_text(p); }, [&] {
    const std::vector<BFloat16> w(static_cast<size_t>(p.oc * g.k), BFloat16(0.25f));  // (the rate is the values')
    std::vector<Products> ways{Products::kF32};
    if (kern.forward_pairs) ways.push_back(Products::kPairs);
    if (kern.forward_tiles) ways.push_back(Products::kTiles);
    const size_t xp_bytes = bytes64(padded_floats(g) * sizeof(float));
    size_t scratch = 0;
    for (Products t : ways) scratch = std::max(scratch, image_scratch_bytes(g, p.oc, t));
    const Workspace buf(xp_bytes + scratch + static_cast<size_t>(p.oc * g.oh * g.ow) * sizeof(float));
    auto* xp = buf.f32();
    std::fill(xp, xp + padded_floats(g), 0.5f);
    float* y32 = reinterpret_cast<float*>(reinterpret_cast<char*>(xp) + xp_bytes + scratch);
    std::vector<PackedWeights> packed;
    std::vector<std::function<void()>> runs;
    for (Products t : ways) packed.push_back(pack_weights(p, g, w.data(), nullptr, kDirectOcb, t));
    for (size_t i = 0; i < ways.size(); ++i)
      runs.push_back([&, i] {
        uint32_t* xq = image_scratch_after(kern, g, xp, xp_bytes, ways[i]);
        forward_image(kern, p, g, packed[i], xp, xq, false, y32, DType::kF32, y32);
      });
    return static_cast<int>(ways[fastest(runs)]);
  }));
}

// How the forward takes its taps: a bf16 image and bf16 weights on a level that has the pair or tile kernels
// as measured fastest (taps_measured), else f32.
Products forward_taps(const DirectConvKernels& kern, const Conv2dParams& p) {
  if ((kern.forward_pairs == nullptr && kern.forward_tiles == nullptr) || p.x_values() != DType::kBF16 ||
      p.w_dtype != DType::kBF16)
    return Products::kF32;
  return forced_or(kern.forward_pairs != nullptr, kern.forward_tiles != nullptr,
                   [&] { return taps_measured(kern, p, geometry(p)); });
}

void check(const Conv2dParams& p, const char* op) {
  check_conv2d_params(p, op);
  DEMI_CHECK(direct_conv_supported(p), op, ": the direct convolution takes groups 1, stride 1, dilation 1, C*KH*KW <= ",
             kDirectMaxK, " and f32|bf16|f16 tensors, got ", describe(p));
}


// How a bf16 weight gradient of p's geometry (image and dz bf16) runs its products: dot products on f32 rows
// and columns, on bf16 ones in pairs (vdpbf16ps), or on the tile unit (AMX), where the level has them. The
// products are exact in f32 every way; which is fastest depends on the CPU (as for the forward's taps) and on
// the layer's taps — the tile unit takes every input channel's taps in one 32-slot step, the dot products
// one tap at a time, so a 3-channel layer's tiles gain three times what a 1-channel one's do — so it is
// measured per geometry with the layer's input channels — one image, every output channel, columns built
// and dz given, each way, best of alternating rounds — and kept (conv-direct-dots-v3-<cpu>.txt); the
// separate and the fused weight gradients read the same choice. (v2 measured one input channel for every
// channel count: model A's 3-channel layer then took the pairs where the tiles are 2.4x as fast.)
Products dots_measured(const DirectConvKernels& kern, const Conv2dParams& p, const DirectGeom& g) {
  // (never destroyed)
  static auto& choices = *new internal::ChoiceCache("conv-direct-dots-v3", {"f32", "pairs", "tiles"});
  return static_cast<Products>(choices.choose(geometry_key(p), [&] { return geometry_text(p); }, [&] {
    const int64_t positions = g.oh * g.ow, k = g.k;  // every input channel's taps at once
    const cpu_internal::TileGeom t = cpu_internal::tile_geom(g, p.oc);
    const size_t xp_bytes = bytes64(padded_floats(g) * sizeof(float));
    const size_t col32 = bytes64(static_cast<size_t>(std::max(k * positions, t.grad_slots * t.pp)) * sizeof(float));
    const size_t dz32 = bytes64(static_cast<size_t>(std::max(p.oc * positions, t.ocp * t.pp)) * sizeof(float));
    const size_t lanes = bytes64(static_cast<size_t>(std::max((p.oc * k + p.oc) * 16, t.grad_slots * t.ocp)) *
                                 sizeof(float));
    const Workspace buf(xp_bytes + col32 + 2 * dz32 + lanes);
    char* at = reinterpret_cast<char*>(buf.f32());
    auto* xp = reinterpret_cast<float*>(at);
    auto* col = reinterpret_cast<float*>(at + xp_bytes);  // (f32, bf16 or the tile unit's columns)
    auto* dz = reinterpret_cast<float*>(at + xp_bytes + col32);
    auto* dz16 = reinterpret_cast<BFloat16*>(at + xp_bytes + col32 + dz32);
    auto* dzt = dz16 + p.oc * positions;
    auto* l = reinterpret_cast<float*>(at + xp_bytes + col32 + 2 * dz32);
    std::fill(xp, xp + padded_floats(g), 0.5f);  // (the rate is the values')
    std::fill(dz, dz + p.oc * positions, 0.25f);
    std::fill(dz16, dz16 + p.oc * positions, BFloat16(0.25f));
    auto* col16 = reinterpret_cast<BFloat16*>(col);
    std::fill(dzt, dzt + t.ocp * t.pp, BFloat16{});
    std::vector<Products> ways{Products::kF32};
    std::vector<std::function<void()>> runs{[&] {
      kern.columns(g, xp, col);
      for (int64_t o0 = 0; o0 < p.oc; o0 += kDzChannels) {
        const int64_t on = std::min(kDzChannels, p.oc - o0);
        kern.dot_rows(dz + o0 * positions, col, on, k, positions, l + o0 * k * 16, k, l + (p.oc * k + o0) * 16);
      }
    }};
    if (kern.dot_rows_bf16) {
      ways.push_back(Products::kPairs);
      runs.push_back([&] {
        kern.columns_bf16(g, xp, col16);
        for (int64_t o0 = 0; o0 < p.oc; o0 += kDzChannels) {
          const int64_t on = std::min(kDzChannels, p.oc - o0);
          kern.dot_rows_bf16(dz16 + o0 * positions, col16, on, k, positions, l + o0 * k * 16, k,
                             l + (p.oc * k + o0) * 16);
        }
      });
    }
    if (kern.weight_sums_tiles) {
      ways.push_back(Products::kTiles);
      runs.push_back([&] {
        for (int64_t o0 = 0; o0 < p.oc; o0 += 16)
          kern.pack_dz_tiles(dz16 + o0 * positions, std::min<int64_t>(16, p.oc - o0), positions, t.pp,
                             dzt + o0 * t.pp);
        kern.weight_sums_tiles(g, t, xp, dzt, col16, l);
      });
    }
    return static_cast<int>(ways[fastest(runs)]);
  }));
}

// How an f16 weight gradient of p's geometry (image and dz f16) runs its products: f32 dot products (dz
// widened, the columns f16 where the level has them) or the tile unit's, each f16 value split into bf16 hi +
// lo and each product taken as four bf16 ones (weight_sums_tiles_f16: exact, f32 sums in another order). Four
// tile products per product against one FMA: measured per geometry as dots_measured measures (dz's widening
// included), kept in conv-direct-dots-f16-v1-<cpu>.txt.
Products dots_measured_f16(const DirectConvKernels& kern, const Conv2dParams& p, const DirectGeom& g) {
  // (never destroyed)
  static auto& choices = *new internal::ChoiceCache("conv-direct-dots-f16-v1", {"f32", "pairs", "tiles"});
  return static_cast<Products>(choices.choose(geometry_key(p), [&] { return geometry_text(p); }, [&] {
    const int64_t positions = g.oh * g.ow, k = g.k;
    const cpu_internal::TileGeom t = cpu_internal::tile_geom(g, p.oc);
    const size_t xp_bytes = bytes64(padded_floats(g) * sizeof(float));
    const size_t col_bytes =
        bytes64(static_cast<size_t>(std::max(k * positions * 4, cpu_internal::split_scratch_bytes(g, t))));
    const size_t dz16_bytes = bytes64(static_cast<size_t>(p.oc * positions) * sizeof(Half));
    const size_t dz32_bytes = bytes64(static_cast<size_t>(kDzChannels * positions) * sizeof(float));
    const size_t lanes = bytes64(static_cast<size_t>(std::max((p.oc * k + p.oc) * 16, t.grad_slots * t.ocp)) *
                                 sizeof(float));
    const Workspace buf(xp_bytes + col_bytes + dz16_bytes + dz32_bytes + lanes);
    char* at = reinterpret_cast<char*>(buf.f32());
    auto* xp = reinterpret_cast<float*>(at);
    char* col = at + xp_bytes;
    auto* dz16 = reinterpret_cast<Half*>(at + xp_bytes + col_bytes);
    auto* dz32 = reinterpret_cast<float*>(at + xp_bytes + col_bytes + dz16_bytes);
    auto* l = reinterpret_cast<float*>(at + xp_bytes + col_bytes + dz16_bytes + dz32_bytes);
    std::fill(xp, xp + padded_floats(g), 0.5f);  // (the rate is the values')
    std::fill(dz16, dz16 + p.oc * positions, Half(0.25f));
    const demi::internal::ConvertKernels& cvt = demi::internal::convert_kernels(cpu_level());
    std::vector<Products> ways{Products::kF32, Products::kTiles};
    std::vector<std::function<void()>> runs{
        [&] {
          if (kern.dot_rows_f16)
            kern.columns_f16(g, xp, reinterpret_cast<Half*>(col));
          else
            kern.columns(g, xp, reinterpret_cast<float*>(col));
          for (int64_t o0 = 0; o0 < p.oc; o0 += kDzChannels) {
            const int64_t on = std::min(kDzChannels, p.oc - o0);
            cvt.f16_to_f32(dz16 + o0 * positions, dz32, on * positions);
            float* lo = l + o0 * k * 16;
            float* dbl = l + (p.oc * k + o0) * 16;
            if (kern.dot_rows_f16)
              kern.dot_rows_f16(dz32, reinterpret_cast<const Half*>(col), on, k, positions, lo, k, dbl);
            else
              kern.dot_rows(dz32, reinterpret_cast<const float*>(col), on, k, positions, lo, k, dbl);
          }
        },
        [&] {
          std::vector<const Half*> blocks;
          for (int64_t o0 = 0; o0 < p.oc; o0 += 16) blocks.push_back(dz16 + o0 * positions);
          cpu_internal::F16Dz dz;
          dz.rows = blocks.data();
          kern.weight_sums_tiles_f16(g, t, xp, dz, p.oc, reinterpret_cast<BFloat16*>(col), l);
        }};
    return static_cast<int>(ways[fastest(runs)]);
  }));
}

// How a weight gradient with dz in dz_dtype runs its products: dots_measured's choice for a bf16 image and a
// bf16 dz on a level with the pair or tile kernels, dots_measured_f16's for an f16 image and an f16 dz on a
// level with the tile unit, else f32 dot products.
Products dots_way(const DirectConvKernels& kern, const Conv2dParams& p, const DirectGeom& g, DType dz_dtype) {
  if (kern.weight_sums_tiles_f16 != nullptr && p.x_values() == DType::kF16 && dz_dtype == DType::kF16)
    return forced_or(false, true, [&] { return dots_measured_f16(kern, p, g); });
  if ((kern.dot_rows_bf16 == nullptr && kern.weight_sums_tiles == nullptr) || p.x_values() != DType::kBF16 ||
      dz_dtype != DType::kBF16)
    return Products::kF32;
  return forced_or(kern.dot_rows_bf16 != nullptr, kern.weight_sums_tiles != nullptr,
                   [&] { return dots_measured(kern, p, g); });
}

// The fused 2x2 / stride-2 pool's f16 gradient (dy and argmax, (N, OC, PH, PW)), which an f16 weight gradient
// on the tile unit reads as it packs dz (cpu_internal::F16Dz) instead of a dense dz built per image.
struct PooledF16 {
  const Half* dy = nullptr;
  const uint8_t* argmax = nullptr;
  int64_t ph = 0, pw = 0;
};

// The weight gradient on the tile unit (dots_way kTiles): the threads take contiguous runs of images, each
// summing into its own (grad_slots, OCP) f32 block; at the end each (oc, k) adds the threads' sums in thread
// order. A bf16 dz (DirectConvKernels::weight_sums_tiles) is taken 16 channels at a time and packed per image,
// then the columns built and multiplied a chunk of TileGeom::cp positions at a time; an f16 one
// (weight_sums_tiles_f16) is held as every channel's rows, f16 (or, `pooled`, read from the fused 2x2 pool's
// gradient as it is packed: none held), and split with the columns a few output rows at a time. rows,
// tmp_bytes as for backward_weights_impl (here 16 channels at a time, in dz_dtype).
template <class Rows, class TmpBytes>
void backward_weights_tiles(const DirectConvKernels& kern, const Conv2dParams& p, const DirectGeom& g, const void* x,
                            DType dz_dtype, Rows&& rows, TmpBytes&& tmp_bytes, const PooledF16* pooled, float* dw32,
                            float* db32) {
  const cpu_internal::TileGeom t = cpu_internal::tile_geom(g, p.oc);
  const bool split = dz_dtype == DType::kF16;
  const int64_t positions = g.oh * g.ow, threads = parts_for(p.n);
  const size_t xp_bytes = bytes64(padded_floats(g) * sizeof(float)),
               // the columns (a chunk), dz packed (the image's): or the image, the columns and dz split (a chunk)
               col_bytes = bytes64(split ? static_cast<size_t>(cpu_internal::split_scratch_bytes(g, t))
                                         : static_cast<size_t>(t.grad_slots * t.cp) * sizeof(BFloat16)),
               dzt_bytes = split ? 0 : bytes64(static_cast<size_t>(t.ocp * t.pp) * sizeof(BFloat16)),
               // dz's rows: 16 channels at a time, or every channel's (the split; none from the pool's gradient)
               rows_bytes = pooled ? 0 : bytes64(tmp_bytes(split ? p.oc : std::min<int64_t>(16, p.oc), dz_dtype)),
               sums_bytes = bytes64(static_cast<size_t>(t.grad_slots * t.ocp) * sizeof(float));
  PartScratch scratch(threads, xp_bytes + col_bytes + dzt_bytes + rows_bytes + sums_bytes);
  const size_t sums_at = xp_bytes + col_bytes + dzt_bytes + rows_bytes;
  for_each_part(threads, p.n, [&](int64_t part, int64_t n0, int64_t n1) {
    char* base = scratch.part(part);
    auto* xp = reinterpret_cast<float*>(base);
    auto* col = reinterpret_cast<BFloat16*>(base + xp_bytes);
    auto* dzt = reinterpret_cast<BFloat16*>(base + xp_bytes + col_bytes);
    char* tmp = base + xp_bytes + col_bytes + dzt_bytes;
    auto* sums = reinterpret_cast<float*>(base + sums_at);
    std::fill(sums, sums + t.grad_slots * t.ocp, 0.0f);
    if (!split) std::fill(dzt, dzt + t.ocp * t.pp, BFloat16{});  // (the channel blocks past OC stay 0)
    std::vector<const Half*> blocks(split && !pooled ? static_cast<size_t>(t.ocp / 16) : 0);  // (dz's rows)
    for (int64_t n = n0; n < n1; ++n) {
      pad_image(p, g, x, n, xp);
      if (pooled) {  // (split)
        cpu_internal::F16Dz dz;
        const int64_t plane = p.oc * pooled->ph * pooled->pw;
        dz.dy = pooled->dy + n * plane;
        dz.argmax = pooled->argmax + n * plane;
        dz.ph = pooled->ph;
        dz.pw = pooled->pw;
        kern.weight_sums_tiles_f16(g, t, xp, dz, p.oc, col, sums);
        continue;
      }
      for (int64_t o0 = 0; o0 < p.oc; o0 += 16) {
        const int64_t on = std::min<int64_t>(16, p.oc - o0);
        if (split) {  // each block's rows built after the last's (the space past them is rows' own)
          float* at = reinterpret_cast<float*>(tmp + static_cast<size_t>(o0 * positions) * sizeof(Half));
          blocks[static_cast<size_t>(o0 / 16)] = static_cast<const Half*>(rows(n, o0, on, at, DType::kF16));
        } else {
          kern.pack_dz_tiles(static_cast<const BFloat16*>(rows(n, o0, on, reinterpret_cast<float*>(tmp), DType::kBF16)),
                             on, positions, t.pp, dzt + o0 * t.pp);
        }
      }
      if (split) {
        cpu_internal::F16Dz dz;
        dz.rows = blocks.data();
        kern.weight_sums_tiles_f16(g, t, xp, dz, p.oc, col, sums);
      } else {
        kern.weight_sums_tiles(g, t, xp, dzt, col, sums);
      }
    }
  });
  for (int64_t oc = 0; oc < p.oc; ++oc)
    for (int64_t k = 0; k <= g.k; ++k) {
      float s = 0.0f;
      for (int64_t part = 0; part < threads; ++part)
        s += reinterpret_cast<const float*>(scratch.part(part) + sums_at)[k * t.ocp + oc];
      (k < g.k ? dw32[oc * g.k + k] : db32[oc]) = s;
    }
}

// The weight gradient. The threads take contiguous runs of images, each summing into its own 16-lane partials
// (DirectConvKernels::dot_rows, or dot_rows_bf16 where the image and dz are bf16, the level has it and it
// measures faster: a fixed order within and across its images); at the end each (oc, k)'s lanes are added in
// lane order, then the threads' sums in thread order (the bits depend on the thread count, as the choice
// cache's key does).
// `rows(n, o0, on, tmp, dtype)` returns channels [o0, o0 + on) of image n's dz as rows of OH * OW in dtype (f32,
// or dz's own bf16 or f16), in place or built in tmp, tmp_bytes(on, dtype) bytes of the thread's scratch (what
// rows needs: none when dz is given in that dtype); on <= kDzChannels (16 on the tile unit). The columns are bf16 where the rows are.
// dw32 (OC, K), db32 (OC). Each (oc, k) sums its positions in the same order whichever channels share a
// call, so taking the channels a few at a time keeps the bits and bounds the dz built at once.
// pooled (nullable): where dz is the fused 2x2 pool's gradient, the tile unit's f16 weight gradient reads it
// from there.
template <class Rows, class TmpBytes>
void backward_weights_impl(const Conv2dParams& p, const void* x, DType dz_dtype, Rows&& rows, TmpBytes&& tmp_bytes,
                           float* dw32, float* db32, const PooledF16* pooled = nullptr) {
  const DirectConvKernels& kern = kernels();
  const DirectGeom g = geometry(p);
  const Products way = dots_way(kern, p, g, dz_dtype);
  if (way == Products::kTiles)
    return backward_weights_tiles(kern, p, g, x, dz_dtype, rows, tmp_bytes, dz_dtype == DType::kF16 ? pooled : nullptr,
                                  dw32, db32);
  const bool bf16 = way == Products::kPairs;
  const int64_t positions = g.oh * g.ow, threads = parts_for(p.n);
  const int64_t part = (p.oc * g.k + p.oc) * 16;  // one thread's lanes for dw and db
  // The columns of every input channel at once, built once per image, where they fit kAllColumnsBytes;
  // else of one input channel at a time (its KH * KW taps), built again for each chunk of output channels.
  // A (oc, k) lane's sum is the same whichever taps share a call. (Model A's 3-channel first layer built
  // its bf16 columns 12 times per image, one channel per chunk of 8 output channels: columns took as long
  // as the dot products.)
  // An f16 image's columns in f16 where the level has them (dz stays f32: its products are FMAs on f32).
  const bool f16_columns = !bf16 && kern.dot_rows_f16 && p.x_values() == DType::kF16;
  const size_t value_bytes = bf16 || f16_columns ? size_t{2} : sizeof(float);
  const bool all_channels = static_cast<size_t>(g.k * positions) * value_bytes <= kAllColumnsBytes;
  DirectGeom gc = g;
  if (!all_channels) {
    gc.c = 1;
    gc.k = g.kh * g.kw;
  }
  const size_t xp_bytes = bytes64(padded_floats(g) * sizeof(float)),
               col_bytes = bytes64(static_cast<size_t>(gc.k * positions) * value_bytes),
               rows_bytes = bytes64(tmp_bytes(std::min(p.oc, kDzChannels), bf16 ? DType::kBF16 : DType::kF32)),
               lane_bytes = bytes64(static_cast<size_t>(part) * sizeof(float));
  PartScratch scratch(threads, xp_bytes + col_bytes + rows_bytes + lane_bytes);
  for_each_part(threads, p.n, [&](int64_t t, int64_t n0, int64_t n1) {
    char* base = scratch.part(t);
    auto* xp = reinterpret_cast<float*>(base);
    auto* col = reinterpret_cast<float*>(base + xp_bytes);
    auto* tmp = reinterpret_cast<float*>(base + xp_bytes + col_bytes);
    auto* lanes = reinterpret_cast<float*>(base + xp_bytes + col_bytes + rows_bytes);
    float* db_lanes = lanes + p.oc * g.k * 16;
    std::fill(lanes, lanes + part, 0.0f);
    // The columns of gc's channels from the padded image, from plane c: every channel's (all_channels) or
    // channel c's. Built once per image, or once per image, channel and chunk of output channels.
    const auto columns = [&](int64_t c) {
      const float* plane = xp + c * g.hp * g.wp;
      if (bf16)
        kern.columns_bf16(gc, plane, reinterpret_cast<BFloat16*>(col));
      else if (f16_columns)
        kern.columns_f16(gc, plane, reinterpret_cast<Half*>(col));
      else
        kern.columns(gc, plane, col);
    };
    const int64_t calls = g.c / gc.c;  // dot products per chunk: one over every channel, or one per channel
    for (int64_t n = n0; n < n1; ++n) {
      pad_image(p, g, x, n, xp);
      if (calls == 1) columns(0);
      for (int64_t o0 = 0; o0 < p.oc; o0 += kDzChannels) {
        const int64_t on = std::min(kDzChannels, p.oc - o0);
        const void* dz = rows(n, o0, on, tmp, bf16 ? DType::kBF16 : DType::kF32);
        for (int64_t c = 0; c < calls; ++c) {
          if (calls > 1) columns(c);
          float* l = lanes + (o0 * g.k + c * gc.k) * 16;
          float* dbl = c == 0 ? db_lanes + o0 * 16 : nullptr;  // the bias sums once
          if (bf16)
            kern.dot_rows_bf16(static_cast<const BFloat16*>(dz), reinterpret_cast<const BFloat16*>(col), on, gc.k,
                               positions, l, g.k, dbl);
          else if (f16_columns)
            kern.dot_rows_f16(static_cast<const float*>(dz), reinterpret_cast<const Half*>(col), on, gc.k, positions,
                              l, g.k, dbl);
          else
            kern.dot_rows(static_cast<const float*>(dz), col, on, gc.k, positions, l, g.k, dbl);
        }
      }
    }
  });
  auto lane_sum = [](const float* l) {
    float s = 0.0f;
    for (int i = 0; i < 16; ++i) s += l[i];
    return s;
  };
  const size_t lanes_at = xp_bytes + col_bytes + rows_bytes;
  for (int64_t i = 0; i < p.oc * g.k + p.oc; ++i) {
    float s = 0.0f;
    for (int64_t t = 0; t < threads; ++t)
      s += lane_sum(reinterpret_cast<const float*>(scratch.part(t) + lanes_at) + i * 16);
    (i < p.oc * g.k ? dw32[i] : db32[i - p.oc * g.k]) = s;
  }
}

// dw32 (OC, K) -> dw (OC, K) in dtype t (+= when accumulate); db32 -> db likewise.
void store_gradients(const Conv2dParams& p, const float* dw32, const float* db32, void* dw, DType dw_dtype, void* db,
                     DType db_dtype, bool accumulate) {
  const DirectGeom g = geometry(p);
  std::vector<float> row(static_cast<size_t>(g.k));
  for (int64_t oc = 0; oc < p.oc; ++oc) {
    void* dst = element_at(dw, oc * g.k, dw_dtype);
    const float* src = dw32 + oc * g.k;
    if (accumulate) {
      convert(dst, dw_dtype, row.data(), DType::kF32, g.k);
      for (int64_t k = 0; k < g.k; ++k) row[static_cast<size_t>(k)] += src[k];
      src = row.data();
    }
    convert(src, DType::kF32, dst, dw_dtype, g.k);
  }
  if (!db) return;
  std::vector<float> b(db32, db32 + p.oc);
  if (accumulate) {
    std::vector<float> old(static_cast<size_t>(p.oc));
    convert(db, db_dtype, old.data(), DType::kF32, p.oc);
    for (int64_t oc = 0; oc < p.oc; ++oc) b[static_cast<size_t>(oc)] += old[static_cast<size_t>(oc)];
  }
  convert(b.data(), DType::kF32, db, db_dtype, p.oc);
}

}  // namespace

bool direct_conv_supported(const Conv2dParams& p) {
  return p.groups == 1 && p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 && p.dilation_w == 1 &&
         p.c * p.kh * p.kw <= kDirectMaxK && p.out_h() >= 1 && p.out_w() >= 1 && is_f32_or_low(p.x_dtype) &&
         is_f32_or_low(p.w_dtype) && is_f32_or_low(p.bias_dtype) && is_f32_or_low(p.y_dtype);
}

namespace {
const char* products_name(Products way) {
  return way == Products::kTiles ? "tiles" : way == Products::kPairs ? "bf16 pairs" : "f32";
}
}  // namespace

ScopedDirectConvProducts::ScopedDirectConvProducts(const char* way) : saved_(g_forced_products.load()) {
  const std::string w = way ? way : "";
  DEMI_CHECK(w.empty() || w == "f32" || w == "bf16 pairs" || w == "tiles",
             "ScopedDirectConvProducts: the way is f32, bf16 pairs or tiles, got \"", w, "\"");
  g_forced_products = w.empty()               ? -1
                      : w == "tiles"          ? static_cast<int>(Products::kTiles)
                      : w == "bf16 pairs"     ? static_cast<int>(Products::kPairs)
                                              : static_cast<int>(Products::kF32);
}

ScopedDirectConvProducts::~ScopedDirectConvProducts() { g_forced_products = saved_; }

const char* direct_conv_forward_products(const Conv2dParams& p) { return products_name(forward_taps(kernels(), p)); }

const char* direct_conv_dots_products(const Conv2dParams& p) {
  return products_name(dots_way(kernels(), p, geometry(p), p.y_dtype));
}

void direct_conv2d_forward(const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  check(p, "conv2d_forward (direct)");
  const DirectConvKernels& kern = kernels();
  const DirectGeom g = geometry(p);
  const Products taps = forward_taps(kern, p);
  const PackedWeights pw = pack_weights(p, g, w, bias, kDirectOcb, taps);
  const int64_t per_image = p.oc * g.oh * g.ow;
  const int64_t parts = parts_for(p.n);
  const size_t xp_bytes = bytes64(padded_floats(g) * sizeof(float)), xq_bytes = image_scratch_bytes(g, p.oc, taps);
  const size_t y_bytes = p.y_dtype == DType::kF32 ? 0 : static_cast<size_t>(per_image) * sizeof(float);
  PartScratch scratch(parts, xp_bytes + xq_bytes + y_bytes);
  for_each_part(parts, p.n, [&](int64_t t, int64_t n0, int64_t n1) {
    auto* xp = reinterpret_cast<float*>(scratch.part(t));
    auto* y32 = reinterpret_cast<float*>(scratch.part(t) + xp_bytes + xq_bytes);
    for (int64_t n = n0; n < n1; ++n) {
      pad_image(p, g, x, n, xp);
      uint32_t* xq = image_scratch_after(kern, g, xp, xp_bytes, taps);
      forward_image(kern, p, g, pw, xp, xq, p.relu, element_at(y, n * per_image, p.y_dtype), p.y_dtype, y32);
    }
  });
}

void direct_conv2d_relu_max_pool2d_forward(const Conv2dParams& p, const Pool2dParams& pool, const void* x,
                                           const void* w, const void* bias, DType y_dtype, void* y,
                                           uint8_t* argmax) {
  check(p, "conv2d + relu + max_pool2d forward (direct)");
  DEMI_CHECK(strided_pool_supported(pool) && pool.c == p.oc && pool.h == p.out_h() && pool.w == p.out_w(),
             "conv2d + relu + max_pool2d forward (direct): the pool must cover the convolution's output with windows "
             "that neither overlap nor reach padding");
  const DirectConvKernels& kern = kernels();
  const DirectGeom g = geometry(p);
  const int64_t per_image = p.oc * g.oh * g.ow, pooled = pool.c * pool.oh * pool.ow;
  // The convolution's own output dtype: the separate ops pool the values it stores (bf16: the same ties), and
  // an f16 output of an f32 convolution is pooled in f32, rounded once.
  const DType conv_dtype = p.y_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  const Products taps = forward_taps(kern, p);
  // Pooled in registers (the output is never stored as such): by the FMA and pair tiles, and from the tile
  // unit's sums at the padded width (those in the thread's scratch).
  if (pool.is_2x2_stride_2() && kern.forward_pool2x2) {
    const bool tiles = taps == Products::kTiles && kern.forward_pool2x2_tiles != nullptr;
    const bool in_pairs = taps == Products::kPairs && kern.forward_pool2x2_pairs != nullptr;
    const Products way = tiles ? Products::kTiles : in_pairs ? Products::kPairs : Products::kF32;
    const PackedWeights pw = pack_weights(p, g, w, bias, cpu_internal::kDirectPoolOcb, way);
    const int64_t plane = pool.oh * pool.ow;
    const int64_t parts = parts_for(p.n);
    const size_t xp_bytes = bytes64(padded_floats(g) * sizeof(float));
    const size_t xq_bytes = image_scratch_bytes(g, p.oc, way, true);
    PartScratch scratch(parts, xp_bytes + xq_bytes +
                                   (y_dtype == DType::kF32 ? 0 : static_cast<size_t>(pooled) * sizeof(float)));
    for_each_part(parts, p.n, [&](int64_t t, int64_t n0, int64_t n1) {
      auto* xp = reinterpret_cast<float*>(scratch.part(t));
      auto* out32 = reinterpret_cast<float*>(scratch.part(t) + xp_bytes + xq_bytes);
      for (int64_t n = n0; n < n1; ++n) {
        pad_image(p, g, x, n, xp);
        uint32_t* xq = image_scratch_after(kern, g, xp, xp_bytes, way);
        float* dst = y_dtype == DType::kF32 ? static_cast<float*>(y) + n * pooled : out32;
        uint8_t* am = argmax ? argmax + n * pooled : nullptr;
        for (int64_t tile = 0; tile < pw.tiles; ++tile) {  // (on the tile unit: one, of every channel)
          const int ocn = static_cast<int>(std::min<int64_t>(pw.ocb, p.oc - tile * pw.ocb));
          float* out = dst + tile * pw.ocb * plane;
          uint8_t* out_am = am ? am + tile * pw.ocb * plane : nullptr;
          if (tiles)
            kern.forward_pool2x2_tiles(g, pw.tg, xp, pw.wt.data(), pw.bias.data(), conv_dtype == DType::kBF16, xq,
                                       out, out_am, ocn, pool.oh, pool.ow);
          else if (in_pairs)
            kern.forward_pool2x2_pairs(g, pw.plan, xp, xq, pw.tile_pairs(tile), pw.bias.data() + tile * pw.ocb,
                                       conv_dtype == DType::kBF16, out, out_am, ocn, pool.oh, pool.ow);
          else
            kern.forward_pool2x2(g, xp, pw.tile_w(tile, g), pw.bias.data() + tile * pw.ocb, conv_dtype == DType::kBF16,
                                 out, out_am, ocn, pool.oh, pool.ow);
        }
        if (y_dtype != DType::kF32) convert(dst, DType::kF32, element_at(y, n * pooled, y_dtype), y_dtype, pooled);
      }
    });
    return;
  }
  const PackedWeights pw = pack_weights(p, g, w, bias, kDirectOcb, taps);
  Pool2dParams one = pool;
  one.n = 1;
  const int64_t parts = parts_for(p.n);
  const size_t xp_bytes = bytes64(padded_floats(g) * sizeof(float)), xq_bytes = image_scratch_bytes(g, p.oc, taps),
               y_bytes = bytes64(static_cast<size_t>(per_image) * sizeof(float)),
               low_bytes = bytes64(static_cast<size_t>(per_image) * dtype_size(conv_dtype));
  PartScratch scratch(parts,
                      xp_bytes + xq_bytes + y_bytes + low_bytes + static_cast<size_t>(pooled) * sizeof(float));
  for_each_part(parts, p.n, [&](int64_t t, int64_t n0, int64_t n1) {
    char* base = scratch.part(t);
    auto* xp = reinterpret_cast<float*>(base);
    auto* y32 = reinterpret_cast<float*>(base + xp_bytes + xq_bytes);
    void* ylow = base + xp_bytes + xq_bytes + y_bytes;
    void* pooled_tmp = base + xp_bytes + xq_bytes + y_bytes + low_bytes;
    for (int64_t n = n0; n < n1; ++n) {
      pad_image(p, g, x, n, xp);
      uint32_t* xq = image_scratch_after(kern, g, xp, xp_bytes, taps);
      void* conv_out = conv_dtype == DType::kF32 ? static_cast<void*>(y32) : ylow;
      forward_image(kern, p, g, pw, xp, xq, false, conv_out, conv_dtype, y32);
      void* dst = element_at(y, n * pooled, y_dtype);
      relu_max_pool2d_forward(one, conv_dtype, conv_out, conv_dtype == y_dtype ? dst : pooled_tmp,
                              argmax ? argmax + n * pooled : nullptr);
      if (conv_dtype != y_dtype) convert(pooled_tmp, conv_dtype, dst, y_dtype, pooled);
    }
  });
}

void direct_conv2d_backward_weights(const Conv2dParams& p, const void* x, const void* dy, void* dw, void* db) {
  check(p, "conv2d_backward_weights (direct)");
  const DirectGeom g = geometry(p);
  const int64_t positions = g.oh * g.ow;
  std::vector<float> dw32(static_cast<size_t>(p.oc * g.k)), db32(static_cast<size_t>(p.oc));
  backward_weights_impl(
      p, x, p.y_dtype,
      [&](int64_t n, int64_t o0, int64_t on, float* tmp, DType dtype) -> const void* {  // (dtype f32 or dy's)
        const int64_t at = (n * p.oc + o0) * positions;
        if (dtype == p.y_dtype) return element_at(dy, at, p.y_dtype);
        convert(element_at(dy, at, p.y_dtype), p.y_dtype, tmp, DType::kF32, on * positions);
        return tmp;
      },
      [&](int64_t on, DType dtype) {
        return dtype == p.y_dtype ? size_t{0} : static_cast<size_t>(on * positions) * sizeof(float);
      },
      dw32.data(), db32.data());
  store_gradients(p, dw32.data(), db32.data(), dw, p.w_dtype, db, p.bias_dtype, p.accumulate);
}

void direct_conv2d_relu_max_pool2d_backward_weights(const Conv2dParams& p, const Pool2dParams& pool, const void* x,
                                                    DType dy_dtype, const void* dy, const uint8_t* argmax, void* dw,
                                                    DType dw_dtype, void* db, DType db_dtype) {
  check(p, "conv2d + relu + max_pool2d backward (direct)");
  DEMI_CHECK(strided_pool_supported(pool) && pool.c == p.oc && pool.h == p.out_h() && pool.w == p.out_w(),
             "conv2d + relu + max_pool2d backward (direct): the pool must cover the convolution's output with windows "
             "that neither overlap nor reach padding");
  const int64_t pooled = pool.oh * pool.ow;
  std::vector<float> dw32(static_cast<size_t>(p.oc * geometry(p).k)), db32(static_cast<size_t>(p.oc));
  // dz = max_pool2d_backward(dy, argmax), as the separate ops give the convolution (dy's values, exactly, or
  // rounded to bf16: fused_dense_gradient_dtype), built one image at a time while it is hot.
  const DType dz_dtype = fused_dense_gradient_dtype(p, dy_dtype);
  // (an f16 dz on the tile unit is read from dy and argmax as it is packed: no dense dz per image)
  const PooledF16 from_pool{static_cast<const Half*>(dy), argmax, pool.oh, pool.ow};
  // Where dz is f32 (no bf16 dot rows), dy's f32 values are built in tmp past it unless dy is f32 already
  const bool dy32_in_tmp = dy_dtype != DType::kF32 || dz_dtype != DType::kF32;
  backward_weights_impl(
      p, x, dz_dtype,
      [&](int64_t n, int64_t o0, int64_t on, float* tmp, DType dtype) -> const void* {  // (f32 or dz's)
        Pool2dParams one = pool;  // the image's channels [o0, o0 + on)
        one.n = 1;
        one.c = on;
        const int64_t at = (n * p.oc + o0) * pooled;
        const void* src = element_at(dy, at, dy_dtype);
        if (dtype == DType::kF16) {  // dz in f16 (the split tile products): dy's own values
          max_pool2d_backward(one, DType::kF16, src, argmax + at, tmp);
          return tmp;
        }
        if (dtype == DType::kBF16) {  // dz in bf16: dy's values exactly, or rounded into tmp past dz first
          if (dy_dtype != DType::kBF16) {
            auto* dy16 = reinterpret_cast<BFloat16*>(tmp) + on * p.out_h() * p.out_w();
            convert(src, dy_dtype, dy16, DType::kBF16, on * pooled);
            src = dy16;
          }
          max_pool2d_backward(one, DType::kBF16, src, argmax + at, tmp);
          return tmp;
        }
        if (dy32_in_tmp) {  // dy widened into tmp past dz (and rounded where dz is bf16)
          float* dy32 = tmp + on * p.out_h() * p.out_w();
          convert(src, dy_dtype, dy32, DType::kF32, on * pooled);
          if (dz_dtype != dy_dtype) round_f32(dy32, dy32, on * pooled, dz_dtype);
          src = dy32;
        }
        max_pool2d_backward(one, DType::kF32, src, argmax + at, tmp);
        return tmp;
      },
      [&](int64_t on, DType dtype) {  // dz (f16, bf16 or f32), and dy in dz's dtype where it has another
        const int64_t dz = on * p.out_h() * p.out_w();
        if (dtype == DType::kF16) return static_cast<size_t>(dz) * sizeof(Half);  // (dy f16: dz_dtype is dy's)
        if (dtype == DType::kBF16) return static_cast<size_t>(dz + (dy_dtype == DType::kBF16 ? 0 : on * pooled)) * sizeof(BFloat16);
        return static_cast<size_t>(dz + (dy32_in_tmp ? on * pooled : 0)) * sizeof(float);
      },
      dw32.data(), db32.data(), pool.is_2x2_stride_2() && dy_dtype == DType::kF16 ? &from_pool : nullptr);
  store_gradients(p, dw32.data(), db32.data(), dw, dw_dtype, db, db_dtype, false);
}

}  // namespace cpu
}  // namespace demi::kernels
