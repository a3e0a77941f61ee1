// The fast layer-normalisation kernels against their reference twins (every dtype, every CPU level, odd
// widths, one row), the f64 backward against finite differences, and argument checks.
#include "demi/kernels/cpu/layernorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "demi/core/error.h"
#include "demi/kernels/cpu/internal/test_util.h"

namespace demi::kernels {
namespace {

using testing::Buffer;
using testing::for_each_level;
using testing::random_floats;

LayerNormParams params(int64_t rows, int64_t dim) {
  LayerNormParams p;
  p.rows = rows;
  p.dim = dim;
  return p;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

TEST(LayerNorm, ForwardAndBackwardMatchReference) {
  const std::vector<LayerNormParams> shapes = {params(7, 256), params(1, 5), params(130, 33), params(3, 16),
                                               params(65, 3), params(200, 100)};
  for (DType t : testing::kFastDtypes) {
    SCOPED_TRACE(testing::dtype_trace(t));
    for (const LayerNormParams& p : shapes) {
      for (bool affine : {true, false}) {
        SCOPED_TRACE(str_cat("(", p.rows, ", ", p.dim, ")", affine ? " affine" : ""));
        const int64_t n = p.numel(), d = p.dim;
        // A mean far from zero: the two-pass variance must not lose it. dy follows x (plus noise) so that
        // dgamma = sum(dy * xhat) does not cancel down to its rounding error.
        Buffer x(t, random_floats(n, 11, 3.0f, 7.0f));
        std::vector<float> dyv = random_floats(n, 12, -0.5f, 0.5f);
        for (int64_t i = 0; i < n; ++i) dyv[static_cast<size_t>(i)] += 0.25f * static_cast<float>(x.get(i));
        Buffer dy(t, dyv);
        std::vector<float> gamma = random_floats(d, 13, 0.5f, 1.5f), beta = random_floats(d, 14);
        const float* g = affine ? gamma.data() : nullptr;
        const float* b = affine ? beta.data() : nullptr;
        Buffer want_y(t, n), want_dx(t, n);
        std::vector<float> wm(static_cast<size_t>(p.rows)), wr(static_cast<size_t>(p.rows)), wdg(static_cast<size_t>(d)),
            wdb(static_cast<size_t>(d));
        testing::visit_fast(t, [&](auto tag) {
          using T = decltype(tag);
          ref::layer_norm_forward(x.as<T>(), g, b, p, want_y.as<T>(), wm.data(), wr.data());
          ref::layer_norm_backward(x.as<T>(), dy.as<T>(), g, wm.data(), wr.data(), p, want_dx.as<T>(), wdg.data(),
                                   wdb.data());
        });
        // dgamma, dbeta sum `rows` terms in f32 blocks; scale the f32 tolerance by the term count's root.
        const Tolerance f32 = tolerance_for(DType::kF32);
        const Tolerance sum_tol = {f32.rtol * 4, f32.atol * std::sqrt(static_cast<double>(p.rows)) * 8};
        for_each_level([&](CpuLevel) {
          Buffer y(t, n), dx(t, n);
          std::vector<float> m(wm.size()), r(wr.size()), dg(wdg.size()), db(wdb.size());
          layer_norm_forward(x.data(), t, g, b, p, y.data(), m.data(), r.data());
          layer_norm_backward(x.data(), dy.data(), t, g, wm.data(), wr.data(), p, dx.data(), dg.data(), db.data());
          EXPECT_TRUE(testing::all_close(y, want_y, tolerance_for(t), "y"));
          EXPECT_TRUE(testing::all_close(widen(m), widen(wm), f32, "mean"));
          EXPECT_TRUE(testing::all_close(widen(r), widen(wr), f32, "rstd"));
          EXPECT_TRUE(testing::all_close(dx, want_dx, tolerance_for(t), "dx"));
          EXPECT_TRUE(testing::all_close(widen(dg), widen(wdg), sum_tol, "dgamma"));
          EXPECT_TRUE(testing::all_close(widen(db), widen(wdb), sum_tol, "dbeta"));
        });
      }
    }
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const LayerNormParams p = params(3, 7);
  const size_t n = static_cast<size_t>(p.numel()), d = static_cast<size_t>(p.dim);
  std::vector<double> x, gamma, beta, w;
  for (float f : random_floats(p.numel(), 21)) x.push_back(f);
  for (float f : random_floats(p.dim, 22, 0.5f, 1.5f)) gamma.push_back(f);
  for (float f : random_floats(p.dim, 23)) beta.push_back(f);
  for (float f : random_floats(p.numel(), 24)) w.push_back(f);
  std::vector<double> y(n), mean(3), rstd(3);
  auto loss = [&] {
    layer_norm_forward(x.data(), DType::kF64, gamma.data(), beta.data(), p, y.data(), mean.data(), rstd.data());
    double l = 0;
    for (size_t i = 0; i < n; ++i) l += w[i] * y[i];
    return l;
  };
  loss();
  std::vector<double> dx(n), dg(d), db(d);
  layer_norm_backward(x.data(), w.data(), DType::kF64, gamma.data(), mean.data(), rstd.data(), p, dx.data(), dg.data(),
                      db.data());
  EXPECT_TRUE(testing::all_close(dx, testing::numeric_grad(loss, x), kFiniteDiffTolerance, "dx"));
  EXPECT_TRUE(testing::all_close(dg, testing::numeric_grad(loss, gamma), kFiniteDiffTolerance, "dgamma"));
  EXPECT_TRUE(testing::all_close(db, testing::numeric_grad(loss, beta), kFiniteDiffTolerance, "dbeta"));
}

TEST(LayerNorm, RejectsBadArguments) {
  std::vector<float> x(6), y(6), m(2), r(2);
  EXPECT_THROW(layer_norm_forward(x.data(), DType::kI32, nullptr, nullptr, params(2, 3), y.data(), m.data(), r.data()),
               Error);
  EXPECT_THROW(layer_norm_forward(x.data(), DType::kF32, nullptr, nullptr, params(2, 0), y.data(), m.data(), r.data()),
               Error);
  LayerNormParams bad = params(2, 3);
  bad.eps = 0;
  EXPECT_THROW(layer_norm_forward(x.data(), DType::kF32, nullptr, nullptr, bad, y.data(), m.data(), r.data()), Error);
}

}  // namespace
}  // namespace demi::kernels
