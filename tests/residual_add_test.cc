// A residual connection's add fused into the store of the product before it (ops::dense_add,
// Dense::call_add, MultiheadAttention::call_add, the Transformer layer's two branches): one op where the sum
// is in the Dense's own dtype, the two ops exactly everywhere else; the same gradients; clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "demi/amp/policy.h"
#include "demi/autograd/autograd.h"
#include "demi/core/rng.h"
#include "demi/kernels/tolerance.h"
#include "demi/nn/gpt.h"
#include "demi/nn/layers.h"
#include "demi/nn/models.h"
#include "demi/nn/transformer.h"
#include "demi/ops/observer.h"
#include "demi/ops/ops.h"
#include "demi/ops/trace.h"

namespace demi {
namespace {

using ops::Op;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

struct Inputs {
  Tensor x, w, b, r;
};

// x (M, K), w (N, K), b (N), r (M, N) in `dtype` (r in `r_dtype`), uniform in [-1, 1].
Inputs inputs(DType dtype, DType r_dtype, uint64_t seed, int64_t m = 37, int64_t n = 70, int64_t k = 45) {
  Generator gen(seed);
  return {uniform({m, k}, -1, 1, gen, dtype), uniform({n, k}, -1, 1, gen, dtype), uniform({n}, -1, 1, gen, dtype),
          uniform({m, n}, -1, 1, gen, r_dtype)};
}

// In the Dense's dtype (no policy: the operands' own) the add runs in the product's store: one op, the f64
// sum within the dtype's tolerance (one rounding: at least as close as the two ops).
TEST(ResidualAdd, FusedWhereTheSumIsInTheDensesDtype) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(t));
    Inputs in = inputs(t, t, 1);
    ops::OpTrace trace;
    Tensor fused = ops::dense_add(in.x, in.w, in.b, in.r);
    EXPECT_EQ(trace.of(Op::kAdd).size(), 0u) << trace.to_string();
    ASSERT_EQ(trace.of(Op::kDense).size(), 1u) << trace.to_string();
    EXPECT_EQ(fused.dtype(), t);
    Tensor two_ops = ops::add(in.r, ops::dense(in.x, in.w, in.b));
    Tensor want = ops::add(in.r.to(DType::kF64), ops::dense(in.x.to(DType::kF64), in.w.to(DType::kF64),
                                                            in.b.to(DType::kF64)));
    const Tolerance tol = tolerance_for_sum(t, 45 + 2, 1.0);
    double fused_err = 0, two_err = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      EXPECT_TRUE(tol.close(fused.get(i), want.get(i))) << i << ": " << fused.get(i) << " vs f64 " << want.get(i);
      fused_err = std::max(fused_err, std::abs(fused.get(i) - want.get(i)));
      two_err = std::max(two_err, std::abs(two_ops.get(i) - want.get(i)));
    }
    if (t != DType::kF32) {
      EXPECT_LE(fused_err, two_err) << "one rounding is no further from the f64 sum than two";
    }
  }
}

// Anywhere the fused sum would not be the Add's but for its rounding, the two ops run, bit for bit: a
// residual in another dtype, fusion switched off (the numerics report), and AMP's O1 (Dense's output cast
// back to FP32 before the Add).
TEST(ResidualAdd, ElseExactlyTheTwoOps) {
  {
    SCOPED_TRACE("a float32 residual beside a bfloat16 product");
    Inputs in = inputs(DType::kBF16, DType::kF32, 2);
    ops::OpTrace trace;
    Tensor y = ops::dense_add(in.x, in.w, in.b, in.r);
    EXPECT_EQ(trace.of(Op::kAdd).size(), 1u) << trace.to_string();
    EXPECT_TRUE(same_bits(y, ops::add(in.r, ops::dense(in.x, in.w, in.b))));
  }
  {
    SCOPED_TRACE("FusionScope off");
    Inputs in = inputs(DType::kBF16, DType::kBF16, 3);
    ops::FusionScope off(false);
    ops::OpTrace trace;
    Tensor y = ops::dense_add(in.x, in.w, in.b, in.r);
    EXPECT_EQ(trace.of(Op::kAdd).size(), 1u) << trace.to_string();
    EXPECT_TRUE(same_bits(y, ops::add(in.r, ops::dense(in.x, in.w, in.b))));
  }
}

// The backward is Dense's, and the residual's gradient the output's: bit for bit the two ops' gradients in
// f32 (the same products on the same output gradient).
TEST(ResidualAdd, GradientsAreTheTwoOpsGradients) {
  Tensor grads[2][4];
  for (int fused = 0; fused < 2; ++fused) {
    Inputs in = inputs(DType::kF32, DType::kF32, 4);
    for (Tensor* t : {&in.x, &in.w, &in.b, &in.r}) t->set_requires_grad(true);
    Tensor y = fused ? ops::dense_add(in.x, in.w, in.b, in.r) : ops::add(in.r, ops::dense(in.x, in.w, in.b));
    Generator gen(5);
    autograd::backward(y, uniform(y.shape(), -1, 1, gen));
    int i = 0;
    for (const Tensor* t : {&in.x, &in.w, &in.b, &in.r}) grads[fused][i++] = t->grad();
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(grads[1][i].defined()) << "input " << i << " got no gradient";
    EXPECT_TRUE(same_bits(grads[0][i], grads[1][i])) << "input " << i;
  }
}

TEST(ResidualAdd, ErrorsNameTheShapes) {
  Inputs in = inputs(DType::kF32, DType::kF32, 6);
  try {
    ops::dense_add(in.x, in.w, in.b, in.x);
    FAIL() << "a residual of the wrong shape was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("residual (37, 70)"), std::string::npos) << what;
    EXPECT_NE(what.find("(37, 45)"), std::string::npos) << what;
  }
  nn::Dense layer(45, 70);
  EXPECT_THROW(layer.call_add(in.x, in.x), Error);
}

// The layers: Dense::call_add on (B, S, F) inputs, a layer with a ReLU (the two ops: the ReLU comes before
// the add), and model D's encoder layer, whose two residual adds run in its products at O0 and O2 — but not
// at O1 (the products' outputs are FP32 there) or with dropout on its branches.
TEST(ResidualAdd, LayersFuseWhereTheirBranchEndsInAProduct) {
  set_seed(7);
  Generator gen(8);
  Tensor x = uniform({2, 5, 12}, -1, 1, gen), r = uniform({2, 5, 6}, -1, 1, gen);
  nn::Dense plain(12, 6);
  {
    ops::OpTrace trace;
    Tensor y = plain.call_add(x, r);
    EXPECT_EQ(trace.of(Op::kAdd).size(), 0u) << trace.to_string();
    EXPECT_EQ(y.shape(), r.shape());
    Tensor want = ops::add(r, plain(x));
    for (int64_t i = 0; i < y.numel(); ++i) EXPECT_NEAR(y.get(i), want.get(i), 1e-5);
  }
  nn::DenseOptions o;
  o.activation = "relu";
  nn::Dense relu(12, 6, o);
  {
    ops::OpTrace trace;
    Tensor y = relu.call_add(x, r);
    EXPECT_EQ(trace.of(Op::kAdd).size(), 1u) << trace.to_string();
    EXPECT_TRUE(same_bits(y, ops::add(r, relu(x))));
  }
  struct Expect {
    amp::Level level;
    double dropout;
    size_t adds;  // Add ops in one forward of the layer
  };
  for (const Expect& e : {Expect{amp::Level::kO0, 0.0, 0}, Expect{amp::Level::kO1, 0.0, 2},
                          Expect{amp::Level::kO2, 0.0, 0}, Expect{amp::Level::kO2, 0.2, 2}}) {
    SCOPED_TRACE(str_cat(amp::level_name(e.level), " dropout ", e.dropout));
    set_seed(9);
    nn::TransformerClassifierOptions d;
    d.vocab_size = 20, d.d_model = 16, d.num_layers = 1, d.nhead = 2, d.dim_feedforward = 32, d.seq_len = 6;
    d.dropout = e.dropout;
    nn::TransformerClassifier net(d);
    amp::auto_mixed_precision(net, e.level, DType::kBF16);
    Tensor tokens = from_vector(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 6});
    ops::OpTrace trace;
    Tensor y = net(tokens);
    // (The embedding and the position table are one Add outside the layer.)
    EXPECT_EQ(trace.of(Op::kAdd).size(), e.adds + 1) << trace.to_string();
    for (int64_t i = 0; i < y.numel(); ++i) EXPECT_TRUE(std::isfinite(y.get(i)));
  }
}

// A Dense recomputed on its own (its forward re-run in backward from its input alone) cannot return the
// residual's gradient from the fused op, so call_add runs the two ops there: the residual still gets its
// gradient, and every gradient is the plain layer's.
TEST(ResidualAdd, ARecomputedDenseRunsTheTwoOps) {
  Tensor grads[2][2];
  for (int recomputed = 0; recomputed < 2; ++recomputed) {
    set_seed(12);
    nn::Dense layer(12, 6);
    if (recomputed) layer.recompute();
    Generator gen(13);
    Tensor x = uniform({5, 12}, -1, 1, gen).set_requires_grad(true);
    Tensor r = uniform({5, 6}, -1, 1, gen).set_requires_grad(true);
    ops::OpTrace trace;
    Tensor y = layer.call_add(x, r);
    EXPECT_EQ(trace.of(Op::kAdd).size(), recomputed ? 1u : 0u) << trace.to_string();
    autograd::backward(ops::sum(y));
    grads[recomputed][0] = x.grad();
    grads[recomputed][1] = r.grad();
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(grads[1][i].defined()) << "input " << i << " got no gradient";
    EXPECT_TRUE(same_bits(grads[0][i], grads[1][i])) << "input " << i;
  }
}

// The GPT's blocks the same way: both residual adds in their branch's last product without dropout (the
// embedding's add stays), the two ops with it; the logits those of the two ops (fusion off) up to the one
// rounding.
TEST(ResidualAdd, GptBlocksFuseWithoutDropout) {
  for (int with_dropout = 0; with_dropout < 2; ++with_dropout) {
    SCOPED_TRACE(with_dropout ? "dropout 0.1" : "no dropout");
    set_seed(10);
    nn::GPTOptions o;
    o.vocab_size = 30, o.block_size = 8, o.n_layer = 2, o.n_head = 2, o.n_embd = 16;
    o.dropout = with_dropout ? 0.1 : 0.0;
    nn::GPT gpt(o);
    gpt.set_train(false);  // dropout off in the values, still in the structure
    Tensor idx = from_vector(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, {2, 8});
    ops::OpTrace trace;
    Tensor logits = gpt(idx);
    EXPECT_EQ(trace.of(Op::kAdd).size(), with_dropout ? 5u : 1u) << trace.to_string();
    ops::FusionScope off(false);
    Tensor two_ops = gpt(idx);
    for (int64_t i = 0; i < logits.numel(); ++i) EXPECT_NEAR(logits.get(i), two_ops.get(i), 1e-5) << i;
  }
}

}  // namespace
}  // namespace demi
