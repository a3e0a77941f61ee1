// The reference models of BENCHMARKS.md (A: the seed's SimpleCNN, B: LeNet-style, C: MLP), built from
// demi's layers, shared by the command-line tool, the examples, the tests and the benchmarks.
#pragma once

#include <memory>

#include "demi/nn/layers.h"

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
  Tensor construct(const Tensor& x) override {
    return fc->call(flatten->call(max_pool->call(relu->call(conv1->call(x)))));
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

}  // namespace demi::nn
