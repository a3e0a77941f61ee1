#include "demi/kernels/cpu/loss.h"

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

struct CeShape {
  int64_t n, c;
};
const std::vector<CeShape> kShapes = {{1, 1}, {1, 10}, {7, 10}, {256, 10}, {33, 1000}, {5, 3}, {3, 4097}};

std::vector<float> labels_for(int64_t n, int64_t c, uint64_t seed) {
  std::vector<float> v = random_floats(n, seed, 0.0f, 1.0f);
  for (auto& x : v) x = std::floor(x * static_cast<float>(c) * 0.999f);
  return v;
}

// Rows of positive weights; normalised to sum 1 unless `raw` (the formula holds for any sum).
std::vector<float> probs_for(int64_t n, int64_t c, uint64_t seed, bool raw) {
  std::vector<float> p = random_floats(n * c, seed, 0.05f, 1.0f);
  if (!raw)
    for (int64_t i = 0; i < n; ++i) {
      float s = 0;
      for (int64_t j = 0; j < c; ++j) s += p[static_cast<size_t>(i * c + j)];
      for (int64_t j = 0; j < c; ++j) p[static_cast<size_t>(i * c + j)] /= s;
    }
  return p;
}

int64_t loss_size(Reduction r, int64_t n) { return r == Reduction::kNone ? n : 1; }

TEST(SoftmaxCrossEntropy, SparseMatchesReference) {
  for (DType t : testing::kFastDtypes) {
    for (DType lt : {DType::kI32, DType::kI64}) {
      SCOPED_TRACE(str_cat(dtype_name(t), " labels ", dtype_name(lt)));
      for (CeShape s : kShapes) {
        for (Reduction r : {Reduction::kNone, Reduction::kMean, Reduction::kSum}) {
          SCOPED_TRACE(str_cat("(", s.n, ", ", s.c, ") ", reduction_name(r)));
          CrossEntropyParams p{s.n, s.c, r};
          Buffer x(t, random_floats(s.n * s.c, 71, -8.0f, 8.0f)), labels(lt, labels_for(s.n, s.c, 72));
          Buffer dloss(DType::kF32, random_floats(loss_size(r, s.n), 73));
          Buffer want_loss(DType::kF32, loss_size(r, s.n)), want_lse(DType::kF32, s.n), want_dx(t, s.n * s.c);
          testing::visit_fast(t, [&](auto tag) {
            using T = decltype(tag);
            auto run = [&](auto* lab) {
              ref::softmax_cross_entropy_sparse_forward(x.as<T>(), lab, p, want_loss.as<float>(), want_lse.as<float>());
              ref::softmax_cross_entropy_sparse_backward(x.as<T>(), lab, want_lse.as<float>(), dloss.as<float>(), p,
                                                         want_dx.as<T>());
            };
            lt == DType::kI32 ? run(labels.as<int32_t>()) : run(labels.as<int64_t>());
          });
          for_each_level([&](CpuLevel) {
            Buffer loss(DType::kF32, loss_size(r, s.n)), lse(DType::kF32, s.n), dx(t, s.n * s.c), dx2(t, s.n * s.c);
            softmax_cross_entropy_sparse_forward(x.data(), t, labels.data(), lt, p, loss.as<float>(), lse.as<float>());
            softmax_cross_entropy_sparse_backward(x.data(), t, labels.data(), lt, lse.as<float>(), dloss.as<float>(), p,
                                                  dx.data());
            softmax_cross_entropy_sparse_backward(x.data(), t, labels.data(), lt, nullptr, dloss.as<float>(), p,
                                                  dx2.data());
            EXPECT_TRUE(testing::all_close(loss, want_loss, tolerance_for(DType::kF32), "loss"));
            EXPECT_TRUE(testing::all_close(lse, want_lse, tolerance_for(DType::kF32), "lse"));
            EXPECT_TRUE(testing::all_close(dx, want_dx, tolerance_for(t), "dlogits"));
            EXPECT_TRUE(testing::all_close(dx2, want_dx, tolerance_for(t), "dlogits without lse"));
          });
        }
      }
    }
  }
}

TEST(SoftmaxCrossEntropy, DenseMatchesReference) {
  for (DType t : testing::kFastDtypes) {
    for (DType pt : {t, DType::kF32}) {
      SCOPED_TRACE(str_cat(dtype_name(t), " probs ", dtype_name(pt)));
      for (CeShape s : kShapes) {
        for (Reduction r : {Reduction::kNone, Reduction::kMean, Reduction::kSum}) {
          bool raw = r == Reduction::kSum;  // label rows that do not sum to 1 too
          SCOPED_TRACE(str_cat("(", s.n, ", ", s.c, ") ", reduction_name(r)));
          CrossEntropyParams p{s.n, s.c, r};
          Buffer x(t, random_floats(s.n * s.c, 74, -8.0f, 8.0f)), probs(pt, probs_for(s.n, s.c, 75, raw));
          Buffer dloss(DType::kF32, random_floats(loss_size(r, s.n), 76));
          Buffer want_loss(DType::kF32, loss_size(r, s.n)), want_lse(DType::kF32, s.n), want_dx(t, s.n * s.c);
          testing::visit_fast(t, [&](auto tag) {
            using T = decltype(tag);
            auto run = [&](auto* pr) {
              ref::softmax_cross_entropy_dense_forward(x.as<T>(), pr, p, want_loss.as<float>(), want_lse.as<float>());
              ref::softmax_cross_entropy_dense_backward(x.as<T>(), pr, want_lse.as<float>(), dloss.as<float>(), p,
                                                        want_dx.as<T>());
            };
            pt == t ? run(probs.as<T>()) : run(probs.as<float>());
          });
          for_each_level([&](CpuLevel) {
            Buffer loss(DType::kF32, loss_size(r, s.n)), lse(DType::kF32, s.n), dx(t, s.n * s.c);
            softmax_cross_entropy_dense_forward(x.data(), t, probs.data(), pt, p, loss.as<float>(), lse.as<float>());
            softmax_cross_entropy_dense_backward(x.data(), t, probs.data(), pt, lse.as<float>(), dloss.as<float>(), p,
                                                 dx.data());
            EXPECT_TRUE(testing::all_close(loss, want_loss, tolerance_for(DType::kF32), "loss"));
            EXPECT_TRUE(testing::all_close(dx, want_dx, tolerance_for(t), "dlogits"));
          });
        }
      }
    }
  }
}

TEST(SoftmaxCrossEntropy, LabelOutOfRangeNamesRowLabelAndClasses) {
  std::vector<float> x(5 * 10, 0.5f), loss(1), dx(50), dloss = {1.0f};
  std::vector<int32_t> bad = {0, 1, 2, 10, 4};
  std::vector<int64_t> negative = {0, -1, 2, 3, 4};
  CrossEntropyParams p{5, 10, Reduction::kMean};
  for_each_level([&](CpuLevel) {
    try {
      softmax_cross_entropy_sparse_forward(x.data(), DType::kF32, bad.data(), DType::kI32, p, loss.data());
      FAIL() << "expected demi::Error";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("row 3"), std::string::npos) << msg;
      EXPECT_NE(msg.find("label 10"), std::string::npos) << msg;
      EXPECT_NE(msg.find("10 classes"), std::string::npos) << msg;
    }
    EXPECT_THROW(softmax_cross_entropy_sparse_forward(x.data(), DType::kF32, negative.data(), DType::kI64, p,
                                                      loss.data()),
                 Error);
    EXPECT_THROW(softmax_cross_entropy_sparse_backward(x.data(), DType::kF32, bad.data(), DType::kI32, nullptr,
                                                       dloss.data(), p, dx.data()),
                 Error);
    EXPECT_THROW(softmax_cross_entropy_sparse_forward(x.data(), DType::kF32, x.data(), DType::kF32, p, loss.data()),
                 Error);
  });
  std::vector<double> x64(50, 0.5), l64(1);
  EXPECT_THROW(softmax_cross_entropy_sparse_forward(x64.data(), DType::kF64, bad.data(), DType::kI32, p, l64.data()),
               Error);
}

TEST(SoftmaxCrossEntropy, HugeLogitsGiveFiniteLoss) {
  const int64_t n = 4, c = 19;
  std::vector<float> vals = random_floats(n * c, 77, -1.0f, 1.0f);
  for (auto& v : vals) v *= 1e4f;
  std::vector<float> f16_vals(vals.size());
  for (size_t i = 0; i < vals.size(); ++i) f16_vals[i] = vals[i] > 0 ? 65504.0f - 32.0f * (i % 7) : -65504.0f;
  std::vector<int32_t> labels = {3, 0, 18, 7};
  for_each_level([&](CpuLevel) {
    for (auto [t, v] : {std::pair{DType::kF32, vals}, std::pair{DType::kF16, f16_vals}}) {
      Buffer x(t, v), dx(t, n * c);
      float loss = 0, want = 0, dloss = 1.0f;
      CrossEntropyParams p{n, c, Reduction::kSum};
      softmax_cross_entropy_sparse_forward(x.data(), t, labels.data(), DType::kI32, p, &loss);
      softmax_cross_entropy_sparse_backward(x.data(), t, labels.data(), DType::kI32, nullptr, &dloss, p, dx.data());
      testing::visit_fast(t, [&](auto tag) {
        using T = decltype(tag);
        ref::softmax_cross_entropy_sparse_forward(x.as<T>(), labels.data(), p, &want, nullptr);
      });
      EXPECT_TRUE(std::isfinite(loss));
      EXPECT_TRUE(tolerance_for(DType::kF32).close(loss, want)) << loss << " vs " << want;
      for (int64_t i = 0; i < n * c; ++i) ASSERT_TRUE(std::isfinite(dx.get(i)));
    }
  });
}

// f64 central finite differences of the f64 reference: L = sum(w * loss) (w = dloss).
TEST(SoftmaxCrossEntropy, BackwardMatchesFiniteDifferences) {
  const int64_t n = 3, c = 5;
  std::vector<int64_t> labels = {4, 0, 2};
  std::vector<double> probs;
  for (float f : probs_for(n, c, 78, true)) probs.push_back(f);
  for (Reduction r : {Reduction::kNone, Reduction::kMean, Reduction::kSum}) {
    for (bool sparse : {true, false}) {
      SCOPED_TRACE(str_cat(sparse ? "sparse " : "dense ", reduction_name(r)));
      CrossEntropyParams p{n, c, r};
      std::vector<double> x, w, loss(static_cast<size_t>(loss_size(r, n))), dx(static_cast<size_t>(n * c));
      for (float f : random_floats(n * c, 79, -3.0f, 3.0f)) x.push_back(f);
      for (float f : random_floats(loss_size(r, n), 80)) w.push_back(f);
      auto objective = [&] {
        if (sparse)
          softmax_cross_entropy_sparse_forward(x.data(), DType::kF64, labels.data(), DType::kI64, p, loss.data());
        else
          softmax_cross_entropy_dense_forward(x.data(), DType::kF64, probs.data(), DType::kF64, p, loss.data());
        double l = 0;
        for (size_t i = 0; i < loss.size(); ++i) l += w[i] * loss[i];
        return l;
      };
      if (sparse)
        softmax_cross_entropy_sparse_backward(x.data(), DType::kF64, labels.data(), DType::kI64, nullptr, w.data(), p,
                                              dx.data());
      else
        softmax_cross_entropy_dense_backward(x.data(), DType::kF64, probs.data(), DType::kF64, nullptr, w.data(), p,
                                             dx.data());
      EXPECT_TRUE(testing::all_close(dx, testing::numeric_grad(objective, x), kFiniteDiffTolerance));
    }
  }
}

TEST(MseLoss, MatchesReference) {
  for (DType t : testing::kFastDtypes) {
    SCOPED_TRACE(testing::dtype_trace(t));
    for (int64_t n : {1, 17, 1000, 100003}) {
      for (Reduction r : {Reduction::kNone, Reduction::kMean, Reduction::kSum}) {
        SCOPED_TRACE(str_cat("n=", n, " ", reduction_name(r)));
        Buffer x(t, random_floats(n, 81)), target(t, random_floats(n, 82)), dloss(DType::kF32, random_floats(loss_size(r, n), 83));
        Buffer want(DType::kF32, loss_size(r, n)), want_dx(t, n), want_dt(t, n);
        testing::visit_fast(t, [&](auto tag) {
          using T = decltype(tag);
          ref::mse_forward(x.as<T>(), target.as<T>(), n, r, want.as<float>());
          ref::mse_backward(x.as<T>(), target.as<T>(), n, r, dloss.as<float>(), want_dx.as<T>(), want_dt.as<T>());
        });
        for_each_level([&](CpuLevel) {
          Buffer loss(DType::kF32, loss_size(r, n)), dx(t, n), dt(t, n);
          mse_forward(x.data(), target.data(), t, n, r, loss.as<float>());
          mse_backward(x.data(), target.data(), t, n, r, dloss.as<float>(), dx.data(), dt.data());
          EXPECT_TRUE(testing::all_close(loss, want, tolerance_for(DType::kF32), "loss"));
          EXPECT_TRUE(testing::all_close(dx, want_dx, tolerance_for(t), "dx"));
          EXPECT_TRUE(testing::all_close(dt, want_dt, tolerance_for(t), "dtarget"));
        });
      }
    }
  }
}

TEST(MseLoss, BackwardMatchesFiniteDifferences) {
  const int64_t n = 7;
  for (Reduction r : {Reduction::kNone, Reduction::kMean, Reduction::kSum}) {
    SCOPED_TRACE(str_cat(reduction_name(r)));
    std::vector<double> x, t, w, loss(static_cast<size_t>(loss_size(r, n))), dx(n), dt(n);
    for (float f : random_floats(n, 84)) x.push_back(f);
    for (float f : random_floats(n, 85)) t.push_back(f);
    for (float f : random_floats(loss_size(r, n), 86)) w.push_back(f);
    auto objective = [&] {
      mse_forward(x.data(), t.data(), DType::kF64, n, r, loss.data());
      double l = 0;
      for (size_t i = 0; i < loss.size(); ++i) l += w[i] * loss[i];
      return l;
    };
    mse_backward(x.data(), t.data(), DType::kF64, n, r, w.data(), dx.data(), dt.data());
    EXPECT_TRUE(testing::all_close(dx, testing::numeric_grad(objective, x), kFiniteDiffTolerance, "dx"));
    EXPECT_TRUE(testing::all_close(dt, testing::numeric_grad(objective, t), kFiniteDiffTolerance, "dtarget"));
  }
}

}  // namespace
}  // namespace demi::kernels
