// Layers of issue 17 against PyTorch (scripts/make_golden.py more_layers): GroupNorm, Conv1d, Softmax, and
// LogSoftmax + NLLLoss, forward and backward in f32; bad input named.
#include <gtest/gtest.h>

#include "demi/amp/policy.h"
#include "demi/autograd/autograd.h"
#include "demi/nn/layers.h"
#include "golden_util.h"

namespace demi {
namespace {

using testing::expect_close;

Tolerance tol(int terms) { return testing::tolerance_for_terms(DType::kF32, terms); }
Tensor leaf(const Tensor& t) { return t.to(DType::kF32, true).set_requires_grad(true); }

TEST(LayersGolden, GroupNormMatchesPyTorch) {
  auto g = testing::read_golden("more_layers");
  nn::GroupNorm gn(2, 4);
  gn.gamma.copy_(g["gn.gamma"]);
  gn.beta.copy_(g["gn.beta"]);
  Tensor x = leaf(g["gn.x"]);
  Tensor y = gn(x);
  expect_close(y, g["gn.y"], tol(40), "y");
  autograd::backward(y, g["gn.dy"].to(DType::kF32));
  expect_close(x.grad(), g["gn.dx"], tol(100), "dx");
  expect_close(gn.gamma.grad(), g["gn.dgamma"], tol(100), "dgamma");
  expect_close(gn.beta.grad(), g["gn.dbeta"], tol(100), "dbeta");
}

TEST(LayersGolden, Conv1dMatchesPyTorch) {
  auto g = testing::read_golden("more_layers");
  nn::Conv1d conv(3, 4, 3, nn::Conv1dOptions{.stride = 2, .pad_mode = "pad", .padding = 1, .has_bias = true});
  ASSERT_EQ(conv.weight.shape(), Shape({4, 3, 3}));
  conv.weight.copy_(g["c1.w"]);
  conv.bias.copy_(g["c1.b"]);
  Tensor x = leaf(g["c1.x"]);
  Tensor y = conv(x);
  ASSERT_EQ(y.shape(), Shape({2, 4, 4}));
  expect_close(y, g["c1.y"], tol(20), "y");
  autograd::backward(y, g["c1.dy"].to(DType::kF32));
  expect_close(x.grad(), g["c1.dx"], tol(40), "dx");
  expect_close(conv.weight.grad(), g["c1.dw"], tol(40), "dw");
  expect_close(conv.bias.grad(), g["c1.db"], tol(40), "db");
}

TEST(LayersGolden, SoftmaxAndNllLossMatchPyTorch) {
  auto g = testing::read_golden("more_layers");
  Tensor x = leaf(g["sm.x"]);
  Tensor y = nn::Softmax(1)(x);
  expect_close(y, g["sm.y"], tol(10), "softmax");
  autograd::backward(y, g["sm.dy"].to(DType::kF32));
  expect_close(x.grad(), g["sm.dx"], tol(20), "softmax dx");
  Tensor z = leaf(g["nll.x"]);
  Tensor loss = nn::NLLLoss()(nn::LogSoftmax(1)(z), g["nll.labels"]);
  expect_close(loss.reshape({1}), g["nll.loss"], tol(20), "nll loss");
  autograd::backward(loss);
  expect_close(z.grad(), g["nll.dx"], tol(20), "nll dx");
  // LogSoftmax + NLLLoss is the cross entropy.
  Tensor ce = nn::SoftmaxCrossEntropyWithLogits(true, "mean")(g["nll.x"].to(DType::kF32), g["nll.labels"]);
  EXPECT_NEAR(ce.item(), loss.item(), 1e-6);
}

TEST(Layers, BadInputIsNamed) {
  nn::NLLLoss nll;
  Tensor lp = zeros({2, 3});
  try {
    nll(lp, from_vector(std::vector<int32_t>{1, 3}, {2}));
    ADD_FAILURE() << "a label outside the classes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 3 of sample 1 is outside [0, 3)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(nn::GroupNorm(3, 4), Error);
  nn::GroupNorm gn(2, 4);
  EXPECT_THROW(gn(zeros({2, 6, 3})), Error);
  nn::Conv1d conv(3, 4, 3);
  EXPECT_THROW(conv(zeros({2, 5, 7})), Error);
  EXPECT_THROW(nn::Conv1d(3, 4, 3, nn::Conv1dOptions{.padding = 1}), Error) << "padding needs pad_mode pad";
}

}  // namespace
}  // namespace demi
