#include "demi/nn/layers.h"

#include <gtest/gtest.h>

#include "demi/nn/models.h"

namespace demi::nn {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& what, std::initializer_list<const char*> parts) {
  ASSERT_FALSE(what.empty()) << "expected an error";
  for (const char* p : parts) EXPECT_NE(what.find(p), std::string::npos) << "missing '" << p << "' in: " << what;
}

TEST(Cell, ParametersHaveDottedPaths) {
  LeNet net;
  std::vector<std::string> names;
  for (const auto& [n, p] : net.parameters_and_names()) names.push_back(n);
  std::vector<std::string> want = {"features.0.weight",   "features.0.bias",   "features.3.weight",
                                   "features.3.bias",     "classifier.1.weight", "classifier.1.bias",
                                   "classifier.3.weight", "classifier.3.bias"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(net.trainable_params().size(), 8u);
  for (const auto& [n, p] : net.parameters_and_names()) {
    EXPECT_EQ(p.category(), MemCategory::kParameter) << n;
    EXPECT_TRUE(p.requires_grad()) << n;
  }
}

TEST(Cell, MindSporeDefaults) {
  Conv2d conv(3, 8, 3);
  EXPECT_FALSE(conv.bias.defined()) << "MindSpore's Conv2d has has_bias=False";
  EXPECT_EQ(conv.output_shape({2, 3, 10, 10}), Shape({2, 8, 10, 10})) << "pad_mode defaults to \"same\"";
  Dense fc(4, 2);
  EXPECT_TRUE(fc.bias.defined());
  BatchNorm2d bn(3);
  EXPECT_EQ(bn.buffers_and_names().size(), 2u);
}

TEST(Cell, DenseFedTheWrongFeatureCountNamesLayerShapesAndTheFix) {
  // The seed computes Dense(32 * 15 * 15) by hand; with MindSpore's default pad_mode "same" the conv
  // keeps 32x32, so the Dense gets 32 * 16 * 16 features.
  class SeedAsWritten : public Cell {
   public:
    SeedAsWritten() : Cell("SimpleCNN") {
      conv1 = register_cell("conv1", std::make_shared<Conv2d>(3, 32, 3));
      pool = register_cell("max_pool", std::make_shared<MaxPool2d>(2, 2));
      flat = register_cell("flatten", std::make_shared<Flatten>());
      fc = register_cell("fc", std::make_shared<Dense>(32 * 15 * 15, 10));
    }
    Tensor construct(const Tensor& x) override { return fc->call(flat->call(pool->call(conv1->call(x)))); }
    std::shared_ptr<Conv2d> conv1;
    std::shared_ptr<MaxPool2d> pool;
    std::shared_ptr<Flatten> flat;
    std::shared_ptr<Dense> fc;
  };
  SeedAsWritten net;
  std::string what = error_of([&] { net(zeros({2, 3, 32, 32})); });
  expect_contains(what, {"SimpleCNN layer 'fc' (Dense)", "7200", "8192", "(2, 8192)", "pad_mode"});
}

// A foreign exception raised inside construct (the Python package's, from a Python sub-computation) leaves the
// cell tree as itself; demi's own errors get the layer's path.
TEST(Cell, ForeignErrorsLeaveConstructUnchanged) {
  struct Thrower : Cell {
    Thrower() : Cell("Thrower") {}
    Tensor construct(const Tensor&) override {
      throw ForeignError("user's own", std::make_exception_ptr(std::out_of_range("user's own")));
    }
  };
  SequentialCell seq;
  seq.append(std::make_shared<Thrower>());
  try {
    seq(zeros(Shape{1}));
    FAIL() << "no exception";
  } catch (const ForeignError& e) {
    EXPECT_EQ(std::string(e.what()), "user's own");
    EXPECT_THROW(std::rethrow_exception(e.original()), std::out_of_range);
  }
}

TEST(Cell, Conv2dWrongChannelsOr3DInput) {
  SimpleCNN net;
  expect_contains(error_of([&] { net(zeros({2, 1, 32, 32})); }),
                  {"SimpleCNN layer 'conv1' (Conv2d)", "3 input channels", "(2, 1, 32, 32)"});
  expect_contains(error_of([&] { net(zeros({3, 32, 32})); }), {"'conv1'", "4-D", "(3, 32, 32)"});
}

TEST(Cell, LabelsOutOfRangeInTheLoss) {
  SoftmaxCrossEntropyWithLogits loss(true, "mean");
  std::vector<int32_t> labels = {1, 10};
  expect_contains(error_of([&] { loss(zeros({2, 10}), from_vector(labels, {2})); }),
                  {"SoftmaxCrossEntropyWithLogits", "10"});
}

TEST(Cell, BadConstructorArguments) {
  expect_contains(error_of([] { Conv2d(3, 8, 3, Conv2dOptions::Make(1, "same", 1)); }), {"pad_mode=\"pad\""});
  expect_contains(error_of([] { Conv2d(3, 8, 3, Conv2dOptions::Make(1, "full")); }), {"full"});
  expect_contains(error_of([] { Dense(0, 2); }), {"Dense", "in_channels"});
  expect_contains(error_of([] { Dropout(1.5); }), {"keep_prob"});
}

TEST(Cell, ToFloatPinsADtype) {
  Dense fc(4, 3);
  fc.to_float(DType::kBF16);
  Tensor y = fc(ones({2, 4}));
  EXPECT_EQ(y.dtype(), DType::kBF16);
  fc.to_float(std::nullopt);
  EXPECT_EQ(fc(ones({2, 4})).dtype(), DType::kF32);
}

TEST(Cell, TrainAndEvalModes) {
  LeNet net(true);
  net.set_train(false);
  for (auto& [path, cell] : net.cells_and_names()) EXPECT_FALSE(cell->training()) << path;
  Tensor y = net(zeros({1, 1, 28, 28}));  // batch 1 is fine in eval (running statistics)
  EXPECT_EQ(y.shape(), Shape({1, 10}));
}

}  // namespace
}  // namespace demi::nn
