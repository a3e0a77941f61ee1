// The layers, with MindSpore's names and defaults (documented per layer: the seed's code must mean in
// demi what it means in MindSpore). Weight initializers follow MindSpore >= 2.1, which matches PyTorch:
// HeUniform(sqrt(5)) weights and U(±1/sqrt(fan_in)) biases (MindSpore 2.0 drew Normal(0.01) weights).
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "demi/core/rng.h"
#include "demi/nn/cell.h"
#include "demi/nn/init.h"
#include "demi/ops/ops.h"

namespace demi::nn {

struct DenseOptions {
  bool has_bias = true;                         // MindSpore: has_bias=True
  std::optional<Initializer> weight_init;       // default HeUniform(sqrt(5))
  std::optional<Initializer> bias_init;         // default U(±1/sqrt(in_channels))
  std::string activation;                       // "" (none) or "relu" (fused into the product)
};

// x (*, in_channels) -> (*, out_channels); weight (out_channels, in_channels), bias (out_channels).
class Dense : public Cell {
 public:
  Dense(int64_t in, int64_t out, const DenseOptions& options = {});
  Tensor construct(const Tensor& x) override;
  // This layer followed by a ReLU as one op (SequentialCell's fusion): called as the layer (its hooks,
  // precision and name), the ReLU applied in the product's epilogue.
  Tensor call_relu(const Tensor& x);
  // residual + this layer(x) as one op (a residual connection's add in the product's store: ops::dense_add),
  // called as the layer; residual has the output's shape. A layer with a ReLU, or one recomputed on its own,
  // runs the two ops.
  Tensor call_add(const Tensor& x, const Tensor& residual);
  Tensor weight, bias;
  int64_t in_channels, out_channels;

 private:
  bool relu_;
  bool fused_relu_ = false;  // set only during call_relu
  Tensor residual_;          // set only during call_add
};

struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1};             // MindSpore: stride=1
  std::string pad_mode = "same";                   // MindSpore: pad_mode="same" (NOT PyTorch's no padding)
  std::array<int64_t, 4> padding{0, 0, 0, 0};      // top, bottom, left, right; only with pad_mode "pad"
  std::array<int64_t, 2> dilation{1, 1};
  int64_t group = 1;
  bool has_bias = false;                           // MindSpore: has_bias=False (PyTorch: bias=True)
  std::optional<Initializer> weight_init;          // default HeUniform(sqrt(5))
  std::optional<Initializer> bias_init;            // default U(±1/sqrt(fan_in))

  // Conveniences matching MindSpore's scalar arguments.
  static Conv2dOptions Make(int64_t stride, const std::string& pad_mode, int64_t padding = 0,
                            bool has_bias = false);
};

// x (N, in_channels, H, W) -> (N, out_channels, OH, OW); weight (out, in/group, kh, kw).
class Conv2d : public Cell {
 public:
  Conv2d(int64_t in, int64_t out, std::array<int64_t, 2> kernel, const Conv2dOptions& options = {});
  Conv2d(int64_t in, int64_t out, int64_t kernel, const Conv2dOptions& options = {})
      : Conv2d(in, out, std::array<int64_t, 2>{kernel, kernel}, options) {}
  Tensor construct(const Tensor& x) override;
  // This convolution followed by ReLU and a max-pool with `pool` as one fused op (ops::conv2d_relu_max_pool2d:
  // the same values, the full-size output never stored), run as this cell (its path in errors, its pin).
  Tensor call_relu_max_pool(const Tensor& x, const ops::Pool2dOptions& pool);
  // The output shape for an input shape, or a demi::Error naming both (used for early diagnosis).
  Shape output_shape(const Shape& input) const;
  Tensor weight, bias;
  int64_t in_channels, out_channels;
  std::array<int64_t, 2> kernel_size;
  ops::Conv2dOptions op_options;

 private:
  const ops::Pool2dOptions* fused_pool_ = nullptr;  // set only during call_relu_max_pool
};

// MindSpore: Conv1d(in_channels, out_channels, kernel_size, stride=1, pad_mode="same", padding=0, dilation=1,
// group=1, has_bias=False): x (N, in_channels, L) -> (N, out_channels, OL); weight (out, in/group, k). Runs as
// the 2-D convolution of (N, C, 1, L) by (out, in/group, 1, k) (the same kernels, forward and backward).
struct Conv1dOptions {
  int64_t stride = 1;
  std::string pad_mode = "same";
  int64_t padding = 0;  // both ends; only with pad_mode "pad"
  int64_t dilation = 1;
  int64_t group = 1;
  bool has_bias = false;
};
class Conv1d : public Cell {
 public:
  Conv1d(int64_t in, int64_t out, int64_t kernel, const Conv1dOptions& options = {});
  Tensor construct(const Tensor& x) override;
  Tensor weight, bias;
  int64_t in_channels, out_channels, kernel_size;
  ops::Conv2dOptions op_options;
};

// MindSpore: Conv2dTranspose(in_channels, out_channels, kernel_size, stride=1, pad_mode="same", padding=0,
// output_padding=0, dilation=1, group=1, has_bias=False): x (N, in, H, W) -> (N, out, OH, OW), the
// adjoint of Conv2d(out, in, ...) (ops::conv2d_transpose has the output sizes); weight (in, out/group, kh,
// kw), as MindSpore and PyTorch hold it, initialised as PyTorch's ConvTranspose2d (HeUniform(sqrt(5)) over
// fan_in = out/group * kh * kw).
struct Conv2dTransposeOptions {
  std::array<int64_t, 2> stride{1, 1};
  std::string pad_mode = "same";
  std::array<int64_t, 4> padding{0, 0, 0, 0};  // top, bottom, left, right; only with pad_mode "pad"
  std::array<int64_t, 2> output_padding{0, 0};  // only with pad_mode "pad"; below the stride
  std::array<int64_t, 2> dilation{1, 1};
  int64_t group = 1;
  bool has_bias = false;
  std::optional<Initializer> weight_init;
  std::optional<Initializer> bias_init;
};
class Conv2dTranspose : public Cell {
 public:
  Conv2dTranspose(int64_t in, int64_t out, std::array<int64_t, 2> kernel, const Conv2dTransposeOptions& options = {});
  Conv2dTranspose(int64_t in, int64_t out, int64_t kernel, const Conv2dTransposeOptions& options = {})
      : Conv2dTranspose(in, out, std::array<int64_t, 2>{kernel, kernel}, options) {}
  Tensor construct(const Tensor& x) override;
  Shape output_shape(const Shape& input) const;
  Tensor weight, bias;
  int64_t in_channels, out_channels;
  std::array<int64_t, 2> kernel_size;
  ops::Conv2dTransposeOptions op_options;
};

// MindSpore: MaxPool2d(kernel_size=1, stride=1, pad_mode="valid").
class MaxPool2d : public Cell {
 public:
  explicit MaxPool2d(int64_t kernel_size = 1, int64_t stride = 1, const std::string& pad_mode = "valid");
  Tensor construct(const Tensor& x) override;
  ops::Pool2dOptions options;
};

class AvgPool2d : public Cell {
 public:
  explicit AvgPool2d(int64_t kernel_size = 1, int64_t stride = 1, const std::string& pad_mode = "valid");
  Tensor construct(const Tensor& x) override;
  ops::Pool2dOptions options;
};

// PyTorch: AdaptiveAvgPool2d(output_size) (MindSpore: nn.AdaptiveAvgPool2d). x (N, C, H, W) -> (N, C, oh, ow),
// output (i, j) the mean of rows [floor(i H / oh), ceil((i + 1) H / oh)) and the columns likewise, PyTorch's
// windows. Output (1, 1) is global average pooling, one reduction; where H and W are multiples of the
// output size the windows tile the input (an AvgPool2d with kernel = stride = H / oh); other sizes, whose
// windows may overlap and differ in size, are two products with constant averaging matrices, (oh, H) on
// the rows and (ow, W) on the columns (swept ops: matmul, transpose, reshape).
class AdaptiveAvgPool2d : public Cell {
 public:
  explicit AdaptiveAvgPool2d(std::array<int64_t, 2> size);
  explicit AdaptiveAvgPool2d(int64_t size) : AdaptiveAvgPool2d(std::array<int64_t, 2>{size, size}) {}
  Tensor construct(const Tensor& x) override;
  std::array<int64_t, 2> output_size;
};

// MindSpore: LeakyReLU(alpha=0.2): x for x >= 0, alpha * x below (alpha in [0, 1]); composed as
// relu(x) - alpha * relu(-x) from swept ops (forward, backward and AMP class are theirs).
class LeakyReLU : public Cell {
 public:
  explicit LeakyReLU(double alpha = 0.2);
  Tensor construct(const Tensor& x) override;
  double alpha;
};

// MindSpore: ELU(alpha=1.0): x for x > 0, alpha (e^x - 1) below. Composed of swept ops: with z = min(x, 0)
// = -relu(-x), e^z = sigmoid(z) / sigmoid(-z), where the divisor is >= 1/2 (no cancellation for any z).
class ELU : public Cell {
 public:
  explicit ELU(double alpha = 1.0);
  Tensor construct(const Tensor& x) override;
  double alpha;
};

// MindSpore: PReLU(channel=1, w=0.25): LeakyReLU with a learned slope per channel (axis 1), the parameter
// "w" (channel); channel 1 shares one slope. Composed as relu(x) - w * relu(-x).
class PReLU : public Cell {
 public:
  explicit PReLU(int64_t channel = 1, double w_init = 0.25);
  Tensor construct(const Tensor& x) override;
  Tensor w;
};

// A residual connection: body(x) + shortcut(x), the shortcut the input itself unless given (a projection
// where the body changes the shape). The sum is ops::add, so it runs in the branches' common dtype.
class Residual : public Cell {
 public:
  explicit Residual(CellPtr body, CellPtr shortcut = nullptr);
  Tensor construct(const Tensor& x) override;
  CellPtr body, shortcut;
};

// The input, unchanged (a placeholder in a SequentialCell, a residual block's shortcut).
class Identity : public Cell {
 public:
  Identity() : Cell("Identity") {}
  Tensor construct(const Tensor& x) override { return x; }
};

class ReLU : public Cell {
 public:
  ReLU() : Cell("ReLU") {}
  Tensor construct(const Tensor& x) override { return ops::relu(x); }
};
class Sigmoid : public Cell {
 public:
  Sigmoid() : Cell("Sigmoid") {}
  Tensor construct(const Tensor& x) override { return ops::sigmoid(x); }
};
class Tanh : public Cell {
 public:
  Tanh() : Cell("Tanh") {}
  Tensor construct(const Tensor& x) override { return ops::tanh(x); }
};
// MindSpore: GELU(approximate=True) — the tanh approximation by default.
class GELU : public Cell {
 public:
  explicit GELU(bool approximate = true) : Cell("GELU"), approximate_(approximate) {}
  Tensor construct(const Tensor& x) override { return ops::gelu(x, approximate_); }

 private:
  bool approximate_;
};
class SiLU : public Cell {
 public:
  SiLU() : Cell("SiLU") {}
  Tensor construct(const Tensor& x) override { return ops::silu(x); }
};

// (N, d1, d2, ...) -> (N, d1*d2*...). MindSpore's Flatten keeps the first dimension.
class Flatten : public Cell {
 public:
  explicit Flatten(int start_dim = 1) : Cell("Flatten"), start_dim_(start_dim) {}
  Tensor construct(const Tensor& x) override { return ops::flatten(x, start_dim_); }

 private:
  int start_dim_;
};

// MindSpore: BatchNorm2d(num_features, eps=1e-5, momentum=0.9, affine=True); gamma ones, beta zeros,
// moving mean zeros, moving variance ones. running = momentum * running + (1 - momentum) * batch.
struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.9;
  bool affine = true;
};
class BatchNorm : public Cell {
 public:
  BatchNorm(const char* type_name, int rank, int64_t features, const BatchNormOptions& options);
  Tensor construct(const Tensor& x) override;
  Tensor gamma, beta, moving_mean, moving_variance;
  int64_t num_features;

 private:
  int rank_;
  BatchNormOptions options_;
};
// x (N, C)
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t features, const BatchNormOptions& options = {})
      : BatchNorm("BatchNorm1d", 2, features, options) {}
};
// x (N, C, H, W)
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t features, const BatchNormOptions& options = {})
      : BatchNorm("BatchNorm2d", 4, features, options) {}
};

// MindSpore 2.x: Dropout(keep_prob=0.5); identity in eval mode. The mask comes from the cell's own
// counter-based generator (seeded from the default generator when built), so runs are reproducible.
class Dropout : public Cell {
 public:
  explicit Dropout(double keep_prob = 0.5);
  Tensor construct(const Tensor& x) override;
  Generator& generator() { return gen_; }
  Generator* own_generator() override { return &gen_; }

 private:
  double keep_prob_;
  Generator gen_;
};

// Runs its cells in order; their names are "0", "1", ... ("features.0.weight").
class SequentialCell : public Cell {
 public:
  SequentialCell() : Cell("SequentialCell") {}
  explicit SequentialCell(std::vector<CellPtr> cells);
  SequentialCell& append(CellPtr cell);
  Tensor construct(const Tensor& x) override;
  size_t size() const { return cells_.size(); }
  Cell& operator[](size_t i) { return *cells_.at(i); }

 private:
  std::vector<CellPtr> cells_;
};

// The eager fusions: a layer and the layers that consume its output, run as one op with the same values.
// SequentialCell applies them to its consecutive cells; graph mode to any network's calls
// (nn/call_fusion.h). Each `*_applies` says whether the fusion holds now (fusion on, no pinned dtype or
// policy that the fused op would not honour, the input's rank); the others run the fused call.
namespace fusion {
// Conv2d -> ReLU -> MaxPool2d: the convolution's full-size output is never stored (nor reordered to NCHW),
// only the pooled result and one-byte window indices.
bool conv_relu_max_pool_applies(const ReLU& relu, const MaxPool2d& pool, const Tensor& x);
Tensor conv_relu_max_pool(Conv2d& conv, const MaxPool2d& pool, const Tensor& x);
// Dense -> ReLU: the ReLU applied where the product stores its output, so the pre-activation is never stored
// and backward keeps the mask as bits.
bool dense_relu_applies(const ReLU& relu);
Tensor dense_relu(Dense& dense, const Tensor& x);
// ReLU -> MaxPool2d: one pass instead of two; backward needs only the pool's window indices.
bool relu_max_pool_applies(const ReLU& relu, const MaxPool2d& pool, const Tensor& x);
Tensor relu_max_pool(ReLU& relu, const MaxPool2d& pool, const Tensor& x);
}  // namespace fusion

// MindSpore: GroupNorm(num_groups, num_channels, eps=1e-5, affine=True): x (N, C, *) normalised over each
// group of C / num_groups channels and all trailing positions, then gamma, beta (C) per channel. Computed
// as a LayerNorm of (N * groups, C / groups * positions) — FP32 statistics, on the AMP black list like the
// other norms — followed by the per-channel affine.
class GroupNorm : public Cell {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor construct(const Tensor& x) override;
  Tensor gamma, beta;  // undefined without affine
  int64_t num_groups, num_channels;
  double epsilon;
};

// MindSpore: Softmax(axis=-1) and LogSoftmax(axis=-1): the ops as layers (FP32 accumulation, AMP black list).
class Softmax : public Cell {
 public:
  explicit Softmax(int axis = -1) : Cell("Softmax"), axis_(axis) {}
  Tensor construct(const Tensor& x) override { return ops::softmax(x, axis_); }

 private:
  int axis_;
};
class LogSoftmax : public Cell {
 public:
  explicit LogSoftmax(int axis = -1) : Cell("LogSoftmax"), axis_(axis) {}
  Tensor construct(const Tensor& x) override { return ops::log_softmax(x, axis_); }

 private:
  int axis_;
};

// MindSpore / PyTorch: LSTM(input_size, hidden_size, num_layers=1, has_bias=True), batch-first only (demi has
// no sequence-first layout), unidirectional, no dropout between layers. Per layer k the parameters are
// weight_ih_l{k} (4H, in), weight_hh_l{k} (4H, H), bias_ih_l{k}, bias_hh_l{k} (4H), gates in PyTorch's
// order i, f, g, o, all drawn from U(+-1/sqrt(H)):
//   i, f, o = sigmoid(.), g = tanh(.) of x_t W_ih^T + b_ih + h W_hh^T + b_hh;  c = f c + i g;  h = o tanh(c)
// Composed of swept ops (Dense, Split, the activations, Concat): one product over all steps for the input
// part, one per step for the recurrent part.
struct RecurrentState {
  Tensor output;  // (B, T, H): the last layer's h at every step
  Tensor h_n;     // (num_layers, B, H)
  Tensor c_n;     // (num_layers, B, H) (LSTM only)
};
class LSTM : public Cell {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool has_bias = true);
  // x (B, T, input_size) from zero states -> the output (B, T, H)
  Tensor construct(const Tensor& x) override;
  // x (B, T, input_size), h0 and c0 (num_layers, B, H) or undefined (zeros) -> output, h_n, c_n
  RecurrentState forward(const Tensor& x, const Tensor& h0 = Tensor(), const Tensor& c0 = Tensor());
  int64_t input_size, hidden_size, num_layers;
  std::vector<Tensor> weight_ih, weight_hh, bias_ih, bias_hh;  // per layer (biases undefined without has_bias)
};

// MindSpore / PyTorch: GRU(input_size, hidden_size, num_layers=1, has_bias=True), batch-first, unidirectional;
// weight_ih_l{k} (3H, in), weight_hh_l{k} (3H, H), gates r, z, n:
//   r = sigmoid(x W_ir + b_ir + h W_hr + b_hr), z likewise, n = tanh(x W_in + b_in + r (h W_hn + b_hn)),
//   h' = (1 - z) n + z h
class GRU : public Cell {
 public:
  GRU(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1, bool has_bias = true);
  Tensor construct(const Tensor& x) override;
  // h0 (num_layers, B, H) or undefined (zeros) -> output, h_n (c_n undefined)
  RecurrentState forward(const Tensor& x, const Tensor& h0 = Tensor());
  int64_t input_size, hidden_size, num_layers;
  std::vector<Tensor> weight_ih, weight_hh, bias_ih, bias_hh;
};

// ---- losses ----

// MindSpore: SoftmaxCrossEntropyWithLogits(sparse=False, reduction="none"). logits (N, C) with labels (N)
// class ids (sparse) or (N, C) probabilities; sparse also takes a sequence's (*, C) logits with (*) labels
// (a language model's (B, T, vocab) and (B, T)), every position one sample ("none" returns shape (*)).
class SoftmaxCrossEntropyWithLogits : public LossCell {
 public:
  explicit SoftmaxCrossEntropyWithLogits(bool sparse = false, const std::string& reduction = "none");
  Tensor construct(const Tensor& logits, const Tensor& labels) override;

 private:
  bool sparse_;
  ops::Reduction reduction_;
};

// MindSpore: NLLLoss(reduction="mean") (no class weights): log-probabilities (N, C) and class ids (N) int32|int64
// -> -logp[n, label n], averaged, summed, or per sample ("none"). LogSoftmax then NLLLoss is the cross
// entropy. A label outside [0, C) is an error naming it.
class NLLLoss : public LossCell {
 public:
  explicit NLLLoss(const std::string& reduction = "mean");
  Tensor construct(const Tensor& log_probs, const Tensor& labels) override;

 private:
  ops::Reduction reduction_;
};

// MindSpore: L1Loss(reduction="mean"): |logits - labels|, composed as relu(d) + relu(-d).
class L1Loss : public LossCell {
 public:
  explicit L1Loss(const std::string& reduction = "mean");
  Tensor construct(const Tensor& logits, const Tensor& labels) override;

 private:
  ops::Reduction reduction_;
};

// MindSpore: SmoothL1Loss(beta=1.0, reduction="none") (PyTorch's default reduction is "mean"): with
// a = |logits - labels|, 0.5 a^2 / beta below beta and a - 0.5 beta above; composed as q (a - q / 2) / beta
// with q = min(a, beta) = a - relu(a - beta).
class SmoothL1Loss : public LossCell {
 public:
  explicit SmoothL1Loss(double beta = 1.0, const std::string& reduction = "none");
  Tensor construct(const Tensor& logits, const Tensor& labels) override;

 private:
  double beta_;
  ops::Reduction reduction_;
};

// MindSpore: BCEWithLogitsLoss(reduction="mean") (no weights): -[y log sigmoid(x) + (1 - y) log sigmoid(-x)],
// targets y in [0, 1] of the logits' shape. Both log-sigmoids come from one stable log-softmax over
// [x, 0] (so no exp of a large x overflows, at any AMP level).
class BCEWithLogitsLoss : public LossCell {
 public:
  explicit BCEWithLogitsLoss(const std::string& reduction = "mean");
  Tensor construct(const Tensor& logits, const Tensor& labels) override;

 private:
  ops::Reduction reduction_;
};

// MindSpore: MSELoss(reduction="mean").
class MSELoss : public LossCell {
 public:
  explicit MSELoss(const std::string& reduction = "mean");
  Tensor construct(const Tensor& logits, const Tensor& labels) override;

 private:
  ops::Reduction reduction_;
};

}  // namespace demi::nn
