// Layers of issue 17 against PyTorch (scripts/make_golden.py more_layers, composite_layers): GroupNorm,
// Conv1d, Conv2dTranspose (scripts/make_golden.py conv_transpose), Softmax, LogSoftmax + NLLLoss, LeakyReLU, ELU, PReLU, L1Loss, SmoothL1Loss, BCEWithLogitsLoss, LSTM, GRU, forward
// and backward in f32; bad input named.
#include <gtest/gtest.h>

#include <memory>

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

// MindSpore's three pad modes; "pad" with groups, stride, dilation and output_padding.
TEST(LayersGolden, Conv2dTransposeMatchesPyTorch) {
  auto g = testing::read_golden("conv_transpose");
  struct Case {
    const char* name;
    nn::Conv2dTransposeOptions options;
    std::array<int64_t, 2> kernel;
  } cases[] = {
      {"pad",
       {.stride = {2, 1}, .pad_mode = "pad", .padding = {1, 1, 0, 0}, .output_padding = {1, 0}, .dilation = {1, 2},
        .group = 2, .has_bias = true},
       {3, 2}},
      {"same", {.stride = {2, 2}, .has_bias = true}, {3, 3}},
      {"valid", {.stride = {3, 3}, .pad_mode = "valid"}, {2, 2}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string p = c.name;
    Tensor x0 = g[p + ".x"], w0 = g[p + ".w"];
    nn::Conv2dTranspose conv(x0.dim(1), w0.dim(1) * c.options.group, c.kernel, c.options);
    ASSERT_EQ(conv.weight.shape(), w0.shape());
    conv.weight.copy_(w0);
    if (c.options.has_bias) conv.bias.copy_(g[p + ".b"]);
    Tensor x = leaf(x0);
    Tensor y = conv(x);
    ASSERT_EQ(y.shape(), g[p + ".y"].shape());
    EXPECT_EQ(conv.output_shape(x.shape()), y.shape());
    expect_close(y, g[p + ".y"], tol(20), "y");
    autograd::backward(y, g[p + ".dy"].to(DType::kF32));
    expect_close(x.grad(), g[p + ".dx"], tol(40), "dx");
    expect_close(conv.weight.grad(), g[p + ".dw"], tol(80), "dw");
    if (c.options.has_bias) expect_close(conv.bias.grad(), g[p + ".db"], tol(200), "db");
  }
}

// Conv2dTranspose is the adjoint of Conv2d: <conv(u), v> = <u, conv_transpose(v)> for the same weight, at
// strides and paddings where a strided convolution leaves rows unread (output_padding).
TEST(Layers, Conv2dTransposeIsTheAdjointOfConv2d) {
  Generator gen(7);
  ops::Conv2dOptions co;
  co.stride = {2, 3};
  co.pad_mode = ops::PadMode::kPad;
  co.padding = {1, 2, 0, 1};
  co.groups = 3;
  ops::Conv2dTransposeOptions to;
  to.stride = co.stride;
  to.pad_mode = co.pad_mode;
  to.padding = co.padding;
  to.output_padding = {1, 2};
  to.groups = co.groups;
  Tensor w = uniform({6, 2, 3, 2}, -1, 1, gen, DType::kF64);  // conv: 6 <- 6 channels; transposed: 6 -> 6
  Tensor v = uniform({2, 6, 4, 3}, -1, 1, gen, DType::kF64);
  Tensor ct = ops::conv2d_transpose(v, w, Tensor(), to);
  Tensor u = uniform(ct.shape(), -1, 1, gen, DType::kF64);
  Tensor cu = ops::conv2d(u, w, Tensor(), co);
  ASSERT_EQ(cu.shape(), v.shape());
  double lhs = ops::sum(ops::mul(cu, v)).item(), rhs = ops::sum(ops::mul(u, ct)).item();
  EXPECT_NEAR(lhs, rhs, 1e-10 * std::max(1.0, std::abs(lhs)));
}

TEST(Layers, Conv2dTransposeRefusesBadOptionsAndInput) {
  using O = nn::Conv2dTransposeOptions;
  EXPECT_THROW(nn::Conv2dTranspose(3, 4, 3, O{.padding = {1, 1, 1, 1}}), Error) << "padding needs pad_mode pad";
  EXPECT_THROW(nn::Conv2dTranspose(3, 4, 3, O{.stride = {2, 2}, .output_padding = {1, 1}}), Error)
      << "output_padding needs pad_mode pad";
  EXPECT_THROW(nn::Conv2dTranspose(3, 4, 3, O{.stride = {2, 2}, .pad_mode = "pad", .output_padding = {2, 0}}), Error)
      << "output_padding below the stride";
  EXPECT_THROW(nn::Conv2dTranspose(3, 4, 3, O{.group = 2}), Error) << "3 channels in 2 groups";
  nn::Conv2dTranspose conv(3, 4, 3, O{.pad_mode = "pad", .padding = {2, 2, 0, 0}});
  try {
    conv(zeros({2, 3, 1, 5}));  // (1 - 1) * 1 + 3 - 4 = -1 rows
    ADD_FAILURE() << "an empty output was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("leaves no output"), std::string::npos) << e.what();
  }
  try {
    conv(zeros({2, 4, 5, 5}));
    ADD_FAILURE() << "4 channels were accepted by a layer of 3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(N, 3, H, W)"), std::string::npos) << e.what();
  }
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

// Layers composed of swept ops (their forward, backward and AMP class are those ops'), against PyTorch.
TEST(LayersGolden, ComposedActivationsAndLossesMatchPyTorch) {
  auto g = testing::read_golden("composite_layers");
  {
    Tensor x = leaf(g["leaky.x"]);
    Tensor y = nn::LeakyReLU(0.2)(x);
    expect_close(y, g["leaky.y"], tol(4), "leaky y");
    autograd::backward(y, g["leaky.dy"].to(DType::kF32));
    expect_close(x.grad(), g["leaky.dx"], tol(4), "leaky dx");
  }
  {
    Tensor x = leaf(g["elu.x"]);
    Tensor y = nn::ELU(0.7)(x);
    expect_close(y, g["elu.y"], tol(8), "elu y");
    autograd::backward(y, g["elu.dy"].to(DType::kF32));
    expect_close(x.grad(), g["elu.dx"], tol(8), "elu dx");
  }
  {
    nn::PReLU prelu(3);
    prelu.w.copy_(g["prelu.w"]);
    Tensor x = leaf(g["prelu.x"]);
    Tensor y = prelu(x);
    expect_close(y, g["prelu.y"], tol(4), "prelu y");
    autograd::backward(y, g["prelu.dy"].to(DType::kF32));
    expect_close(x.grad(), g["prelu.dx"], tol(4), "prelu dx");
    expect_close(prelu.w.grad(), g["prelu.dw"], tol(20), "prelu dw");
  }
  {
    Tensor x = leaf(g["l1.x"]);
    Tensor loss = nn::L1Loss()(x, g["l1.t"].to(DType::kF32));
    expect_close(loss.reshape({1}), g["l1.loss"], tol(20), "l1");
    autograd::backward(loss);
    expect_close(x.grad(), g["l1.dx"], tol(20), "l1 dx");
  }
  {
    Tensor x = leaf(g["sl1.x"]);
    Tensor y = nn::SmoothL1Loss(0.5)(x, g["sl1.t"].to(DType::kF32));
    expect_close(y, g["sl1.y"], tol(8), "smooth l1");
    autograd::backward(y, g["sl1.dy"].to(DType::kF32));
    expect_close(x.grad(), g["sl1.dx"], tol(8), "smooth l1 dx");
  }
  {
    Tensor x = leaf(g["bce.x"]);
    Tensor loss = nn::BCEWithLogitsLoss()(x, g["bce.t"].to(DType::kF32));
    expect_close(loss.reshape({1}), g["bce.loss"], tol(40), "bce (logits +-30 stay finite)");
    autograd::backward(loss);
    expect_close(x.grad(), g["bce.dx"], tol(40), "bce dx");
  }
}

// Two-layer LSTM and GRU from given initial states: output, h_n (c_n), and every gradient, against PyTorch.
TEST(LayersGolden, LstmAndGruMatchPyTorch) {
  auto g = testing::read_golden("recurrent");
  for (const std::string kind : {"lstm", "gru"}) {
    SCOPED_TRACE(kind);
    std::unique_ptr<nn::Cell> cell;
    if (kind == "lstm") cell = std::make_unique<nn::LSTM>(3, 4, 2);
    else cell = std::make_unique<nn::GRU>(3, 4, 2);
    auto named = cell->parameters_and_names();
    ASSERT_EQ(named.size(), 8u);
    for (auto& [name, p] : named) {
      ASSERT_TRUE(g.count(kind + "." + name)) << "no PyTorch value for " << name;
      p.copy_(g[kind + "." + name]);
    }
    Tensor x = leaf(g[kind + ".x"]);
    nn::RecurrentState s = kind == "lstm"
                               ? static_cast<nn::LSTM&>(*cell).forward(x, g[kind + ".h0"].to(DType::kF32),
                                                                        g[kind + ".c0"].to(DType::kF32))
                               : static_cast<nn::GRU&>(*cell).forward(x, g[kind + ".h0"].to(DType::kF32));
    expect_close(s.output, g[kind + ".y"], tol(200), "output");
    expect_close(s.h_n, g[kind + ".hn"], tol(200), "h_n");
    if (kind == "lstm") expect_close(s.c_n, g[kind + ".cn"], tol(200), "c_n");
    Tensor loss = ops::add(ops::sum(ops::mul(s.output, g[kind + ".ry"].to(DType::kF32))),
                           ops::sum(ops::mul(s.h_n, g[kind + ".rh"].to(DType::kF32))));
    autograd::backward(loss);
    expect_close(x.grad(), g[kind + ".dx"], tol(1000), "dx");
    for (auto& [name, p] : named) expect_close(p.grad(), g[kind + ".d." + name], tol(1000), "d " + name);
  }
}

// Without states the recurrent layers start from zeros; Identity passes its input through.
TEST(Layers, ZeroStatesAndIdentity) {
  set_seed(4);
  nn::LSTM lstm(3, 4, 2);
  nn::GRU gru(3, 4, 2);
  Tensor x = normal({2, 5, 3}, 0, 1, default_generator());
  EXPECT_EQ(lstm(x).to_vector(), lstm.forward(x, zeros({2, 2, 4}), zeros({2, 2, 4})).output.to_vector());
  EXPECT_EQ(gru(x).to_vector(), gru.forward(x, zeros({2, 2, 4})).output.to_vector());
  EXPECT_EQ(lstm(x).shape(), Shape({2, 5, 4}));
  EXPECT_TRUE(nn::Identity()(x).is_same(x));
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
  EXPECT_THROW(nn::LeakyReLU(1.5), Error);
  nn::LSTM lstm(3, 4, 2);
  EXPECT_THROW(lstm(zeros({2, 5, 4})), Error) << "input_size 3";
  EXPECT_THROW(lstm.forward(zeros({2, 5, 3}), zeros({1, 2, 4})), Error) << "h0 needs 2 layers";
  nn::PReLU prelu(3);
  EXPECT_THROW(prelu(zeros({2, 4, 5})), Error);
  EXPECT_THROW(nn::L1Loss()(zeros({2, 3}), zeros({3, 2})), Error);
  EXPECT_THROW(nn::BCEWithLogitsLoss()(zeros({2, 3}), zeros({2, 3}, DType::kI32)), Error);
}

}  // namespace
}  // namespace demi
