// The op sweep: one case per op in the op table (checked against kNumOps at compile time), each
//   - backward against f64 central finite differences on random inputs, and
//   - forward in f32, bf16 and f16 against the f64 result within the dtype's tolerance, and
//   - forward and backward replayed from graph mode's static memory plan, bit for bit eager's.
// A new op does not compile into this file's table without its case.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>

#include "demi/autograd/autograd.h"
#include "demi/core/rng.h"
#include "demi/graph/step_graph.h"
#include "demi/kernels/tolerance.h"
#include "demi/ops/ops.h"

namespace demi {
namespace {

using ops::Op;

struct SweepCase {
  Op op;
  // Random f64 inputs; which of them are differentiated.
  std::function<std::vector<Tensor>(Generator&)> inputs;
  std::vector<bool> differentiable;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  bool check_low_precision = true;
  double low_precision_scale = 1;  // tolerance multiplier for ops that sum many terms
  double fd_step = kFiniteDiffStep;
};

Tensor rnd(Generator& g, const Shape& s, double lo = -1, double hi = 1) { return uniform(s, lo, hi, g, DType::kF64); }

// Values bounded away from 0 (division, kinks) and from each other enough for max ties not to matter.
Tensor away_from_zero(Generator& g, const Shape& s) {
  Tensor t = rnd(g, s, 0.3, 1.0);
  for (int64_t i = 0; i < t.numel(); i += 2) t.set(i, -t.get(i));
  return t;
}

Tensor distinct(Generator& g, const Shape& s) {
  // a shuffled ramp: every value differs by at least 0.05 (no ties for max)
  Tensor t = empty(s, DType::kF64);
  int64_t n = t.numel();
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(g.next_int(i + 1))]);
  for (int64_t i = 0; i < n; ++i) t.set(i, 0.05 * static_cast<double>(perm[static_cast<size_t>(i)]) - 0.025 * n + 0.01);
  return t;
}

Tensor on_grid(Tensor t) {
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std::round(t.get(i) * 256) / 256);
  return t;
}

Tensor labels(Generator& g, int64_t n, int64_t c) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = g.next_int(c);
  return from_vector(v, {n});
}

ops::Pool2dOptions pool(int64_t k, int64_t s) {
  ops::Pool2dOptions o;
  o.kernel = {k, k};
  o.stride = {s, s};
  return o;
}

ops::Conv2dOptions conv_opts() {
  ops::Conv2dOptions o;
  o.stride = {2, 1};
  o.pad_mode = ops::PadMode::kPad;
  o.padding = {1, 0, 1, 1};
  o.groups = 1;
  return o;
}

ops::Conv2dTransposeOptions conv_transpose_opts() {
  ops::Conv2dTransposeOptions o;
  o.stride = {2, 1};
  o.pad_mode = ops::PadMode::kPad;
  o.padding = {1, 0, 0, 1};
  o.output_padding = {1, 0};
  o.dilation = {1, 2};
  o.groups = 2;
  return o;
}

std::vector<SweepCase> make_cases() {
  using V = std::vector<Tensor>;
  SweepCase table[] = {
      // Through f32 and back: inputs and step are multiples of 2^-8, exact in f32, so differences are exact.
      {Op::kCast, [](Generator& g) { return V{on_grid(rnd(g, {3, 4}))}; }, {true},
       [](const V& x) { return ops::cast(ops::cast(x[0], DType::kF32), DType::kF64); }, false, 1, 1.0 / 256},
      {Op::kReshape, [](Generator& g) { return V{rnd(g, {2, 3, 4})}; }, {true},
       [](const V& x) { return ops::reshape(x[0], {4, -1}); }},
      {Op::kAdd, [](Generator& g) { return V{rnd(g, {2, 3, 4}), rnd(g, {3, 1})}; }, {true, true},
       [](const V& x) { return ops::add(x[0], x[1]); }},
      {Op::kSub, [](Generator& g) { return V{rnd(g, {4, 3}), rnd(g, {3})}; }, {true, true},
       [](const V& x) { return ops::sub(x[0], x[1]); }},
      {Op::kMul, [](Generator& g) { return V{rnd(g, {2, 1, 3}), rnd(g, {4, 3})}; }, {true, true},
       [](const V& x) { return ops::mul(x[0], x[1]); }},
      {Op::kDiv, [](Generator& g) { return V{rnd(g, {3, 5}), away_from_zero(g, {3, 5})}; }, {true, true},
       [](const V& x) { return ops::div(x[0], x[1]); }},
      {Op::kNeg, [](Generator& g) { return V{rnd(g, {7})}; }, {true}, [](const V& x) { return ops::neg(x[0]); }},
      {Op::kAddScalar, [](Generator& g) { return V{rnd(g, {7})}; }, {true},
       [](const V& x) { return ops::add_scalar(x[0], 0.75); }},
      {Op::kMulScalar, [](Generator& g) { return V{rnd(g, {7})}; }, {true},
       [](const V& x) { return ops::mul_scalar(x[0], -1.5); }},
      {Op::kMatmul, [](Generator& g) { return V{rnd(g, {3, 5}), rnd(g, {4, 5})}; }, {true, true},
       [](const V& x) { return ops::matmul(x[0], x[1], false, true); }, true, 3},
      {Op::kBatchMatmul, [](Generator& g) { return V{rnd(g, {2, 5, 3}), rnd(g, {2, 5, 4})}; }, {true, true},
       [](const V& x) { return ops::batch_matmul(x[0], x[1], true, false); }, true, 3},
      // Dense, and Dense with a residual added in its product's store (ops::dense_add).
      {Op::kDense, [](Generator& g) { return V{rnd(g, {3, 6}), rnd(g, {4, 6}), rnd(g, {4}), rnd(g, {3, 4})}; },
       {true, true, true, true},
       [](const V& x) { return ops::add(ops::dense(x[0], x[1], x[2]), ops::dense_add(x[0], x[1], x[2], x[3])); },
       true, 3},
      {Op::kConv2d, [](Generator& g) { return V{rnd(g, {2, 3, 6, 5}), rnd(g, {4, 3, 3, 2}), rnd(g, {4})}; },
       {true, true, true}, [](const V& x) { return ops::conv2d(x[0], x[1], x[2], conv_opts()); }, true, 5},
      {Op::kMaxPool2d, [](Generator& g) { return V{distinct(g, {2, 2, 5, 4})}; }, {true},
       [](const V& x) { return ops::max_pool2d(x[0], pool(2, 2)); }},
      {Op::kAvgPool2d, [](Generator& g) { return V{rnd(g, {2, 2, 7, 6})}; }, {true},
       [](const V& x) { return ops::avg_pool2d(x[0], pool(3, 2)); }},
      {Op::kReluMaxPool2d, [](Generator& g) { return V{distinct(g, {2, 2, 6, 4})}; }, {true},
       [](const V& x) { return ops::relu_max_pool2d(x[0], pool(2, 2)); }},
      {Op::kRelu, [](Generator& g) { return V{away_from_zero(g, {11})}; }, {true},
       [](const V& x) { return ops::relu(x[0]); }},
      {Op::kSigmoid, [](Generator& g) { return V{rnd(g, {11}, -3, 3)}; }, {true},
       [](const V& x) { return ops::sigmoid(x[0]); }},
      {Op::kTanh, [](Generator& g) { return V{rnd(g, {11}, -3, 3)}; }, {true},
       [](const V& x) { return ops::tanh(x[0]); }},
      {Op::kGelu, [](Generator& g) { return V{rnd(g, {11}, -3, 3), rnd(g, {11}, -3, 3)}; }, {true, true},
       [](const V& x) { return ops::add(ops::gelu(x[0], false), ops::gelu(x[1], true)); }},
      {Op::kSilu, [](Generator& g) { return V{rnd(g, {11}, -3, 3)}; }, {true},
       [](const V& x) { return ops::silu(x[0]); }},
      {Op::kSum, [](Generator& g) { return V{rnd(g, {2, 3, 4})}; }, {true},
       [](const V& x) { return ops::add(ops::sum(x[0], {0, 2}), ops::sum(x[0])); }, true, 4},
      {Op::kMean, [](Generator& g) { return V{rnd(g, {2, 3, 4})}; }, {true},
       [](const V& x) { return ops::mean(x[0], {1}, true); }, true, 2},
      {Op::kMax, [](Generator& g) { return V{distinct(g, {3, 4, 2})}; }, {true},
       [](const V& x) { return ops::max(x[0], 1); }},
      {Op::kArgmax, [](Generator& g) { return V{distinct(g, {3, 5})}; }, {false},
       [](const V& x) { return ops::argmax(x[0], -1); }},
      {Op::kSoftmax, [](Generator& g) { return V{rnd(g, {3, 5}, -2, 2)}; }, {true},
       [](const V& x) { return ops::softmax(x[0], 0); }, true, 2},
      {Op::kLogSoftmax, [](Generator& g) { return V{rnd(g, {3, 5}, -2, 2)}; }, {true},
       [](const V& x) { return ops::log_softmax(x[0], -1); }, true, 2},
      {Op::kSoftmaxCrossEntropy, [](Generator& g) { return V{rnd(g, {4, 6}, -2, 2), labels(g, 4, 6)}; },
       {true, false},
       [](const V& x) { return ops::softmax_cross_entropy(x[0], x[1], true, ops::Reduction::kNone); }, true, 2},
      {Op::kMseLoss, [](Generator& g) { return V{rnd(g, {3, 4}), rnd(g, {3, 4})}; }, {true, true},
       [](const V& x) { return ops::mse_loss(x[0], x[1], ops::Reduction::kMean); }, true, 2},
      {Op::kBatchNorm, [](Generator& g) { return V{rnd(g, {4, 3, 2, 2}, -2, 2), rnd(g, {3}, 0.5, 1.5), rnd(g, {3})}; },
       {true, true, true},
       [](const V& x) {
         Tensor rm = zeros({3}), rv = ones({3});
         return ops::batch_norm(x[0], x[1], x[2], rm, rv, ops::BatchNormOptions{});
       },
       true, 8},
      {Op::kDropout, [](Generator& g) { return V{rnd(g, {5, 7})}; }, {true},
       [](const V& x) {
         Generator gen(42);  // the same mask on every call, so finite differences see one function
         return ops::dropout(x[0], 0.7, gen, true);
       },
       true, 2},
      // Repeated ids: the table gradient must add both rows' contributions.
      {Op::kEmbedding,
       [](Generator& g) { return V{from_vector(std::vector<int64_t>{3, 0, 3, 1, 4, 0}, {2, 3}), rnd(g, {5, 4})}; },
       {false, true}, [](const V& x) { return ops::embedding(x[0], x[1]); }},
      {Op::kLayerNorm, [](Generator& g) { return V{rnd(g, {3, 2, 6}, -2, 2), rnd(g, {6}, 0.5, 1.5), rnd(g, {6})}; },
       {true, true, true}, [](const V& x) { return ops::layer_norm(x[0], x[1], x[2], 1e-5); }, true, 8},
      {Op::kTranspose, [](Generator& g) { return V{rnd(g, {2, 3, 4})}; }, {true},
       [](const V& x) { return ops::transpose(x[0], {2, 0, -2}); }},
      // The middle part is unused: its gradient arrives undefined and must come back as zeros.
      {Op::kSplit, [](Generator& g) { return V{rnd(g, {2, 6, 2})}; }, {true},
       [](const V& x) {
         std::vector<Tensor> parts = ops::split(x[0], 1, 3);
         return ops::sub(parts[0], ops::mul_scalar(parts[2], 2.0));
       }},
      // Two batches of two heads, a per-batch additive mask with one key masked out (-inf), causal (3 queries,
      // the last 3 of 5 positions; tests/transformer_test.cc checks causal against its explicit mask).
      {Op::kAttention,
       [](Generator& g) {
         Tensor mask = rnd(g, {2, 3, 5}, -1, 0);
         mask.set(4, -INFINITY);
         return V{rnd(g, {4, 3, 4}, -2, 2), rnd(g, {4, 5, 4}, -2, 2), rnd(g, {4, 5, 3}), mask};
       },
       {true, true, true, false},
       [](const V& x) { return ops::scaled_dot_product_attention(x[0], x[1], x[2], x[3], 0.6, 2, true); }, true, 6},
      // 16 output channels, so the fast (16-channel) pooling runs in low precision; the 6x7 ("same") convolution output
      // leaves its last column outside every 2x2 window. (f64 runs the two ops; the fused kernels are checked
      // against them bit for bit in kernels/onednn/conv_test.cc.)
      {Op::kConv2dReluMaxPool2d,
       [](Generator& g) { return V{rnd(g, {2, 3, 6, 7}), rnd(g, {16, 3, 3, 3}), rnd(g, {16})}; }, {true, true, true},
       [](const V& x) { return ops::conv2d_relu_max_pool2d(x[0], x[1], x[2], ops::Conv2dOptions{}, pool(2, 2)); },
       true, 5},
      // Three parts of different widths along the middle axis; the middle one is not differentiated.
      {Op::kConcat, [](Generator& g) { return V{rnd(g, {2, 1, 3}), rnd(g, {2, 3, 3}), rnd(g, {2, 2, 3})}; },
       {true, false, true}, [](const V& x) { return ops::concat(x, 1); }},
      // Two groups, a stride, a dilation, asymmetric padding and an output_padding row, with a bias.
      {Op::kConv2dTranspose, [](Generator& g) { return V{rnd(g, {2, 4, 3, 4}), rnd(g, {4, 3, 3, 2}), rnd(g, {6})}; },
       {true, true, true}, [](const V& x) { return ops::conv2d_transpose(x[0], x[1], x[2], conv_transpose_opts()); },
       true, 5},
      // A recomputed Dense -> tanh: the weight is used inside the function (not an input of the node), so its
      // gradient comes from the re-run's backward.
      {Op::kRecompute, [](Generator& g) { return V{rnd(g, {3, 4}), rnd(g, {5, 4})}; }, {true, true},
       [](const V& x) {
         const Tensor w = x[1];
         return autograd::recompute([w](const Tensor& in) { return ops::tanh(ops::dense(in, w, Tensor())); }, x[0]);
       },
       true, 2},
  };
  static_assert(std::extent_v<decltype(table)> == ops::kNumOps,
                "every op in the op table needs its case in this sweep (one per Op, in enum order)");
  return std::vector<SweepCase>(std::begin(table), std::end(table));
}

// sum(y * r) in f64, without recording.
double weighted_sum(const Tensor& y, const Tensor& r) {
  Tensor y64 = y.to(DType::kF64);
  double s = 0;
  for (int64_t i = 0; i < y64.numel(); ++i) s += y64.get(i) * r.get(i);
  return s;
}

class OpSweep : public ::testing::TestWithParam<int> {};

TEST_P(OpSweep, BackwardMatchesFiniteDifferences) {
  static const auto cases = make_cases();
  const SweepCase& c = cases[static_cast<size_t>(GetParam())];
  ASSERT_EQ(static_cast<int>(c.op), GetParam()) << "sweep table out of enum order at " << ops::op_name(c.op);
  if (!ops::op_info(c.op).differentiable) GTEST_SKIP() << ops::op_name(c.op) << " is not differentiable";
  Generator gen(1000 + GetParam());
  std::vector<Tensor> in = c.inputs(gen);
  for (size_t i = 0; i < in.size(); ++i)
    if (c.differentiable[i]) in[i].set_requires_grad(true);
  Tensor y = c.fn(in);
  Tensor r = uniform(y.shape(), -1, 1, gen, DType::kF64);
  autograd::backward(y, r.to(y.dtype()));
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!c.differentiable[i]) continue;
    Tensor analytic = in[i].grad();
    ASSERT_TRUE(analytic.defined()) << ops::op_name(c.op) << ": input " << i << " got no gradient";
    Tensor base = in[i].clone();
    int64_t n = base.numel();
    int64_t step = std::max<int64_t>(1, n / 12);
    for (int64_t k = 0; k < n; k += step) {
      std::vector<Tensor> plus = in, minus = in;
      plus[i] = base.clone();
      minus[i] = base.clone();
      plus[i].set(k, base.get(k) + c.fd_step);
      minus[i].set(k, base.get(k) - c.fd_step);
      double numeric = (weighted_sum(c.fn(plus), r) - weighted_sum(c.fn(minus), r)) / (2 * c.fd_step);
      EXPECT_TRUE(kFiniteDiffTolerance.close(analytic.get(k), numeric))
          << ops::op_name(c.op) << " input " << i << " element " << k << ": analytic " << analytic.get(k)
          << ", finite differences " << numeric;
    }
  }
}

TEST_P(OpSweep, LowPrecisionForwardMatchesF64) {
  static const auto cases = make_cases();
  const SweepCase& c = cases[static_cast<size_t>(GetParam())];
  if (!c.check_low_precision) GTEST_SKIP() << ops::op_name(c.op) << " has no low-precision form to compare";
  autograd::NoGradGuard no_grad;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    Generator gen(2000 + GetParam());
    std::vector<Tensor> in64 = c.inputs(gen);
    std::vector<Tensor> low, rounded;
    for (const Tensor& t : in64) {
      Tensor l = is_floating(t.dtype()) ? t.to(dt) : t;
      low.push_back(l);
      rounded.push_back(is_floating(t.dtype()) ? l.to(DType::kF64) : t);  // the f64 reference sees the same inputs
    }
    Tensor want = c.fn(rounded);
    Tensor got = c.fn(low);
    ASSERT_EQ(got.numel(), want.numel());
    Tolerance tol = tolerance_for(dt);
    double peak = 1;
    for (int64_t k = 0; k < want.numel(); ++k) peak = std::max(peak, std::abs(want.get(k)));
    for (int64_t k = 0; k < want.numel(); ++k) {
      double err = std::abs(got.get(k) - want.get(k));
      double bound = c.low_precision_scale * (tol.atol * peak + tol.rtol * std::abs(want.get(k)));
      EXPECT_LE(err, bound) << ops::op_name(c.op) << " in " << dt << " element " << k << ": got " << got.get(k)
                            << ", f64 " << want.get(k);
    }
  }
}

// Each op through a one-op graph: four steps of forward and backward (fresh inputs each time) run as
// PYNATIVE, then the same four under graph mode's step runner (warm-up, trace, two replays from the
// arena), from the same seed: outputs and gradients bit for bit the same, in f64 and f32.
TEST_P(OpSweep, ReplayedFromAStaticPlanMatchesEager) {
  static const auto cases = make_cases();
  const SweepCase& c = cases[static_cast<size_t>(GetParam())];
  for (DType dt : {DType::kF64, DType::kF32}) {
    if (dt != DType::kF64 && !c.check_low_precision) continue;  // an op with no form but f64's
    Generator gen(3000 + GetParam());
    const std::vector<Tensor> base = c.inputs(gen);
    Tensor r;
    auto step = [&](std::vector<Tensor>& results) {
      std::vector<Tensor> in;
      for (const Tensor& t : base) in.push_back(is_floating(t.dtype()) && t.dtype() != dt ? t.to(dt) : t.clone());
      const bool grads = ops::op_info(c.op).differentiable;
      for (size_t i = 0; i < in.size(); ++i)
        if (grads && c.differentiable[i]) in[i].set_requires_grad(true);
      Tensor y = c.fn(in);
      {
        autograd::NoGradGuard no_grad;
        results.push_back(y.clone());
      }
      if (grads && y.requires_grad()) {
        if (!r.defined()) r = uniform(y.shape(), -1, 1, gen, DType::kF64);
        autograd::backward(y, r.to(y.dtype()));
        autograd::NoGradGuard no_grad;
        for (size_t i = 0; i < in.size(); ++i)
          if (c.differentiable[i]) results.push_back(in[i].grad().clone());
      }
      return true;
    };
    std::vector<Tensor> eager, replayed;
    set_seed(17);
    for (int k = 0; k < 4; ++k) step(eager);
    set_seed(17);
    graph::StepGraphs graphs("op sweep step");
    for (int k = 0; k < 4; ++k) graphs.run("one op", [&] { return step(replayed); });
    EXPECT_EQ(graphs.stats().replayed_steps, 2) << ops::op_name(c.op) << " in " << dt;
    EXPECT_EQ(graphs.stats().diverged_steps, 0) << ops::op_name(c.op) << " in " << dt;
    ASSERT_EQ(eager.size(), replayed.size()) << ops::op_name(c.op);
    for (size_t k = 0; k < eager.size(); ++k) {
      ASSERT_EQ(eager[k].defined(), replayed[k].defined()) << ops::op_name(c.op) << " result " << k;
      if (!eager[k].defined()) continue;
      ASSERT_EQ(eager[k].nbytes(), replayed[k].nbytes()) << ops::op_name(c.op) << " result " << k;
      EXPECT_EQ(std::memcmp(eager[k].raw_data(), replayed[k].raw_data(), eager[k].nbytes()), 0)
          << ops::op_name(c.op) << " in " << dt << ": result " << k << " differs after replay";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpSweep, ::testing::Range(0, ops::kNumOps),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::string(ops::op_name(static_cast<Op>(p.param)));
                         });

}  // namespace
}  // namespace demi
