// The fused Dense -> ReLU's backward writes the masked gradient into y's own buffer when its backward rule
// holds y's only reference (one activation-sized buffer less at backward's peak), and into a new buffer
// when anything else still holds y.
#include <gtest/gtest.h>

#include <cstring>

#include "demi/autograd/autograd.h"
#include "demi/core/memory.h"
#include "demi/core/rng.h"
#include "demi/ops/ops.h"

namespace demi {
namespace {

struct Backward {
  int64_t peak = 0;  // tracked bytes backward adds at its peak to what was live when it began
  Tensor dx, dw1, dw2;
};

// x (256, 8) -> Dense(8 -> 512) + ReLU -> Dense(512 -> 1) -> sum; `hold` keeps y, and checks that backward
// leaves it as the forward wrote it.
Backward run(bool hold) {
  Generator gen(11);
  Tensor x = uniform({256, 8}, -1, 1, gen).set_requires_grad(true);
  Tensor w1 = uniform({512, 8}, -1, 1, gen).set_requires_grad(true);
  Tensor w2 = uniform({1, 512}, -1, 1, gen).set_requires_grad(true);
  Tensor y = ops::dense(x, w1, Tensor(), /*relu=*/true);
  Tensor loss = ops::sum(ops::dense(y, w2));
  Tensor kept = hold ? y.clone() : Tensor();
  if (!hold) y = Tensor();
  Backward r;
  {
    const int64_t before = mem_stats().total_current;
    ScopedPeak peak;
    autograd::backward(loss);
    r.peak = peak.peak().total_peak - before;
  }
  if (hold) {
    EXPECT_EQ(std::memcmp(y.raw_data(), kept.raw_data(), static_cast<size_t>(y.numel()) * sizeof(float)), 0)
        << "backward wrote into a ReLU output that was still held";
  }
  r.dx = x.grad();
  r.dw1 = w1.grad();
  r.dw2 = w2.grad();
  return r;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

TEST(DenseRelu, BackwardMasksIntoTheOutputOnlyWhenNothingElseHoldsIt) {
  const Backward held = run(true), dropped = run(false);
  EXPECT_TRUE(same_bits(held.dx, dropped.dx));
  EXPECT_TRUE(same_bits(held.dw1, dropped.dw1));
  EXPECT_TRUE(same_bits(held.dw2, dropped.dw2));
  // y is 256 x 512 f32 (512 KiB): the masked gradient takes a buffer of its size only while y is held.
  const int64_t y_bytes = 256 * 512 * int64_t{sizeof(float)};
  EXPECT_GE(held.peak - dropped.peak, y_bytes * 9 / 10);
}

}  // namespace
}  // namespace demi
