#include "demi/nn/layers.h"

#include <cmath>
#include <functional>
#include <utility>

namespace demi::nn {
namespace {

Initializer default_bias_init(int64_t fan) {
  return Initializer::Uniform(1.0 / std::sqrt(static_cast<double>(fan)));
}

ops::Pool2dOptions pool_options(const char* layer, int64_t kernel, int64_t stride, const std::string& pad_mode) {
  DEMI_CHECK(kernel >= 1 && stride >= 1, layer, ": kernel_size and stride must be >= 1, got kernel_size=",
             kernel, " stride=", stride);
  ops::Pool2dOptions o;
  o.kernel = {kernel, kernel};
  o.stride = {stride, stride};
  o.pad_mode = ops::parse_pad_mode(pad_mode);
  DEMI_CHECK(o.pad_mode != ops::PadMode::kPad, layer, ": pad_mode must be \"valid\" or \"same\", got \"",
             pad_mode, "\"");
  return o;
}

// The checks Conv2d and Conv2dTranspose share: positive sizes, channels divisible by the group count.
void check_conv_layer(const char* type, int64_t in, int64_t out, std::array<int64_t, 2> kernel, int64_t group) {
  DEMI_CHECK(in >= 1 && out >= 1, type, ": in_channels and out_channels must be >= 1, got ", in, " and ", out);
  DEMI_CHECK(kernel[0] >= 1 && kernel[1] >= 1, type, ": kernel_size must be >= 1, got (", kernel[0], ", ",
             kernel[1], ")");
  DEMI_CHECK(group >= 1 && in % group == 0 && out % group == 0, type, ": in_channels (", in, ") and out_channels (",
             out, ") must be divisible by group (", group, ")");
}

// A convolution layer's initial weight (HeUniform(sqrt(5)) unless given) and, with has_bias, its bias
// (U(+-1/sqrt(fan_in)) unless given; undefined otherwise), drawn in that order.
template <class Options>
std::pair<Tensor, Tensor> initial_conv_parameters(const Shape& wshape, int64_t out, const Options& options) {
  Generator& gen = default_generator();
  Tensor w = initialize(wshape, options.weight_init.value_or(Initializer::HeUniform(std::sqrt(5.0))), gen);
  Tensor b;
  if (options.has_bias) b = initialize({out}, options.bias_init.value_or(default_bias_init(fan_in(wshape))), gen);
  return {w, b};
}

}  // namespace

// ---- Dense ----
Dense::Dense(int64_t in, int64_t out, const DenseOptions& options)
    : Cell("Dense"), in_channels(in), out_channels(out), relu_(false) {
  DEMI_CHECK(in >= 1 && out >= 1, "Dense: in_channels and out_channels must be >= 1, got ", in, " and ", out);
  DEMI_CHECK(options.activation.empty() || options.activation == "relu",
             "Dense: activation must be \"\" or \"relu\", got \"", options.activation, "\"");
  relu_ = options.activation == "relu";
  Generator& gen = default_generator();
  weight = register_parameter(
      "weight", initialize({out, in}, options.weight_init.value_or(Initializer::HeUniform(std::sqrt(5.0))), gen));
  if (options.has_bias)
    bias = register_parameter("bias", initialize({out}, options.bias_init.value_or(default_bias_init(in)), gen));
}

Tensor Dense::construct(const Tensor& x) {
  DEMI_CHECK(x.rank() >= 1 && x.dim(-1) == in_channels, "expected input of shape (*, ", in_channels,
             ") (in_channels=", in_channels, "), got ", x.describe(),
             x.rank() >= 2 ? str_cat("; the previous layer produces ", x.numel() / x.dim(0),
                                     " features per sample — set in_channels to that, or fix the layer "
                                     "before (e.g. a Conv2d's pad_mode, whose MindSpore default is \"same\")")
                           : std::string());
  const bool relu = relu_ || fused_relu_;
  Shape out_shape = x.shape();
  out_shape[-1] = out_channels;
  if (residual_.defined()) {
    DEMI_CHECK(residual_.shape() == out_shape, "expected a residual of the output's shape ", out_shape, ", got ",
               residual_.describe());
    if (x.rank() == 2) return ops::dense_add(x, weight, bias, residual_);
    Tensor y = ops::dense_add(ops::reshape(x, {-1, in_channels}), weight, bias,
                              ops::reshape(residual_, {-1, out_channels}));
    return ops::reshape(y, out_shape);
  }
  if (x.rank() == 2) return ops::dense(x, weight, bias, relu);
  // (*, in) -> flatten the leading dimensions, then restore them.
  Tensor y = ops::dense(ops::reshape(x, {-1, in_channels}), weight, bias, relu);
  return ops::reshape(y, out_shape);
}

Tensor Dense::call_relu(const Tensor& x) { return call_with(fused_relu_, true, x); }

Tensor Dense::call_add(const Tensor& x, const Tensor& residual) {
  if (relu_) return ops::add(residual, (*this)(x));  // (the ReLU comes before the add)
  return call_adding(residual_, residual, x);
}

// ---- Conv2d ----
Conv2dOptions Conv2dOptions::Make(int64_t stride, const std::string& pad_mode, int64_t padding, bool has_bias) {
  Conv2dOptions o;
  o.stride = {stride, stride};
  o.pad_mode = pad_mode;
  o.padding = {padding, padding, padding, padding};
  o.has_bias = has_bias;
  return o;
}

Conv2d::Conv2d(int64_t in, int64_t out, std::array<int64_t, 2> kernel, const Conv2dOptions& options)
    : Cell("Conv2d"), in_channels(in), out_channels(out), kernel_size(kernel) {
  check_conv_layer("Conv2d", in, out, kernel, options.group);
  op_options.stride = options.stride;
  op_options.pad_mode = ops::parse_pad_mode(options.pad_mode);
  op_options.padding = options.padding;
  op_options.dilation = options.dilation;
  op_options.groups = options.group;
  bool any_padding = options.padding[0] || options.padding[1] || options.padding[2] || options.padding[3];
  DEMI_CHECK(op_options.pad_mode == ops::PadMode::kPad || !any_padding,
             "Conv2d: padding is only allowed with pad_mode=\"pad\" (as in MindSpore), got pad_mode=\"",
             options.pad_mode, "\" with padding (", options.padding[0], ", ", options.padding[1], ", ",
             options.padding[2], ", ", options.padding[3], ")");
  Shape wshape{out, in / options.group, kernel[0], kernel[1]};
  auto [w0, b0] = initial_conv_parameters(wshape, out, options);
  weight = register_parameter("weight", w0);
  if (b0.defined()) bias = register_parameter("bias", b0);
}

// ---- Conv2dTranspose ----
Conv2dTranspose::Conv2dTranspose(int64_t in, int64_t out, std::array<int64_t, 2> kernel,
                                 const Conv2dTransposeOptions& options)
    : Cell("Conv2dTranspose"), in_channels(in), out_channels(out), kernel_size(kernel) {
  check_conv_layer("Conv2dTranspose", in, out, kernel, options.group);
  op_options.stride = options.stride;
  op_options.pad_mode = ops::parse_pad_mode(options.pad_mode);
  op_options.padding = options.padding;
  op_options.output_padding = options.output_padding;
  op_options.dilation = options.dilation;
  op_options.groups = options.group;
  ops::check_conv2d_transpose_options(op_options);
  Shape wshape{in, out / options.group, kernel[0], kernel[1]};
  auto [w0, b0] = initial_conv_parameters(wshape, out, options);
  weight = register_parameter("weight", w0);
  if (b0.defined()) bias = register_parameter("bias", b0);
}

Shape Conv2dTranspose::output_shape(const Shape& input) const {
  DEMI_CHECK(input.rank() == 4 && input[1] == in_channels, "Conv2dTranspose: expected an input (N, ", in_channels,
             ", H, W), got ", input);
  auto [oh, ow] = ops::conv2d_transpose_output_size(input[2], input[3], kernel_size[0], kernel_size[1], op_options);
  return {input[0], out_channels, oh, ow};
}

Tensor Conv2dTranspose::construct(const Tensor& x) {
  DEMI_CHECK(x.rank() == 4 && x.dim(1) == in_channels, "expected a 4-D input (N, ", in_channels, ", H, W), got ",
             x.describe());
  return ops::conv2d_transpose(x, weight, bias, op_options);
}

// ---- Conv1d ----
Conv1d::Conv1d(int64_t in, int64_t out, int64_t kernel, const Conv1dOptions& o)
    : Cell("Conv1d"), in_channels(in), out_channels(out), kernel_size(kernel) {
  DEMI_CHECK(in >= 1 && out >= 1 && kernel >= 1 && o.stride >= 1 && o.dilation >= 1 && o.padding >= 0,
             "Conv1d: in_channels, out_channels, kernel_size, stride and dilation must be >= 1 and padding >= 0, "
             "got ", in, ", ", out, ", ", kernel, ", ", o.stride, ", ", o.dilation, ", ", o.padding);
  DEMI_CHECK(o.group >= 1 && in % o.group == 0 && out % o.group == 0, "Conv1d: in_channels (", in,
             ") and out_channels (", out, ") must be divisible by group (", o.group, ")");
  op_options.stride = {1, o.stride};
  op_options.pad_mode = ops::parse_pad_mode(o.pad_mode);
  DEMI_CHECK(op_options.pad_mode == ops::PadMode::kPad || o.padding == 0,
             "Conv1d: padding is only allowed with pad_mode=\"pad\" (as in MindSpore), got pad_mode=\"", o.pad_mode,
             "\" with padding ", o.padding);
  op_options.padding = {0, 0, o.padding, o.padding};
  op_options.dilation = {1, o.dilation};
  op_options.groups = o.group;
  const Shape wshape{out, in / o.group, kernel};
  Generator& gen = default_generator();
  weight = register_parameter("weight", initialize(wshape, Initializer::HeUniform(std::sqrt(5.0)), gen));
  if (o.has_bias) bias = register_parameter("bias", initialize({out}, default_bias_init(fan_in(wshape)), gen));
}

Tensor Conv1d::construct(const Tensor& x) {
  DEMI_CHECK(x.rank() == 3 && x.dim(1) == in_channels, "expected a 3-D input (N, ", in_channels, ", L), got ",
             x.describe());
  const int64_t n = x.dim(0), l = x.dim(2);
  Tensor w = ops::reshape(weight, {out_channels, weight.dim(1), 1, kernel_size});
  Tensor y = ops::conv2d(ops::reshape(x, {n, in_channels, 1, l}), w, bias, op_options);
  return ops::reshape(y, {n, out_channels, y.dim(3)});
}

Shape Conv2d::output_shape(const Shape& input) const {
  DEMI_CHECK(input.rank() == 4 && input[1] == in_channels, "Conv2d: expected an input (N, ", in_channels,
             ", H, W), got ", input);
  kernels::Conv2dPadding p = kernels::resolve_conv2d_padding(
      op_options.pad_mode, input[2], input[3], kernel_size[0], kernel_size[1], op_options.stride[0],
      op_options.stride[1], op_options.dilation[0], op_options.dilation[1], op_options.padding[0],
      op_options.padding[1], op_options.padding[2], op_options.padding[3]);
  return {input[0], out_channels, p.out_h, p.out_w};
}

Tensor Conv2d::construct(const Tensor& x) {
  DEMI_CHECK(x.rank() == 4, "expected a 4-D input (N, C, H, W) with C=", in_channels, ", got ", x.describe());
  DEMI_CHECK(x.dim(1) == in_channels, "expected ", in_channels, " input channels (N, ", in_channels,
             ", H, W), got ", x.describe());
  if (fused_pool_ != nullptr) return ops::conv2d_relu_max_pool2d(x, weight, bias, op_options, *fused_pool_);
  return ops::conv2d(x, weight, bias, op_options);
}

Tensor Conv2d::call_relu_max_pool(const Tensor& x, const ops::Pool2dOptions& pool) {
  return call_with(fused_pool_, &pool, x);
}

// ---- pooling ----
MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, const std::string& pad_mode)
    : Cell("MaxPool2d"), options(pool_options("MaxPool2d", kernel, stride, pad_mode)) {}

Tensor MaxPool2d::construct(const Tensor& x) {
  DEMI_CHECK(x.rank() == 4, "expected a 4-D input (N, C, H, W), got ", x.describe());
  return ops::max_pool2d(x, options);
}

AvgPool2d::AvgPool2d(int64_t kernel, int64_t stride, const std::string& pad_mode)
    : Cell("AvgPool2d"), options(pool_options("AvgPool2d", kernel, stride, pad_mode)) {}

Tensor AvgPool2d::construct(const Tensor& x) {
  DEMI_CHECK(x.rank() == 4, "expected a 4-D input (N, C, H, W), got ", x.describe());
  return ops::avg_pool2d(x, options);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(std::array<int64_t, 2> size) : Cell("AdaptiveAvgPool2d"), output_size(size) {
  DEMI_CHECK(size[0] >= 1 && size[1] >= 1, "AdaptiveAvgPool2d: output_size must be >= 1, got (", size[0], ", ",
             size[1], ")");
}

Tensor AdaptiveAvgPool2d::construct(const Tensor& x) {
  DEMI_CHECK(x.rank() == 4, "expected a 4-D input (N, C, H, W), got ", x.describe());
  const int64_t h = x.dim(2), w = x.dim(3), oh = output_size[0], ow = output_size[1];
  if (oh == 1 && ow == 1) return ops::mean(x, {2, 3}, /*keepdim=*/true);
  if (h % oh == 0 && w % ow == 0) {
    ops::Pool2dOptions o;
    o.kernel = {h / oh, w / ow};
    o.stride = o.kernel;
    return ops::avg_pool2d(x, o);
  }
  // (out, in): row i averages PyTorch's window [floor(i in / out), ceil((i + 1) in / out)).
  auto averaging = [&](int64_t out, int64_t in) {
    std::vector<double> m(static_cast<size_t>(out * in), 0.0);
    for (int64_t i = 0; i < out; ++i) {
      const int64_t start = i * in / out, end = ((i + 1) * in + out - 1) / out;
      for (int64_t j = start; j < end; ++j) m[static_cast<size_t>(i * in + j)] = 1.0 / static_cast<double>(end - start);
    }
    return from_vector(m, {out, in}).to(x.dtype());
  };
  const int64_t n = x.dim(0), c = x.dim(1);
  // Columns: (N C H, W) x (ow, W)^T; then rows: (N C ow, H) x (oh, H)^T, and back to (N, C, oh, ow).
  Tensor cols = ops::matmul(ops::reshape(x, {n * c * h, w}), averaging(ow, w), false, true);
  Tensor t = ops::transpose(ops::reshape(cols, {n * c, h, ow}), {0, 2, 1});
  Tensor rows = ops::matmul(ops::reshape(t, {n * c * ow, h}), averaging(oh, h), false, true);
  return ops::reshape(ops::transpose(ops::reshape(rows, {n * c, ow, oh}), {0, 2, 1}), {n, c, oh, ow});
}

Residual::Residual(CellPtr body_cell, CellPtr shortcut_cell)
    : Cell("Residual"), body(std::move(body_cell)), shortcut(std::move(shortcut_cell)) {
  DEMI_CHECK(body != nullptr, "Residual: the body must be a cell");
  add_cell("body", body);
  if (shortcut) add_cell("shortcut", shortcut);
}

Tensor Residual::construct(const Tensor& x) {
  Tensor y = (*body)(x);
  Tensor s = shortcut ? (*shortcut)(x) : x;
  DEMI_CHECK(y.shape() == s.shape(), "Residual: the body's output ", y.describe(), " and the shortcut's ",
             s.describe(), " differ in shape (give a shortcut that projects the input)");
  return ops::add(y, s);
}

// ---- BatchNorm ----
BatchNorm::BatchNorm(const char* type_name, int rank, int64_t features, const BatchNormOptions& options)
    : Cell(type_name), num_features(features), rank_(rank), options_(options) {
  DEMI_CHECK(features >= 1, type_name, ": num_features must be >= 1, got ", features);
  DEMI_CHECK(options.momentum >= 0 && options.momentum <= 1, type_name, ": momentum must be in [0, 1], got ",
             options.momentum);
  gamma = register_parameter("gamma", ones({features}), options.affine);
  beta = register_parameter("beta", zeros({features}), options.affine);
  moving_mean = register_buffer("moving_mean", zeros({features}));
  moving_variance = register_buffer("moving_variance", ones({features}));
}

Tensor BatchNorm::construct(const Tensor& x) {
  DEMI_CHECK(x.rank() == rank_ && x.dim(1) == num_features, "expected input (N, ", num_features,
             rank_ == 4 ? ", H, W)" : ")", ", got ", x.describe());
  ops::BatchNormOptions o;
  o.training = training();
  o.momentum = options_.momentum;
  o.eps = options_.eps;
  return ops::batch_norm(x, gamma, beta, moving_mean, moving_variance, o);
}

// ---- Dropout ----
Dropout::Dropout(double keep_prob) : Cell("Dropout"), keep_prob_(keep_prob), gen_(default_generator().next_u64()) {
  DEMI_CHECK(keep_prob > 0 && keep_prob <= 1, "Dropout: keep_prob must be in (0, 1], got ", keep_prob);
}

Tensor Dropout::construct(const Tensor& x) { return ops::dropout(x, keep_prob_, gen_, training()); }

// ---- SequentialCell ----
SequentialCell::SequentialCell(std::vector<CellPtr> cells) : Cell("SequentialCell") {
  for (auto& c : cells) append(std::move(c));
}

SequentialCell& SequentialCell::append(CellPtr cell) {
  add_cell(std::to_string(cells_.size()), cell);
  cells_.push_back(std::move(cell));
  return *this;
}

Tensor SequentialCell::construct(const Tensor& x) {
  Tensor y = x;
  for (size_t i = 0; i < cells_.size(); ++i) {
    auto next = [&](size_t k) { return i + k < cells_.size() ? cells_[i + k].get() : nullptr; };
    auto* conv = dynamic_cast<Conv2d*>(cells_[i].get());
    auto* dense = dynamic_cast<Dense*>(cells_[i].get());
    auto* relu = dynamic_cast<ReLU*>(cells_[i].get());
    auto* relu_next = dynamic_cast<ReLU*>(next(1));
    if (conv != nullptr && relu_next != nullptr) {
      auto* pool = dynamic_cast<MaxPool2d*>(next(2));
      if (pool != nullptr && fusion::conv_relu_max_pool_applies(*relu_next, *pool, y)) {
        y = fusion::conv_relu_max_pool(*conv, *pool, y);
        i += 2;
        continue;
      }
    }
    if (dense != nullptr && relu_next != nullptr && fusion::dense_relu_applies(*relu_next)) {
      y = fusion::dense_relu(*dense, y);
      ++i;
      continue;
    }
    auto* pool_next = dynamic_cast<MaxPool2d*>(next(1));
    if (relu != nullptr && pool_next != nullptr && fusion::relu_max_pool_applies(*relu, *pool_next, y)) {
      y = fusion::relu_max_pool(*relu, *pool_next, y);
      ++i;
      continue;
    }
    y = (*cells_[i])(y);
  }
  return y;
}

namespace fusion {

// (the conditions of its ReLU -> MaxPool2d part: the convolution runs in its own cell's scopes)
bool conv_relu_max_pool_applies(const ReLU& relu, const MaxPool2d& pool, const Tensor& x) {
  return relu_max_pool_applies(relu, pool, x);
}

Tensor conv_relu_max_pool(Conv2d& conv, const MaxPool2d& pool, const Tensor& x) {
  return conv.call_relu_max_pool(x, pool.options);
}

bool dense_relu_applies(const ReLU& relu) {
  return ops::fusion_enabled() && !relu.pinned_dtype() && relu.precision_policy() == nullptr;
}

Tensor dense_relu(Dense& dense, const Tensor& x) { return dense.call_relu(x); }

bool relu_max_pool_applies(const ReLU& relu, const MaxPool2d& pool, const Tensor& x) {
  return ops::fusion_enabled() && !relu.pinned_dtype() && !pool.pinned_dtype() && x.rank() == 4;
}

Tensor relu_max_pool(ReLU& relu, const MaxPool2d& pool, const Tensor& x) {
  ops::LayerScope layer(relu.layer_id());  // the fused op is the ReLU's (and its pool's)
  return ops::relu_max_pool2d(x, pool.options);
}

}  // namespace fusion

// ---- losses ----
SoftmaxCrossEntropyWithLogits::SoftmaxCrossEntropyWithLogits(bool sparse, const std::string& reduction)
    : LossCell("SoftmaxCrossEntropyWithLogits"), sparse_(sparse), reduction_(ops::parse_reduction(reduction)) {}

Tensor SoftmaxCrossEntropyWithLogits::construct(const Tensor& logits, const Tensor& labels) {
  if (sparse_ && logits.rank() > 2 && labels.rank() == logits.rank() - 1) {
    // A sequence model's (B, T, C) logits with (B, T) labels: every position is one sample.
    for (int i = 0; i < labels.rank(); ++i)
      DEMI_CHECK(labels.dim(i) == logits.dim(i), "expected labels of shape ", logits.shape(),
                 " without its last axis for logits ", logits.describe(), ", got ", labels.describe());
    Tensor loss = ops::softmax_cross_entropy(ops::reshape(logits, {-1, logits.dim(-1)}), ops::reshape(labels, {-1}),
                                             true, reduction_);
    return reduction_ == ops::Reduction::kNone ? ops::reshape(loss, labels.shape()) : loss;
  }
  return ops::softmax_cross_entropy(logits, labels, sparse_, reduction_);
}

// ---- GroupNorm ----
GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps, bool affine)
    : Cell("GroupNorm"), num_groups(groups), num_channels(channels), epsilon(eps) {
  DEMI_CHECK(groups >= 1 && channels >= 1 && channels % groups == 0, "GroupNorm: num_channels (", channels,
             ") must be a positive multiple of num_groups (", groups, ")");
  DEMI_CHECK(eps > 0, "GroupNorm: eps must be positive, got ", eps);
  if (affine) {
    gamma = register_parameter("gamma", ones({channels}));
    beta = register_parameter("beta", zeros({channels}));
  }
}

Tensor GroupNorm::construct(const Tensor& x) {
  DEMI_CHECK(x.rank() >= 2 && x.dim(1) == num_channels, "expected an input (N, ", num_channels, ", *), got ",
             x.describe());
  const int64_t n = x.dim(0);
  Tensor y = ops::layer_norm(ops::reshape(x, {n * num_groups, -1}), Tensor(), Tensor(), epsilon);
  y = ops::reshape(y, x.shape());
  if (!gamma.defined()) return y;
  std::vector<int64_t> dims(static_cast<size_t>(x.rank() - 1), 1);  // (C, 1, ..., 1)
  dims[0] = num_channels;
  const Shape per_channel{std::span<const int64_t>(dims)};
  return ops::add(ops::mul(y, ops::reshape(gamma, per_channel)), ops::reshape(beta, per_channel));
}

// ---- LeakyReLU, PReLU ----
LeakyReLU::LeakyReLU(double a) : Cell("LeakyReLU"), alpha(a) {
  DEMI_CHECK(a >= 0 && a <= 1, "LeakyReLU: alpha must be in [0, 1], got ", a);
}

Tensor LeakyReLU::construct(const Tensor& x) {
  return ops::sub(ops::relu(x), ops::mul_scalar(ops::relu(ops::neg(x)), alpha));
}

ELU::ELU(double a) : Cell("ELU"), alpha(a) {
  DEMI_CHECK(a > 0 && std::isfinite(a), "ELU: alpha must be positive, got ", a);
}

Tensor ELU::construct(const Tensor& x) {
  Tensor z = ops::neg(ops::relu(ops::neg(x)));                          // min(x, 0)
  Tensor ez = ops::div(ops::sigmoid(z), ops::sigmoid(ops::neg(z)));     // e^z
  return ops::add(ops::relu(x), ops::mul_scalar(ops::add_scalar(ez, -1.0), alpha));
}

PReLU::PReLU(int64_t channel, double w_init) : Cell("PReLU") {
  DEMI_CHECK(channel >= 1, "PReLU: channel must be >= 1, got ", channel);
  w = register_parameter("w", full({channel}, w_init));
}

Tensor PReLU::construct(const Tensor& x) {
  const int64_t c = w.numel();
  DEMI_CHECK(c == 1 || (x.rank() >= 2 && x.dim(1) == c), "expected an input (N, ", c, ", *) for ", c,
             " slopes, got ", x.describe());
  Tensor slope = w;
  if (c > 1 && x.rank() > 2) {
    std::vector<int64_t> dims(static_cast<size_t>(x.rank() - 1), 1);  // (C, 1, ..., 1)
    dims[0] = c;
    slope = ops::reshape(w, Shape{std::span<const int64_t>(dims)});
  }
  return ops::sub(ops::relu(x), ops::mul(ops::relu(ops::neg(x)), slope));
}

namespace {

Tensor reduce_loss(const Tensor& per_element, ops::Reduction r) {
  if (r == ops::Reduction::kNone) return per_element;
  return r == ops::Reduction::kSum ? ops::sum(per_element) : ops::mean(per_element);
}

void check_same_shape(const Tensor& logits, const Tensor& labels) {
  DEMI_CHECK(logits.shape() == labels.shape() && is_floating(labels.dtype()),
             "expected floating labels of the logits' shape ", logits.shape(), ", got ", labels.describe());
}

}  // namespace

// ---- L1Loss, SmoothL1Loss, BCEWithLogitsLoss ----
L1Loss::L1Loss(const std::string& reduction) : LossCell("L1Loss"), reduction_(ops::parse_reduction(reduction)) {}

Tensor L1Loss::construct(const Tensor& logits, const Tensor& labels) {
  check_same_shape(logits, labels);
  Tensor d = ops::sub(logits, labels);
  return reduce_loss(ops::add(ops::relu(d), ops::relu(ops::neg(d))), reduction_);
}

SmoothL1Loss::SmoothL1Loss(double beta, const std::string& reduction)
    : LossCell("SmoothL1Loss"), beta_(beta), reduction_(ops::parse_reduction(reduction)) {
  DEMI_CHECK(beta > 0, "SmoothL1Loss: beta must be > 0, got ", beta);
}

Tensor SmoothL1Loss::construct(const Tensor& logits, const Tensor& labels) {
  check_same_shape(logits, labels);
  Tensor d = ops::sub(logits, labels);
  Tensor a = ops::add(ops::relu(d), ops::relu(ops::neg(d)));
  Tensor q = ops::sub(a, ops::relu(ops::add_scalar(a, -beta_)));  // min(a, beta)
  return reduce_loss(ops::mul_scalar(ops::mul(q, ops::sub(a, ops::mul_scalar(q, 0.5))), 1.0 / beta_), reduction_);
}

BCEWithLogitsLoss::BCEWithLogitsLoss(const std::string& reduction)
    : LossCell("BCEWithLogitsLoss"), reduction_(ops::parse_reduction(reduction)) {}

Tensor BCEWithLogitsLoss::construct(const Tensor& logits, const Tensor& labels) {
  check_same_shape(logits, labels);
  // [x, 0] per element as one (M, 1) x (1, 2) product, then log-softmax: [log sigmoid(x), log sigmoid(-x)].
  Tensor pair = ops::matmul(ops::reshape(logits, {-1, 1}), from_vector(std::vector<float>{1.0f, 0.0f}, {1, 2}));
  Tensor lp = ops::log_softmax(pair, -1);
  // y, 1 - y as the (M, 2) weights of the two columns (labels get no gradient).
  const Tensor y = labels.to(DType::kF32);
  Tensor w = empty({logits.numel(), 2});
  for (int64_t i = 0; i < logits.numel(); ++i) {
    const double yi = y.get(i);
    w.set(2 * i, yi);
    w.set(2 * i + 1, 1.0 - yi);
  }
  Tensor per = ops::neg(ops::sum(ops::mul(lp, w), {1}));
  return reduce_loss(ops::reshape(per, logits.shape()), reduction_);
}

// ---- LSTM, GRU ----
namespace {

// Registers layer k's four tensors of a recurrent cell with `gates` gates, drawn from U(+-1/sqrt(H)).
void register_recurrent_layer(const std::function<Tensor(const std::string&, Tensor)>& reg, int64_t k, int64_t in,
                              int64_t hidden, int64_t gates, bool has_bias, std::vector<Tensor>& w_ih,
                              std::vector<Tensor>& w_hh, std::vector<Tensor>& b_ih, std::vector<Tensor>& b_hh) {
  const Initializer init = Initializer::Uniform(1.0 / std::sqrt(static_cast<double>(hidden)));
  Generator& gen = default_generator();
  const std::string l = "_l" + std::to_string(k);
  w_ih.push_back(reg("weight_ih" + l, initialize({gates * hidden, in}, init, gen)));
  w_hh.push_back(reg("weight_hh" + l, initialize({gates * hidden, hidden}, init, gen)));
  b_ih.push_back(has_bias ? reg("bias_ih" + l, initialize({gates * hidden}, init, gen)) : Tensor());
  b_hh.push_back(has_bias ? reg("bias_hh" + l, initialize({gates * hidden}, init, gen)) : Tensor());
}

void check_recurrent_input(const Tensor& x, int64_t input_size) {
  DEMI_CHECK(x.rank() == 3 && x.dim(2) == input_size && x.dim(1) >= 1, "expected a batch-first input (B, T, ",
             input_size, ") with T >= 1, got ", x.describe());
}

// The initial state of layer k: state[k] of a (num_layers, B, H) tensor, or zeros.
Tensor initial_state(const Tensor& s, int64_t k, int64_t layers, int64_t b, int64_t h, const char* name) {
  if (!s.defined()) return zeros({b, h});
  DEMI_CHECK(s.rank() == 3 && s.dim(0) == layers && s.dim(1) == b && s.dim(2) == h, "expected ", name, " (", layers,
             ", ", b, ", ", h, "), got ", s.describe());
  return ops::reshape(ops::split(s, 0, layers)[static_cast<size_t>(k)], {b, h});
}

// The per-step input projections x_t W_ih^T + b_ih of all steps, as T tensors (B, gates * H).
std::vector<Tensor> input_projections(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t bs = x.dim(0), t = x.dim(1), g = w.dim(0);
  Tensor xw = ops::reshape(ops::dense(ops::reshape(x, {bs * t, x.dim(2)}), w, b), {bs, t, g});
  std::vector<Tensor> steps = ops::split(xw, 1, t);
  for (Tensor& s : steps) s = ops::reshape(s, {bs, g});
  return steps;
}

Tensor stack_steps(const std::vector<Tensor>& hs, int64_t b, int64_t h) {
  std::vector<Tensor> parts;
  for (const Tensor& t : hs) parts.push_back(ops::reshape(t, {b, 1, h}));
  return ops::concat(parts, 1);
}

Tensor stack_layers(const std::vector<Tensor>& hs, int64_t b, int64_t h) {
  std::vector<Tensor> parts;
  for (const Tensor& t : hs) parts.push_back(ops::reshape(t, {1, b, h}));
  return ops::concat(parts, 0);
}

}  // namespace

LSTM::LSTM(int64_t in, int64_t hidden, int64_t layers, bool has_bias)
    : Cell("LSTM"), input_size(in), hidden_size(hidden), num_layers(layers) {
  DEMI_CHECK(in >= 1 && hidden >= 1 && layers >= 1, "LSTM: input_size, hidden_size and num_layers must be >= 1, got ",
             in, ", ", hidden, ", ", layers);
  auto reg = [this](const std::string& n, Tensor t) { return register_parameter(n, std::move(t)); };
  for (int64_t k = 0; k < layers; ++k)
    register_recurrent_layer(reg, k, k == 0 ? in : hidden, hidden, 4, has_bias, weight_ih, weight_hh, bias_ih, bias_hh);
}

Tensor LSTM::construct(const Tensor& x) { return forward(x).output; }

RecurrentState LSTM::forward(const Tensor& x, const Tensor& h0, const Tensor& c0) {
  check_recurrent_input(x, input_size);
  const int64_t b = x.dim(0), hs = hidden_size;
  Tensor layer_in = x;
  std::vector<Tensor> h_last, c_last;
  RecurrentState out;
  for (int64_t k = 0; k < num_layers; ++k) {
    const size_t kk = static_cast<size_t>(k);
    Tensor h = initial_state(h0, k, num_layers, b, hs, "h0"), c = initial_state(c0, k, num_layers, b, hs, "c0");
    std::vector<Tensor> hs_t;
    for (const Tensor& xt : input_projections(layer_in, weight_ih[kk], bias_ih[kk])) {
      std::vector<Tensor> g = ops::split(ops::add(xt, ops::dense(h, weight_hh[kk], bias_hh[kk])), 1, 4);
      c = ops::add(ops::mul(ops::sigmoid(g[1]), c), ops::mul(ops::sigmoid(g[0]), ops::tanh(g[2])));
      h = ops::mul(ops::sigmoid(g[3]), ops::tanh(c));
      hs_t.push_back(h);
    }
    layer_in = stack_steps(hs_t, b, hs);
    h_last.push_back(h);
    c_last.push_back(c);
  }
  out.output = layer_in;
  out.h_n = stack_layers(h_last, b, hs);
  out.c_n = stack_layers(c_last, b, hs);
  return out;
}

GRU::GRU(int64_t in, int64_t hidden, int64_t layers, bool has_bias)
    : Cell("GRU"), input_size(in), hidden_size(hidden), num_layers(layers) {
  DEMI_CHECK(in >= 1 && hidden >= 1 && layers >= 1, "GRU: input_size, hidden_size and num_layers must be >= 1, got ",
             in, ", ", hidden, ", ", layers);
  auto reg = [this](const std::string& n, Tensor t) { return register_parameter(n, std::move(t)); };
  for (int64_t k = 0; k < layers; ++k)
    register_recurrent_layer(reg, k, k == 0 ? in : hidden, hidden, 3, has_bias, weight_ih, weight_hh, bias_ih, bias_hh);
}

Tensor GRU::construct(const Tensor& x) { return forward(x).output; }

RecurrentState GRU::forward(const Tensor& x, const Tensor& h0) {
  check_recurrent_input(x, input_size);
  const int64_t b = x.dim(0), hs = hidden_size;
  Tensor layer_in = x;
  std::vector<Tensor> h_last;
  RecurrentState out;
  for (int64_t k = 0; k < num_layers; ++k) {
    const size_t kk = static_cast<size_t>(k);
    Tensor h = initial_state(h0, k, num_layers, b, hs, "h0");
    std::vector<Tensor> hs_t;
    for (const Tensor& xt : input_projections(layer_in, weight_ih[kk], bias_ih[kk])) {
      std::vector<Tensor> gi = ops::split(xt, 1, 3);
      std::vector<Tensor> gh = ops::split(ops::dense(h, weight_hh[kk], bias_hh[kk]), 1, 3);
      Tensor r = ops::sigmoid(ops::add(gi[0], gh[0]));
      Tensor z = ops::sigmoid(ops::add(gi[1], gh[1]));
      Tensor n = ops::tanh(ops::add(gi[2], ops::mul(r, gh[2])));
      h = ops::add(n, ops::mul(z, ops::sub(h, n)));  // (1 - z) n + z h
      hs_t.push_back(h);
    }
    layer_in = stack_steps(hs_t, b, hs);
    h_last.push_back(h);
  }
  out.output = layer_in;
  out.h_n = stack_layers(h_last, b, hs);
  return out;
}

// ---- NLLLoss ----
NLLLoss::NLLLoss(const std::string& reduction) : LossCell("NLLLoss"), reduction_(ops::parse_reduction(reduction)) {}

Tensor NLLLoss::construct(const Tensor& log_probs, const Tensor& labels) {
  DEMI_CHECK(log_probs.rank() == 2 && labels.rank() == 1 && labels.dim(0) == log_probs.dim(0) &&
                 (labels.dtype() == DType::kI32 || labels.dtype() == DType::kI64),
             "expected log-probabilities (N, C) and int32|int64 labels (N), got ", log_probs.describe(), " and ",
             labels.describe());
  const int64_t n = log_probs.dim(0), c = log_probs.dim(1);
  // The selection as a constant one-hot mask: -sum_c(logp * onehot) per sample.
  Tensor onehot = zeros({n, c});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t y = static_cast<int64_t>(labels.get(i));
    DEMI_CHECK(y >= 0 && y < c, "label ", y, " of sample ", i, " is outside [0, ", c, ") for log-probabilities ",
               log_probs.describe());
    onehot.set(i * c + y, 1.0);
  }
  Tensor per_sample = ops::neg(ops::sum(ops::mul(log_probs, onehot), {1}));
  if (reduction_ == ops::Reduction::kNone) return per_sample;
  return reduction_ == ops::Reduction::kSum ? ops::sum(per_sample) : ops::mean(per_sample);
}

MSELoss::MSELoss(const std::string& reduction) : LossCell("MSELoss"), reduction_(ops::parse_reduction(reduction)) {}

Tensor MSELoss::construct(const Tensor& logits, const Tensor& labels) {
  return ops::mse_loss(logits, labels, reduction_);
}

}  // namespace demi::nn
