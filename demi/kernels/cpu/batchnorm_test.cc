#include "demi/kernels/cpu/batchnorm.h"

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

std::string shape_of(const BatchNormParams& p) {
  return str_cat("(", p.n, ", ", p.c, ", ", p.spatial, ")");
}

BatchNormParams params(int64_t n, int64_t c, int64_t s) {
  BatchNormParams p;
  p.n = n, p.c = c, p.spatial = s;
  return p;
}

const std::vector<BatchNormParams> kShapes = {
    params(4, 3, 25),  params(1, 5, 49), params(7, 6, 1),  params(2, 300, 1), params(3, 4, 17),
    params(5, 2, 3),   params(16, 8, 784), params(2, 1, 1), params(64, 20, 1),
};

TEST(BatchNorm, TrainingForwardAndBackwardMatchReference) {
  for (DType t : testing::kFastDtypes) {
    SCOPED_TRACE(testing::dtype_trace(t));
    for (const BatchNormParams& p : kShapes) {
      for (bool affine : {true, false}) {
        SCOPED_TRACE(str_cat(shape_of(p), affine ? " affine" : " no affine"));
        const int64_t n = p.numel(), c = p.c;
        // A mean far from zero: the two-pass variance must not lose it. dy follows x (plus noise) so that
        // dgamma = sum(dy * xhat) is well conditioned: with independent dy it sums 10^4 terms of either sign
        // to about 1, and any f32 accumulation is off by 1e-4 — the tolerance would measure the data.
        Buffer x(t, random_floats(n, 91, 2.0f, 6.0f));
        std::vector<float> dyv = random_floats(n, 92, -0.25f, 0.25f);
        for (int64_t i = 0; i < n; ++i) dyv[static_cast<size_t>(i)] += 0.25f * static_cast<float>(x.get(i));
        Buffer dy(t, dyv);
        std::vector<float> gamma = random_floats(c, 93, 0.5f, 1.5f), beta = random_floats(c, 94);
        const float* g = affine ? gamma.data() : nullptr;
        const float* b = affine ? beta.data() : nullptr;
        std::vector<float> rm0 = random_floats(c, 95), rv0 = random_floats(c, 96, 0.5f, 2.0f);
        Buffer want_y(t, n), want_dx(t, n);
        std::vector<float> wmean(c), winv(c), wrm = rm0, wrv = rv0, wdg(c), wdb(c);
        testing::visit_fast(t, [&](auto tag) {
          using T = decltype(tag);
          ref::batch_norm_forward_training(x.as<T>(), g, b, p, want_y.as<T>(), wmean.data(), winv.data(), wrm.data(),
                                           wrv.data());
          ref::batch_norm_backward(x.as<T>(), dy.as<T>(), g, wmean.data(), winv.data(), p, true, want_dx.as<T>(),
                                   wdg.data(), wdb.data());
        });
        const Tolerance stat_tol = tolerance_for(DType::kF32);
        for_each_level([&](CpuLevel) {
          Buffer y(t, n), dx(t, n);
          std::vector<float> mean(c), inv(c), rm = rm0, rv = rv0, dg(c), db(c);
          batch_norm_forward_training(x.data(), t, g, b, p, y.data(), mean.data(), inv.data(), rm.data(), rv.data());
          // Backward from the reference's statistics, so each kernel is compared on its own.
          batch_norm_backward(x.data(), dy.data(), t, g, wmean.data(), winv.data(), p, true, dx.data(),
                              affine ? dg.data() : nullptr, affine ? db.data() : nullptr);
          auto d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
          EXPECT_TRUE(testing::all_close(y, want_y, tolerance_for(t), "y"));
          EXPECT_TRUE(testing::all_close(d(mean), d(wmean), stat_tol, "mean"));
          EXPECT_TRUE(testing::all_close(d(inv), d(winv), stat_tol, "invstd"));
          EXPECT_TRUE(testing::all_close(d(rm), d(wrm), stat_tol, "running_mean"));
          EXPECT_TRUE(testing::all_close(d(rv), d(wrv), stat_tol, "running_var"));
          EXPECT_TRUE(testing::all_close(dx, want_dx, tolerance_for(t), "dx"));
          if (affine) {
            EXPECT_TRUE(testing::all_close(d(dg), d(wdg), stat_tol, "dgamma"));
            EXPECT_TRUE(testing::all_close(d(db), d(wdb), stat_tol, "dbeta"));
          }
        });
      }
    }
  }
}

TEST(BatchNorm, InferenceForwardAndBackwardMatchReference) {
  for (DType t : testing::kFastDtypes) {
    SCOPED_TRACE(testing::dtype_trace(t));
    for (const BatchNormParams& p : kShapes) {
      SCOPED_TRACE(shape_of(p));
      const int64_t n = p.numel(), c = p.c;
      Buffer x(t, random_floats(n, 101)), dy(t, random_floats(n, 102));
      std::vector<float> gamma = random_floats(c, 103), beta = random_floats(c, 104);
      std::vector<float> rm = random_floats(c, 105), rv = random_floats(c, 106, 0.5f, 2.0f), inv(c);
      for (int64_t k = 0; k < c; ++k) inv[static_cast<size_t>(k)] = 1.0f / std::sqrt(rv[static_cast<size_t>(k)] + p.eps);
      Buffer want_y(t, n), want_dx(t, n);
      std::vector<float> wdg(c), wdb(c);
      testing::visit_fast(t, [&](auto tag) {
        using T = decltype(tag);
        ref::batch_norm_forward_inference(x.as<T>(), gamma.data(), beta.data(), rm.data(), rv.data(), p,
                                          want_y.as<T>());
        ref::batch_norm_backward(x.as<T>(), dy.as<T>(), gamma.data(), rm.data(), inv.data(), p, false,
                                 want_dx.as<T>(), wdg.data(), wdb.data());
      });
      for_each_level([&](CpuLevel) {
        Buffer y(t, n), dx(t, n);
        std::vector<float> saved_inv(c), dg(c), db(c);
        batch_norm_forward_inference(x.data(), t, gamma.data(), beta.data(), rm.data(), rv.data(), p, y.data(),
                                     saved_inv.data());
        batch_norm_backward(x.data(), dy.data(), t, gamma.data(), rm.data(), saved_inv.data(), p, false, dx.data(),
                            dg.data(), db.data());
        EXPECT_TRUE(testing::all_close(y, want_y, tolerance_for(t), "y"));
        EXPECT_TRUE(testing::all_close(dx, want_dx, tolerance_for(t), "dx"));
        EXPECT_EQ(saved_inv, inv);
      });
    }
  }
}

// MindSpore's convention: running = momentum * running + (1 - momentum) * batch, momentum 0.9 by default,
// with the unbiased batch variance (N*S / (N*S - 1)) unless unbiased_running_var is false.
TEST(BatchNorm, RunningStatisticsFollowMindSporesMomentumAndUnbiasedVariance) {
  std::vector<float> x = {1, 2, 3, 4}, y(4), mean(1), inv(1);
  BatchNormParams p = params(4, 1, 1);
  EXPECT_EQ(p.momentum, 0.9f);
  EXPECT_EQ(p.eps, 1e-5f);
  for_each_level([&](CpuLevel) {
    std::vector<float> rm = {0.0f}, rv = {1.0f};
    batch_norm_forward_training(x.data(), DType::kF32, nullptr, nullptr, p, y.data(), mean.data(), inv.data(),
                                rm.data(), rv.data());
    EXPECT_FLOAT_EQ(mean[0], 2.5f);
    EXPECT_FLOAT_EQ(inv[0], 1.0f / std::sqrt(1.25f + 1e-5f));  // normalised with the biased variance
    EXPECT_FLOAT_EQ(rm[0], 0.25f);
    EXPECT_FLOAT_EQ(rv[0], 0.9f + 0.1f * (5.0f / 3.0f));       // unbiased: 1.25 * 4 / 3
    BatchNormParams biased = p;
    biased.unbiased_running_var = false;
    rv = {1.0f};
    batch_norm_forward_training(x.data(), DType::kF32, nullptr, nullptr, biased, y.data(), mean.data(), inv.data(),
                                nullptr, rv.data());
    EXPECT_FLOAT_EQ(rv[0], 0.9f + 0.1f * 1.25f);
  });
}

TEST(BatchNorm, OneValuePerChannelIsAnError) {
  std::vector<float> x(3), y(3), m(3), v(3);
  try {
    batch_norm_forward_training(x.data(), DType::kF32, nullptr, nullptr, params(1, 3, 1), y.data(), m.data(),
                                v.data(), nullptr, nullptr);
    FAIL() << "expected demi::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than one value per channel"), std::string::npos) << e.what();
  }
  EXPECT_THROW(batch_norm_forward_training(x.data(), DType::kI32, nullptr, nullptr, params(3, 1, 1), y.data(),
                                           m.data(), v.data(), nullptr, nullptr),
               Error);
}

// f64 central finite differences of the f64 reference: L = sum(w * y) over x, gamma and beta.
TEST(BatchNorm, BackwardMatchesFiniteDifferences) {
  for (const BatchNormParams& p : {params(3, 2, 4), params(5, 3, 1)}) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(str_cat(shape_of(p), training ? " training" : " inference"));
      const size_t n = static_cast<size_t>(p.numel()), c = static_cast<size_t>(p.c);
      std::vector<double> x, w, gamma, beta, y(n), mean(c), inv(c), rm(c, 0.3), rv(c, 1.7);
      for (float f : random_floats(p.numel(), 111)) x.push_back(f);
      for (float f : random_floats(p.numel(), 112)) w.push_back(f);
      for (float f : random_floats(p.c, 113, 0.5f, 1.5f)) gamma.push_back(f);
      for (float f : random_floats(p.c, 114)) beta.push_back(f);
      auto objective = [&] {
        if (training)
          batch_norm_forward_training(x.data(), DType::kF64, gamma.data(), beta.data(), p, y.data(), mean.data(),
                                      inv.data(), nullptr, nullptr);
        else
          batch_norm_forward_inference(x.data(), DType::kF64, gamma.data(), beta.data(), rm.data(), rv.data(), p,
                                       y.data());
        double l = 0;
        for (size_t i = 0; i < n; ++i) l += w[i] * y[i];
        return l;
      };
      objective();
      if (!training) {
        for (size_t k = 0; k < c; ++k) mean[k] = rm[k], inv[k] = 1.0 / std::sqrt(rv[k] + static_cast<double>(p.eps));
      }
      std::vector<double> dx(n), dg(c), db(c);
      batch_norm_backward(x.data(), w.data(), DType::kF64, gamma.data(), mean.data(), inv.data(), p, training,
                          dx.data(), dg.data(), db.data());
      EXPECT_TRUE(testing::all_close(dx, testing::numeric_grad(objective, x), kFiniteDiffTolerance, "dx"));
      EXPECT_TRUE(testing::all_close(dg, testing::numeric_grad(objective, gamma), kFiniteDiffTolerance, "dgamma"));
      EXPECT_TRUE(testing::all_close(db, testing::numeric_grad(objective, beta), kFiniteDiffTolerance, "dbeta"));
    }
  }
}

}  // namespace
}  // namespace demi::kernels
