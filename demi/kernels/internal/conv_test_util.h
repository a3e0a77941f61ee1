// Convolution test helpers shared by the oneDNN and demi convolution tests: geometries, operands exactly
// representable in every dtype (so one f32 reference serves f32, bf16 and f16) with the reference results,
// and a check of all three directions of an implementation against them. Used by *_test.cc files only.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "demi/kernels/conv_params.h"
#include "demi/kernels/internal/matmul_conv_test_util.h"
#include "demi/kernels/reference/conv.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels::testing {


struct Geometry {
  const char* name;
  int64_t n, c, h, w, oc, kh, kw, sh, sw, pt, pb, pl, pr, dh, dw, groups;
};

inline const Geometry kGeometries[] = {
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

inline Conv2dParams params_of(const Geometry& g) {
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
    x = dyadic_operand(DType::kF32, p.x_numel(), s);
    w = dyadic_operand(DType::kF32, p.w_numel(), s + 1);
    bias = dyadic_operand(DType::kF32, p.oc, s + 2);
    dy = dyadic_operand(DType::kF32, p.y_numel(), s + 3);
    dx0 = dyadic_operand(DType::kF32, p.x_numel(), s + 4);
    dw0 = dyadic_operand(DType::kF32, p.w_numel(), s + 5);
    db0 = dyadic_operand(DType::kF32, p.oc, s + 6);
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

inline const char* layout_name(ConvLayout l) {
  return l == ConvLayout::kPlain ? "plain" : l == ConvLayout::kBlocked ? "blocked" : "auto";
}

// The three directions of a convolution implementation under test.
struct ConvKernels {
  void (*forward)(const Conv2dParams&, const void*, const void*, const void*, void*);
  void (*backward_data)(const Conv2dParams&, const void*, const void*, void*);
  void (*backward_weights)(const Conv2dParams&, const void*, const void*, void*, void*);
};

// in: dtype of every input; out: dtype of every output (y, dx, dw, db).
inline void check_all_directions(const ConvKernels& k, const Fixture& f, DType in, DType out, ConvLayout layout,
                                 bool accumulate) {
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
  k.forward(p, x.data(), w.data(), bias.data(), y.data());
  EXPECT_TRUE(all_close(y.data(), out, f.y, tolerance_for_sum(out, cg * p.kh * p.kw, 1.0))) << "forward";

  // Backward-data: dy, w in `in` -> dx in `out`.
  p.relu = false;
  p.accumulate = accumulate;
  p.y_dtype = in;
  p.x_dtype = out;
  Operand dx = cast_operand(f.dx0, out);
  k.backward_data(p, dy.data(), w.data(), dx.data());
  EXPECT_TRUE(
      all_close(dx.data(), out, accumulate ? f.dx_acc : f.dx, tolerance_for_sum(out, ocg * p.kh * p.kw, 1.0)))
      << "backward-data";

  // Backward-weights: x, dy in `in` -> dw, db in `out`.
  p.x_dtype = in;
  p.w_dtype = p.bias_dtype = out;
  Operand dw = cast_operand(f.dw0, out), db = cast_operand(f.db0, out);
  k.backward_weights(p, x.data(), dy.data(), dw.data(), db.data());
  const int64_t terms = p.n * p.out_h() * p.out_w();
  EXPECT_TRUE(all_close(dw.data(), out, accumulate ? f.dw_acc : f.dw, tolerance_for_sum(out, terms, 1.0)))
      << "backward-weights";
  EXPECT_TRUE(all_close(db.data(), out, accumulate ? f.db_acc : f.db, tolerance_for_sum(out, terms, 1.0)))
      << "bias gradient";
}

}  // namespace demi::kernels::testing
