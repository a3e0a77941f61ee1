#include "demi/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

namespace demi::optim {
namespace {

Tensor param(std::vector<float> v) {
  Tensor p = from_vector(v, {static_cast<int64_t>(v.size())});
  p.set_requires_grad(true);
  return p;
}

void set_grad(Tensor& p, std::vector<float> g) { p.set_grad(from_vector(g, p.shape())); }

TEST(Momentum, MatchesMindSporesFormula) {
  Tensor p = param({1.0f, -2.0f});
  Momentum opt({p}, 0.1, 0.9);
  set_grad(p, {0.5f, 1.0f});
  opt.step();  // v = g; p -= lr v
  EXPECT_FLOAT_EQ(p.get(0), 1.0f - 0.1f * 0.5f);
  set_grad(p, {0.5f, 1.0f});
  opt.step();  // v = 0.9 v + g = 0.95
  EXPECT_FLOAT_EQ(p.get(0), 0.95f - 0.1f * 0.95f);
  EXPECT_EQ(opt.global_step(), 2);
}

TEST(Momentum, NesterovAndWeightDecay) {
  Tensor p = param({1.0f});
  Momentum opt({p}, 0.1, 0.9, /*weight_decay=*/0.01, /*nesterov=*/true);
  set_grad(p, {0.5f});
  opt.step();
  float g = 0.5f + 0.01f * 1.0f, v = g;
  EXPECT_FLOAT_EQ(p.get(0), 1.0f - 0.1f * (g + 0.9f * v));
}

TEST(Adam, FirstStepMovesByTheLearningRate) {
  Tensor p = param({1.0f, -1.0f});
  Adam opt({p}, 0.01);
  set_grad(p, {3.0f, -0.2f});
  opt.step();  // bias-corrected m/sqrt(v) = sign(g)
  EXPECT_NEAR(p.get(0), 1.0 - 0.01, 1e-6);
  EXPECT_NEAR(p.get(1), -1.0 + 0.01, 1e-6);
}

TEST(AdamW, DecouplesWeightDecay) {
  Tensor p = param({2.0f});
  AdamW opt({p}, 0.1, {}, 0.5);
  set_grad(p, {0.0f});
  opt.step();  // zero gradient: only the decay acts, p *= 1 - lr * wd
  EXPECT_NEAR(p.get(0), 2.0 * (1 - 0.1 * 0.5), 1e-6);
}

TEST(Optimizer, SkipsParametersWithoutGradientsAndZeroGradDropsThem) {
  Tensor a = param({1.0f}), b = param({1.0f});
  SGD opt({a, b}, 1.0);
  set_grad(a, {1.0f});
  opt.step();
  EXPECT_FLOAT_EQ(a.get(0), 0.0f);
  EXPECT_FLOAT_EQ(b.get(0), 1.0f);
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
}

TEST(Optimizer, StateIsFp32AndTracked) {
  Tensor p = param({1.0f, 2.0f, 3.0f});
  int64_t before = mem_stats().cur(MemCategory::kOptimizerState);
  Adam opt({p}, 0.1);
  EXPECT_EQ(mem_stats().cur(MemCategory::kOptimizerState) - before, 2 * 3 * 4);
  EXPECT_EQ(opt.state().size(), 2u);
  EXPECT_EQ(opt.state()[0].second.dtype(), DType::kF32);
}

TEST(Optimizer, BadHyperParametersAreErrors) {
  Tensor p = param({1.0f});
  EXPECT_THROW(Momentum({p}, std::nan(""), 0.9), Error);
  EXPECT_THROW(Momentum({p}, std::numeric_limits<double>::infinity(), 0.9), Error);
  EXPECT_THROW(Momentum({p}, 0.1, -1), Error);
  EXPECT_THROW(SGD({}, 0.1), Error);
  Tensor h = from_vector(std::vector<float>{1.0f}, {1}).to(DType::kF16);
  EXPECT_THROW(SGD({h}, 0.1), Error) << "parameters must be FP32 masters";
}

// AMP O2/O3's low-precision parameter gradients: widened a chunk at a time and multiplied by
// low_grad_multiplier as the update reads them, bit for bit the update from the FP32 gradient
// float(g) * multiplier; a current low copy is rewritten all the same.
TEST(Optimizer, LowPrecisionGradientsAreWidenedAndMultipliedAsRead) {
  const int64_t n = 70000;  // several update chunks and several widening chunks, with a tail
  std::vector<float> w0(static_cast<size_t>(n)), g0(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    w0[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i));
    g0[static_cast<size_t>(i)] = 1000.0f * std::cos(0.11f * static_cast<float>(i));
  }
  const float multiplier = 1.0f / 1024.0f * 0.75f;
  auto make = [](const std::string& kind, Tensor p) -> std::unique_ptr<Optimizer> {
    if (kind == "Momentum") return std::make_unique<Momentum>(std::vector<Tensor>{p}, 0.1, 0.9, 0.01);
    if (kind == "AdamW") return std::make_unique<AdamW>(std::vector<Tensor>{p}, 0.01, AdamOptions{}, 0.1);
    return std::make_unique<LAMB>(std::vector<Tensor>{p}, 0.01, AdamOptions{}, 0.01);
  };
  for (DType low : {DType::kF16, DType::kBF16}) {
    for (const std::string kind : {"Momentum", "AdamW", "LAMB"}) {
      Tensor a = param(w0), b = param(w0);
      auto oa = make(kind, a), ob = make(kind, b);
      for (int step = 0; step < 2; ++step) {
        Tensor g_low = from_vector(g0, a.shape()).to(low);
        a.set_grad(g_low);
        Tensor g_wide = g_low.to(DType::kF32);
        for (int64_t i = 0; i < n; ++i) g_wide.set(i, g_wide.get(i) * multiplier);
        b.set_grad(g_wide);
        oa->step(multiplier);
        ob->step(multiplier);  // FP32 gradients are read as they are
        EXPECT_EQ(a.grad().dtype(), low) << "the gradient is left as it is";
      }
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(a.get(i), b.get(i)) << kind << " " << dtype_name(low) << " element " << i;
    }
  }
  Tensor p = param({1.0f});
  Momentum opt({p}, 0.1, 0.9);
  p.set_grad(from_vector(std::vector<float>{1.0f}, {1}).to(DType::kBF16));
  EXPECT_THROW(opt.step(std::numeric_limits<float>::infinity()), Error);
  EXPECT_THROW(
      {
        p.set_grad(from_vector(std::vector<int32_t>{1}, {1}));
        opt.step();
      },
      Error);
}

// BF16 state: every update is the FP32 update of the state widened from BF16, with the state rounded back to
// nearest even after it — bit for bit an FP32-state optimizer whose state is rounded after every step, for
// FP32 and BF16 gradients, over several update and widening chunks, and for LAMB's whole-parameter pass.
TEST(Optimizer, Bf16StateIsTheFp32UpdateRoundedAfterEachStep) {
  const int64_t n = 70000;
  std::vector<float> w0(static_cast<size_t>(n)), g0(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    w0[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i));
    g0[static_cast<size_t>(i)] = std::cos(0.11f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 7));
  }
  auto make = [](const std::string& kind, Tensor p) -> std::unique_ptr<Optimizer> {
    std::vector<Tensor> ps{p};
    if (kind == "Momentum") return std::make_unique<Momentum>(ps, 0.1, 0.9, 0.01);
    if (kind == "Nesterov") return std::make_unique<Momentum>(ps, 0.1, 0.9, 0.01, true);
    if (kind == "Adam") return std::make_unique<Adam>(ps, 0.01, AdamOptions{}, 0.01);
    if (kind == "AdamW") return std::make_unique<AdamW>(ps, 0.01, AdamOptions{}, 0.1);
    if (kind == "RMSProp")
      return std::make_unique<RMSProp>(ps, 0.01, RMSPropOptions{.momentum = 0.9, .centered = true});
    return std::make_unique<LAMB>(ps, 0.01, AdamOptions{}, 0.01);
  };
  auto round_state = [](Optimizer& o) {
    for (auto& [name, t] : o.state()) {
      Tensor r = t.to(DType::kBF16).to(DType::kF32);
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, r.get(i));
    }
  };
  for (DType grad : {DType::kF32, DType::kBF16}) {
    for (const std::string kind : {"Momentum", "Nesterov", "Adam", "AdamW", "RMSProp", "LAMB"}) {
      Tensor a = param(w0), b = param(w0);
      auto oa = make(kind, a), ob = make(kind, b);
      oa->set_state_dtype(DType::kBF16);
      for (int step = 0; step < 3; ++step) {
        Tensor g = from_vector(g0, a.shape()).to(grad);
        a.set_grad(g);
        b.set_grad(g);
        oa->step();
        ob->step();
        round_state(*ob);
      }
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(a.get(i), b.get(i)) << kind << " (" << dtype_name(grad) << " gradients) element " << i;
      auto sa = oa->state(), sb = ob->state();
      ASSERT_EQ(sa.size(), sb.size());
      for (size_t k = 0; k < sa.size(); ++k) {
        ASSERT_EQ(sa[k].second.dtype(), DType::kBF16) << kind << " " << sa[k].first;
        Tensor wide = sa[k].second.to(DType::kF32);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(wide.get(i), sb[k].second.get(i)) << kind << " " << sa[k].first;
      }
    }
  }
}

// Momentum updates a low-precision gradient and BF16 state in one pass (update_mixed): bit for bit the
// optimizer's widening path (the chunks widened into FP32 buffers around update()), which a Momentum without
// update_mixed takes — every gradient dtype, either state dtype, a multiplier, Nesterov, over several chunks.
class WidenedMomentum : public Momentum {
 public:
  using Momentum::Momentum;

 protected:
  bool has_update_mixed() const override { return false; }
};

TEST(Optimizer, MomentumInOnePassIsTheWidenedUpdate) {
  const int64_t n = 70000;
  std::vector<float> w0(static_cast<size_t>(n)), g0(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    w0[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i));
    g0[static_cast<size_t>(i)] = 300.0f * std::cos(0.11f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 7));
  }
  for (DType grad : {DType::kF32, DType::kF16, DType::kBF16})
    for (DType state : {DType::kF32, DType::kBF16})
      for (bool nesterov : {false, true})
        for (float multiplier : {1.0f, 0.75f / 1024}) {
          if (grad == DType::kF32 && state == DType::kF32) continue;  // (not chunked: update() itself)
          SCOPED_TRACE(::testing::Message() << dtype_name(grad) << " gradient, " << dtype_name(state) << " state"
                                            << (nesterov ? ", nesterov" : "") << ", multiplier " << multiplier);
          Tensor a = param(w0), b = param(w0);
          Momentum oa({a}, 0.1, 0.9, 0.01, nesterov);
          WidenedMomentum ob({b}, 0.1, 0.9, 0.01, nesterov);
          oa.set_state_dtype(state);
          ob.set_state_dtype(state);
          for (int step = 0; step < 3; ++step) {
            Tensor g = from_vector(g0, a.shape()).to(grad);
            a.set_grad(g);
            b.set_grad(g);
            oa.step(multiplier);
            ob.step(multiplier);
          }
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a.get(i), b.get(i)) << "element " << i;
          Tensor sa = oa.state()[0].second.to(DType::kF32), sb = ob.state()[0].second.to(DType::kF32);
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sa.get(i), sb.get(i)) << "state element " << i;
        }
}

TEST(Optimizer, Bf16StateTakesHalfTheBytesAndIsRefusedWhereItCannotWork) {
  Tensor p = param({1.0f, 2.0f, 3.0f, 4.0f});
  const int64_t before = mem_stats().cur(MemCategory::kOptimizerState);
  Adam opt({p}, 0.1);
  EXPECT_EQ(mem_stats().cur(MemCategory::kOptimizerState) - before, 2 * 4 * 4);
  opt.set_state_dtype(DType::kBF16);
  EXPECT_EQ(opt.state_dtype(), DType::kBF16);
  EXPECT_EQ(mem_stats().cur(MemCategory::kOptimizerState) - before, 2 * 4 * 2) << "the FP32 state is freed";
  set_grad(p, {1.0f, -1.0f, 0.5f, 0.25f});
  opt.step();
  opt.set_state_dtype(DType::kF32);  // back: converted exactly
  EXPECT_EQ(opt.state()[0].second.dtype(), DType::kF32);
  const float m_bf16 = from_vector(std::vector<float>{0.1f}, {1}).to(DType::kBF16).to(DType::kF32).get(0);
  EXPECT_EQ(opt.state()[0].second.get(0), m_bf16) << "m = (1 - beta1) g = 0.1, held as bf16(0.1)";
  EXPECT_THROW(opt.set_state_dtype(DType::kF16), Error) << "fp16's range does not hold second moments";
  Tensor q = param({1.0f});
  Adagrad ada({q}, 0.1);
  try {
    ada.set_state_dtype(DType::kBF16);
    FAIL() << "Adagrad's growing sums in bf16 are refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Adagrad"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ada.state_dtype(), DType::kF32);
}

TEST(LrSchedule, StepAndCosineWithWarmup) {
  auto s = step_lr(1.0, 10, 0.5);
  EXPECT_DOUBLE_EQ(s->lr(9), 1.0);
  EXPECT_DOUBLE_EQ(s->lr(10), 0.5);
  auto c = cosine_lr(1.0, 110, 10, 0.0);
  EXPECT_DOUBLE_EQ(c->lr(0), 0.1);
  EXPECT_DOUBLE_EQ(c->lr(9), 1.0);
  EXPECT_NEAR(c->lr(60), 0.5, 1e-12);
  EXPECT_NEAR(c->lr(110), 0.0, 1e-12);
  EXPECT_THROW(cosine_lr(1.0, 10, 11), Error);
}

}  // namespace
}  // namespace demi::optim
