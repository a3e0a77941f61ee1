// The Transformer end to end: LayerNorm, MultiheadAttention and TransformerEncoderLayer against PyTorch
// (tests/golden, scripts/make_golden.py), masks, fp16 safety of attention, what each AMP level runs the new
// ops in, model D training at O0, O2-bf16 and O2-fp16, and the large-model training features: gradient
// clipping after unscaling, gradient accumulation with one loss-scale decision, AdamW with warm-up and
// cosine decay, and weight-decay parameter groups.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "demi/amp/policy.h"
#include "demi/core/cpu.h"
#include "demi/amp/train_step.h"
#include "demi/autograd/autograd.h"
#include "demi/kernels/attention.h"
#include "demi/kernels/tolerance.h"
#include "demi/nn/models.h"
#include "demi/nn/transformer.h"
#include "demi/ops/observer.h"
#include "demi/ops/ops.h"
#include "demi/optim/param_groups.h"
#include "golden_util.h"

namespace demi {
namespace {

using amp::Level;
using ops::Op;
using testing::expect_close;
using testing::read_golden;

// f32 results of a chain of ops against PyTorch's f64: the f32 tolerance grown with the number of terms.
Tolerance f32_tol(int terms) { return testing::tolerance_for_terms(DType::kF32, terms); }

// A boolean tensor from the fixtures' 0/1 integers.
Tensor as_bool(const Tensor& t) {
  std::vector<bool> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.get(i) != 0);
  return from_vector(v, t.shape());
}

Tensor grad_leaf(const Tensor& t) { return t.to(DType::kF32, true).set_requires_grad(true); }

// ---- golden values from PyTorch ----

TEST(TransformerGolden, LayerNormForwardAndBackward) {
  auto g = read_golden("layernorm");
  for (DType dt : {DType::kF64, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = g["x"].to(dt, true).set_requires_grad(true);
    Tensor gamma = g["gamma"].to(dt, true).set_requires_grad(true);
    Tensor beta = g["beta"].to(dt, true).set_requires_grad(true);
    Tensor y = ops::layer_norm(x, gamma, beta, 1e-5);
    Tolerance tol = dt == DType::kF64 ? Tolerance{1e-10, 1e-10} : f32_tol(16);
    expect_close(y, g["y"], tol, "y");
    autograd::backward(y, g["dy"].to(dt));
    expect_close(x.grad(), g["dx"], tol, "dx");
    expect_close(gamma.grad(), g["dgamma"], tol, "dgamma");
    expect_close(beta.grad(), g["dbeta"], tol, "dbeta");
  }
}

void load_mha(nn::MultiheadAttention& m, std::map<std::string, Tensor>& g) {
  m.in_proj_weight.copy_(g["w.in_proj_weight"]);
  m.in_proj_bias.copy_(g["w.in_proj_bias"]);
  m.out_proj->weight.copy_(g["w.out_proj.weight"]);
  m.out_proj->bias.copy_(g["w.out_proj.bias"]);
}

void expect_mha_grads(nn::MultiheadAttention& m, std::map<std::string, Tensor>& g, const std::string& c, Tolerance tol) {
  expect_close(m.in_proj_weight.grad(), g[c + ".d.in_proj_weight"], tol, c + " d in_proj_weight");
  expect_close(m.in_proj_bias.grad(), g[c + ".d.in_proj_bias"], tol, c + " d in_proj_bias");
  expect_close(m.out_proj->weight.grad(), g[c + ".d.out_proj.weight"], tol, c + " d out_proj.weight");
  expect_close(m.out_proj->bias.grad(), g[c + ".d.out_proj.bias"], tol, c + " d out_proj.bias");
}

// torch.nn.MultiheadAttention(8, 2, batch_first=True): self-attention, self-attention with a causal float
// mask and a boolean key padding mask, cross-attention; the fused core and the composed one.
TEST(TransformerGolden, MultiheadAttentionMatchesPyTorch) {
  auto g = read_golden("mha");
  const Tolerance tol = f32_tol(400);
  for (bool composed : {false, true}) {
    SCOPED_TRACE(composed ? "composed core" : "fused core");
    nn::MultiheadAttention m(8, 2);
    m.force_composed = composed;
    load_mha(m, g);
    {
      Tensor x = grad_leaf(g["self.query"]);
      Tensor y = m(x);
      expect_close(y, g["self.y"], tol, "self y");
      autograd::backward(y, g["self.dy"].to(DType::kF32));
      expect_close(x.grad(), g["self.dquery"], tol, "self dquery");
      expect_mha_grads(m, g, "self", tol);
    }
    for (Tensor& p : m.trainable_params()) p.set_grad(Tensor());
    {
      Tensor x = grad_leaf(g["masked.query"]);
      Tensor causal = zeros({5, 5});
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t j = i + 1; j < 5; ++j) causal.set(i * 5 + j, -INFINITY);
      Tensor y = m(x, x, x, causal, as_bool(g["masked.padding"]));
      expect_close(y, g["masked.y"], tol, "masked y");
      autograd::backward(y, g["masked.dy"].to(DType::kF32));
      expect_close(x.grad(), g["masked.dquery"], tol, "masked dquery");
      expect_mha_grads(m, g, "masked", tol);
    }
    for (Tensor& p : m.trainable_params()) p.set_grad(Tensor());
    {
      Tensor q = grad_leaf(g["cross.query"]), kv = grad_leaf(g["cross.kv"]);
      Tensor y = m(q, kv, kv);
      expect_close(y, g["cross.y"], tol, "cross y");
      autograd::backward(y, g["cross.dy"].to(DType::kF32));
      expect_close(q.grad(), g["cross.dquery"], tol, "cross dquery");
      // key and value are one tensor in PyTorch's call: its gradient sums both uses.
      expect_close(kv.grad(), g["cross.dkv"], tol, "cross dkv");
      expect_mha_grads(m, g, "cross", tol);
    }
  }
}

void load_encoder_layer(nn::TransformerEncoderLayer& l, std::map<std::string, Tensor>& g, const std::string& c) {
  auto named = l.parameters_and_names();
  ASSERT_EQ(named.size(), 12u);
  for (auto& [name, p] : named) {
    ASSERT_TRUE(g.count(c + "." + name)) << "no PyTorch value for " << name;
    p.copy_(g[c + "." + name]);
  }
}

// torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0, batch_first=True): post-norm ReLU with a key
// padding mask; pre-norm GELU. Forward and the gradients of the input and of every parameter.
TEST(TransformerGolden, EncoderLayerMatchesPyTorch) {
  auto g = read_golden("encoder_layer");
  const Tolerance tol = f32_tol(1000);
  for (bool pre : {false, true}) {
    const std::string c = pre ? "pre" : "post";
    SCOPED_TRACE(c);
    nn::TransformerEncoderLayer layer(8, 2, 16, 0.0, pre ? "gelu" : "relu", 1e-5, pre);
    load_encoder_layer(layer, g, c);
    Tensor x = grad_leaf(g[c + ".x"]);
    Tensor y = pre ? layer(x) : layer(x, Tensor(), as_bool(g["post.padding"]));
    expect_close(y, g[c + ".y"], tol, "y");
    autograd::backward(y, g[c + ".dy"].to(DType::kF32));
    expect_close(x.grad(), g[c + ".dx"], tol, "dx");
    for (auto& [name, p] : layer.parameters_and_names()) expect_close(p.grad(), g[c + ".d." + name], tol, "d " + name);
  }
}

// ---- masks and numerics ----

// Padding keys out must give, for every query, what attention over the unpadded prefix gives.
TEST(Attention, KeyPaddingMaskEqualsTruncatedSequence) {
  set_seed(5);
  nn::MultiheadAttention m(16, 4);
  autograd::NoGradGuard no_grad;
  Tensor x = normal({1, 7, 16}, 0, 1, default_generator());
  std::vector<float> xs = x.to_vector();
  Tensor prefix = from_vector(std::vector<float>(xs.begin(), xs.begin() + 4 * 16), {1, 4, 16});
  Tensor q = x;  // queries: all 7 tokens; keys and values: the first 4 (the rest padded out)
  std::vector<bool> pad = {false, false, false, false, true, true, true};
  Tensor padded = m(q, x, x, Tensor(), from_vector(pad, {1, 7}));
  Tensor truncated = m(q, prefix, prefix);
  expect_close(padded, truncated, f32_tol(16), "padded vs truncated");
}

// Self-attention's heads read and merged in place (ops::attention_heads, where the fused bf16 kernels run)
// give the bits of the heads split apart, attended by scaled_dot_product_attention and merged — forward, the
// packed projection's gradient, with a key-padding mask, recomputed probabilities, and inside a
// MultiheadAttention at O2-bf16 (which takes the in-place heads there).
TEST(Attention, HeadsInPlaceGiveTheBitsOfTheHeadsSplitApart) {
  {
  const DType low = DType::kBF16;  // (f16 keeps its heads apart: see attention_heads_fused, and the end)
  const int64_t b = 3, s = 40, h = 4, dh = 32, e = h * dh;
  Generator gen(5);
  Tensor qkv0 = uniform({b, s, 3 * e}, -2.0, 2.0, gen).to(low);
  Tensor mask = zeros({b, 1, s});
  for (int64_t j = 0; j < s; j += 7) mask.set(j, -INFINITY);
  amp::AmpPolicy policy(Level::kO2, low);  // (the f32 mask would make the ops' dtype f32 without it)
  ops::PrecisionScope scope(&policy);
  kernels::set_attention_policy(kernels::AttentionPolicy::kTiles);
  if (!ops::attention_heads_fused(qkv0, h, mask)) {
    kernels::set_attention_policy(kernels::AttentionPolicy::kAuto);
    GTEST_SKIP() << "the fused attention kernels need the amx level; this CPU runs " << cpu_level_name(cpu_level());
  }
  Tensor dy = uniform({b, s, e}, -1.0, 1.0, gen).to(low);
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recomputed probabilities" : "kept probabilities");
    Tensor in_place = qkv0.clone(), apart = qkv0.clone();
    in_place.set_requires_grad(true);
    apart.set_requires_grad(true);
    Tensor y = ops::attention_heads(in_place, h, mask, false, recompute);
    std::vector<Tensor> parts = ops::split(ops::transpose(ops::reshape(apart, {b, s, 3, h, dh}), {2, 0, 3, 1, 4}), 0, 3);
    Tensor o = ops::scaled_dot_product_attention(ops::reshape(parts[0], {b * h, s, dh}), ops::reshape(parts[1], {b * h, s, dh}),
                                                 ops::reshape(parts[2], {b * h, s, dh}), mask, 0, h, false, recompute);
    Tensor y2 = ops::reshape(ops::transpose(ops::reshape(o, {b, h, s, dh}), {0, 2, 1, 3}), {b, s, e});
    ASSERT_EQ(y.shape(), y2.shape());
    ASSERT_EQ(y.dtype(), low);
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.get(i), y2.get(i)) << "output " << i;
    autograd::backward(y, dy);
    autograd::backward(y2, dy);
    for (int64_t i = 0; i < qkv0.numel(); ++i)
      ASSERT_EQ(in_place.grad().get(i), apart.grad().get(i)) << "qkv gradient " << i;
  }
  // A bad mask is refused by name, not attended.
  EXPECT_FALSE(ops::attention_heads_fused(qkv0, h, zeros({2, s})));
  EXPECT_THROW(ops::attention_heads(qkv0, h, zeros({2, s})), Error);
  EXPECT_FALSE(ops::attention_heads_fused(qkv0, 5, Tensor())) << "heads must divide E";
  // The layer at O2-bf16 takes them (one attention op, no permutation of the heads); with the fused kernels
  // not chosen it splits the heads apart.
  struct Count : ops::OpObserver {
    int attention = 0, transposes = 0;
    void on_op(const ops::OpEvent& ev) override {
      if (ev.backward) return;
      attention += ev.op == Op::kAttention;
      transposes += ev.op == Op::kTranspose;
    }
  };
  nn::MultiheadAttention m(e, h);
  Tensor x = uniform({b, s, e}, -1.0, 1.0, gen);
  for (auto way : {kernels::AttentionPolicy::kTiles, kernels::AttentionPolicy::kProducts}) {
    kernels::set_attention_policy(way);
    Count count;
    {
      ops::OpObserverScope observe(&count);
      EXPECT_EQ(m(x).dtype(), low);
    }
    EXPECT_EQ(count.attention, 1);
    EXPECT_EQ(count.transposes, way == kernels::AttentionPolicy::kTiles ? 0 : 2);
  }
  kernels::set_attention_policy(kernels::AttentionPolicy::kAuto);
  }
  // f16 keeps its heads apart (its fused backward in place measured slower than apart).
  amp::AmpPolicy f16(Level::kO2, DType::kF16);
  ops::PrecisionScope scope(&f16);
  kernels::set_attention_policy(kernels::AttentionPolicy::kTiles);
  EXPECT_FALSE(ops::attention_heads_fused(zeros({2, 8, 96}).to(DType::kF16), 4));
  kernels::set_attention_policy(kernels::AttentionPolicy::kAuto);
}

// A query whose every key is masked attends to nothing (a zero attention row, so the output is the
// out_proj bias), rather than 0/0 = NaN.
TEST(Attention, FullyMaskedRowGivesNoNaN) {
  Tensor q = ones({1, 2, 4}), k = ones({1, 3, 4}), v = ones({1, 3, 4});
  Tensor mask = zeros({2, 3});
  for (int64_t j = 0; j < 3; ++j) mask.set(3 + j, -INFINITY);
  Tensor y = ops::scaled_dot_product_attention(q, k, v, mask);
  for (int64_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(y.get(i), 1.0f);
  for (int64_t i = 4; i < 8; ++i) EXPECT_EQ(y.get(i), 0.0f);
}

// Under O2-fp16 the attention scores of these inputs are 67600, beyond fp16's 65504: a naive fp16 path (the
// composed core: scores from an fp16 product, softmax of fp16 values) produces inf and then NaN; demi's
// fused core writes the scores in FP32, subtracts the maximum in FP32 and matches the FP32 result.
TEST(Attention, O2Fp16ScoresBeyondFp16RangeStayFinite) {
  auto run = [](Level level, bool composed) {
    set_seed(6);  // the same out_proj weights in every run
    nn::MultiheadAttention m(16, 2);
    m.force_composed = composed;
    autograd::NoGradGuard no_grad;
    // q and k read dims 0-3 of each head (x = 1 there for every token) with weight 130, so every score is
    // 4 * 130^2 = 67600 (exact in f32; every key scores the same, so attention is uniform); v = x.
    Tensor w = zeros({48, 16});
    for (int64_t i = 0; i < 16; ++i) {
      if (i % 8 < 4) {
        w.set(i * 16 + i, 130.0);
        w.set((16 + i) * 16 + i, 130.0);
      }
      w.set((32 + i) * 16 + i, 1.0);
    }
    m.in_proj_weight.copy_(w);
    Generator gen(7);
    Tensor x = uniform({2, 6, 16}, -1.0, 1.0, gen);
    for (int64_t t = 0; t < 12; ++t)
      for (int64_t i = 0; i < 16; ++i)
        if (i % 8 < 4) x.set(t * 16 + i, 1.0);
    amp::auto_mixed_precision(m, level, DType::kF16);
    return m(x);
  };
  Tensor want = run(Level::kO0, false);
  Tensor fused = run(Level::kO2, false);
  Tensor naive = run(Level::kO2, true);
  bool naive_finite = true;
  for (int64_t i = 0; i < naive.numel(); ++i) naive_finite = naive_finite && std::isfinite(naive.get(i));
  EXPECT_FALSE(naive_finite) << "the scores were meant to overflow a naive fp16 path";
  for (int64_t i = 0; i < fused.numel(); ++i) ASSERT_TRUE(std::isfinite(fused.get(i))) << "element " << i;
  // x, the weights, v and the output each rounded to fp16 once: a few fp16 roundings of values near 1.
  const Tolerance f16 = tolerance_for(DType::kF16);
  expect_close(fused, want, {4 * f16.rtol, 4 * f16.atol}, "O2-fp16 vs O0");
}

// recompute_probs: the fused core keeps q, k, v (and the mask) for backward, not the (N, Sq, Sk)
// probabilities, and backward recomputes them with the same kernels: the same gradients, bit for bit, at
// every level. Here the probabilities (8 x 64 x 64, f32 128 KiB) are 16x the output: with recompute_probs
// only the output's bytes are new after the forward; without it the probabilities are kept too.
TEST(Attention, RecomputedProbabilitiesGiveTheSameGradientsAndAreNotKept) {
  for (Level level : {Level::kO0, Level::kO2}) {
    for (DType low : {DType::kBF16, DType::kF16}) {
      std::vector<Tensor> grads[2];
      int64_t held[2] = {0, 0};
      for (int recompute = 0; recompute < 2; ++recompute) {
        Generator gen(11);
        std::vector<Tensor> qkv;
        for (int i = 0; i < 3; ++i) {
          qkv.push_back(uniform({8, 64, 4}, -2.0, 2.0, gen));
          qkv.back().set_requires_grad(true);
        }
        Tensor mask = uniform({64, 64}, -1.0, 0.0, gen);
        amp::AmpPolicy policy(level, low);
        ops::PrecisionScope scope(&policy);
        const int64_t before = mem_stats().total_current;
        Tensor y = ops::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], mask, 0, 2, false, recompute == 1);
        held[recompute] = mem_stats().total_current - before;
        autograd::backward(y, ones(y.shape()).to(y.dtype()));
        for (Tensor& t : qkv) grads[recompute].push_back(t.grad());
      }
      SCOPED_TRACE(::testing::Message() << amp::level_name(level) << " " << dtype_name(low));
      for (size_t i = 0; i < 3; ++i)
        for (int64_t e = 0; e < grads[0][i].numel(); ++e)
          ASSERT_EQ(grads[0][i].get(e), grads[1][i].get(e)) << "input " << i << " element " << e;
      const int64_t elem = level == Level::kO0 ? 4 : 2, probs = 8 * 64 * 64 * elem, out = 8 * 64 * 4 * elem;
      EXPECT_GE(held[0], probs + out) << "kept: the probabilities";
      // The output, and at O2 the low-precision casts of q, k and v that backward reads.
      EXPECT_LE(held[1], level == Level::kO0 ? out : 4 * out) << "recomputed: nothing of the probabilities";
      if (level == Level::kO0) break;  // O0 has no low dtype
    }
  }
  // MultiheadAttention takes it on its fused core; with attention dropout in training it runs the composed
  // core, where the setting would do nothing: an error.
  nn::MultiheadAttention m(8, 2, /*dropout=*/0.1);
  m.recompute_probabilities = true;
  Tensor x = ones({1, 3, 8});
  EXPECT_THROW(m(x), Error);
  m.set_train(false);
  EXPECT_NO_THROW(m(x)) << "no dropout in evaluation: the fused core";
}

// The dtype each level runs the new ops in.
TEST(Attention, EachLevelRunsTransformerOpsInThePromisedDtype) {
  struct Expect {
    Level level;
    DType embedding, layer_norm_compute, layer_norm_out, attention;
  };
  const DType F32 = DType::kF32, BF = DType::kBF16;
  const Expect table[] = {{Level::kO0, F32, F32, F32, F32},
                          {Level::kO1, F32, F32, F32, BF},
                          {Level::kO2, BF, F32, BF, BF},
                          {Level::kO3, BF, BF, BF, BF}};
  for (const Expect& e : table) {
    SCOPED_TRACE(amp::level_name(e.level));
    set_seed(8);
    nn::TransformerClassifierOptions o;
    o.vocab_size = 20, o.d_model = 16, o.num_layers = 1, o.nhead = 2, o.dim_feedforward = 32, o.seq_len = 6;
    nn::TransformerClassifier net(o);
    amp::auto_mixed_precision(net, e.level, BF);
    Tensor tokens = from_vector(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 6});
    ops::OpTrace trace;
    Tensor y = net(tokens);
    EXPECT_EQ(y.dtype(), F32) << "the network output is FP32 at every level";
    std::string where = trace.to_string();
    for (const auto& r : trace.of(Op::kEmbedding)) EXPECT_EQ(r.output_dtypes[0], e.embedding) << where;
    ASSERT_EQ(trace.of(Op::kLayerNorm).size(), 2u) << where;
    for (const auto& r : trace.of(Op::kLayerNorm)) {
      EXPECT_EQ(r.compute_dtype, e.layer_norm_compute) << where;
      EXPECT_EQ(r.output_dtypes[0], e.layer_norm_out) << where;
    }
    for (const auto& r : trace.of(Op::kAttention)) EXPECT_EQ(r.compute_dtype, e.attention) << where;
  }
}

// Dropout (attention probabilities, feed-forward, residual branches) acts in training only: in eval mode the
// layer computes what the fused, dropout-free path computes; in training it differs, stays finite and has
// gradients.
TEST(Transformer, DropoutOnlyInTraining) {
  set_seed(11);
  nn::TransformerEncoderLayer layer(16, 4, 32, 0.3);
  Tensor x = normal({2, 5, 16}, 0, 1, default_generator());
  layer.set_train(false);
  Tensor eval1 = layer(x);
  layer.self_attn->force_composed = true;  // the path dropout uses, without dropout in eval
  Tensor eval2 = layer(x);
  expect_close(eval1, eval2.to(DType::kF64), f32_tol(64), "eval: fused vs composed");
  layer.set_train(true);
  Tensor xt = x.clone().set_requires_grad(true);
  Tensor train = layer(xt);
  double diff = 0;
  for (int64_t i = 0; i < train.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(train.get(i)));
    diff = std::max(diff, std::abs(train.get(i) - eval1.get(i)));
  }
  EXPECT_GT(diff, 1e-3) << "dropout changed nothing in training";
  autograd::backward(ops::sum(train));
  ASSERT_TRUE(xt.grad().defined());
  ASSERT_TRUE(layer.self_attn->in_proj_weight.grad().defined());
}

TEST(Transformer, ErrorsNameTheLayerAndShapes) {
  nn::TransformerClassifierOptions o;
  o.vocab_size = 10, o.d_model = 8, o.num_layers = 1, o.nhead = 2, o.dim_feedforward = 8, o.seq_len = 4;
  nn::TransformerClassifier net(o);
  try {
    net(from_vector(std::vector<int32_t>{1, 2, 3, 42}, {1, 4}));
    ADD_FAILURE() << "an id outside the vocabulary must throw";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("embedding"), std::string::npos) << w;
    EXPECT_NE(w.find("id 42"), std::string::npos) << w;
  }
  EXPECT_THROW(nn::MultiheadAttention(10, 3), Error);
  nn::MultiheadAttention m(8, 2);
  EXPECT_THROW(m(ones({2, 3, 8}), ones({2, 3, 8}), ones({2, 3, 8}), ones({3, 4})), Error);
}

// ---- model D training at three levels ----

struct TokenBatch {
  Tensor tokens, labels;
};

// A learnable synthetic task: label = token[0] % 10 (the model must carry position 0's token to the pool).
std::vector<TokenBatch> token_batches(int n, int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  std::vector<TokenBatch> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> t(static_cast<size_t>(batch * seq)), l(static_cast<size_t>(batch));
    for (auto& v : t) v = static_cast<int32_t>(g.next_int(vocab));
    for (int64_t b = 0; b < batch; ++b) l[static_cast<size_t>(b)] = t[static_cast<size_t>(b * seq)] % 10;
    out.push_back({from_vector(t, {batch, seq}), from_vector(l, {batch})});
  }
  return out;
}

nn::TransformerClassifierOptions small_model_d() {
  nn::TransformerClassifierOptions o;  // model D's structure (post-norm, ReLU, mean pool), scaled down
  o.vocab_size = 40, o.d_model = 32, o.num_layers = 2, o.nhead = 4, o.dim_feedforward = 64, o.seq_len = 12;
  return o;
}

struct TrainRun {
  std::vector<float> losses;
  int skipped = 0;
};

TrainRun train_model_d(Level level, DType low, int steps) {
  set_seed(21);
  auto net = std::make_shared<nn::TransformerClassifier>(small_model_d());
  auto loss_fn = std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean");
  // AdamW, warm-up then cosine decay, no decay on biases and norms, clipping at 1: the large-model recipe.
  auto groups = optim::weight_decay_groups(net->parameters_and_names(), 0.01);
  auto opt = std::make_shared<optim::AdamW>(groups, optim::cosine_lr(3e-3, steps, steps / 10));
  amp::TrainOptions o;
  o.low_dtype = low;
  o.clip_grad_norm = 1.0;
  auto step = amp::build_train_network(net, opt, loss_fn, level, o);
  auto data = token_batches(steps, 32, 12, 40, 99);
  TrainRun run;
  // A step skipped for an overflow (fp16's dynamic scale backing off from 2^24) changes nothing; its batch is
  // fed again, so every level sees the same batch at its k-th update and the curves compare update by update.
  for (int i = 0, calls = 0; i < steps && calls < 2 * steps; ++calls) {
    amp::StepResult r = (*step)(data[static_cast<size_t>(i)].tokens, data[static_cast<size_t>(i)].labels);
    EXPECT_TRUE(std::isfinite(r.loss)) << amp::level_name(level) << " step " << i;
    if (std::getenv("DEMI_TEST_VERBOSE"))
      std::printf("%s %s step %d loss %.4f scale %g skipped %d\n", amp::level_name(level), dtype_name(low).data(), i,
                  r.loss, r.loss_scale, static_cast<int>(r.skipped));
    if (r.skipped) {
      ++run.skipped;
      continue;
    }
    run.losses.push_back(r.loss);
    ++i;
  }
  EXPECT_EQ(run.losses.size(), static_cast<size_t>(steps)) << amp::level_name(level);
  return run;
}

double window_mean(const std::vector<float>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

TEST(ModelD, LossFallsTheSameWayAtO0O2Bf16AndO2Fp16) {
  const int steps = 90;
  TrainRun o0 = train_model_d(Level::kO0, DType::kBF16, steps);
  TrainRun bf16 = train_model_d(Level::kO2, DType::kBF16, steps);
  TrainRun fp16 = train_model_d(Level::kO2, DType::kF16, steps);  // dynamic loss scale (O2-fp16's default)
  const size_t w = 15;
  const double start = window_mean(o0.losses, 0, w), end = window_mean(o0.losses, steps - w, steps);
  EXPECT_NEAR(start, std::log(10.0), 0.3) << "chance level at the start";
  EXPECT_LT(end, 0.5 * start) << "O0 learns the task";
  for (const TrainRun* r : {&bf16, &fp16}) {
    const char* name = r == &bf16 ? "O2-bf16" : "O2-fp16";
    for (size_t b = 0; b + w <= static_cast<size_t>(steps); b += w) {
      double ref = window_mean(o0.losses, b, b + w), got = window_mean(r->losses, b, b + w);
      EXPECT_NEAR(got, ref, 0.1 + 0.15 * ref) << name << " steps " << b << ".." << b + w;
    }
  }
  // The dynamic scale starts at 2^24 and backs off through a few overflowing steps, then trains.
  EXPECT_LE(fp16.skipped, 20);
  EXPECT_EQ(bf16.skipped, 0);
}

// ---- training features ----

struct TinyProblem {
  std::shared_ptr<nn::Dense> net;
  Tensor x, y;
};

TinyProblem tiny_problem(int64_t batch) {
  set_seed(31);
  TinyProblem t;
  t.net = std::make_shared<nn::Dense>(6, 3);
  t.x = normal({batch, 6}, 0, 1, default_generator());
  std::vector<int32_t> l(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) l[static_cast<size_t>(i)] = static_cast<int32_t>(i % 3);
  t.y = from_vector(l, {batch});
  return t;
}

// The SGD update (lr 1) of one step with the given manager and clipping, as a flat vector.
std::vector<float> sgd_update(std::shared_ptr<amp::LossScaleManager> manager, double clip, amp::StepResult* out) {
  TinyProblem t = tiny_problem(8);
  std::vector<float> before = t.net->weight.to_vector();
  auto opt = std::make_shared<optim::SGD>(t.net->trainable_params(), 1.0);
  amp::TrainOptions o;
  o.loss_scale_manager = std::move(manager);
  o.clip_grad_norm = clip;
  auto step = amp::build_train_network(t.net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                       Level::kO0, o);
  *out = (*step)(t.x, t.y);
  std::vector<float> after = t.net->weight.to_vector(), delta(before.size());
  for (size_t i = 0; i < before.size(); ++i) delta[i] = before[i] - after[i];
  return delta;
}

double norm_of(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

// Clipping runs on unscaled gradients: with a loss scale of 1024 and a threshold above the true norm, the
// update is the unclipped one. Clipping the scaled gradients (the classic AMP bug) would see a norm 1024x
// too large and shrink the update ~1000x. Below the true norm, the update's norm is exactly the threshold.
TEST(TrainingFeatures, ClipGradNormRunsAfterUnscaling) {
  amp::StepResult plain, scaled, clipped;
  std::vector<float> want = sgd_update(nullptr, 0, &plain);
  const double true_norm = [&] {
    amp::StepResult r;
    sgd_update(nullptr, 1e9, &r);  // clipping on with a huge threshold only measures the norm
    return r.grad_norm;
  }();
  ASSERT_GT(true_norm, 0);
  const double threshold = 2 * true_norm;  // correct clipping leaves these gradients alone
  std::vector<float> got = sgd_update(std::make_shared<amp::FixedLossScaleManager>(1024.0), threshold, &scaled);
  EXPECT_EQ(scaled.loss_scale, 1024.0);
  EXPECT_NEAR(scaled.grad_norm, true_norm, 1e-5 * true_norm) << "the norm is measured on unscaled gradients";
  EXPECT_FALSE(scaled.clipped);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6 + 1e-5 * std::abs(want[i]));
  // What clipping before unscaling would have done: coefficient threshold / (1024 * norm).
  const double buggy_coef = threshold / (1024.0 * true_norm);
  EXPECT_LT(buggy_coef, 0.01) << "the bug would have shrunk this update " << 1 / buggy_coef << "x";

  const double low = 0.25 * true_norm;
  std::vector<float> cut = sgd_update(std::make_shared<amp::FixedLossScaleManager>(1024.0), low, &clipped);
  EXPECT_TRUE(clipped.clipped);
  // Only the weight is in `cut`; the bias shares the clip coefficient, so weight's norm is its share.
  const double coef = low / (true_norm + 1e-6);
  EXPECT_NEAR(norm_of(cut), coef * norm_of(want), 1e-5 * norm_of(want));
}

// k micro-batches of b samples give the update one batch of k * b gives (mean losses, so the mean of the
// micro-batch gradients), with one loss-scale decision per update.
TEST(TrainingFeatures, AccumulationOverMicroBatchesEqualsOneBigBatch) {
  auto make = [](std::shared_ptr<nn::Dense>& net, std::shared_ptr<amp::LossScaleManager> m) {
    auto opt = std::make_shared<optim::SGD>(net->trainable_params(), 0.5);
    amp::TrainOptions o;
    o.loss_scale_manager = std::move(m);
    return amp::build_train_network(net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                    Level::kO0, o);
  };
  TinyProblem big = tiny_problem(12);
  auto big_step = make(big.net, nullptr);
  amp::StepResult rb = (*big_step)(big.x, big.y);

  TinyProblem micro = tiny_problem(12);  // same seed: same weights and data
  auto manager = std::make_shared<amp::DynamicLossScaleManager>(256.0, 2.0, /*scale_window=*/1);
  auto micro_step = make(micro.net, manager);
  double loss_sum = 0;
  for (int64_t k = 0; k < 3; ++k) {
    std::vector<float> xs = micro.x.to_vector(), ys = micro.y.to_vector();
    std::vector<float> xk(xs.begin() + k * 24, xs.begin() + (k + 1) * 24);
    std::vector<int32_t> yk;
    for (int64_t i = 4 * k; i < 4 * (k + 1); ++i) yk.push_back(static_cast<int32_t>(ys[static_cast<size_t>(i)]));
    loss_sum += micro_step->accumulate(from_vector(xk, {4, 6}), from_vector(yk, {4}));
  }
  EXPECT_EQ(micro_step->accumulated_micro_batches(), 3);
  EXPECT_EQ(manager->get_loss_scale(), 256.0) << "no loss-scale decision between micro-batches";
  amp::StepResult rm = micro_step->step();
  EXPECT_EQ(rm.micro_batches, 3);
  EXPECT_FALSE(rm.overflow);
  EXPECT_EQ(manager->get_loss_scale(), 512.0) << "exactly one decision (scale_window 1) for the update";
  EXPECT_NEAR(rm.loss, loss_sum / 3, 1e-6);
  EXPECT_NEAR(rm.loss, rb.loss, 1e-5);
  expect_close(micro.net->weight, big.net->weight.to(DType::kF64), f32_tol(12), "weight");
  expect_close(micro.net->bias, big.net->bias.to(DType::kF64), f32_tol(12), "bias");

  // An overflow in one micro-batch skips the whole update and backs the scale off once.
  std::vector<float> w0 = micro.net->weight.to_vector();
  micro_step->accumulate(big.x, big.y);
  Tensor bad = big.x.clone();
  bad.set(0, std::numeric_limits<float>::infinity());
  micro_step->accumulate(bad, big.y);
  amp::StepResult ro = micro_step->step();
  EXPECT_TRUE(ro.overflow);
  EXPECT_TRUE(ro.skipped);
  EXPECT_EQ(manager->get_loss_scale(), 256.0);
  EXPECT_EQ(micro.net->weight.to_vector(), w0);
  EXPECT_THROW(micro_step->step(), Error) << "step() with nothing accumulated";
}

TEST(TrainingFeatures, WeightDecayGroupsExemptBiasesAndNorms) {
  nn::TransformerClassifier net(small_model_d());
  auto groups = optim::weight_decay_groups(net.parameters_and_names(), 0.05);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.05);
  EXPECT_EQ(groups[1].weight_decay, 0.0);
  for (const Tensor& p : groups[0].params) EXPECT_EQ(p.rank(), 2) << p.name();
  for (const Tensor& p : groups[1].params) EXPECT_EQ(p.rank(), 1) << p.name();
  size_t total = groups[0].params.size() + groups[1].params.size();
  EXPECT_EQ(total, net.trainable_params().size());
  // Names too: the learned positions can be exempted by name.
  auto by_name = optim::weight_decay_groups(net.parameters_and_names(), 0.05, {"pos_embedding"});
  EXPECT_EQ(by_name[1].params.size(), groups[1].params.size() + 1);

  // An exempt parameter with a zero gradient stays put under AdamW; a decayed one shrinks.
  optim::AdamW opt(groups, optim::fixed_lr(0.1));
  Tensor w = groups[0].params[0], g = groups[1].params[0];
  std::vector<float> w0 = w.to_vector(), g0 = g.to_vector();
  for (const auto& grp : groups)
    for (Tensor p : grp.params) p.set_grad(zeros(p.shape()));
  opt.step();
  EXPECT_EQ(g.to_vector(), g0);
  EXPECT_LT(norm_of(w.to_vector()), norm_of(w0));
}

TEST(TrainingFeatures, CosineScheduleWithWarmup) {
  auto s = optim::cosine_lr(1e-3, 100, 10, 1e-5);
  // Linear warm-up over 10 steps, the first step already at max / 10 (step + 1 of 10), then cosine.
  EXPECT_NEAR(s->lr(0), 1e-4, 1e-12);
  EXPECT_NEAR(s->lr(4), 5e-4, 1e-12);
  EXPECT_NEAR(s->lr(9), 1e-3, 1e-12);
  EXPECT_NEAR(s->lr(10), 1e-3, 1e-12);
  EXPECT_NEAR(s->lr(55), 1e-5 + (1e-3 - 1e-5) * 0.5, 1e-9);
  EXPECT_NEAR(s->lr(100), 1e-5, 1e-12);
  EXPECT_NEAR(s->lr(500), 1e-5, 1e-12);
}

}  // namespace
}  // namespace demi
