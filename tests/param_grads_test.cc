// Parameter gradients and memory. AMP O2/O3's low-precision parameter gradients
// (AmpPolicy::low_precision_param_grads): the weight gradients are stored in bfloat16 (in float16 runs
// too), rounded once from the products' FP32 sums; micro-batches accumulate in FP32; the train step
// unscales and clips them as the optimizer reads them; training follows FP32 gradients closely.
// The optimizer in backward: each parameter updated as its gradient completes, bit for bit the usual step.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "demi/amp/loss_scale.h"
#include "demi/amp/policy.h"
#include "demi/amp/train_step.h"
#include "demi/core/memory.h"
#include "demi/core/rng.h"
#include "demi/kernels/matmul.h"
#include "demi/kernels/onednn/conv.h"
#include "demi/nn/models.h"
#include "demi/ops/ops.h"

namespace demi {
namespace {

using amp::Level;

struct Trainer {
  std::shared_ptr<nn::LeNet> net;
  std::shared_ptr<optim::Momentum> opt;
  std::shared_ptr<amp::TrainStep> step;
};

// LeNet with BatchNorm (its parameters stay FP32 at O2), built from one seed.
Trainer make_trainer(Level level, DType low, std::optional<bool> low_grads, double clip = 0,
                     bool in_backward = false) {
  set_seed(11);
  Trainer r;
  r.net = std::make_shared<nn::LeNet>(/*batch_norm=*/true);
  r.opt = std::make_shared<optim::Momentum>(r.net->trainable_params(), 0.05, 0.9);
  amp::TrainOptions o;
  o.low_dtype = low;
  // fp16: a fixed loss scale, so that both runs of a comparison scale alike.
  if (low == DType::kF16 && !in_backward)
    o.loss_scale_manager = std::make_shared<amp::FixedLossScaleManager>(256.0, true);
  o.no_loss_scale = in_backward;
  o.optimizer_in_backward = in_backward;
  o.low_precision_param_grads = low_grads;
  o.clip_grad_norm = clip;
  r.step = amp::build_train_network(r.net, r.opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                    level, o);
  return r;
}

struct Batch {
  Tensor x, y;
};

Batch batch(uint64_t seed) {
  Generator g(seed);
  Tensor x = normal({8, 1, 28, 28}, 0, 1, g);
  std::vector<int32_t> l(8);
  for (auto& v : l) v = static_cast<int32_t>(g.next_int(10));
  return {x, from_vector(l, {8})};
}

// Within one rounding of the low dtype (the two runs' products may sum in different orders).
void expect_rounded_from(const Tensor& low, const Tensor& wide, const std::string& what) {
  ASSERT_EQ(low.numel(), wide.numel()) << what;
  const double eps = low.dtype() == DType::kF16 ? 1.0 / 1024 : 1.0 / 128;
  Tensor l = low.to(DType::kF32);
  double scale = 0;
  for (int64_t i = 0; i < wide.numel(); ++i) scale = std::max(scale, std::abs(static_cast<double>(wide.get(i))));
  for (int64_t i = 0; i < wide.numel(); ++i) {
    const double a = l.get(i), b = wide.get(i);
    ASSERT_LE(std::abs(a - b), eps * std::abs(b) + 1e-5 * scale)
        << what << " element " << i << ": " << a << " vs " << b;
  }
}

// The kernels of both runs of a comparison fixed (oneDNN's products, demi's convolutions where a geometry
// has them), none chosen by measurement: each choice is measured per key, the keys differ by the
// gradient's dtype, and two choices measured apart (on a loaded machine: in ctest) may sum in different
// orders, which a cancelling sum (a bias gradient of 1e-7 among values up to 2e-4) shows past any bound
// of one rounding.
class SameKernels {
 public:
  SameKernels()
      : matmul_(kernels::matmul_policy()), gemm_(kernels::onednn::conv_gemm_policy()),
        direct_(kernels::onednn::conv_direct_policy()) {
    kernels::set_matmul_policy(kernels::MatmulPolicy::kOnednn);
    kernels::onednn::set_conv_gemm_policy(kernels::onednn::ConvGemmPolicy::kOn);
    kernels::onednn::set_conv_direct_policy(kernels::onednn::ConvDirectPolicy::kOn);
  }
  ~SameKernels() {
    kernels::set_matmul_policy(matmul_);
    kernels::onednn::set_conv_gemm_policy(gemm_);
    kernels::onednn::set_conv_direct_policy(direct_);
  }

 private:
  kernels::MatmulPolicy matmul_;
  kernels::onednn::ConvGemmPolicy gemm_;
  kernels::onednn::ConvDirectPolicy direct_;
};

TEST(LowPrecisionParamGrads, O2KeepsConvAndDenseWeightGradientsLowAndBatchNormsFP32) {
  SameKernels same;
  for (DType low : {DType::kF16, DType::kBF16}) {
    Trainer on = make_trainer(Level::kO2, low, true), off = make_trainer(Level::kO2, low, false);
    Batch b = batch(3);
    on.step->accumulate(b.x, b.y);
    off.step->accumulate(b.x, b.y);
    auto named_on = on.net->parameters_and_names(), named_off = off.net->parameters_and_names();
    ASSERT_EQ(named_on.size(), named_off.size());
    int64_t bytes_on = 0, bytes_off = 0;
    int lowered = 0;
    for (size_t i = 0; i < named_on.size(); ++i) {
      const auto& [name, p] = named_on[i];
      const Tensor g_on = p.grad(), g_off = named_off[i].second.grad();
      ASSERT_TRUE(g_on.defined() && g_off.defined()) << name;
      EXPECT_EQ(g_off.dtype(), DType::kF32) << name;
      const bool batch_norm = name.find("gamma") != std::string::npos || name.find("beta") != std::string::npos;
      EXPECT_EQ(g_on.dtype(), batch_norm ? DType::kF32 : DType::kBF16) << name << " at O2 " << dtype_name(low);
      if (g_on.dtype() == DType::kBF16) ++lowered;
      expect_rounded_from(g_on, g_off, name + " " + std::string(dtype_name(low)));
      bytes_on += g_on.nbytes();
      bytes_off += g_off.nbytes();
    }
    EXPECT_GE(lowered, 8) << "the convolutions' and Dense layers' weights and biases";
    EXPECT_LT(bytes_on, bytes_off * 0.55) << "half the bytes, but for the BatchNorms' FP32 ones";
  }
  // O1 hands FP32 back: its parameter gradients stay FP32.
  Trainer o1 = make_trainer(Level::kO1, DType::kBF16, std::nullopt);
  EXPECT_FALSE(amp::AmpPolicy(Level::kO1, DType::kBF16).low_precision_param_grads());
  EXPECT_TRUE(amp::AmpPolicy(Level::kO2, DType::kF16).low_precision_param_grads()) << "the default at O2, fp16 too";
  Batch b = batch(3);
  o1.step->accumulate(b.x, b.y);
  for (const auto& [name, p] : o1.net->parameters_and_names()) EXPECT_EQ(p.grad().dtype(), DType::kF32) << name;
}

TEST(LowPrecisionParamGrads, TrainingFollowsFP32GradientsWithClippingAndAnOverflowStep) {
  for (DType low : {DType::kF16, DType::kBF16}) {
    Trainer on = make_trainer(Level::kO2, low, true, /*clip=*/0.5), off = make_trainer(Level::kO2, low, false, 0.5);
    for (int s = 0; s < 8; ++s) {
      Batch b = batch(100 + static_cast<uint64_t>(s));
      if (s == 4) b.x.set(0, std::numeric_limits<float>::infinity());  // an overflow: skipped by both
      amp::StepResult r_on = (*on.step)(b.x, b.y), r_off = (*off.step)(b.x, b.y);
      EXPECT_EQ(r_on.overflow, s == 4) << s;
      EXPECT_EQ(r_off.overflow, s == 4) << s;
      if (s == 4) continue;
      EXPECT_NEAR(r_on.loss, r_off.loss, 0.02 * std::abs(r_off.loss)) << dtype_name(low) << " step " << s;
      EXPECT_TRUE(r_on.clipped && r_off.clipped) << "the clip must bite for this test to mean something";
      // The trajectories part by the gradients' rounding, slowly.
      EXPECT_NEAR(r_on.grad_norm, r_off.grad_norm, 0.03 * r_off.grad_norm) << dtype_name(low) << " step " << s;
    }
    EXPECT_EQ(on.opt->global_step(), 7);
    auto w_on = on.net->parameters_and_names(), w_off = off.net->parameters_and_names();
    for (size_t i = 0; i < w_on.size(); ++i) {
      const Tensor& a = w_on[i].second;
      const Tensor& b = w_off[i].second;
      double diff = 0, norm = 0;
      for (int64_t k = 0; k < a.numel(); ++k) {
        diff = std::max(diff, std::abs(static_cast<double>(a.get(k)) - b.get(k)));
        norm = std::max(norm, std::abs(static_cast<double>(b.get(k))));
      }
      EXPECT_LE(diff, 0.02 * norm + 1e-3) << w_on[i].first << " " << dtype_name(low);
    }
  }
}

TEST(LowPrecisionParamGrads, MicroBatchesAccumulateInFP32) {
  Trainer two = make_trainer(Level::kO2, DType::kBF16, true), first = make_trainer(Level::kO2, DType::kBF16, true),
      second = make_trainer(Level::kO2, DType::kBF16, true);
  Batch b1 = batch(7), b2 = batch(8);
  two.step->accumulate(b1.x, b1.y);
  two.step->accumulate(b2.x, b2.y);
  first.step->accumulate(b1.x, b1.y);
  second.step->accumulate(b2.x, b2.y);
  const Tensor w = two.net->parameters_and_names()[0].second;
  const Tensor g = w.grad(), g1 = first.net->parameters_and_names()[0].second.grad(),
               g2 = second.net->parameters_and_names()[0].second.grad();
  ASSERT_EQ(g1.dtype(), DType::kBF16);
  EXPECT_EQ(g.dtype(), DType::kF32) << "the second micro-batch adds into an FP32 accumulator";
  Tensor w1 = g1.to(DType::kF32), w2 = g2.to(DType::kF32);
  for (int64_t i = 0; i < g.numel(); ++i) ASSERT_EQ(g.get(i), w1.get(i) + w2.get(i)) << i;
  amp::StepResult r = two.step->step();
  EXPECT_FALSE(r.overflow);
  EXPECT_EQ(r.micro_batches, 2);
}

TEST(LowPrecisionParamGrads, ThePublicUnscaleRefusesToFlushThemInPlace) {
  std::vector<Tensor> grads = {full({4}, 2.0), full({3}, 2.0).to(DType::kF16)};
  EXPECT_EQ(amp::unscale_and_check(grads, 1.0f), -1) << "a check without scaling reads them";
  try {
    amp::unscale_and_check(grads, 0.5f);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("gradient 1"), std::string::npos) << m;
    EXPECT_NE(m.find("float16"), std::string::npos) << m;
    EXPECT_NE(m.find("optimizer.step(inv_scale)"), std::string::npos) << m;
  }
  // clip_grad_norm takes them: the norm over every dtype, the low ones rounded to their dtype.
  std::vector<Tensor> clip = {full({4}, 3.0), full({4}, 4.0).to(DType::kBF16)};
  const double norm = amp::clip_grad_norm(clip, 5.0);
  EXPECT_NEAR(norm, 10.0, 1e-9);
  EXPECT_NEAR(clip[0].get(0), 1.5, 1e-6);
  EXPECT_NEAR(clip[1].to(DType::kF32).get(0), 2.0, 1e-2);
  EXPECT_EQ(clip[1].dtype(), DType::kBF16);
}

TEST(OptimizerInBackward, UpdatesBitForBitAsTheStepAfterBackwardWithLessGradientMemory) {
  for (Level level : {Level::kO0, Level::kO2}) {
    Trainer usual = make_trainer(level, DType::kBF16, std::nullopt);
    Trainer early = make_trainer(level, DType::kBF16, std::nullopt, 0, /*in_backward=*/true);
    // The gradients' own peak: updated in backward, no step holds every gradient at once. (Whether that
    // lowers the whole training peak depends on where it lies, in forward, in a kernel's workspace or at the
    // end of backward, and so on the kernels this CPU chose: printed, not asserted.)
    int64_t peak_usual = 0, peak_early = 0, grads_usual = 0, grads_early = 0;
    for (int s = 0; s < 4; ++s) {
      Batch b = batch(200 + static_cast<uint64_t>(s));
      mem_reset_peak();
      amp::StepResult a = (*usual.step)(b.x, b.y);
      peak_usual = std::max(peak_usual, mem_stats().train_peak);
      grads_usual = std::max(grads_usual, mem_stats().pk(MemCategory::kGradient));
      usual.opt->zero_grad();  // one process tracks both runs: neither's gradients may outlive its step
      mem_reset_peak();
      amp::StepResult e = (*early.step)(b.x, b.y);
      peak_early = std::max(peak_early, mem_stats().train_peak);
      grads_early = std::max(grads_early, mem_stats().pk(MemCategory::kGradient));
      ASSERT_EQ(a.loss, e.loss) << amp::level_name(level) << " step " << s;
      EXPECT_FALSE(e.overflow);
    }
    EXPECT_EQ(early.opt->global_step(), 4);
    auto w_usual = usual.net->parameters_and_names(), w_early = early.net->parameters_and_names();
    for (size_t i = 0; i < w_usual.size(); ++i) {
      EXPECT_FALSE(w_early[i].second.grad().defined()) << "freed once applied: " << w_early[i].first;
      for (int64_t k = 0; k < w_usual[i].second.numel(); ++k)
        ASSERT_EQ(w_usual[i].second.get(k), w_early[i].second.get(k)) << w_usual[i].first << " " << k;
    }
    EXPECT_LT(grads_early, grads_usual) << amp::level_name(level) << ": no step holds every gradient";
    std::printf("%s training peak: %lld bytes updating after backward, %lld in backward; gradients' peak %lld, "
                "%lld\n",
                amp::level_name(level), static_cast<long long>(peak_usual), static_cast<long long>(peak_early),
                static_cast<long long>(grads_usual), static_cast<long long>(grads_early));
  }
}

TEST(OptimizerInBackward, ANonFiniteGradientSkipsItsParameterAndTheConditionsAreChecked) {
  Trainer early = make_trainer(Level::kO2, DType::kBF16, std::nullopt, 0, /*in_backward=*/true);
  Batch b = batch(5);
  (*early.step)(b.x, b.y);
  Tensor w = early.net->parameters_and_names()[0].second.clone();
  b.x.set(0, std::numeric_limits<float>::infinity());
  amp::StepResult r = (*early.step)(b.x, b.y);
  EXPECT_TRUE(r.overflow);
  EXPECT_FALSE(r.first_nonfinite.empty());
  const Tensor w_now = early.net->parameters_and_names()[0].second;
  for (int64_t k = 0; k < w.numel(); ++k) ASSERT_EQ(w_now.get(k), w.get(k)) << "the first conv's update is skipped";
  // What needs every gradient before the update cannot run with it.
  EXPECT_THROW(early.step->accumulate(b.x, b.y), Error);
  early.step->set_clip_grad_norm(1.0);
  try {
    (*early.step)(b.x, b.y);
    FAIL() << "clipping with the optimizer in backward must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient clipping"), std::string::npos) << e.what();
  }
  Trainer scaled = make_trainer(Level::kO2, DType::kF16, std::nullopt);
  scaled.step->set_optimizer_in_backward(true);
  EXPECT_THROW((*scaled.step)(b.x, b.y), Error) << "a loss scale needs every gradient before its decision";
}

}  // namespace
}  // namespace demi
