// The reference convolution is checked against identities that do not share its loop nest: a hand
// example; strided = subsampled stride-1; padded = unpadded on a zero-padded input; dilated = dense with
// a zero-stuffed kernel; grouped = per-group convolutions side by side; and backward-data and
// backward-weights as exact adjoints of forward in f64.
#include "demi/kernels/reference/conv.h"

#include <gtest/gtest.h>

#include <vector>

#include "demi/kernels/internal/matmul_conv_test_util.h"

namespace demi::kernels::ref {
namespace {

using kernels::testing::dot;
using kernels::testing::random_operand;
using kernels::testing::widen;

Conv2dParams f64_params(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t kh, int64_t kw) {
  Conv2dParams p;
  p.n = n;
  p.c = c;
  p.h = h;
  p.w = w;
  p.oc = oc;
  p.kh = kh;
  p.kw = kw;
  p.x_dtype = p.w_dtype = p.y_dtype = p.bias_dtype = DType::kF64;
  return p;
}

std::vector<double> forward(const Conv2dParams& p, const std::vector<double>& x, const std::vector<double>& w,
                            const double* bias = nullptr) {
  std::vector<double> y(p.y_numel());
  conv2d_forward(p, x.data(), w.data(), bias, y.data());
  return y;
}

std::vector<double> rand_vec(int64_t n, uint64_t seed) {
  auto o = random_operand(DType::kF64, n, seed);
  return widen(o.data(), DType::kF64, n);
}

TEST(RefConv, HandExample) {
  // x (1, 1, 3, 3) = 1..9, w (1, 1, 2, 2) = [[1, 0], [0, -1]], bias 10: y[i][j] = x[i][j] - x[i+1][j+1] + 10.
  Conv2dParams p = f64_params(1, 1, 3, 3, 1, 2, 2);
  std::vector<double> x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w = {1, 0, 0, -1};
  double bias = 10;
  EXPECT_EQ(forward(p, x, w, &bias), (std::vector<double>{6, 6, 6, 6}));
  p.relu = true;
  bias = -5;
  EXPECT_EQ(forward(p, x, w, &bias), (std::vector<double>{0, 0, 0, 0}));
}

TEST(RefConv, StridedIsSubsampledStrideOne) {
  Conv2dParams p = f64_params(2, 3, 9, 8, 4, 3, 2);
  p.pad_top = 1;
  p.pad_left = 1;
  auto x = rand_vec(p.x_numel(), 1), w = rand_vec(p.w_numel(), 2);
  std::vector<double> dense = forward(p, x, w);
  Conv2dParams s = p;
  s.stride_h = 2;
  s.stride_w = 3;
  std::vector<double> strided = forward(s, x, w);
  for (int64_t n = 0; n < p.n * p.oc; ++n)
    for (int64_t i = 0; i < s.out_h(); ++i)
      for (int64_t j = 0; j < s.out_w(); ++j)
        EXPECT_EQ(strided[(n * s.out_h() + i) * s.out_w() + j],
                  dense[(n * p.out_h() + i * 2) * p.out_w() + j * 3]);
}

TEST(RefConv, PaddedIsUnpaddedOnZeroPaddedInput) {
  Conv2dParams p = f64_params(1, 2, 5, 6, 3, 3, 3);
  p.pad_top = 2;
  p.pad_bottom = 0;
  p.pad_left = 1;
  p.pad_right = 3;
  auto x = rand_vec(p.x_numel(), 3), w = rand_vec(p.w_numel(), 4);
  Conv2dParams q = f64_params(1, 2, 5 + 2, 6 + 4, 3, 3, 3);
  std::vector<double> xp(q.x_numel(), 0.0);
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 6; ++j) xp[(c * 7 + i + 2) * 10 + j + 1] = x[(c * 5 + i) * 6 + j];
  EXPECT_EQ(forward(p, x, w), forward(q, xp, w));
}

TEST(RefConv, DilatedIsDenseWithZeroStuffedKernel) {
  Conv2dParams p = f64_params(2, 2, 11, 10, 3, 3, 2);
  p.dilation_h = 2;
  p.dilation_w = 3;
  p.pad_top = p.pad_bottom = 1;
  auto x = rand_vec(p.x_numel(), 5), w = rand_vec(p.w_numel(), 6);
  Conv2dParams q = p;
  q.dilation_h = q.dilation_w = 1;
  q.kh = 5;
  q.kw = 4;
  std::vector<double> wq(q.w_numel(), 0.0);
  for (int64_t o = 0; o < 3 * 2; ++o)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 2; ++j) wq[(o * 5 + i * 2) * 4 + j * 3] = w[(o * 3 + i) * 2 + j];
  EXPECT_EQ(forward(p, x, w), forward(q, x, wq));
}

TEST(RefConv, GroupedIsPerGroupConvolutions) {
  for (int64_t groups : {2, 6}) {  // 6: depthwise with channel multiplier 2
    Conv2dParams p = f64_params(2, 6, 7, 7, 12, 3, 3);
    p.groups = groups;
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
    auto x = rand_vec(p.x_numel(), 7), w = rand_vec(p.w_numel(), 8);
    std::vector<double> y = forward(p, x, w);
    const int64_t cg = 6 / groups, ocg = 12 / groups, plane = 49;
    Conv2dParams q = p;
    q.c = cg;
    q.oc = ocg;
    q.groups = 1;
    for (int64_t g = 0; g < groups; ++g) {
      std::vector<double> xg(q.x_numel()), wg(q.w_numel());
      for (int64_t n = 0; n < 2; ++n)
        for (int64_t c = 0; c < cg; ++c)
          for (int64_t i = 0; i < plane; ++i)
            xg[(n * cg + c) * plane + i] = x[(n * 6 + g * cg + c) * plane + i];
      for (int64_t i = 0; i < q.w_numel(); ++i) wg[i] = w[g * q.w_numel() + i];
      std::vector<double> yg = forward(q, xg, wg);
      for (int64_t n = 0; n < 2; ++n)
        for (int64_t o = 0; o < ocg; ++o)
          for (int64_t i = 0; i < plane; ++i)
            EXPECT_EQ(yg[(n * ocg + o) * plane + i], y[(n * 12 + g * ocg + o) * plane + i]);
    }
  }
}

// <conv(x, w), dy> = <x, backward_data(dy, w)> = <w, backward_weights(x, dy)>, and db = sum(dy).
TEST(RefConv, BackwardIsTheAdjointOfForward) {
  struct Case {
    int64_t n, c, h, w, oc, kh, kw, sh, sw, pt, pb, pl, pr, dh, dw, groups;
  };
  const Case cases[] = {
      {2, 3, 8, 8, 4, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1},   {1, 4, 9, 7, 6, 3, 2, 2, 1, 0, 1, 2, 1, 1, 1, 2},
      {2, 4, 10, 10, 4, 3, 3, 1, 2, 2, 2, 2, 2, 2, 2, 4}, {1, 5, 6, 6, 3, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
      {3, 2, 7, 9, 2, 5, 3, 3, 2, 1, 3, 0, 2, 1, 2, 1},
  };
  uint64_t seed = 10;
  for (const Case& k : cases) {
    Conv2dParams p = f64_params(k.n, k.c, k.h, k.w, k.oc, k.kh, k.kw);
    p.stride_h = k.sh;
    p.stride_w = k.sw;
    p.pad_top = k.pt;
    p.pad_bottom = k.pb;
    p.pad_left = k.pl;
    p.pad_right = k.pr;
    p.dilation_h = k.dh;
    p.dilation_w = k.dw;
    p.groups = k.groups;
    SCOPED_TRACE(describe(p));
    auto x = rand_vec(p.x_numel(), ++seed), w = rand_vec(p.w_numel(), ++seed),
         dy = rand_vec(p.y_numel(), ++seed);
    std::vector<double> dx(p.x_numel()), dw(p.w_numel()), db(p.oc);
    conv2d_backward_data(p, dy.data(), w.data(), dx.data());
    conv2d_backward_weights(p, x.data(), dy.data(), dw.data(), db.data());
    const double lhs = dot(forward(p, x, w), dy);
    EXPECT_NEAR(dot(x, dx), lhs, 1e-10 * (1 + std::abs(lhs)));
    EXPECT_NEAR(dot(w, dw), lhs, 1e-10 * (1 + std::abs(lhs)));
    const int64_t plane = p.out_h() * p.out_w();
    for (int64_t o = 0; o < p.oc; ++o) {
      double s = 0;
      for (int64_t n = 0; n < p.n; ++n)
        for (int64_t i = 0; i < plane; ++i) s += dy[(n * p.oc + o) * plane + i];
      EXPECT_NEAR(db[o], s, 1e-12);
    }
    // Accumulate adds to what is there.
    std::vector<double> dx2(dx), dw2(dw), db2(db);
    p.accumulate = true;
    conv2d_backward_data(p, dy.data(), w.data(), dx2.data());
    conv2d_backward_weights(p, x.data(), dy.data(), dw2.data(), db2.data());
    for (int64_t i = 0; i < p.x_numel(); ++i) EXPECT_DOUBLE_EQ(dx2[i], 2 * dx[i]);
    for (int64_t i = 0; i < p.w_numel(); ++i) EXPECT_DOUBLE_EQ(dw2[i], 2 * dw[i]);
    for (int64_t i = 0; i < p.oc; ++i) EXPECT_DOUBLE_EQ(db2[i], 2 * db[i]);
  }
}

}  // namespace
}  // namespace demi::kernels::ref
