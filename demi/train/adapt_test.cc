// Adaptive AMP through the Model: attribution in the run's log and summary, promotion, and resume.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "demi/autograd/autograd.h"
#include "demi/core/test_support.h"
#include "demi/data/data.h"
#include "demi/nn/layers.h"
#include "demi/nn/models.h"
#include "demi/ops/ops.h"
#include "demi/train/checkpoint.h"
#include "demi/train/model.h"

namespace demi::train {
namespace {

// Regression onto targets up to ~1e5: a float16 Dense output overflows once the net has learnt them.
std::shared_ptr<data::Dataset> big_targets(int64_t n) {
  Generator g(11);
  Tensor x = uniform({n, 128}, 0.0, 1.0, g);
  Tensor y = ops::mul_scalar(ops::sum(x, {1}, true), 1.2e3);  // ~7.7e4 on average, past 65504
  return std::make_shared<data::NumpySlicesDataset>(std::vector<Tensor>{x, y}, std::vector<std::string>{"x", "y"})
      ->batch(16, true);
}

struct AdaptRun {
  std::shared_ptr<nn::SequentialCell> net;
  std::shared_ptr<Model> model;
  std::ostringstream log;
  AdaptRun(bool adapt, amp::Level level = amp::Level::kO3) {
    set_seed(3);
    net = std::make_shared<nn::SequentialCell>(std::vector<nn::CellPtr>{
        std::make_shared<nn::Dense>(128, 64), std::make_shared<nn::ReLU>(), std::make_shared<nn::Dense>(64, 1)});
    auto opt = std::make_shared<optim::Adam>(net->trainable_params(), 0.1);
    model = std::make_shared<Model>(net, std::make_shared<nn::MSELoss>("mean"), opt, std::map<std::string, MetricPtr>{},
                                    ModelOptions{.amp_level = level, .low_dtype = DType::kF16, .amp_adapt = adapt});
  }
  void train(int epochs) {
    set_callback_stream(&log);
    try {
      model->train(epochs, big_targets(640));
    } catch (...) {
      set_callback_stream(nullptr);
      throw;
    }
    set_callback_stream(nullptr);
  }
};

// The compute dtype of the forward Dense calls of `net` on a batch, in call order.
std::vector<DType> dense_dtypes(nn::Cell& net) {
  ops::OpTrace trace;
  autograd::NoGradGuard no_grad;
  net.call(zeros({2, 128}));
  std::vector<DType> out;
  for (const auto& r : trace.of(ops::Op::kDense)) out.push_back(r.compute_dtype);
  return out;
}

TEST(AmpAdapt, FixedO3StopsAndNamesTheOpAdaptivePromotesOnlyThatLayer) {
  AdaptRun fixed(false);
  try {
    fixed.train(3);
    FAIL() << "fixed O3 float16 should stop on the overflowing output: " << fixed.log.str() << " skipped "
           << fixed.model->last_summary().skipped_steps << " loss " << fixed.model->last_summary().mean_last_epoch_loss;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("forward Dense in layer '2' (Dense), float16"), std::string::npos) << e.what();
  }
  EXPECT_NE(fixed.log.str().find("Model.train: overflow at epoch "), std::string::npos) << fixed.log.str();

  AdaptRun adaptive(true);
  EXPECT_EQ(dense_dtypes(*adaptive.net), (std::vector<DType>{DType::kF16, DType::kF16}));
  adaptive.train(3);
  const TrainSummary& s = adaptive.model->last_summary();
  ASSERT_EQ(s.promotions.size(), 1u) << adaptive.log.str();
  EXPECT_EQ(s.promotions[0].layer, "2");
  EXPECT_EQ(s.promotions[0].type, "Dense");
  EXPECT_GE(s.overflow_ops.at("Dense fwd in '2'"), 2);
  EXPECT_NE(adaptive.log.str().find("amp-adapt: layer '2' (Dense) now runs in FP32"), std::string::npos);
  EXPECT_LT(s.mean_last_epoch_loss, 1e8) << "trains once the layer runs in FP32";
  EXPECT_EQ(dense_dtypes(*adaptive.net), (std::vector<DType>{DType::kF16, DType::kF32}))
      << "only the promoted layer runs in FP32";
}

TEST(AmpAdapt, PromotionsAreCheckpointedAndRestoredOnResume) {
  AdaptRun a(true);
  a.train(2);
  ASSERT_EQ(a.model->amp_adapter()->promoted_layers(), std::vector<std::string>{"2"});
  const test_support::TempDir tmp("demi_adapt");
  const auto path = tmp / "adapt.safetensors";
  save_checkpoint(path, *a.model);
  io::TrainingState ck = load_checkpoint(path);
  EXPECT_EQ(ck.meta.amp_promotions, std::vector<std::string>{"2"});

  AdaptRun b(true);
  restore_checkpoint(ck, *b.model);
  EXPECT_EQ(b.model->amp_adapter()->promoted_layers(), std::vector<std::string>{"2"});
  EXPECT_EQ(dense_dtypes(*b.net), (std::vector<DType>{DType::kF16, DType::kF32}));
  b.train(1);  // continues without stalling: the restored promotion holds
  EXPECT_EQ(b.model->last_summary().promotions.size(), 1u);

  AdaptRun c(false);  // a run without adaptive AMP cannot honour the promotions: it says so
  try {
    restore_checkpoint(ck, *c.model);
    FAIL() << "restoring promotions into a run without amp_adapt must fail in strict mode";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("AMP promotions"), std::string::npos) << e.what();
  }
}

TEST(AmpAdapt, ADynamicScalesOwnBackOffNeverPromotes) {
  // A finite forward at O2 float16 with dynamic scaling: the first steps overflow in backward (the scale
  // starts at 2^24) and are attributed, but lowering the scale cures them: nothing is promoted.
  set_seed(5);
  auto net = std::make_shared<nn::SequentialCell>(std::vector<nn::CellPtr>{
      std::make_shared<nn::Dense>(8, 32), std::make_shared<nn::ReLU>(), std::make_shared<nn::Dense>(32, 1)});
  Generator g(2);
  Tensor x = uniform({320, 8}, 0.0, 1.0, g);
  Tensor y = ops::sum(x, {1}, true);
  auto ds = std::make_shared<data::NumpySlicesDataset>(std::vector<Tensor>{x, y}, std::vector<std::string>{"x", "y"})
                ->batch(16, true);
  Model model(net, std::make_shared<nn::MSELoss>("mean"), std::make_shared<optim::Adam>(net->trainable_params(), 1e-3),
              {}, {.amp_level = amp::Level::kO2, .low_dtype = DType::kF16, .amp_adapt = true});
  std::ostringstream log;
  set_callback_stream(&log);
  model.train(1, ds);
  set_callback_stream(nullptr);
  EXPECT_GT(model.last_summary().skipped_steps, 0) << "the scale backs off from 2^24";
  EXPECT_FALSE(model.last_summary().overflow_ops.empty()) << log.str();
  EXPECT_TRUE(model.last_summary().promotions.empty()) << log.str();
}

TEST(AmpAdapt, RestoringAnUnknownLayerIsAnErrorNamingIt) {
  AdaptRun a(true);
  try {
    a.model->amp_adapter()->restore({"2", "body.9"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'body.9'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace demi::train

namespace demi::train {
namespace {

std::shared_ptr<data::Dataset> digits_like(int64_t n) {
  Generator g(4);
  Tensor x = normal({n, 1, 28, 28}, 0.0, 1.0, g);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % 10);
  return std::make_shared<data::NumpySlicesDataset>(std::vector<Tensor>{x, from_vector(labels, {n})},
                                                    std::vector<std::string>{"image", "label"})
      ->batch(128, true);
}

std::vector<std::string> underflow_warnings(const ModelOptions& o) {
  set_seed(2);
  auto net = std::make_shared<nn::LeNet>();
  Model model(net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
              std::make_shared<optim::Momentum>(net->trainable_params(), 0.01, 0.9), {}, o);
  std::ostringstream log;
  set_callback_stream(&log);
  model.train(1, digits_like(256));
  set_callback_stream(nullptr);
  std::vector<std::string> out;
  for (const auto& w : model.last_summary().warnings)
    if (w.find("subnormal") != std::string::npos) out.push_back(w);
  return out;
}

TEST(UnderflowWarning, Float16GradientsWithoutALossScaleAreWarnedAbout) {
  // O3 float16 has no loss scale by default: LeNet's float16 activation gradients sit below 2^-14.
  auto w = underflow_warnings({.amp_level = amp::Level::kO3, .low_dtype = DType::kF16});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("of the float16 gradient values of step 1 are subnormal"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("the worst is the backward of"), std::string::npos) << w[0];
  // A loss scale lifts them into float16's normal range; bfloat16 has FP32's range.
  EXPECT_TRUE(underflow_warnings({.amp_level = amp::Level::kO3, .low_dtype = DType::kF16,
                                  .loss_scale_manager = std::make_shared<amp::FixedLossScaleManager>(1024.0)})
                  .empty());
  EXPECT_TRUE(underflow_warnings({.amp_level = amp::Level::kO3, .low_dtype = DType::kBF16}).empty());
}

}  // namespace
}  // namespace demi::train
