// Graph mode's rewrite of a network's calls: the eager fusions (nn::fusion in layers.h, which
// SequentialCell applies to its consecutive cells) applied to any network, wherever a layer's output goes
// straight into the layers that fuse with it. A construct written as the seed and MindSpore's model zoo
// write it,
//
//   Tensor construct(const Tensor& x) override {
//     return fc->call(flatten->call(max_pool->call(relu->call(conv->call(x)))));
//   }
//
// runs Conv2d -> ReLU -> MaxPool2d as the one fused op a SequentialCell would run: the convolution's
// full-size output and the ReLU's are never made. The fusions: Conv2d -> ReLU -> MaxPool2d, Dense -> ReLU,
// ReLU -> MaxPool2d.
//
// Learnt from a run of the step's forward that changes nothing (graph mode runs one before the first step
// of a key: no gradient, the running statistics and generators put back): the calls of those four layer
// types in order, each with the tensor it took and the one it gave, and every op's reads. A chain is
// consecutive calls each taking the previous one's output, in one context (precision policy, pinned dtype,
// fusion on, enclosing layer), whose outputs no other op reads: eager mode adds such an op's gradient to the
// chain's before the first layer's backward, which fused would be summed in another order.
//
// Applied to every step of the key, the first one included: the chain's first call returns a pending value
// (core/tensor.h, PendingValue) with the shape and dtype the learning run gave, a middle call another, and
// the last call runs the fused op on the first call's input. A pending value read in any other way (its
// data on the host, a value kept past the step, an op the learning run did not show) is computed with the
// very calls eager mode makes, and its chain is not applied again: never a wrong value. (Only an op reading
// it after the chain's fused op ran, which the learning run did not show, makes that one step's gradient
// differ from PYNATIVE's in its last bits: summed in another order.) A chain applies only where everything
// its fused op depends on is as when it was learnt: the same cells at the same place among the step's
// calls, the input's shape and dtype, the context, no cell's structure changed (Cell::structure_version).
//
// The fused ops give the calls' values bit for bit, except a convolution computing in float16 (its fused
// backward sums in another order): there only the ReLU and the max-pool are fused (tests/graph_mode_test.cc
// trains networks written this way in both modes at every level).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "demi/nn/cell.h"

namespace demi::nn {

class CallFusions {
 public:
  CallFusions();
  ~CallFusions();
  CallFusions(const CallFusions&) = delete;
  CallFusions& operator=(const CallFusions&) = delete;

  // Scopes of this thread, one at a time: the first around the learning run, which records its calls and
  // finds the chains (learnt: the run returned, else it teaches nothing); the second around each step.
  void begin_learning();
  void end_learning(bool learnt);
  void begin_applying();
  void end_applying();

  // "fused 2 chains of layer calls: conv1 -> relu -> pool (Conv2d -> ReLU -> MaxPool2d), fc1 -> relu (Dense
  // -> ReLU)": the chains that ran fused, then those given up; empty when none did.
  std::string describe() const;

  // Called before each forward of a step (TrainStep does): one that runs its forward again (overflow
  // attribution's re-run of the batch) matches the chains from the first call again.
  static void begin_forward();

  // Whether a network could have a chain: graph_fusion is on, and it has a ReLU or a MaxPool2d cell (every
  // chain ends in one). A caller skips the learning run (one more forward, construct's host code included)
  // where it could not.
  static bool could_fuse(Cell& net);
  // What the learning run's forward takes: a copy of the first kLearningSamples samples of a batch (so it
  // costs little time and memory; every chain layer keeps its input's first dimension, which the chains
  // take from the step's input).
  static constexpr int64_t kLearningSamples = 2;
  static Tensor learning_batch(const Tensor& batch);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

namespace internal {
// Whether a CallFusions scope is open in this thread (Cell::operator() asks on every call).
bool call_fusions_active();
// Cell::operator()'s path while one is open.
Tensor call_through_fusions(Cell& cell, const Tensor& x);
}  // namespace internal

}  // namespace demi::nn
