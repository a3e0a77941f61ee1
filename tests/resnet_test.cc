// Model R, ResNet-18: its BasicBlock against PyTorch (training-mode BatchNorm, the downsampling shortcut;
// scripts/make_golden.py basic_block), the network's shape and parameter count against torchvision's
// CIFAR form, AdaptiveAvgPool2d (tiling and overlapping windows, scripts/make_golden.py conv_transpose) and
// Residual.
#include <gtest/gtest.h>

#include "demi/autograd/autograd.h"
#include "demi/nn/models.h"
#include "golden_util.h"

namespace demi {
namespace {

using testing::expect_close;

Tolerance f32_tol(int terms) { return testing::tolerance_for_terms(DType::kF32, terms); }

TEST(ResNetGolden, BasicBlockWithDownsampleMatchesPyTorch) {
  auto g = testing::read_golden("basic_block");
  nn::BasicBlock block(4, 8, 2);
  auto named = block.parameters_and_names();
  ASSERT_EQ(named.size(), 9u);
  for (auto& [name, p] : named) {
    ASSERT_TRUE(g.count(name)) << "no PyTorch value for " << name;
    p.copy_(g[name]);
  }
  Tensor x = g["x"].to(DType::kF32, true).set_requires_grad(true);
  Tensor y = block(x);
  expect_close(y, g["y"], f32_tol(300), "y");
  expect_close(nn::AdaptiveAvgPool2d(1)(y), g["pooled"], f32_tol(300), "pooled");
  autograd::backward(y, g["dy"].to(DType::kF32));
  expect_close(x.grad(), g["dx"], f32_tol(1000), "dx");
  for (auto& [name, p] : named) expect_close(p.grad(), g["d." + name], f32_tol(1000), "d " + name);
}

TEST(ResNet18, HasTorchvisionsCifarShape) {
  set_seed(1);
  nn::ResNet18 net;
  // torchvision's resnet18 with a 3x3 stem, no max-pool and 10 classes: 11,173,962 parameters.
  EXPECT_EQ(net.num_parameters(), 11173962);
  autograd::NoGradGuard no_grad;
  Tensor y = net(normal({2, 3, 32, 32}, 0, 1, default_generator()));
  EXPECT_EQ(y.shape(), Shape({2, 10}));
  int downsamples = 0;
  for (auto& [path, cell] : net.cells_and_names()) downsamples += path.ends_with(".downsample");
  EXPECT_EQ(downsamples, 3) << "layer2..layer4 change shape in their first block";
}

TEST(AdaptiveAvgPool2d, TilesTheInputOrRefuses) {
  Generator gen(3);
  Tensor x = normal({2, 3, 4, 6}, 0, 1, gen);
  ops::Pool2dOptions o;
  o.kernel = {2, 2};
  o.stride = {2, 2};
  expect_close(nn::AdaptiveAvgPool2d({2, 3})(x), ops::avg_pool2d(x, o), f32_tol(4), "(2, 3) = 2x2 windows");
  Tensor global = nn::AdaptiveAvgPool2d(1)(x);
  EXPECT_EQ(global.shape(), Shape({2, 3, 1, 1}));
  expect_close(global, ops::mean(x, {2, 3}, true), f32_tol(24), "global");
}

// Windows that overlap and differ in size (7 -> 3 rows: [0, 3), [2, 5), [4, 7); 5 -> 2 columns: [0, 3),
// [2, 5)) against PyTorch, forward and backward.
TEST(AdaptiveAvgPool2d, OverlappingWindowsMatchPyTorch) {
  auto g = testing::read_golden("conv_transpose");
  Tensor x = g["adaptive.x"].to(DType::kF32, true).set_requires_grad(true);
  nn::AdaptiveAvgPool2d pool({3, 2});
  Tensor y = pool(x);
  ASSERT_EQ(y.shape(), Shape({2, 3, 3, 2}));
  expect_close(y, g["adaptive.y"], f32_tol(12), "y");
  autograd::backward(y, g["adaptive.dy"].to(DType::kF32));
  expect_close(x.grad(), g["adaptive.dx"], f32_tol(12), "dx");
}

TEST(Residual, AddsTheShortcutAndChecksShapes) {
  Generator gen(5);
  auto dense = std::make_shared<nn::Dense>(4, 4);
  nn::Residual res(dense);
  Tensor x0 = normal({3, 4}, 0, 1, gen);
  Tensor x = x0.clone().set_requires_grad(true);
  Tensor y = res(x);
  autograd::backward(ops::sum(y));
  autograd::NoGradGuard no_grad;
  expect_close(y, ops::add((*dense)(x0), x0), f32_tol(8), "dense(x) + x");
  // d/dx sum(W x + b + x) = the column sums of W, plus one.
  Tensor expected = ops::add_scalar(ops::sum(dense->weight, {0}), 1.0);
  expect_close(x.grad(), ops::add(zeros({3, 4}), expected), f32_tol(8), "gradient");
  EXPECT_EQ(res.parameters_and_names().size(), 2u) << "body.weight and body.bias";
  nn::Residual projected(std::make_shared<nn::Dense>(4, 6),
                        std::make_shared<nn::Dense>(4, 6, nn::DenseOptions{.has_bias = false}));
  EXPECT_EQ(projected(x).shape(), Shape({3, 6}));
  nn::Residual mismatched(std::make_shared<nn::Dense>(4, 6));
  try {
    mismatched(x);
    ADD_FAILURE() << "a shape mismatch was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("differ in shape"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace demi
