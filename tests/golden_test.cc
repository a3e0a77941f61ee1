// Every layer's forward and backward against PyTorch's values (tests/golden, scripts/make_golden.py),
// in f64 (the reference kernels; tight tolerance) and in f32 (the fast kernels; f32 tolerance), and the
// first five training losses of model A from fixed weights.
#include <gtest/gtest.h>


#include "demi/autograd/autograd.h"
#include "demi/kernels/tolerance.h"
#include "demi/nn/models.h"
#include "demi/ops/ops.h"
#include "demi/optim/optimizer.h"
#include "golden_util.h"

namespace demi {
namespace {

using testing::expect_close;
using testing::read_golden;

class Golden : public ::testing::TestWithParam<DType> {
 protected:
  DType dt() const { return GetParam(); }
  // A leaf in the test's dtype that requires grad.
  Tensor leaf(const Tensor& t) const { return t.to(dt(), true).set_requires_grad(true); }
  // Tolerance for a result built from sums of up to `terms` products.
  Tolerance tol(int terms = 1) const { return testing::tolerance_for_terms(dt(), terms); }
};

TEST_P(Golden, Dense) {
  auto g = read_golden("dense");
  Tensor x = leaf(g["x"]), w = leaf(g["w"]), b = leaf(g["b"]);
  Tensor y = ops::dense(x, w, b);
  expect_close(y, g["y"], tol(5), "y");
  autograd::backward(y, g["dy"].to(y.dtype()));
  expect_close(x.grad(), g["dx"], tol(3), "dx");
  expect_close(w.grad(), g["dw"], tol(4), "dw");
  expect_close(b.grad(), g["db"], tol(4), "db");
}

void conv_case(const Golden& t, const char* name, ops::Conv2dOptions o, DType dt, Tolerance tol_y, Tolerance tol_g) {
  auto g = read_golden(name);
  Tensor x = g["x"].to(dt, true).set_requires_grad(true);
  Tensor w = g["w"].to(dt, true).set_requires_grad(true);
  Tensor b = g.count("b") ? g["b"].to(dt, true).set_requires_grad(true) : Tensor();
  Tensor y = ops::conv2d(x, w, b, o);
  expect_close(y, g["y"], tol_y, std::string(name) + " y");
  autograd::backward(y, g["dy"].to(y.dtype()));
  expect_close(x.grad(), g["dx"], tol_g, std::string(name) + " dx");
  expect_close(w.grad(), g["dw"], tol_g, std::string(name) + " dw");
  if (b.defined()) expect_close(b.grad(), g["db"], tol_g, std::string(name) + " db");
  (void)t;
}

ops::Conv2dOptions pad_options(int64_t stride, int64_t pad, int64_t dilation, int64_t groups) {
  ops::Conv2dOptions o;
  o.stride = {stride, stride};
  o.pad_mode = pad ? ops::PadMode::kPad : ops::PadMode::kValid;
  o.padding = {pad, pad, pad, pad};
  o.dilation = {dilation, dilation};
  o.groups = groups;
  return o;
}

TEST_P(Golden, Conv2d) {
  conv_case(*this, "conv_pad1", pad_options(1, 1, 1, 1), dt(), tol(27), tol(100));
  conv_case(*this, "conv_stride2", pad_options(2, 0, 1, 1), dt(), tol(27), tol(100));
  conv_case(*this, "conv_dilation2", pad_options(1, 2, 2, 1), dt(), tol(18), tol(100));
  conv_case(*this, "conv_groups2", pad_options(1, 1, 1, 2), dt(), tol(18), tol(100));
}

TEST_P(Golden, Pooling) {
  auto g = read_golden("max_pool2d");
  ops::Pool2dOptions o;
  o.kernel = {2, 2};
  o.stride = {2, 2};
  Tensor x = leaf(g["x"]);
  Tensor y = ops::max_pool2d(x, o);
  expect_close(y, g["y"], tol(), "max y");
  autograd::backward(y, g["dy"].to(y.dtype()));
  expect_close(x.grad(), g["dx"], tol(), "max dx");

  auto a = read_golden("avg_pool2d");
  o.kernel = {3, 3};
  Tensor xa = leaf(a["x"]);
  Tensor ya = ops::avg_pool2d(xa, o);
  expect_close(ya, a["y"], tol(9), "avg y");
  autograd::backward(ya, a["dy"].to(ya.dtype()));
  expect_close(xa.grad(), a["dx"], tol(9), "avg dx");
}

TEST_P(Golden, Activations) {
  auto g = read_golden("activations");
  struct Case {
    const char* name;
    Tensor (*fn)(const Tensor&);
  };
  const Case cases[] = {
      {"relu", [](const Tensor& x) { return ops::relu(x); }},
      {"sigmoid", [](const Tensor& x) { return ops::sigmoid(x); }},
      {"tanh", [](const Tensor& x) { return ops::tanh(x); }},
      {"gelu", [](const Tensor& x) { return ops::gelu(x, false); }},
      {"gelu_tanh", [](const Tensor& x) { return ops::gelu(x, true); }},
      {"silu", [](const Tensor& x) { return ops::silu(x); }},
  };
  for (const auto& c : cases) {
    std::string n = c.name;
    Tensor x = leaf(g[n + ".x"]);
    Tensor y = c.fn(x);
    expect_close(y, g[n + ".y"], tol(4), n + " y");
    autograd::backward(y, g[n + ".dy"].to(y.dtype()));
    expect_close(x.grad(), g[n + ".dx"], tol(4), n + " dx");
  }
}

TEST_P(Golden, SoftmaxAndLosses) {
  auto g = read_golden("softmax_losses");
  {
    Tensor x = leaf(g["softmax.x"]);
    Tensor y = ops::softmax(x);
    expect_close(y, g["softmax.y"], tol(6), "softmax y");
    autograd::backward(y, g["softmax.dy"].to(y.dtype()));
    expect_close(x.grad(), g["softmax.dx"], tol(6), "softmax dx");
  }
  {
    Tensor x = leaf(g["log_softmax.x"]);
    Tensor y = ops::log_softmax(x);
    expect_close(y, g["log_softmax.y"], tol(6), "log_softmax y");
    autograd::backward(y, g["log_softmax.dy"].to(y.dtype()));
    expect_close(x.grad(), g["log_softmax.dx"], tol(6), "log_softmax dx");
  }
  for (const char* red : {"mean", "sum", "none"}) {
    std::string p = std::string("ce_") + red + ".";
    Tensor x = leaf(g[p + "x"]);
    Tensor loss = ops::softmax_cross_entropy(x, g[p + "labels"], true, ops::parse_reduction(red));
    EXPECT_EQ(loss.dtype(), dt() == DType::kF64 ? DType::kF64 : DType::kF32) << "losses are FP32 (f64 for f64)";
    expect_close(loss, g[p + "loss"], tolerance_for(DType::kF32), p + "loss");
    autograd::backward(loss, g[p + "dloss"].to(loss.dtype()));
    expect_close(x.grad(), g[p + "dx"], tol(6), p + "dx");
  }
  {
    Tensor x = leaf(g["ce_dense.x"]);
    Tensor loss = ops::softmax_cross_entropy(x, g["ce_dense.p"].to(dt()), false, ops::Reduction::kMean);
    expect_close(loss, g["ce_dense.loss"], tolerance_for(DType::kF32), "ce_dense loss");
    autograd::backward(loss);
    expect_close(x.grad(), g["ce_dense.dx"], tol(6), "ce_dense dx");
  }
  {
    Tensor x = leaf(g["mse.x"]);
    Tensor loss = ops::mse_loss(x, g["mse.t"].to(dt()), ops::Reduction::kMean);
    expect_close(loss, g["mse.loss"], tolerance_for(DType::kF32), "mse loss");
    autograd::backward(loss);
    expect_close(x.grad(), g["mse.dx"], tol(), "mse dx");
  }
}

TEST_P(Golden, BatchNorm2d) {
  auto g = read_golden("batchnorm2d");
  Tensor x = leaf(g["x"]);
  // Parameters and statistics are FP32 in training; the f64 run keeps them f64 so only the kernel differs.
  DType pdt = dt() == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor gamma = g["gamma"].to(pdt, true).set_requires_grad(true);
  Tensor beta = g["beta"].to(pdt, true).set_requires_grad(true);
  Tensor rm = g["running_mean_in"].to(pdt, true);
  Tensor rv = g["running_var_in"].to(pdt, true);
  ops::BatchNormOptions o;
  Tensor y = ops::batch_norm(x, gamma, beta, rm, rv, o);
  expect_close(y, g["y"], tol(100), "y");
  autograd::backward(y, g["dy"].to(y.dtype()));
  expect_close(x.grad(), g["dx"], tol(100), "dx");
  expect_close(gamma.grad(), g["dgamma"], tolerance_for(DType::kF32), "dgamma");
  expect_close(beta.grad(), g["dbeta"], tolerance_for(DType::kF32), "dbeta");
  expect_close(rm, g["running_mean_out"], tolerance_for(DType::kF32), "running mean");
  expect_close(rv, g["running_var_out"], tolerance_for(DType::kF32), "running var");
  o.training = false;
  Tensor ye = ops::batch_norm(x, gamma, beta, rm, rv, o);
  // The running statistics are updated with an f32 momentum (BatchNormParams), so the inference output
  // inherits f32 accuracy even in the f64 run.
  expect_close(ye, g["y_eval"], dt() == DType::kF64 ? tolerance_for(DType::kF32) : tol(4), "y eval");
}

INSTANTIATE_TEST_SUITE_P(DTypes, Golden, ::testing::Values(DType::kF64, DType::kF32),
                         [](const ::testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

// scale * sin(a * i + b), computed in f64 and rounded to f32, as scripts/make_golden.py's formula().
Tensor formula(const Shape& shape, double a, double b, double scale) {
  Tensor t = empty(shape, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(scale * std::sin(a * static_cast<double>(i) + b));
  return t;
}

TEST(GoldenTraining, ModelAFirstFiveLossesMatchPyTorch) {
  auto g = read_golden("model_a_steps");
  nn::SimpleCNN net;
  net.conv1->weight.copy_(formula({32, 3, 3, 3}, 0.7, 1.0, 0.2));
  net.fc->weight.copy_(formula({10, 7200}, 0.3, 0.5, 0.01));
  net.fc->bias.copy_(formula({10}, 1.3, 0.2, 0.1));
  nn::SoftmaxCrossEntropyWithLogits loss_fn(true, "mean");
  optim::Momentum opt(net.trainable_params(), 0.01, 0.9);
  for (int step = 0; step < 5; ++step) {
    Tensor x = formula({32, 3, 32, 32}, 0.1, step, 1.0);
    std::vector<int32_t> labels(32);
    for (int i = 0; i < 32; ++i) labels[static_cast<size_t>(i)] = (i * 3 + step * 7) % 10;
    opt.zero_grad();
    Tensor loss = loss_fn(net(x), from_vector(labels, {32}));
    autograd::backward(loss);
    opt.step();
    EXPECT_NEAR(loss.item(), g["losses"].get(step), 2e-5) << "step " << step;
  }
}

}  // namespace
}  // namespace demi
