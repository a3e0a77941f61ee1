// Model R, ResNet-18: its BasicBlock against PyTorch (training-mode BatchNorm, the downsampling shortcut;
// scripts/make_golden.py basic_block), the network's shape and parameter count against torchvision's
// CIFAR form, and AdaptiveAvgPool2d.
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
  try {
    nn::AdaptiveAvgPool2d({3, 4})(x);
    ADD_FAILURE() << "overlapping windows were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be multiples of the output size (3, 4)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace demi
