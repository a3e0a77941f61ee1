// Backward rules that write a gradient into a saved tensor's own buffer when the rule holds its only
// reference (one activation-sized buffer less at backward's peak), and into a new buffer when anything else
// still holds it: Dense's, MatMul's and the fused Conv2d -> ReLU -> MaxPool2d's data gradient into their
// input, after the weight gradient (its last reader) has run; ReLU's (fused or not) mask, kept as bits, applied to the incoming gradient in place
// where nothing else holds that gradient.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "demi/amp/policy.h"
#include "demi/autograd/autograd.h"
#include "demi/core/memory.h"
#include "demi/core/rng.h"
#include "demi/nn/layers.h"
#include "demi/ops/observer.h"
#include "demi/ops/ops.h"
#include "demi/ops/trace.h"

namespace demi {
namespace {

struct Backward {
  int64_t peak = 0;  // tracked bytes backward adds at its peak to what was live when it began
  Tensor dx, dw1, dw2;
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

// Backward from `loss`, with the activation h dropped (or, with `hold`, kept and checked to be left as the
// forward wrote it), and the gradients of the leaves a, b, c.
Backward backward_of(const Tensor& loss, Tensor& h, bool hold, const Tensor& a, const Tensor& b, const Tensor& c) {
  Tensor kept = hold ? h.clone() : Tensor();
  if (!hold) h = Tensor();
  Backward r;
  {
    const int64_t before = mem_stats().total_current;
    ScopedPeak peak;
    autograd::backward(loss);
    r.peak = peak.peak().total_peak - before;
  }
  if (hold) {
    EXPECT_TRUE(same_bits(h, kept)) << "backward wrote into a saved tensor that was still held";
  }
  r.dx = a.grad();
  r.dw1 = b.grad();
  r.dw2 = c.grad();
  return r;
}

// The same gradients, bit for bit.
void expect_same_gradients(const Backward& a, const Backward& b, const std::string& what = "") {
  EXPECT_TRUE(same_bits(a.dx, b.dx)) << what;
  EXPECT_TRUE(same_bits(a.dw1, b.dw1)) << what;
  EXPECT_TRUE(same_bits(a.dw2, b.dw2)) << what;
}

// x (256, 8) -> Dense(8 -> 512) (+ ReLU with `relu`) = h -> `second`(h, w2 (1, 512)) -> sum, where `second`
// reads h as its saved input and its backward writes h's gradient: Dense(512 -> 1) or MatMul(h, w2ᵀ).
// `hold` keeps h, and checks that backward leaves it as the forward wrote it.
template <typename Second>
Backward run(bool hold, bool relu, Second second, uint64_t seed) {
  Generator gen(seed);
  Tensor x = uniform({256, 8}, -1, 1, gen).set_requires_grad(true);
  Tensor w1 = uniform({512, 8}, -1, 1, gen).set_requires_grad(true);
  Tensor w2 = uniform({1, 512}, -1, 1, gen).set_requires_grad(true);
  Tensor h = ops::dense(x, w1, Tensor(), relu);
  Tensor loss = ops::sum(second(h, w2));
  return backward_of(loss, h, hold, x, w1, w2);
}

// The same gradients whether h is held or not; h is 256 x 512 f32 (512 KiB): a gradient takes a buffer of
// its size only while h is held. A shape's first run measures its kernel choices (with scratch of their
// own, when the choice files are empty, as on a fresh machine): a warm-up run first, so that both measured
// runs use the kernels they keep.
template <typename Second>
void expect_written_into_h(bool relu, Second second, uint64_t seed) {
  run(true, relu, second, seed);
  const Backward held = run(true, relu, second, seed), dropped = run(false, relu, second, seed);
  expect_same_gradients(held, dropped);
  const int64_t h_bytes = 256 * 512 * int64_t{sizeof(float)};
  EXPECT_GE(held.peak - dropped.peak, h_bytes * 9 / 10);
}

Tensor dense_of(const Tensor& h, const Tensor& w2) { return ops::dense(h, w2, Tensor()); }

// The fused ReLU keeps its mask as bits, not h: where nothing else holds h, the next Dense writes h's
// gradient into h's bytes and the mask is applied to it in place, so backward makes no h-sized buffer at
// all (with h kept for the mask, h's gradient took a new one: 512 KiB at this backward's peak).
TEST(DenseRelu, MaskKeptAsBitsSoBackwardMakesNoHiddenSizedBuffer) {
  expect_written_into_h(/*relu=*/true, dense_of, 11);
  // Against the same layers without the ReLU (whose backward's peak is the products' workspace: demi's
  // GEMM packs h for the second layer's weight gradient).
  run(false, /*relu=*/false, dense_of, 11);
  const Backward masked = run(false, /*relu=*/true, dense_of, 11), plain = run(false, /*relu=*/false, dense_of, 11);
  EXPECT_LT(masked.peak - plain.peak, 256 * 512 * int64_t{sizeof(float)} / 4);
}

// The same with ReLU as its own op between two Dense layers (model C's cells), against the gradients of the
// fused layer, bit for bit.
TEST(Relu, MaskKeptAsBitsSoBackwardMakesNoHiddenSizedBuffer) {
  auto separate = [](bool hold) {
    Generator gen(14);
    Tensor x = uniform({256, 8}, -1, 1, gen).set_requires_grad(true);
    Tensor w1 = uniform({512, 8}, -1, 1, gen).set_requires_grad(true);
    Tensor w2 = uniform({1, 512}, -1, 1, gen).set_requires_grad(true);
    Tensor h = ops::relu(ops::dense(x, w1, Tensor()));
    Tensor loss = ops::sum(ops::dense(h, w2, Tensor()));
    return backward_of(loss, h, hold, x, w1, w2);
  };
  separate(false);  // the shapes' kernel choices first
  const Backward held = separate(true), dropped = separate(false);
  const Backward fused = run(false, /*relu=*/true, dense_of, 14);
  for (const Backward* b : {&held, &dropped}) expect_same_gradients(*b, fused);
  const int64_t h_bytes = 256 * 512 * int64_t{sizeof(float)};
  EXPECT_LT(dropped.peak - fused.peak, h_bytes / 4);
  EXPECT_GE(held.peak - dropped.peak, h_bytes * 9 / 10);
}

// A gradient that reaches two nodes (an addition's backward hands the same tensor to both of its inputs) is
// not masked in place: the other input's gradient is all ones, as d sum(relu(a) + c) / dc must be.
TEST(Relu, IncomingGradientSharedWithAnotherNodeIsNotMaskedInPlace) {
  Generator gen(15);
  for (bool fused : {false, true}) {
    Tensor x = uniform({64, 8}, -1, 1, gen).set_requires_grad(true);
    Tensor w1 = uniform({32, 8}, -1, 1, gen).set_requires_grad(true);
    Tensor c = uniform({64, 32}, -1, 1, gen).set_requires_grad(true);
    Tensor a = fused ? ops::dense(x, w1, Tensor(), true) : ops::relu(ops::dense(x, w1, Tensor()));
    Tensor loss = ops::sum(ops::add(a, c));
    a = Tensor();
    autograd::backward(loss);
    const Tensor g = c.grad();
    ASSERT_TRUE(g.defined());
    for (int64_t i = 0; i < g.numel(); ++i) ASSERT_EQ(g.data<float>()[i], 1.0f) << i << (fused ? " fused" : "");
  }
}

TEST(DenseBackward, DataGradientTakesTheInputsBytesOnlyWhenNothingElseHoldsIt) {
  expect_written_into_h(/*relu=*/false, dense_of, 12);
}

TEST(MatmulBackward, GradientOfATakesItsBytesOnlyWhenNothingElseHoldsIt) {
  auto product = [](const Tensor& h, const Tensor& w2) { return ops::matmul(h, w2, false, /*trans_b=*/true); };
  expect_written_into_h(/*relu=*/false, product, 12);
}

TEST(MatmulBackward, AnOperandTakenTwiceIsNotOverwritten) {
  // y = h·hᵀ: b is a, so a's gradient must not be written over a while b's product still reads it.
  auto run = [](bool hold) {
    Generator gen(13);
    Tensor x = uniform({64, 8}, -1, 1, gen).set_requires_grad(true);
    Tensor w1 = uniform({32, 8}, -1, 1, gen).set_requires_grad(true);
    Tensor h = ops::dense(x, w1, Tensor());
    Tensor loss = ops::sum(ops::matmul(h, h, false, true));
    if (!hold) h = Tensor();
    autograd::backward(loss);
    return x.grad();
  };
  const Tensor held = run(true), dropped = run(false);
  EXPECT_TRUE(same_bits(held, dropped));
}

// The fused Conv2d -> ReLU -> MaxPool2d's backward computes its weight gradient first and its data gradient
// into x's bytes where nothing else holds x (model B's second layer): the same gradients bit for bit, in f32
// and bf16, and a backward peak lower by x's size; x left as the forward saw it where it is held.
TEST(Conv2dReluMaxPool2dBackward, DataGradientTakesTheInputsBytesOnlyWhenNothingElseHoldsIt) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    auto run = [&](bool hold) {
      Generator gen(31);
      Tensor x0 = uniform({16, 16, 14, 14}, -1, 1, gen).to(dt).set_requires_grad(true);
      Tensor w = uniform({32, 16, 3, 3}, -0.3, 0.3, gen).to(dt).set_requires_grad(true);
      Tensor b = uniform({32}, -0.1, 0.1, gen).to(dt).set_requires_grad(true);
      Tensor x = ops::mul_scalar(x0, 2.0);  // an activation: only the fused op keeps it
      ops::Conv2dOptions co;
      co.pad_mode = ops::PadMode::kSame;
      ops::Pool2dOptions po;
      po.kernel = {2, 2};
      po.stride = {2, 2};
      Tensor loss = ops::sum(ops::cast(ops::conv2d_relu_max_pool2d(x, w, b, co, po), DType::kF32));
      return backward_of(loss, x, hold, x0, w, b);
    };
    run(true);  // the shapes' kernel choices first
    run(false);
    const Backward held = run(true), dropped = run(false);
    expect_same_gradients(held, dropped, std::string(dtype_name(dt)));
    const int64_t x_bytes = 16 * 16 * 14 * 14 * static_cast<int64_t>(dtype_size(dt));
    EXPECT_GE(held.peak - dropped.peak, x_bytes * 9 / 10) << dtype_name(dt);
  }
}

// SequentialCell runs Dense then ReLU as one op (the ReLU in the product's epilogue): no ReLU op is
// recorded, and the output and every gradient are bit for bit those of the two layers run apart
// (FusionScope off), at O0 and at O2 in both low dtypes.
TEST(SequentialCell, RunsDenseThenReluAsOneOpBitForBit) {
  struct Setting {
    amp::Level level;
    DType low;
  };
  for (Setting s : {Setting{amp::Level::kO0, DType::kBF16}, Setting{amp::Level::kO2, DType::kBF16},
                    Setting{amp::Level::kO2, DType::kF16}}) {
    auto run = [&](bool fuse, bool recompute = false) {
      Generator init(21);
      std::vector<nn::CellPtr> cells = {std::make_shared<nn::Dense>(24, 40), std::make_shared<nn::ReLU>(),
                                        std::make_shared<nn::Dense>(40, 16), std::make_shared<nn::ReLU>(),
                                        std::make_shared<nn::Dense>(16, 3)};
      for (auto& c : cells)
        for (Tensor p : c->trainable_params()) p.copy_(uniform(p.shape(), -0.5, 0.5, init));
      nn::SequentialCell net(cells);
      net.set_train(true);
      if (recompute) {  // the fused layer's recomputing backward runs the fused forward again
        cells[0]->recompute();
        cells[2]->recompute();
      }
      amp::auto_mixed_precision(net, s.level, s.low);
      Generator gen(22);
      Tensor x = uniform({33, 24}, -1, 1, gen).set_requires_grad(true);
      ops::FusionScope fusion(fuse);
      ops::OpTrace trace;
      Tensor y = net(x);
      autograd::backward(ops::sum(y.to(DType::kF32)));
      std::vector<Tensor> out = {y, x.grad()};
      for (const Tensor& p : net.trainable_params()) out.push_back(p.grad());
      return std::make_pair(out, trace.of(ops::Op::kRelu).size());
    };
    const auto [fused, fused_relus] = run(true);
    const auto [apart, apart_relus] = run(false);
    const auto [recomputed, recomputed_relus] = run(true, true);
    EXPECT_EQ(recomputed_relus, 0u);
    ASSERT_EQ(recomputed.size(), fused.size());
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_TRUE(same_bits(recomputed[i], fused[i])) << amp::level_name(s.level) << " recomputed, tensor " << i;
    }
    EXPECT_EQ(fused_relus, 0u) << amp::level_name(s.level);
    EXPECT_EQ(apart_relus, 2u);
    ASSERT_EQ(fused.size(), apart.size());
    for (size_t i = 0; i < fused.size(); ++i) {
      ASSERT_TRUE(fused[i].defined() && apart[i].defined()) << i;
      ASSERT_EQ(fused[i].dtype(), apart[i].dtype()) << i;
      EXPECT_TRUE(same_bits(fused[i], apart[i])) << amp::level_name(s.level) << " " << dtype_name(s.low) << " tensor "
                                                 << i;
    }
  }
}

// The same for Conv2d -> ReLU -> MaxPool2d: a recomputed convolution runs the fused op again in backward.
TEST(SequentialCell, RecomputesAFusedConvolutionAsItRanIt) {
  auto run = [](bool recompute) {
    Generator init(23);
    auto conv = std::make_shared<nn::Conv2d>(3, 8, 3);
    std::vector<nn::CellPtr> cells = {conv, std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2, 2),
                                      std::make_shared<nn::Flatten>(), std::make_shared<nn::Dense>(8 * 5 * 5, 4)};
    for (auto& c : cells)
      for (Tensor p : c->trainable_params()) p.copy_(uniform(p.shape(), -0.5, 0.5, init));
    nn::SequentialCell net(cells);
    net.set_train(true);
    if (recompute) conv->recompute();
    Generator gen(24);
    Tensor x = uniform({4, 3, 10, 10}, -1, 1, gen).set_requires_grad(true);
    autograd::backward(ops::sum(net(x)));
    std::vector<Tensor> out = {x.grad()};
    for (const Tensor& p : net.trainable_params()) out.push_back(p.grad());
    return out;
  };
  const auto plain = run(false), recomputed = run(true);
  ASSERT_EQ(plain.size(), recomputed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(same_bits(plain[i], recomputed[i])) << "tensor " << i;
}

}  // namespace
}  // namespace demi
