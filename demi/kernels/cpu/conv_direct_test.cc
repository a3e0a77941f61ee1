// The direct few-channel convolution against the reference (every geometry of the shared list it takes, one
// with output rows wider than a tile and a partial channel tile, every dtype pairing, accumulation, every CPU
// level), and its fused Conv2d -> ReLU -> MaxPool2d against its own separate kernels, bit for bit.
#include "demi/kernels/cpu/conv_direct.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/conv_direct_kernels.h"
#include "demi/kernels/cpu/pool.h"
#include "demi/kernels/internal/conv_test_util.h"
#include "demi/kernels/reference/conv.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels::cpu {
namespace {

using kernels::testing::Fixture;
using kernels::testing::Geometry;
using kernels::testing::kGeometries;
using kernels::testing::Operand;
using kernels::testing::random_operand;

constexpr DType F32 = DType::kF32, BF16 = DType::kBF16, F16 = DType::kF16;

// 45 output columns (a 32-column tile and a 13-column one), 13 output channels (a 12-channel tile and a
// 1-channel one), asymmetric padding, K = 24.
const Geometry kWide = {"wide rows, asymmetric padding", 2, 2, 5, 45, 13, 3, 4, 1, 1, 1, 0, 2, 1, 1, 1, 1};
// K = 64, the most the direct kernels take (two 32-k steps of the tile unit's forward, three tap blocks of its
// weight gradient with the bias's row), 40 output channels (two 32-channel blocks, the second partial), 3
// output columns at a padded width of 6, 3 images (an odd split between two threads).
const Geometry kWideK = {"K = 64, 40 channels, narrow rows", 3, 4, 9, 3, 40, 4, 4, 1, 1, 2, 1, 2, 1, 1, 1, 1};

// The data gradient is not the direct kernels' (oneDNN's serves it): the reference stands in.
const kernels::testing::ConvKernels kDirect{direct_conv2d_forward, ref::conv2d_backward_data,
                                            direct_conv2d_backward_weights};

// The ways a bf16 layer's products may take at a level: as measured (nullptr), and each one the level has,
// forced (ScopedDirectConvProducts).
std::vector<const char*> product_ways(CpuLevel level) {
  std::vector<const char*> ways{nullptr, "f32"};
  if (level >= CpuLevel::kAvx512Bf16) ways.push_back("bf16 pairs");
  if (level >= CpuLevel::kAmx) ways.push_back("tiles");
  return ways;
}

std::string way_name(const char* way) { return way ? way : "measured"; }

// body(level, way) at every CPU level this machine has, under each way its bf16 products may take there.
template <class Body>
void at_every_level_and_way(Body&& body) {
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    for (const char* way : product_ways(level)) {
      ScopedDirectConvProducts forced(way);
      body(level, way);
    }
  }
}

std::vector<Geometry> direct_geometries() {
  std::vector<Geometry> out;
  for (const Geometry& g : kGeometries)
    if (direct_conv_supported(kernels::testing::params_of(g))) out.push_back(g);
  out.push_back(kWide);
  out.push_back(kWideK);
  return out;
}

TEST(DirectConv, TakesFewChannelStrideOneGeometriesOnly) {
  EXPECT_GE(direct_geometries().size(), 5u);  // A's and B's first layers, 1x1, the wide ones
  Conv2dParams p = kernels::testing::params_of(kGeometries[2]);  // model B conv2: K = 288
  EXPECT_FALSE(direct_conv_supported(p));
  std::vector<float> buf(1 << 16);
  EXPECT_THROW(direct_conv2d_forward(p, buf.data(), buf.data(), nullptr, buf.data()), Error);
  p = kernels::testing::params_of(kGeometries[3]);  // stride 2
  EXPECT_FALSE(direct_conv_supported(p));
  p = kernels::testing::params_of(kGeometries[0]);
  p.x_dtype = p.w_dtype = p.y_dtype = p.bias_dtype = DType::kF64;
  EXPECT_FALSE(direct_conv_supported(p));
}

// The bf16 forward's pairs of taps take every tap once: neighbours (t, t + 1) in one row first, then the rows'
// last taps two at a time, one alone at the end; at most 32 pairs for any K <= kDirectMaxK.
TEST(DirectConv, PairPlanTakesEveryTapOnce) {
  for (int64_t c = 1; c <= 7; ++c)
    for (int64_t kh = 1; kh <= 5; ++kh)
      for (int64_t kw = 1; kw <= 7; ++kw) {
        if (c * kh * kw > kDirectMaxK) continue;
        cpu_internal::DirectGeom g;
        g.c = c, g.kh = kh, g.kw = kw, g.hp = kh + 3, g.wp = kw + 20, g.k = c * kh * kw;
        SCOPED_TRACE(::testing::Message() << "c " << c << " kh " << kh << " kw " << kw);
        const cpu_internal::PairPlan pp = cpu_internal::pair_plan(g);
        EXPECT_LE(pp.n, 32);
        EXPECT_EQ(pp.n, c * kh * (kw / 2) + (c * kh * (kw % 2) + 1) / 2);
        std::vector<int> seen(static_cast<size_t>(g.k), 0);
        for (int s = 0; s < pp.n; ++s) {
          const int t0 = pp.tap0[s], t1 = pp.tap1[s];
          ++seen[static_cast<size_t>(t0)];
          if (t1 >= 0) ++seen[static_cast<size_t>(t1)];
          if (s < pp.neighbours) {
            EXPECT_EQ(t1, t0 + 1);
            EXPECT_EQ(t0 / kw, t1 / kw);  // one row
            EXPECT_EQ(pp.off1[s], pp.off0[s] + 1);
          } else {
            EXPECT_EQ(t0 % kw, kw - 1);  // a row's last tap
          }
          EXPECT_EQ(t1 < 0, s >= pp.built_end);
          EXPECT_EQ(pp.off0[s], (t0 / kw / kh * g.hp + t0 / kw % kh) * g.wp + t0 % kw);
        }
        EXPECT_EQ(seen, std::vector<int>(static_cast<size_t>(g.k), 1));
      }
}

TEST(DirectConv, MatchesReferenceForEveryGeometryDtypeAndLevel) {
  // (bf16 -> f16: a layer whose f16 products are taken in bf16, F16Products::kBf16, keeps y in f16)
  const std::pair<DType, DType> dtypes[] = {{F32, F32}, {BF16, BF16}, {BF16, F32}, {BF16, F16}, {F16, F16},
                                            {F16, F32}};
  at_every_level_and_way([&](CpuLevel level, const char* way) {
    SCOPED_TRACE(::testing::Message() << cpu_level_name(level) << " " << way_name(way));
    int i = 0;
    for (const Geometry& g : direct_geometries()) {
      Fixture f(g);
      for (auto [in, out] : dtypes)
        kernels::testing::check_all_directions(kDirect, f, in, out, ConvLayout::kAuto, (i++ % 2) == 1);
    }
  });
}

// The fused forward equals direct_conv2d_forward then relu_max_pool2d_forward (values and window indices),
// and the fused weight gradient equals max_pool2d_backward then direct_conv2d_backward_weights, bit for bit:
// the fused op visits the same nonzero gradients in the same order. Windows 2x2 (pooled in registers) and
// 3x3 / stride 3 (the convolution's rows, then the pool).
TEST(DirectConv, FusedReluMaxPoolEqualsItsSeparateKernelsBitForBit) {
  struct Case {
    DType in, conv;  // x and w; the convolution's own output dtype (f16 storage: f32)
  };
  const Case cases[] = {{F32, F32}, {BF16, BF16}, {F16, F32}};
  uint64_t seed = 900;
  at_every_level_and_way([&](CpuLevel level, const char* way) {
    for (const Geometry& g : direct_geometries()) {
      for (const Case& k : cases)
        for (int64_t window : {2, 3}) {
          Conv2dParams p = kernels::testing::params_of(g);
          if (p.out_h() < window || p.out_w() < window) continue;
          p.x_dtype = p.w_dtype = k.in;
          p.y_dtype = k.conv;
          p.bias_dtype = F32;
          const DType out = k.in;
          SCOPED_TRACE(::testing::Message() << cpu_level_name(level) << " " << way_name(way) << " " << g.name << " "
                                            << dtype_name(k.in) << " window " << window);
          const Pool2dParams pool =
              make_pool2d_params(p.n, p.oc, p.out_h(), p.out_w(), window, window, window, window, PadMode::kValid);
          Operand x = random_operand(k.in, p.x_numel(), seed += 10), w = random_operand(k.in, p.w_numel(), seed + 1);
          Operand b = random_operand(F32, p.oc, seed + 2), dy = random_operand(out, pool.y_numel(), seed + 3);

          // Separate: the convolution, ReLU + pool (f16 storage: pool the f32 output, round once), and back.
          Operand conv = random_operand(k.conv, p.y_numel(), 1);
          direct_conv2d_forward(p, x.data(), w.data(), b.data(), conv.data());
          Operand want_y = random_operand(out, pool.y_numel(), 2), pooled = random_operand(k.conv, pool.y_numel(), 3);
          std::vector<uint8_t> want_a(static_cast<size_t>(pool.y_numel())), got_a(want_a.size());
          relu_max_pool2d_forward(pool, k.conv, conv.data(), pooled.data(), want_a.data());
          convert(pooled.data(), k.conv, want_y.data(), out, pool.y_numel());
          Operand got_y = random_operand(out, pool.y_numel(), 4);
          direct_conv2d_relu_max_pool2d_forward(p, pool, x.data(), w.data(), b.data(), out, got_y.data(), got_a.data());
          EXPECT_EQ(got_y.bytes, want_y.bytes) << "forward values";
          EXPECT_EQ(got_a, want_a) << "window indices";

          Operand dz = random_operand(out, p.y_numel(), 5);
          max_pool2d_backward(pool, out, dy.data(), want_a.data(), dz.data());
          Conv2dParams q = p;
          q.y_dtype = out;
          q.w_dtype = q.bias_dtype = F32;
          Operand want_dw = random_operand(F32, p.w_numel(), 7), want_db = random_operand(F32, p.oc, 8);
          direct_conv2d_backward_weights(q, x.data(), dz.data(), want_dw.data(), want_db.data());
          Operand got_dw = random_operand(F32, p.w_numel(), 9), got_db = random_operand(F32, p.oc, 10);
          direct_conv2d_relu_max_pool2d_backward_weights(p, pool, x.data(), out, dy.data(), want_a.data(),
                                                         got_dw.data(), F32, got_db.data(), F32);
          EXPECT_EQ(got_dw.bytes, want_dw.bytes) << "weight gradient";
          EXPECT_EQ(got_db.bytes, want_db.bytes) << "bias gradient";
        }
    }
  });
}

// Each (oc, c, i, j) of the weight gradient sums its positions in one fixed order whatever else the call
// computes: a 3-channel convolution's gradient is, bit for bit, the three 1-channel convolutions' gradients
// on its channels (so taking the columns a channel at a time changes no bit), and the bias gradient too.
// Small images take every channel's columns at once (11 x 11 positions x 27 taps, in any dtype), large ones
// one channel's at a time (62 x 62 x 27: past 100 KiB); either way each channel's weights are bit for bit
// the one-channel convolution's (taking the same way: as measured, the 3-channel layer's).
TEST(DirectConv, WeightGradientPerInputChannelIsTheOneChannelConvolutionsBitForBit) {
  at_every_level_and_way([&](CpuLevel level, const char* way) {
    for (int64_t size : {11, 62}) {
      for (DType t : {F32, BF16, F16}) {
        SCOPED_TRACE(::testing::Message() << cpu_level_name(level) << " " << way_name(way) << " " << dtype_name(t)
                                          << " size " << size);
        Conv2dParams p;
        p.n = size > 11 ? 2 : 3, p.c = 3, p.h = size, p.w = size + 2, p.oc = 10, p.kh = 3, p.kw = 3;
        p.pad_top = p.pad_bottom = 1;
        p.x_dtype = p.y_dtype = t;
        p.w_dtype = p.bias_dtype = F32;
        Operand x = random_operand(t, p.x_numel(), 1), dz = random_operand(t, p.y_numel(), 2);
        std::vector<float> dw(static_cast<size_t>(p.w_numel())), db(static_cast<size_t>(p.oc));
        direct_conv2d_backward_weights(p, x.data(), dz.data(), dw.data(), db.data());
        const int64_t taps = p.kh * p.kw, plane = p.h * p.w;
        // (As measured, or forced where the level or dtype has no such way, the way is chosen per channel
        // count: the 1-channel layers take the one the 3-channel layer took.)
        ScopedDirectConvProducts same_way(direct_conv_dots_products(p));
        for (int64_t c = 0; c < p.c; ++c) {
          Conv2dParams q = p;
          q.c = 1;
          Operand xc = random_operand(t, q.x_numel(), 3);
          for (int64_t n = 0; n < p.n; ++n)
            std::memcpy(static_cast<char*>(xc.data()) + n * plane * dtype_size(t),
                        static_cast<const char*>(x.data()) + (n * p.c + c) * plane * dtype_size(t),
                        static_cast<size_t>(plane) * dtype_size(t));
          std::vector<float> dwc(static_cast<size_t>(q.w_numel())), dbc(static_cast<size_t>(q.oc));
          direct_conv2d_backward_weights(q, xc.data(), dz.data(), dwc.data(), dbc.data());
          for (int64_t oc = 0; oc < p.oc; ++oc)
            for (int64_t i = 0; i < taps; ++i)
              ASSERT_EQ(dw[static_cast<size_t>((oc * p.c + c) * taps + i)], dwc[static_cast<size_t>(oc * taps + i)])
                  << "oc " << oc << " channel " << c << " tap " << i;
          EXPECT_EQ(db, dbc);
        }
      }
    }
  });
}

// An f16 image's weight gradient takes f16 columns where the level has them: bit for bit the f32 columns'
// sums (the same image and dz given in f32), whether every channel's columns are held or one's (size 62).
TEST(DirectConv, F16ColumnsGiveTheF32ColumnsSumsBitForBit) {
  ScopedDirectConvProducts f32("f32");  // (not the tile unit's split products, which an f16 layer may take)
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    for (int64_t size : {11, 62}) {
      SCOPED_TRACE(::testing::Message() << cpu_level_name(level) << " size " << size);
      Conv2dParams p;
      p.n = 3, p.c = 3, p.h = size, p.w = size + 3, p.oc = 13, p.kh = 3, p.kw = 3;
      p.pad_left = p.pad_right = 1;
      p.x_dtype = p.y_dtype = F16;
      p.w_dtype = p.bias_dtype = F32;
      Operand x = random_operand(F16, p.x_numel(), 5), dz = random_operand(F16, p.y_numel(), 6);
      std::vector<float> dw(static_cast<size_t>(p.w_numel())), db(static_cast<size_t>(p.oc));
      direct_conv2d_backward_weights(p, x.data(), dz.data(), dw.data(), db.data());
      Conv2dParams q = p;
      q.x_dtype = q.y_dtype = F32;
      std::vector<float> x32(static_cast<size_t>(p.x_numel())), dz32(static_cast<size_t>(p.y_numel()));
      convert(x.data(), F16, x32.data(), F32, p.x_numel());
      convert(dz.data(), F16, dz32.data(), F32, p.y_numel());
      std::vector<float> dw32(dw.size()), db32(db.size());
      direct_conv2d_backward_weights(q, x32.data(), dz32.data(), dw32.data(), db32.data());
      EXPECT_EQ(dw, dw32);
      EXPECT_EQ(db, db32);
    }
  }
}

// The weight gradient's scratch is sized by what each path holds: with bf16 image and gradient, bf16
// columns and bf16 dz; with an f16 gradient, f32 dz and the widened pooled gradient (or on the tile unit,
// the split operands of a few output rows, dz read from the pool's gradient); dz for 8 channels at a
// time (model A's first layer: the f32-sized scratch of before, 0.76 MiB at O2-bf16, was its training
// peak's largest part). Each bound is below the f32-sized scratch (2 x OC x P floats of dz, K x P of columns).
// The columns are every input channel's where they fit 100 KiB a thread (else one channel's at a time), in
// bf16 or f16 where the level has kernels for them (model A's f16 first layer held all three channels' f32
// columns per thread: 0.39 MiB of its O2-fp16 training peak with the f32-sized dz of before).
TEST(DirectConv, WeightGradientScratchIsSizedByThePathsDtypes) {
  const int saved_threads = num_threads();
  set_num_threads(2);
  Conv2dParams p;
  p.n = 8, p.c = 3, p.h = 32, p.w = 32, p.oc = 32, p.kh = 3, p.kw = 3;
  const Pool2dParams pool = make_pool2d_params(p.n, p.oc, p.out_h(), p.out_w(), 2, 2, 2, 2, PadMode::kValid);
  const int64_t positions = p.out_h() * p.out_w(), k = p.c * p.kh * p.kw;
  const int64_t lanes = (p.oc * k + p.oc) * 16 * 4, xp = p.c * p.h * p.w * 4 + 4096;  // padded image + slack
  at_every_level_and_way([&](CpuLevel level, const char* forced_way) {
    for (DType t : {BF16, F16}) {
      SCOPED_TRACE(::testing::Message() << cpu_level_name(level) << " " << way_name(forced_way) << " "
                                        << dtype_name(t));
      p.x_dtype = p.w_dtype = p.y_dtype = t;
      p.bias_dtype = F32;
      Operand x = random_operand(t, p.x_numel(), 1), dy = random_operand(t, pool.y_numel(), 2);
      std::vector<uint8_t> argmax(static_cast<size_t>(pool.y_numel()), 0);
      Operand dw = random_operand(F32, p.w_numel(), 3), db = random_operand(F32, p.oc, 4);
      ScopedPeak peak;
      direct_conv2d_relu_max_pool2d_backward_weights(p, pool, x.data(), t, dy.data(), argmax.data(), dw.data(), F32,
                                                     db.data(), F32);
      const int64_t scratch = peak.peak().pk(MemCategory::kWorkspace) - mem_stats().cur(MemCategory::kWorkspace);
      const std::string way = direct_conv_dots_products(p);  // (what measures fastest)
      const bool bf16_dot = way == "bf16 pairs", tiles = way == "tiles";
      const bool f16_columns = t == F16 && level >= CpuLevel::kAvx512;
      const int64_t dz_rows = tiles ? 16 : 8;  // channels of dz at a time
      // Every input channel's columns (within the 100 KiB for building them once per image): 48.6 KB in
      // bf16 or f16, 97.2 KB in f32 (an f16 image on a level without f16 columns); the tile unit's: 32 slots
      // (27 taps, the bias's ones) x a chunk of 512 of the 928 positions in bf16, and dz packed (32 channels x
      // 928 positions), their 32 x 32 f32 sums in place of the lanes; with f16 values split, the image's hi
      // and lo parts (2 x 3,072 bf16) and the columns' and dz's for four output rows (2 x 2 x 32 x 128 bf16),
      // dz read from the pool's gradient as it is packed (no dz rows)
      const int64_t columns = tiles ? (t == F16 ? 2 * 3072 * 2 + 4 * 32 * 128 * 2 : 32 * 512 * 2)
                                    : k * positions * (bf16_dot || f16_columns ? 2 : 4);
      const int64_t per_thread = tiles && t == F16 ? xp + columns + 32 * 32 * 4
                                 : tiles           ? xp + columns + 32 * 928 * 2 + dz_rows * positions * 2 + 32 * 32 * 4
                                 : bf16_dot        ? xp + columns + dz_rows * positions * 2 + lanes
                                                   : xp + columns + dz_rows * positions * 4 +
                                                  dz_rows * pool.oh * pool.ow * 4 + lanes;
      EXPECT_LE(scratch, 2 * (per_thread + 5 * 64)) << "bytes of scratch";
      EXPECT_LT(scratch, 2 * (xp + k * positions * 4 + 2 * p.oc * positions * 4 + lanes)) << "the f32-sized scratch";
    }
  });
  set_num_threads(saved_threads);
}

// An f16 weight gradient on the tile unit (each value split into bf16 hi + lo, each product as four bf16
// products) is the f16 values' own: within f32 accumulation of the f64 gradient of the values given, and 30x
// closer than bf16 products would be, as close as f32 products (random f16 values with all 11 bits: the
// shared fixture's are exact in bf16, their lo parts 0). Model A's first layer (900 positions: seven chunks and a partial one), 13 channels
// (a partial 16-channel block, a block of none), K = 64 with 40 channels (three slot blocks, four channel
// blocks); weights and bias, fused with the pool's gradient and separate.
TEST(DirectConv, F16WeightGradientOnTheTileUnitIsTheProductsOfTheF16Values) {
  if (cpu_level() < CpuLevel::kAmx)
    GTEST_SKIP() << "this CPU's level is " << cpu_level_name(cpu_level())
                 << ": no tile unit (AMX); f16 weight gradients elsewhere take f32 products, tested at every level";
  const Geometry model_a = {"model A's first layer", 4, 3, 32, 32, 32, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1};
  uint64_t seed = 1200;
  for (const Geometry& g : {model_a, kWide, kWideK}) {
    SCOPED_TRACE(g.name);
    Conv2dParams p = kernels::testing::params_of(g);
    p.x_dtype = p.y_dtype = F16;
    p.w_dtype = p.bias_dtype = F32;
    const Operand x = random_operand(F16, p.x_numel(), seed++), dz = random_operand(F16, p.y_numel(), seed++);
    ScopedDirectConvProducts tiles("tiles");
    ASSERT_STREQ(direct_conv_dots_products(p), "tiles");
    std::vector<float> dw(static_cast<size_t>(p.w_numel())), db(static_cast<size_t>(p.oc));
    direct_conv2d_backward_weights(p, x.data(), dz.data(), dw.data(), db.data());
    // The f64 gradients of the values given and of their bf16 roundings (values_f64).
    const auto as_f64 = kernels::testing::values_f64;
    Conv2dParams p64 = p;
    p64.x_dtype = p64.w_dtype = p64.y_dtype = p64.bias_dtype = DType::kF64;
    std::vector<double> want(dw.size()), want_db(db.size()), rounded(dw.size()), rounded_db(db.size());
    ref::conv2d_backward_weights(p64, as_f64(x, false).data(), as_f64(dz, false).data(), want.data(), want_db.data());
    ref::conv2d_backward_weights(p64, as_f64(x, true).data(), as_f64(dz, true).data(), rounded.data(),
                                 rounded_db.data());
    const int64_t terms = p.n * p.out_h() * p.out_w();
    EXPECT_TRUE(kernels::testing::all_close(dw.data(), F32, want, tolerance_for_sum(F32, terms, 1.0))) << "weights";
    EXPECT_TRUE(kernels::testing::all_close(db.data(), F32, want_db, tolerance_for_sum(F32, terms, 1.0))) << "bias";
    double err = 0, err_bf16 = 0;
    for (size_t i = 0; i < dw.size(); ++i) {
      err = std::max(err, std::abs(dw[i] - want[i]));
      err_bf16 = std::max(err_bf16, std::abs(rounded[i] - want[i]));
    }
    EXPECT_LT(30 * err, err_bf16) << "the f16 values' products, not their bf16 roundings'";
    // As close as the f32 products' sums (the same exact products summed in another order: within 8x; the
    // lo x lo products dropped, 2^-16 of each product, it is 35-55x further here).
    {
      ScopedDirectConvProducts f32("f32");
      std::vector<float> dw32(dw.size()), db32(db.size());
      direct_conv2d_backward_weights(p, x.data(), dz.data(), dw32.data(), db32.data());
      double err32 = 0;
      for (size_t i = 0; i < dw.size(); ++i) err32 = std::max(err32, std::abs(dw32[i] - want[i]));
      EXPECT_LE(err, 8 * err32) << "the f32 products' error " << err32;
    }
    // Fused with the pool's gradient (2 x 2 windows, where they fit): the separate call's bits.
    if (p.out_h() < 2 || p.out_w() < 2) continue;
    const Pool2dParams pool = make_pool2d_params(p.n, p.oc, p.out_h(), p.out_w(), 2, 2, 2, 2, PadMode::kValid);
    const Operand dy = random_operand(F16, pool.y_numel(), seed++);
    std::vector<uint8_t> argmax(static_cast<size_t>(pool.y_numel()));
    for (size_t i = 0; i < argmax.size(); ++i) argmax[i] = static_cast<uint8_t>(i * 7 % 4);
    Operand pooled_dz = random_operand(F16, p.y_numel(), seed++);
    max_pool2d_backward(pool, F16, dy.data(), argmax.data(), pooled_dz.data());
    direct_conv2d_backward_weights(p, x.data(), pooled_dz.data(), dw.data(), db.data());
    std::vector<float> fused_dw(dw.size()), fused_db(db.size());
    direct_conv2d_relu_max_pool2d_backward_weights(p, pool, x.data(), F16, dy.data(), argmax.data(), fused_dw.data(),
                                                   F32, fused_db.data(), F32);
    EXPECT_EQ(fused_dw, dw);
    EXPECT_EQ(fused_db, db);
  }
}

// A bf16 layer forced to the tile unit takes it, forward and weight gradient, where the CPU has AMX (the
// suites above then check its values against the reference and its fused op against its separate calls);
// below the amx level the way is not there and the measured choice stands.
TEST(DirectConv, TileUnitIsTakenWhereTheCpuHasIt) {
  if (cpu_level() < CpuLevel::kAmx)
    GTEST_SKIP() << "this CPU's level is " << cpu_level_name(cpu_level()) << ": no tile unit (AMX) to run on";
  Conv2dParams p = kernels::testing::params_of(kGeometries[0]);  // model A's first layer
  p.x_dtype = p.w_dtype = p.y_dtype = BF16;
  ScopedDirectConvProducts forced("tiles");
  EXPECT_STREQ(direct_conv_forward_products(p), "tiles");
  EXPECT_STREQ(direct_conv_dots_products(p), "tiles");
  ScopedCpuLevel below(CpuLevel::kAvx512Bf16);
  EXPECT_STRNE(direct_conv_forward_products(p), "tiles");
  EXPECT_STRNE(direct_conv_dots_products(p), "tiles");
  EXPECT_THROW(ScopedDirectConvProducts("amx"), Error);
}

}  // namespace
}  // namespace demi::kernels::cpu
