#include "demi/autograd/autograd.h"

#include <gtest/gtest.h>

#include "demi/ops/ops.h"

namespace demi::autograd {
namespace {

Tensor leaf(std::vector<float> v, Shape s) {
  Tensor t = from_vector(v, s);
  t.set_requires_grad(true);
  return t;
}

TEST(Autograd, GradientsAccumulateOverUsesAndCalls) {
  Tensor x = leaf({1, 2, 3}, {3});
  // y = sum(x * x + x): dy/dx = 2x + 1
  Tensor y = ops::sum(ops::add(ops::mul(x, x), x));
  backward(y);
  EXPECT_FLOAT_EQ(x.grad().get(0), 3);
  EXPECT_FLOAT_EQ(x.grad().get(2), 7);
  // A second forward/backward accumulates into .grad.
  backward(ops::sum(x));
  EXPECT_FLOAT_EQ(x.grad().get(0), 4);
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y;
  {
    NoGradGuard g;
    y = ops::mul_scalar(x, 2);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_THROW(backward(ops::sum(y)), Error);
}

TEST(Autograd, BackwardTwiceThroughAFreedGraphIsAClearError) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = ops::sum(ops::mul(x, x));
  backward(y);
  EXPECT_THROW(backward(y), Error);
}

TEST(Autograd, NonScalarRootNeedsAGradient) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = ops::mul_scalar(x, 3);
  EXPECT_THROW(backward(y), Error);
  backward(y, from_vector(std::vector<float>{1, 10}, {2}));
  EXPECT_FLOAT_EQ(x.grad().get(1), 30);
}

TEST(Autograd, SavedTensorsAreFreedByBackward) {
  Generator g(1);
  Tensor x = uniform({256, 256}, -1, 1, g);
  x.set_requires_grad(true);
  int64_t before = mem_stats().total_current;
  Tensor y = ops::sum(ops::mul(ops::tanh(x), x));
  int64_t during = mem_stats().total_current;
  EXPECT_GT(during - before, 256 * 256 * 4) << "forward saved tanh(x)";
  backward(y);
  y = Tensor();
  int64_t after = mem_stats().total_current;
  // Only x's gradient remains.
  EXPECT_LE(after - before, 256 * 256 * 4 + 4096);
}

TEST(Autograd, GradientsOfLowPrecisionLeavesKeepTheirDtype) {
  Tensor x = from_vector(std::vector<float>{1, 2}, {2}).to(DType::kBF16);
  x.set_requires_grad(true);
  backward(ops::sum(ops::mul_scalar(x, 3)));
  EXPECT_EQ(x.grad().dtype(), DType::kBF16);
  EXPECT_FLOAT_EQ(x.grad().get(0), 3);
}

TEST(Autograd, GradientsAreTaggedAsGradients) {
  Tensor x = leaf({1, 2, 3, 4}, {4});
  backward(ops::sum(x));
  EXPECT_EQ(x.grad().category(), MemCategory::kGradient);
}

}  // namespace
}  // namespace demi::autograd
