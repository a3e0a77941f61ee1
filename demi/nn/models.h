// The reference models of BENCHMARKS.md (A: the seed's SimpleCNN, B: LeNet-style, C: MLP, D: Transformer
// encoder classifier; and R, ResNet-18 for 3x32x32), built from demi's layers, shared by the command-line
// tool, the examples, the tests and the benchmarks.
#pragma once

#include <memory>
#include <string>

#include "demi/nn/layers.h"
#include "demi/nn/transformer.h"

namespace demi::nn {

// Model A, the seed's SimpleCNN: Conv2d(3->32, k3, valid) -> ReLU -> MaxPool2d(2, 2) -> Flatten ->
// Dense(7200 -> 10). (MindSpore's Conv2d default pad_mode is "same"; the seed's Dense(32*15*15) needs
// "valid".)
class SimpleCNN : public Cell {
 public:
  explicit SimpleCNN(int64_t num_classes = 10) : Cell("SimpleCNN") {
    conv1 = register_cell("conv1", std::make_shared<Conv2d>(3, 32, 3, Conv2dOptions::Make(1, "valid")));
    relu = register_cell("relu", std::make_shared<ReLU>());
    max_pool = register_cell("max_pool", std::make_shared<MaxPool2d>(2, 2));
    flatten = register_cell("flatten", std::make_shared<Flatten>());
    fc = register_cell("fc", std::make_shared<Dense>(32 * 15 * 15, num_classes));
  }
  // Conv2d, ReLU and MaxPool2d run as one fused op (the same values; see SequentialCell).
  Tensor construct(const Tensor& x) override {
    return fc->call(flatten->call(conv1->call_relu_max_pool(x, max_pool->options)));
  }
  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<MaxPool2d> max_pool;
  std::shared_ptr<Flatten> flatten;
  std::shared_ptr<Dense> fc;
};

// Model B, LeNet-style on 1x28x28 (with an optional BatchNorm after each conv, to exercise the black list).
class LeNet : public Cell {
 public:
  explicit LeNet(bool batch_norm = false) : Cell("LeNet") {
    auto pad1 = Conv2dOptions::Make(1, "pad", 1, true);
    features = register_cell("features", std::make_shared<SequentialCell>());
    features->append(std::make_shared<Conv2d>(1, 32, 3, pad1));
    if (batch_norm) features->append(std::make_shared<BatchNorm2d>(32));
    features->append(std::make_shared<ReLU>());
    features->append(std::make_shared<MaxPool2d>(2, 2));
    features->append(std::make_shared<Conv2d>(32, 64, 3, pad1));
    if (batch_norm) features->append(std::make_shared<BatchNorm2d>(64));
    features->append(std::make_shared<ReLU>());
    features->append(std::make_shared<MaxPool2d>(2, 2));
    classifier = register_cell("classifier", std::make_shared<SequentialCell>());
    classifier->append(std::make_shared<Flatten>());
    classifier->append(std::make_shared<Dense>(64 * 7 * 7, 128));
    classifier->append(std::make_shared<ReLU>());
    classifier->append(std::make_shared<Dense>(128, 10));
  }
  Tensor construct(const Tensor& x) override { return classifier->call(features->call(x)); }
  std::shared_ptr<SequentialCell> features, classifier;
};

// Models A and B written as the seed and MindSpore's model zoo write networks: every layer called in
// construct, one ReLU and one max-pool cell called wherever the network needs one, no SequentialCell and no
// hand-fused call (`demi train --zoo-style`). The same layers, parameters and values as SimpleCNN and LeNet;
// PYNATIVE runs every call as written, graph mode runs the fused ops (nn/call_fusion.h).
class SeedSimpleCNN : public SimpleCNN {
 public:
  using SimpleCNN::SimpleCNN;
  Tensor construct(const Tensor& input) override {
    Tensor x = conv1->call(input);
    x = relu->call(x);
    x = max_pool->call(x);
    x = flatten->call(x);
    return fc->call(x);
  }
};

class ZooLeNet : public Cell {
 public:
  explicit ZooLeNet(bool batch_norm = false) : Cell("ZooLeNet") {
    auto pad1 = Conv2dOptions::Make(1, "pad", 1, true);
    conv1 = register_cell("conv1", std::make_shared<Conv2d>(1, 32, 3, pad1));
    if (batch_norm) bn1 = register_cell("bn1", std::make_shared<BatchNorm2d>(32));
    conv2 = register_cell("conv2", std::make_shared<Conv2d>(32, 64, 3, pad1));
    if (batch_norm) bn2 = register_cell("bn2", std::make_shared<BatchNorm2d>(64));
    relu = register_cell("relu", std::make_shared<ReLU>());
    max_pool2d = register_cell("max_pool2d", std::make_shared<MaxPool2d>(2, 2));
    flatten = register_cell("flatten", std::make_shared<Flatten>());
    fc1 = register_cell("fc1", std::make_shared<Dense>(64 * 7 * 7, 128));
    fc2 = register_cell("fc2", std::make_shared<Dense>(128, 10));
  }
  Tensor construct(const Tensor& input) override {
    Tensor x = conv1->call(input);
    if (bn1) x = bn1->call(x);
    x = max_pool2d->call(relu->call(x));
    x = conv2->call(x);
    if (bn2) x = bn2->call(x);
    x = max_pool2d->call(relu->call(x));
    x = flatten->call(x);
    x = relu->call(fc1->call(x));
    return fc2->call(x);
  }
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<MaxPool2d> max_pool2d;
  std::shared_ptr<Flatten> flatten;
  std::shared_ptr<Dense> fc1, fc2;
};

// Model C: MLP 784-1024-1024-10 with ReLU.
class MLP : public Cell {
 public:
  MLP() : Cell("MLP") {
    body = register_cell("body", std::make_shared<SequentialCell>());
    body->append(std::make_shared<Flatten>());
    body->append(std::make_shared<Dense>(784, 1024));
    body->append(std::make_shared<ReLU>());
    body->append(std::make_shared<Dense>(1024, 1024));
    body->append(std::make_shared<ReLU>());
    body->append(std::make_shared<Dense>(1024, 10));
  }
  Tensor construct(const Tensor& x) override { return body->call(x); }
  std::shared_ptr<SequentialCell> body;
};

// Model D, a Transformer encoder classifier: token embedding + learned positions -> num_layers post-norm
// encoder layers (ReLU, no dropout) -> mean over the tokens -> Dense(d_model -> num_classes). Input: int32 or
// int64 tokens (B, seq_len); the defaults are BENCHMARKS.md's (vocab 1000, d 256, 4 layers, 4 heads, FFN
// 1024, 128 tokens, 10 classes). Parameters: embedding.embedding_table, pos_embedding (seq_len, d_model),
// encoder.layers.N.*, classifier.*.
struct TransformerClassifierOptions {
  int64_t vocab_size = 1000;
  int64_t d_model = 256;
  int64_t num_layers = 4;
  int64_t nhead = 4;
  int64_t dim_feedforward = 1024;
  int64_t seq_len = 128;
  int64_t num_classes = 10;
  double dropout = 0.0;
  std::string activation = "relu";
  bool norm_first = false;
};

class TransformerClassifier : public Cell {
 public:
  explicit TransformerClassifier(const TransformerClassifierOptions& o = {}) : Cell("TransformerClassifier"), options(o) {
    embedding = register_cell("embedding", std::make_shared<Embedding>(o.vocab_size, o.d_model));
    pos_embedding = register_parameter(
        "pos_embedding", initialize({o.seq_len, o.d_model}, Initializer::Normal(0.02), default_generator()));
    encoder = register_cell("encoder", std::make_shared<TransformerEncoder>(
                                           [o] {
                                             return std::make_shared<TransformerEncoderLayer>(
                                                 o.d_model, o.nhead, o.dim_feedforward, o.dropout, o.activation,
                                                 1e-5, o.norm_first);
                                           },
                                           o.num_layers));
    classifier = register_cell("classifier", std::make_shared<Dense>(o.d_model, o.num_classes));
  }
  Tensor construct(const Tensor& tokens) override {
    DEMI_CHECK(tokens.rank() == 2 && tokens.dim(1) == options.seq_len, "expected tokens (B, ", options.seq_len,
               ") (seq_len=", options.seq_len, "), got ", tokens.describe());
    Tensor x = ops::add(embedding->call(tokens), pos_embedding);  // (B, S, D) + (S, D)
    x = encoder->call(x);
    return classifier->call(ops::mean(x, {1}));  // mean-pool over the tokens
  }
  TransformerClassifierOptions options;
  std::shared_ptr<Embedding> embedding;
  Tensor pos_embedding;
  std::shared_ptr<TransformerEncoder> encoder;
  std::shared_ptr<Dense> classifier;
};

// ResNet's BasicBlock (He et al. 2016; torchvision's names): conv1 3x3 (stride) -> bn1 -> ReLU -> conv2 3x3 ->
// bn2, plus the shortcut — the input itself, or a 1x1 convolution (stride) and a BatchNorm when the shape
// changes ("downsample.0", "downsample.1") — then ReLU. Convolutions without bias, BatchNorm after each.
class BasicBlock : public Cell {
 public:
  BasicBlock(int64_t in_channels, int64_t channels, int64_t stride) : Cell("BasicBlock") {
    conv1 = register_cell("conv1",
                          std::make_shared<Conv2d>(in_channels, channels, 3, Conv2dOptions::Make(stride, "pad", 1)));
    bn1 = register_cell("bn1", std::make_shared<BatchNorm2d>(channels));
    conv2 = register_cell("conv2", std::make_shared<Conv2d>(channels, channels, 3, Conv2dOptions::Make(1, "pad", 1)));
    bn2 = register_cell("bn2", std::make_shared<BatchNorm2d>(channels));
    if (stride != 1 || in_channels != channels) {
      downsample = register_cell("downsample", std::make_shared<SequentialCell>());
      downsample->append(std::make_shared<Conv2d>(in_channels, channels, 1, Conv2dOptions::Make(stride, "valid")));
      downsample->append(std::make_shared<BatchNorm2d>(channels));
    }
  }
  Tensor construct(const Tensor& x) override {
    Tensor y = bn2->call(conv2->call(ops::relu(bn1->call(conv1->call(x)))));
    return ops::relu(ops::add(y, downsample ? downsample->call(x) : x));
  }
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<SequentialCell> downsample;  // null: the identity shortcut
};

// Model R, ResNet-18 for 3x32x32 images (the CIFAR form: a 3x3 stem of 64 channels, no max-pool): conv1 ->
// bn1 -> ReLU -> layer1..layer4 (two BasicBlocks each; 64, 128, 256, 512 channels; strides 1, 2, 2, 2) ->
// global average pool -> fc (512 -> num_classes). 11.2M parameters; BatchNorm (FP32 at O2: the black list)
// after every convolution.
class ResNet18 : public Cell {
 public:
  explicit ResNet18(int64_t num_classes = 10) : Cell("ResNet18") {
    conv1 = register_cell("conv1", std::make_shared<Conv2d>(3, 64, 3, Conv2dOptions::Make(1, "pad", 1)));
    bn1 = register_cell("bn1", std::make_shared<BatchNorm2d>(64));
    int64_t in = 64;
    const int64_t channels[4] = {64, 128, 256, 512};
    for (int i = 0; i < 4; ++i) {
      auto layer = std::make_shared<SequentialCell>();
      layer->append(std::make_shared<BasicBlock>(in, channels[i], i == 0 ? 1 : 2));
      layer->append(std::make_shared<BasicBlock>(channels[i], channels[i], 1));
      layers.push_back(register_cell("layer" + std::to_string(i + 1), layer));
      in = channels[i];
    }
    avgpool = register_cell("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
    fc = register_cell("fc", std::make_shared<Dense>(512, num_classes));
  }
  Tensor construct(const Tensor& x) override {
    Tensor y = ops::relu(bn1->call(conv1->call(x)));
    for (auto& layer : layers) y = layer->call(y);
    return fc->call(ops::flatten(avgpool->call(y)));
  }
  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
  std::vector<std::shared_ptr<SequentialCell>> layers;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<Dense> fc;
};

}  // namespace demi::nn
