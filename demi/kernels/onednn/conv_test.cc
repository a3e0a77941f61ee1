// oneDNN convolutions against the reference on operands exactly representable in every dtype (so one f32
// reference serves f32, bf16 and f16), for each geometry, dtype pairing, layout and direction.
#include "demi/kernels/onednn/conv.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/kernels/internal/matmul_conv_test_util.h"
#include "demi/kernels/cpu/pool.h"
#include "demi/kernels/onednn/primitive_cache.h"
#include "demi/kernels/reference/conv.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels::onednn {
namespace {

using kernels::testing::all_close;
using kernels::testing::cast_operand;
using kernels::testing::dyadic_operand;
using kernels::testing::Operand;
using kernels::testing::random_operand;

constexpr DType F32 = DType::kF32, BF16 = DType::kBF16, F16 = DType::kF16, F64 = DType::kF64;

struct Geometry {
  const char* name;
  int64_t n, c, h, w, oc, kh, kw, sh, sw, pt, pb, pl, pr, dh, dw, groups;
};

const Geometry kGeometries[] = {
    {"seed conv (3->32, k3 valid, 32x32)", 2, 3, 32, 32, 32, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    {"model B conv1 (1->32, k3 pad 1)", 2, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {"model B conv2 (32->64, k3 pad 1)", 2, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {"stride 2, asymmetric padding", 1, 5, 11, 9, 7, 3, 2, 2, 2, 0, 1, 2, 1, 1, 1, 1},
    {"dilation 2", 2, 4, 13, 12, 6, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 1},
    {"groups 2", 2, 6, 9, 9, 10, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2},
    {"depthwise, stride 2", 2, 16, 10, 10, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 16},
    {"1x1", 3, 17, 7, 7, 5, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    {"batch 1, 1x5 kernel, stride (1, 3)", 1, 20, 6, 17, 18, 1, 5, 1, 3, 0, 0, 2, 2, 1, 1, 1},
};

Conv2dParams params_of(const Geometry& g) {
  Conv2dParams p;
  p.n = g.n;
  p.c = g.c;
  p.h = g.h;
  p.w = g.w;
  p.oc = g.oc;
  p.kh = g.kh;
  p.kw = g.kw;
  p.stride_h = g.sh;
  p.stride_w = g.sw;
  p.pad_top = g.pt;
  p.pad_bottom = g.pb;
  p.pad_left = g.pl;
  p.pad_right = g.pr;
  p.dilation_h = g.dh;
  p.dilation_w = g.dw;
  p.groups = g.groups;
  return p;
}

// Operands and f32 reference results for one geometry.
struct Fixture {
  Conv2dParams p;
  Operand x, w, bias, dy, dx0, dw0, db0;  // dx0, dw0, db0: what accumulation adds to
  std::vector<double> y, dx, dx_acc, dw, dw_acc, db, db_acc;

  explicit Fixture(const Geometry& g) : p(params_of(g)) {
    uint64_t s = 1000 + static_cast<uint64_t>(p.n * 131 + p.c * 17 + p.h * 7 + p.oc + p.groups * 3 + p.kw);
    x = dyadic_operand(F32, p.x_numel(), s);
    w = dyadic_operand(F32, p.w_numel(), s + 1);
    bias = dyadic_operand(F32, p.oc, s + 2);
    dy = dyadic_operand(F32, p.y_numel(), s + 3);
    dx0 = dyadic_operand(F32, p.x_numel(), s + 4);
    dw0 = dyadic_operand(F32, p.w_numel(), s + 5);
    db0 = dyadic_operand(F32, p.oc, s + 6);
    Conv2dParams r = p;
    r.relu = true;
    std::vector<float> out(p.y_numel());
    ref::conv2d_forward(r, x.f32.data(), w.f32.data(), bias.f32.data(), out.data());
    y.assign(out.begin(), out.end());
    for (bool acc : {false, true}) {
      r.accumulate = acc;
      std::vector<float> gx = dx0.f32, gw = dw0.f32, gb = db0.f32;
      ref::conv2d_backward_data(r, dy.f32.data(), w.f32.data(), gx.data());
      ref::conv2d_backward_weights(r, x.f32.data(), dy.f32.data(), gw.data(), gb.data());
      (acc ? dx_acc : dx).assign(gx.begin(), gx.end());
      (acc ? dw_acc : dw).assign(gw.begin(), gw.end());
      (acc ? db_acc : db).assign(gb.begin(), gb.end());
    }
  }
};

const char* layout_name(ConvLayout l) {
  return l == ConvLayout::kPlain ? "plain" : l == ConvLayout::kBlocked ? "blocked" : "auto";
}

// in: dtype of every input; out: dtype of every output (y, dx, dw, db).
void check_all_directions(const Fixture& f, DType in, DType out, ConvLayout layout, bool accumulate) {
  Conv2dParams p = f.p;
  p.layout = layout;
  SCOPED_TRACE(::testing::Message() << describe(p) << ", in " << dtype_name(in) << ", out " << dtype_name(out)
                                    << ", layout " << layout_name(layout)
                                    << (accumulate ? ", accumulate" : ""));
  const int64_t cg = p.c / p.groups, ocg = p.oc / p.groups;
  Operand x = cast_operand(f.x, in), w = cast_operand(f.w, in), dy = cast_operand(f.dy, in);

  // Forward with bias and ReLU fused (inputs in `in`, y and bias in `out`).
  p.x_dtype = p.w_dtype = in;
  p.y_dtype = p.bias_dtype = out;
  p.relu = true;
  Operand bias = cast_operand(f.bias, out), y = cast_operand(f.dy, out);
  conv2d_forward(p, x.data(), w.data(), bias.data(), y.data());
  EXPECT_TRUE(all_close(y.data(), out, f.y, tolerance_for_sum(out, cg * p.kh * p.kw, 1.0))) << "forward";

  // Backward-data: dy, w in `in` -> dx in `out`.
  p.relu = false;
  p.accumulate = accumulate;
  p.y_dtype = in;
  p.x_dtype = out;
  Operand dx = cast_operand(f.dx0, out);
  conv2d_backward_data(p, dy.data(), w.data(), dx.data());
  EXPECT_TRUE(
      all_close(dx.data(), out, accumulate ? f.dx_acc : f.dx, tolerance_for_sum(out, ocg * p.kh * p.kw, 1.0)))
      << "backward-data";

  // Backward-weights: x, dy in `in` -> dw, db in `out`.
  p.x_dtype = in;
  p.w_dtype = p.bias_dtype = out;
  Operand dw = cast_operand(f.dw0, out), db = cast_operand(f.db0, out);
  conv2d_backward_weights(p, x.data(), dy.data(), dw.data(), db.data());
  const int64_t terms = p.n * p.out_h() * p.out_w();
  EXPECT_TRUE(all_close(dw.data(), out, accumulate ? f.dw_acc : f.dw, tolerance_for_sum(out, terms, 1.0)))
      << "backward-weights";
  EXPECT_TRUE(all_close(db.data(), out, accumulate ? f.db_acc : f.db, tolerance_for_sum(out, terms, 1.0)))
      << "bias gradient";
}

TEST(OnednnConv, MatchesReferenceForEveryGeometryDtypeAndLayout) {
  // Both layouts for f32 and bf16 (different oneDNN kernels); f16 runs the f32 kernels behind a
  // conversion, so the automatic layout suffices there. Accumulation alternates.
  const std::pair<DType, DType> dtypes[] = {{F32, F32}, {BF16, BF16}, {BF16, F32}, {F16, F16}, {F16, F32}};
  for (const Geometry& g : kGeometries) {
    Fixture f(g);
    int i = 0;
    for (auto [in, out] : dtypes) {
      if (in == F16) {
        check_all_directions(f, in, out, ConvLayout::kAuto, (i++ % 2) == 1);
        continue;
      }
      for (ConvLayout layout : {ConvLayout::kPlain, ConvLayout::kBlocked})
        check_all_directions(f, in, out, layout, (i++ % 2) == 1);
    }
  }
}

TEST(OnednnConv, AutoLayoutAndMixedInputs) {
  Fixture f(kGeometries[2]);
  check_all_directions(f, F32, F32, ConvLayout::kAuto, false);
  check_all_directions(f, BF16, BF16, ConvLayout::kAuto, true);
  // f32 activations with bf16 weights meet in f32.
  Conv2dParams p = f.p;
  p.w_dtype = BF16;
  Operand w = cast_operand(f.w, BF16), y = cast_operand(f.dy, F32);
  p.relu = true;
  conv2d_forward(p, f.x.data(), w.data(), f.bias.data(), y.data());
  EXPECT_TRUE(all_close(y.data(), F32, f.y, tolerance_for_sum(F32, p.c * 9, 1.0)));
}

TEST(OnednnConv, ForwardWithoutBiasOrRelu) {
  Fixture f(kGeometries[0]);
  Conv2dParams p = f.p;
  std::vector<float> want(p.y_numel()), got(p.y_numel());
  ref::conv2d_forward(p, f.x.data(), f.w.data(), nullptr, want.data());
  conv2d_forward(p, f.x.data(), f.w.data(), nullptr, got.data());
  EXPECT_TRUE(all_close(got.data(), F32, kernels::testing::widen(want.data(), F32, p.y_numel()),
                        tolerance_for_sum(F32, p.c * 9, 1.0)));
  std::vector<float> dw(p.w_numel()), want_dw(p.w_numel());
  ref::conv2d_backward_weights(p, f.x.data(), f.dy.data(), want_dw.data(), nullptr);
  conv2d_backward_weights(p, f.x.data(), f.dy.data(), dw.data(), nullptr);
  EXPECT_TRUE(all_close(dw.data(), F32, kernels::testing::widen(want_dw.data(), F32, p.w_numel()),
                        tolerance_for_sum(F32, p.n * p.out_h() * p.out_w(), 1.0)));
}

TEST(OnednnConv, Float64RunsTheReference) {
  Conv2dParams p = params_of(kGeometries[3]);
  p.x_dtype = p.w_dtype = p.y_dtype = p.bias_dtype = F64;
  Operand x = dyadic_operand(F64, p.x_numel(), 1), w = dyadic_operand(F64, p.w_numel(), 2);
  std::vector<double> got(p.y_numel()), want(p.y_numel());
  conv2d_forward(p, x.data(), w.data(), nullptr, got.data());
  ref::conv2d_forward(p, x.data(), w.data(), nullptr, want.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(conv2d_implementation(p, ConvDirection::kForward, false), "reference");
}

TEST(OnednnConv, PrimitivesAreCachedAndScratchIsReturned) {
  Fixture f(kGeometries[2]);
  Conv2dParams p = f.p;
  p.x_dtype = p.w_dtype = p.y_dtype = BF16;
  Operand x = cast_operand(f.x, BF16), w = cast_operand(f.w, BF16), y = cast_operand(f.dy, BF16);
  conv2d_forward(p, x.data(), w.data(), nullptr, y.data());
  const PrimitiveCacheStats before = primitive_cache_stats();
  const int64_t ws_before = mem_stats().cur(MemCategory::kWorkspace);
  for (int i = 0; i < 3; ++i) conv2d_forward(p, x.data(), w.data(), nullptr, y.data());
  EXPECT_EQ(primitive_cache_stats().entries, before.entries);
  EXPECT_GE(primitive_cache_stats().hits, before.hits + 3);
  EXPECT_EQ(mem_stats().cur(MemCategory::kWorkspace), ws_before);
}

TEST(OnednnConv, ModelShapesUseOptimisedKernels) {
  // oneDNN's reference convolution is ~100x slower; a layout or dtype combination that silently lands
  // there must fail here, not in a benchmark.
  for (int gi : {0, 1, 2})
    for (DType t : {F32, BF16})
      for (ConvDirection dir :
           {ConvDirection::kForward, ConvDirection::kBackwardData, ConvDirection::kBackwardWeights}) {
        Conv2dParams p = params_of(kGeometries[gi]);
        p.x_dtype = p.w_dtype = p.y_dtype = t;
        if (dir == ConvDirection::kBackwardWeights) p.w_dtype = F32;  // AMP's master gradient
        std::string impl = conv2d_implementation(p, dir, true);
        EXPECT_EQ(impl.find("ref"), std::string::npos) << describe(p) << ": " << impl;
      }
}

TEST(OnednnConv, ErrorsNameTheOpAndShapes) {
  Conv2dParams p = params_of(kGeometries[5]);
  p.groups = 4;  // 6 channels
  float buf[1] = {};
  try {
    conv2d_backward_weights(p, buf, buf, buf, nullptr);
    FAIL() << "expected demi::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("conv2d backward-weights"), std::string::npos) << msg;
    EXPECT_NE(msg.find("groups (4)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("x(2, 6, 9, 9) float32"), std::string::npos) << msg;
  }
}

// The fused Conv2d -> ReLU -> MaxPool2d gives exactly what the three steps give — forward values and window
// indices, and dw, db, dx from the same pooled gradient — for models A's and B's convolutions (and an odd
// size whose last row and column no window covers), in f32, bf16 (AMX: channels-last) and f16 storage
// (computed in f32).
TEST(OnednnConv, FusedReluMaxPoolMatchesTheThreeStepsExactly) {
  struct Case {
    Geometry g;
    DType in, conv;  // x and w; the convolution's output (compute) dtype
    bool need_dx;
  };
  const Geometry odd = {"odd output 9x9 (3->16)", 2, 3, 11, 11, 16, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1};
  const Case cases[] = {{kGeometries[0], F32, F32, false}, {kGeometries[0], BF16, BF16, false},
                        {kGeometries[0], F16, F32, false}, {kGeometries[1], F32, F32, false},
                        {kGeometries[1], BF16, BF16, false}, {kGeometries[2], F32, F32, true},
                        {kGeometries[2], BF16, BF16, true}, {kGeometries[2], F16, F32, true},
                        {odd, F32, F32, true},           {odd, BF16, BF16, true}};
  uint64_t seed = 300;
  for (const Case& k : cases) {
    Conv2dParams p = params_of(k.g);
    p.x_dtype = p.w_dtype = k.in;
    p.y_dtype = k.conv;
    p.bias_dtype = F32;
    const DType out = k.in;  // the pooled output and its gradient, in the storage dtype
    SCOPED_TRACE(std::string(k.g.name) + " " + std::string(dtype_name(k.in)));
    const Pool2dParams pool = make_pool2d_params(p.n, p.oc, p.out_h(), p.out_w(), 2, 2, 2, 2, PadMode::kValid);
    Operand x = random_operand(k.in, p.x_numel(), seed += 10), w = random_operand(k.in, p.w_numel(), seed + 1);
    Operand b = random_operand(F32, p.oc, seed + 2), dy = random_operand(out, pool.y_numel(), seed + 3);

    // Three steps: conv to NCHW, ReLU + pool, and back.
    Operand conv = random_operand(k.conv, p.y_numel(), 1);
    conv2d_forward(p, x.data(), w.data(), b.data(), conv.data());
    Operand conv_out = random_operand(out, p.y_numel(), 1);
    convert(conv.data(), k.conv, conv_out.data(), out, p.y_numel());  // exact for f32 -> f32, bf16 -> bf16
    Operand want_y = random_operand(out, pool.y_numel(), 2);
    std::vector<uint8_t> want_a(pool.y_numel()), got_a(pool.y_numel());
    if (k.conv == out) {
      relu_max_pool2d_forward(pool, out, conv_out.data(), want_y.data(), want_a.data());
    } else {  // f16 storage: pool the f32 output, round once (max and ReLU commute with rounding)
      Operand pooled = random_operand(F32, pool.y_numel(), 3);
      relu_max_pool2d_forward(pool, F32, conv.data(), pooled.data(), want_a.data());
      convert(pooled.data(), F32, want_y.data(), out, pool.y_numel());
    }
    Operand got_y = random_operand(out, pool.y_numel(), 4);
    conv2d_relu_max_pool2d_forward(p, pool, x.data(), w.data(), b.data(), out, got_y.data(), got_a.data());
    EXPECT_EQ(got_y.bytes, want_y.bytes) << "forward values";
    EXPECT_EQ(got_a, want_a) << "window indices";

    Operand dconv = random_operand(k.conv, p.y_numel(), 5);
    {
      Operand dy_c = random_operand(k.conv, pool.y_numel(), 6);
      convert(dy.data(), out, dy_c.data(), k.conv, pool.y_numel());
      max_pool2d_backward(pool, k.conv, dy_c.data(), want_a.data(), dconv.data());
    }
    Conv2dParams q = p;
    q.w_dtype = F32;
    Operand want_dw = random_operand(F32, p.w_numel(), 7), want_db = random_operand(F32, p.oc, 8);
    conv2d_backward_weights(q, x.data(), dconv.data(), want_dw.data(), want_db.data());
    Operand want_dx = random_operand(k.in, p.x_numel(), 9), got_dx = random_operand(k.in, p.x_numel(), 10);
    if (k.need_dx) conv2d_backward_data(p, dconv.data(), w.data(), want_dx.data());
    Operand got_dw = random_operand(F32, p.w_numel(), 11), got_db = random_operand(F32, p.oc, 12);
    conv2d_relu_max_pool2d_backward(p, pool, x.data(), w.data(), out, dy.data(), want_a.data(),
                                    k.need_dx ? got_dx.data() : nullptr, got_dw.data(), F32, got_db.data(), F32);
    EXPECT_EQ(got_dw.bytes, want_dw.bytes) << "dw";
    EXPECT_EQ(got_db.bytes, want_db.bytes) << "db";
    if (k.need_dx) {
      EXPECT_EQ(got_dx.bytes, want_dx.bytes) << "dx";
    }
  }
}

TEST(OnednnConv, FusedReluMaxPoolRefusesAPoolThatDoesNotFit) {
  Conv2dParams p = params_of(kGeometries[0]);
  const Pool2dParams wrong = make_pool2d_params(p.n, p.oc, 16, 16, 2, 2, 2, 2, PadMode::kValid);
  std::vector<float> x(p.x_numel()), w(p.w_numel()), y(wrong.y_numel());
  EXPECT_THROW(conv2d_relu_max_pool2d_forward(p, wrong, x.data(), w.data(), nullptr, F32, y.data(), nullptr), Error);
}

}  // namespace
}  // namespace demi::kernels::onednn
