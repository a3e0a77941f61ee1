// GRAPH_MODE against PYNATIVE_MODE, end to end: the same network trained from the same seed on the same
// batches gives the same loss at every step and the same final weights, bit for bit, at every AMP level
// (O2-fp16 with a dynamic loss scale that overflows and skips steps), with BatchNorm and Dropout; and in
// GRAPH_MODE the updates did run from the static plan's arena, near its lower bound.
// Real data: Debian's Fashion-MNIST (dataset-fashion-mnist) for the image networks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "demi/amp/loss_scale.h"
#include "demi/amp/train_step.h"
#include "demi/core/context.h"
#include "demi/core/rng.h"
#include "demi/data/iterator.h"
#include "demi/data/mnist.h"
#include "demi/data/transforms.h"
#include "demi/train/metrics.h"
#include "demi/train/model.h"
#include "demi/nn/layers.h"
#include "demi/nn/models.h"
#include "demi/ops/observer.h"
#include "demi/ops/ops.h"
#include "demi/optim/lr_schedule.h"

namespace demi {
namespace {

using amp::Level;

const char* kFashion = "/usr/share/datasets/fashion-mnist";
// The arena against the lower bound: the target, <= 1.05, is bench/graph_mode.py's, measured on the
// reference models. The steps here depend on the kernels this machine measures fastest (their
// workspaces), so they check a bound no working plan misses; the planner's quality on fixed recordings
// is demi/graph/memory_plan_test.cc's.
constexpr double kArenaSanity = 1.25;

struct Batches {
  std::vector<Tensor> x, y;
};

// `steps` batches of `batch` Fashion-MNIST training images (scaled to [0, 1]) and labels.
Batches fashion_batches(int steps, int64_t batch) {
  data::MnistDataset ds(kFashion, "train");
  const Tensor& images = ds.images();
  const Tensor& labels = ds.labels();
  Batches b;
  const int64_t per = 28 * 28;
  for (int s = 0; s < steps; ++s) {
    Tensor x = empty({batch, 1, 28, 28});
    Tensor y = empty({batch}, DType::kI32);
    for (int64_t i = 0; i < batch; ++i) {
      const int64_t row = s * batch + i;
      for (int64_t k = 0; k < per; ++k) x.data<float>()[i * per + k] = images.data<uint8_t>()[row * per + k] / 255.0f;
      y.data<int32_t>()[i] = labels.data<int32_t>()[row];
    }
    b.x.push_back(x);
    b.y.push_back(y);
  }
  return b;
}

Batches synthetic_batches(int steps, Shape shape, bool tokens, int64_t classes) {
  Generator g(5);
  Batches b;
  for (int s = 0; s < steps; ++s) {
    if (tokens) {
      std::vector<int32_t> t(static_cast<size_t>(shape.numel()));
      for (auto& v : t) v = static_cast<int32_t>(g.next_int(100));
      b.x.push_back(from_vector(t, shape));
    } else {
      b.x.push_back(normal(shape, 0, 1, g));
    }
    std::vector<int32_t> l(static_cast<size_t>(shape[0]));
    for (auto& v : l) v = static_cast<int32_t>(g.next_int(static_cast<uint64_t>(classes)));
    b.y.push_back(from_vector(l, {shape[0]}));
  }
  return b;
}

struct Setting {
  Level level;
  DType low;
  bool dynamic_scale;  // fp16: DynamicLossScaleManager from 2^24, which overflows first
  bool no_loss_scale = false;
  std::optional<bool> in_backward;  // TrainOptions::optimizer_in_backward (null: graph mode's choice)
};

struct Run {
  std::vector<float> losses;
  std::vector<char> skipped;
  std::vector<Tensor> weights;
  graph::StepGraphs::Stats stats;
  std::vector<std::pair<std::string, graph::PlanSummary>> plans;
  int64_t parallel_allocs = 0;  // allocations by the threads of parallel loops during the steps
  int64_t train_peak = 0;       // the tracked training peak over the steps, above what was live before
  int64_t gradient_peak = 0;    // the gradients' peak over the steps
  bool grads_kept = false;      // a parameter still had its .grad after the last step
};

Run train(const std::function<std::shared_ptr<nn::Cell>()>& make, const Batches& b, Setting s, ExecMode mode) {
  ExecModeScope in_mode(mode);
  // (what another run's results hold is not this run's)
  const int64_t live_before = mem_stats().total_current - mem_stats().cur(MemCategory::kData);
  set_seed(3);
  std::shared_ptr<nn::Cell> net = make();
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.02, 0.9);
  amp::TrainOptions o;
  o.low_dtype = s.low;
  if (s.dynamic_scale) o.loss_scale_manager = std::make_shared<amp::DynamicLossScaleManager>(16777216.0, 2.0, 4);
  o.no_loss_scale = s.no_loss_scale;
  o.optimizer_in_backward = s.in_backward;
  auto step = amp::build_train_network(net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                       s.level, o);
  Run r;
  const int64_t parallel_allocs = mem_stats().parallel_allocs;
  mem_reset_peak();
  for (size_t i = 0; i < b.x.size(); ++i) {
    amp::StepResult res = (*step)(b.x[i], b.y[i]);
    r.losses.push_back(res.loss);
    r.skipped.push_back(res.skipped ? 1 : 0);
  }
  r.parallel_allocs = mem_stats().parallel_allocs - parallel_allocs;
  r.train_peak = mem_stats().train_peak - live_before;
  r.gradient_peak = mem_stats().pk(MemCategory::kGradient);
  for (const Tensor& p : net->trainable_params()) r.grads_kept = r.grads_kept || p.grad().defined();
  for (const Tensor& p : net->trainable_params()) r.weights.push_back(p.clone());
  r.stats = step->graphs().stats();
  r.plans = step->graphs().plans();
  return r;
}

// `skipped_steps` (if given): which steps skipped their update. `traces`: how many times graph mode traces
// (a rewrite given up after the first trace makes a second).
void expect_graph_equals_pynative(const std::string& what, const std::function<std::shared_ptr<nn::Cell>()>& make,
                                  const Batches& b, Setting s, std::vector<char>* skipped_steps = nullptr,
                                  int traces = 1) {
  SCOPED_TRACE(what);
  Run eager = train(make, b, s, ExecMode::kPyNative);
  Run graph = train(make, b, s, ExecMode::kGraph);
  if (skipped_steps) *skipped_steps = eager.skipped;
  ASSERT_EQ(eager.losses.size(), graph.losses.size());
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&eager.losses[i], &graph.losses[i], sizeof(float)), 0)
        << "step " << i << ": " << eager.losses[i] << " vs " << graph.losses[i];
    EXPECT_EQ(eager.skipped[i], graph.skipped[i]) << "step " << i;
  }
  ASSERT_EQ(eager.weights.size(), graph.weights.size());
  for (size_t k = 0; k < eager.weights.size(); ++k)
    EXPECT_EQ(std::memcmp(eager.weights[k].raw_data(), graph.weights[k].raw_data(), eager.weights[k].nbytes()), 0)
        << "parameter " << k;
  // Every allocation of a step is made by the stepping thread (the recording sees it all): the kernels take
  // their threads' scratch before the threads start.
  EXPECT_EQ(eager.parallel_allocs, 0);
  EXPECT_EQ(graph.parallel_allocs, 0);
  // PYNATIVE made no plan; GRAPH replayed most steps from the arena.
  EXPECT_EQ(eager.stats.traced_steps + eager.stats.replayed_steps, 0);
  int64_t skipped = 0;
  for (char k : eager.skipped) skipped += k;
  // The warm-up step, the traced one and the overflow steps before it (never traced) run without a plan.
  EXPECT_EQ(graph.stats.traced_steps, traces);
  EXPECT_GE(graph.stats.replayed_steps, static_cast<int64_t>(b.x.size()) - 2 * traces - skipped);
  EXPECT_GT(graph.stats.arena_allocations, 0);
  ASSERT_EQ(graph.plans.size(), 1u);
  const graph::PlanSummary& p = graph.plans[0].second;
  EXPECT_LE(static_cast<double>(p.arena_bytes), kArenaSanity * static_cast<double>(p.lower_bound)) << p.describe();
  EXPECT_GT(p.trace_seconds, 0) << p.describe();
  EXPECT_NE(p.describe().find("traced in a step of"), std::string::npos) << p.describe();
  if (s.dynamic_scale) {
    EXPECT_GT(skipped, 0) << "the dynamic scale from 2^24 should overflow at first";
  }
}

// The levels issue 14 asks bit identity at; O2-fp16 with a dynamic scale from 2^24 and a window of 4 good
// steps: it overflows first, then grows back into overflow every few steps (forced overflow steps).
std::vector<std::pair<const char*, Setting>> every_level() {
  return {{"O0", {Level::kO0, DType::kF32, false}},
          {"O1 bf16", {Level::kO1, DType::kBF16, false}},
          {"O2 bf16", {Level::kO2, DType::kBF16, false}},
          {"O2 fp16 dynamic", {Level::kO2, DType::kF16, true}},
          {"O3 bf16", {Level::kO3, DType::kBF16, false}}};
}

TEST(GraphMode, LeNetWithBatchNormOnFashionMnistIsBitIdenticalAtEveryLevel) {
  ASSERT_TRUE(std::filesystem::exists(kFashion)) << "Fashion-MNIST missing: scripts/setup installs dataset-fashion-mnist";
  const Batches b = fashion_batches(10, 32);
  auto make = [] { return std::make_shared<nn::LeNet>(/*batch_norm=*/true); };
  expect_graph_equals_pynative("O0", make, b, {Level::kO0, DType::kF32, false});
  expect_graph_equals_pynative("O1 bf16", make, b, {Level::kO1, DType::kBF16, false});
  expect_graph_equals_pynative("O2 bf16", make, b, {Level::kO2, DType::kBF16, false});
  expect_graph_equals_pynative("O2 fp16 dynamic", make, b, {Level::kO2, DType::kF16, true});
  expect_graph_equals_pynative("O3 fp16", make, b, {Level::kO3, DType::kF16, false});
}

TEST(GraphMode, DropoutAndBatchNormDrawTheSameMasksAsPynative) {
  const Batches b = fashion_batches(50, 32);
  auto make = [] {
    auto net = std::make_shared<nn::SequentialCell>();
    net->append(std::make_shared<nn::Conv2d>(1, 8, 3, nn::Conv2dOptions::Make(1, "pad", 1, true)));
    net->append(std::make_shared<nn::BatchNorm2d>(8));
    net->append(std::make_shared<nn::ReLU>());
    net->append(std::make_shared<nn::MaxPool2d>(2, 2));
    net->append(std::make_shared<nn::Flatten>());
    net->append(std::make_shared<nn::Dropout>(0.8));
    net->append(std::make_shared<nn::Dense>(8 * 14 * 14, 10));
    return net;
  };
  for (const auto& [name, s] : every_level()) expect_graph_equals_pynative(name, make, b, s);
}

// Issue 14's matrix: each reference model (D smaller, with dropout) over 50 steps at every level; at O2-fp16
// the overflow steps (each skipping its update and leaving the plan) come throughout the run.
TEST(GraphMode, ReferenceModelsAreBitIdenticalOver50StepsAtEveryLevel) {
  constexpr int kSteps = 50;
  nn::TransformerClassifierOptions o;
  o.vocab_size = 100;
  o.d_model = 32;
  o.nhead = 2;
  o.num_layers = 2;
  o.dim_feedforward = 64;
  o.seq_len = 16;
  o.dropout = 0.1;
  struct Case {
    const char* name;
    std::function<std::shared_ptr<nn::Cell>()> make;
    Batches batches;
  };
  const std::vector<Case> cases = {
      {"A", [] { return std::make_shared<nn::SimpleCNN>(); }, synthetic_batches(kSteps, {8, 3, 32, 32}, false, 10)},
      {"B", [] { return std::make_shared<nn::LeNet>(/*batch_norm=*/false); }, fashion_batches(kSteps, 16)},
      {"C", [] { return std::make_shared<nn::MLP>(); }, fashion_batches(kSteps, 32)},
      {"D", [o] { return std::make_shared<nn::TransformerClassifier>(o); },
       synthetic_batches(kSteps, {8, 16}, true, 10)},
  };
  for (const Case& c : cases)
    for (const auto& [name, s] : every_level()) {
      std::vector<char> skipped;
      expect_graph_equals_pynative(str_cat(c.name, " ", name), c.make, c.batches, s, &skipped);
      if (s.dynamic_scale) {
        int late = 0;
        for (size_t i = kSteps / 2; i < skipped.size(); ++i) late += skipped[i];
        EXPECT_GT(late, 0) << c.name << ": the scale should grow back into overflow in the second half";
      }
    }
}

// Counts a step's forward op calls, by op.
class OpCounter : public ops::OpObserver {
 public:
  void on_op(const ops::OpEvent& e) override {
    if (!e.backward) ++forward[std::string(ops::op_name(e.op))];
  }
  int64_t total() const {
    int64_t n = 0;
    for (const auto& [op, count] : forward) n += count;
    return n;
  }
  std::map<std::string, int64_t> forward;
};

// Turns ContextOptions::graph_fusion off for a scope.
class NoGraphFusion {
 public:
  NoGraphFusion() : saved_(get_context()) {
    ContextOptions off = saved_;
    off.graph_fusion = false;
    set_context(off);
  }
  ~NoGraphFusion() { set_context(saved_); }

 private:
  ContextOptions saved_;
};

// Graph mode runs the eager fusions on any network's calls (nn/call_fusion.h): model B written as
// MindSpore's model zoo writes LeNet (nn::ZooLeNet: each layer called in construct, one ReLU and one max-pool
// cell called at several places) trains bit for bit as model B itself, whose SequentialCells run the fused
// Conv2d -> ReLU -> MaxPool2d and Dense -> ReLU ops: the same losses, weights and step memory, a training peak
// below PYNATIVE's for the calls as written, fewer op calls. With graph_fusion off, graph mode gives
// PYNATIVE's bits for it as for every network.
TEST(GraphMode, FusesTheLayerCallsOfANetworkWrittenAsTheModelZooWritesIt) {
  const Batches b = fashion_batches(20, 16);
  auto zoo = [] { return std::make_shared<nn::ZooLeNet>(); };
  auto lenet = [] { return std::make_shared<nn::LeNet>(); };
  auto levels = every_level();
  levels.push_back({"O1 fp16", {Level::kO1, DType::kF16, false}});
  levels.push_back({"O3 fp16", {Level::kO3, DType::kF16, false}});
  for (const auto& [name, s] : levels) {
    SCOPED_TRACE(name);
    {
      NoGraphFusion off;
      expect_graph_equals_pynative("graph_fusion off", zoo, b, s);
      EXPECT_EQ(train(zoo, b, s, ExecMode::kGraph).plans[0].second.rewrites, "");
    }
    // (a run's peak also counts what its first steps hold while they make the process's kernel choices for
    // new shapes: the runs compared have their kernels chosen by an earlier run)
    (void)train(zoo, b, s, ExecMode::kGraph);
    const auto graph = train(zoo, b, s, ExecMode::kGraph);
    ASSERT_EQ(graph.plans.size(), 1u);
    EXPECT_EQ(graph.plans[0].second.rewrites,
              "fused 3 chains of layer calls: conv1 -> relu -> max_pool2d (Conv2d -> ReLU -> MaxPool2d), conv2 -> "
              "relu -> max_pool2d (Conv2d -> ReLU -> MaxPool2d), fc1 -> relu (Dense -> ReLU)");
    EXPECT_EQ(graph.stats.traced_steps, 1);
    const auto hand_fused = train(lenet, b, s, ExecMode::kGraph);
    ASSERT_EQ(graph.losses.size(), hand_fused.losses.size());
    for (size_t i = 0; i < graph.losses.size(); ++i)
      EXPECT_EQ(std::memcmp(&graph.losses[i], &hand_fused.losses[i], sizeof(float)), 0)
          << "step " << i << ": " << graph.losses[i] << " vs " << hand_fused.losses[i];
    EXPECT_EQ(graph.skipped, hand_fused.skipped);
    for (size_t k = 0; k < graph.weights.size(); ++k)
      EXPECT_EQ(std::memcmp(graph.weights[k].raw_data(), hand_fused.weights[k].raw_data(), graph.weights[k].nbytes()),
                0)
          << "parameter " << k;
    // The same step's memory: the same plan.
    ASSERT_EQ(hand_fused.plans.size(), 1u);
    EXPECT_EQ(graph.plans[0].second.lower_bound, hand_fused.plans[0].second.lower_bound);
    EXPECT_EQ(graph.plans[0].second.arena_bytes, hand_fused.plans[0].second.arena_bytes);
    EXPECT_EQ(graph.plans[0].second.allocations, hand_fused.plans[0].second.allocations);
    const auto eager = train(zoo, b, s, ExecMode::kPyNative);
    EXPECT_LT(graph.train_peak, eager.train_peak);
    std::printf("zoo LeNet %s training peak: PYNATIVE %lld bytes, GRAPH %lld (model B in GRAPH_MODE: %lld)\n", name,
                static_cast<long long>(eager.train_peak), static_cast<long long>(graph.train_peak),
                static_cast<long long>(hand_fused.train_peak));
  }
  // The op calls of a step: each convolution's chain is one op instead of three, the Dense's one of two.
  auto count_ops = [&](ExecMode mode) {
    ExecModeScope in_mode(mode);
    set_seed(3);
    auto net = zoo();
    auto step = amp::build_train_network(net, std::make_shared<optim::Momentum>(net->trainable_params(), 0.02, 0.9),
                                         std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), Level::kO0);
    for (int i = 0; i < 3; ++i) (*step)(b.x[i], b.y[i]);
    OpCounter counter;
    {
      ops::OpObserverScope observe(&counter);
      (*step)(b.x[3], b.y[3]);
    }
    return counter;
  };
  const OpCounter eager = count_ops(ExecMode::kPyNative), graph = count_ops(ExecMode::kGraph);
  EXPECT_EQ(graph.total(), eager.total() - 5);
  EXPECT_EQ(eager.forward.count("Conv2dReLUMaxPool2d"), 0u);
  EXPECT_EQ(graph.forward.at("Conv2dReLUMaxPool2d"), 2);
  EXPECT_EQ(graph.forward.count("ReLU"), 0u) << "every ReLU fused";
}

// A ReLU pinned to FP32 (to_float) keeps its own dtype, which no fused op would honour: at O2 the zoo LeNet's
// chains through it stay as written (PYNATIVE's bits), and the summary says nothing was fused.
TEST(GraphMode, AChainThroughAPinnedLayerRunsAsWritten) {
  const Batches b = fashion_batches(8, 16);
  auto make = [] {
    auto net = std::make_shared<nn::ZooLeNet>();
    net->relu->to_float(DType::kF32);
    return net;
  };
  const Setting s{Level::kO2, DType::kBF16, false};
  expect_graph_equals_pynative("O2 bf16, relu pinned to float32", make, b, s);
  const auto graph = train(make, b, s, ExecMode::kGraph);
  ASSERT_EQ(graph.plans.size(), 1u);
  EXPECT_EQ(graph.plans[0].second.rewrites, "");
}

// A network whose fusable layer output is also read elsewhere. An op's read, seen in the run graph mode
// learns from, keeps that layer out of a chain (eager mode adds that op's gradient to the chain's before the
// convolution's backward: fused, the two would be summed in another order). A read the learning run did not
// show (on the host, a value kept past the step) computes the pending value with the calls as written, and
// the chain runs as written from then on.
class ReadsItsConvOutput : public nn::Cell {
 public:
  enum class Read { kBySecondOp, kOnTheHost, kKeptPastTheStep };
  explicit ReadsItsConvOutput(Read read) : Cell("ReadsItsConvOutput"), read_(read) {
    conv = register_cell("conv", std::make_shared<nn::Conv2d>(1, 4, 3, nn::Conv2dOptions::Make(1, "pad", 1, true)));
    relu = register_cell("relu", std::make_shared<nn::ReLU>());
    pool = register_cell("pool", std::make_shared<nn::MaxPool2d>(2, 2));
    fc = register_cell("fc", std::make_shared<nn::Dense>(4 * 14 * 14, 10));
  }
  Tensor construct(const Tensor& x) override {
    Tensor a = conv->call(x);
    // (from the 5th call of construct: graph mode's learning run, then its eager, traced and first replayed
    // steps; the 3rd step in PYNATIVE mode)
    ++calls_;
    if (read_ == Read::kOnTheHost && calls_ > (get_context().mode == ExecMode::kGraph ? 4 : 3)) {
      host_value = a.to_vector()[0];
      ++host_reads;
    }
    Tensor y = fc->call(ops::flatten(pool->call(relu->call(a)), 1));
    if (read_ == Read::kBySecondOp) y = ops::add(y, ops::mean(a));
    if (read_ == Read::kKeptPastTheStep) kept = a;
    return y;
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::ReLU> relu;
  std::shared_ptr<nn::MaxPool2d> pool;
  std::shared_ptr<nn::Dense> fc;
  float host_value = 0;
  int host_reads = 0;
  Tensor kept;

 private:
  Read read_;
  int calls_ = 0;
};

TEST(GraphMode, ALayerOutputReadElsewhereIsNeverFusedAway) {
  const Batches b = fashion_batches(8, 8);
  using Read = ReadsItsConvOutput::Read;
  for (Read read : {Read::kBySecondOp, Read::kOnTheHost, Read::kKeptPastTheStep}) {
    for (Setting s : {Setting{Level::kO0, DType::kF32, false}, Setting{Level::kO2, DType::kBF16, false}}) {
      SCOPED_TRACE(str_cat(static_cast<int>(read), " ", amp::level_name(s.level)));
      struct Out {
        std::vector<float> losses;
        std::vector<float> read;
        int host_reads = 0;
        graph::StepGraphs::Stats stats;
        std::string rewrites;
      } out[2];
      for (ExecMode mode : {ExecMode::kPyNative, ExecMode::kGraph}) {
        ExecModeScope in_mode(mode);
        set_seed(3);
        auto net = std::make_shared<ReadsItsConvOutput>(read);
        amp::TrainOptions o;
        o.low_dtype = s.low;
        auto step = amp::build_train_network(net, std::make_shared<optim::Momentum>(net->trainable_params(), 0.02, 0.9),
                                             std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), s.level,
                                             o);
        Out& r = out[mode == ExecMode::kGraph];
        for (size_t i = 0; i < b.x.size(); ++i) r.losses.push_back((*step)(b.x[i], b.y[i]).loss);
        r.read = read == Read::kOnTheHost ? std::vector<float>{net->host_value}
                 : read == Read::kKeptPastTheStep ? net->kept.to_vector()
                                                  : std::vector<float>{};
        if (read == Read::kKeptPastTheStep) {
          EXPECT_FALSE(net->kept.is_pending());
        }
        r.host_reads = net->host_reads;
        r.stats = step->graphs().stats();
        if (!step->graphs().plans().empty()) r.rewrites = step->graphs().plans()[0].second.rewrites;
      }
      // The values are PYNATIVE's (the convolution's gradient, fused in the steps before the read, may differ
      // in its last bits).
      ASSERT_EQ(out[0].losses.size(), out[1].losses.size());
      for (size_t i = 0; i < out[0].losses.size(); ++i)
        EXPECT_NEAR(out[1].losses[i], out[0].losses[i], 1e-5 * std::fabs(out[0].losses[i])) << "step " << i;
      ASSERT_EQ(out[0].read.size(), out[1].read.size());
      for (size_t i = 0; i < out[0].read.size(); ++i)
        EXPECT_NEAR(out[1].read[i], out[0].read[i], 1e-4 * (std::fabs(out[0].read[i]) + 1e-3)) << "element " << i;
      EXPECT_EQ(out[0].host_reads, out[1].host_reads);
      EXPECT_EQ(out[1].rewrites, read == Read::kBySecondOp
                                     ? "fused 1 chain of layer calls: relu -> pool (ReLU -> MaxPool2d)"
                                     : "ran 1 chain as written (an output read elsewhere): conv -> relu -> pool "
                                       "(Conv2d -> ReLU -> MaxPool2d)");
      // A value kept past the step is computed at the end of the first step, before the trace; a host read in
      // a replayed step leaves the plan, and the step is traced again.
      EXPECT_EQ(out[1].stats.traced_steps, read == Read::kOnTheHost ? 2 : 1);
    }
  }
}

// A network whose forward holds only at its batch size (a reshape to a fixed batch): the learning run on 2
// samples fails, graph mode says so once and runs the calls as written, bit for bit PYNATIVE's.
class FixedBatchNet : public nn::Cell {
 public:
  FixedBatchNet() : Cell("FixedBatchNet") {
    fc = register_cell("fc", std::make_shared<nn::Dense>(28 * 28, 16));
    relu = register_cell("relu", std::make_shared<nn::ReLU>());
    out = register_cell("out", std::make_shared<nn::Dense>(16, 10));
  }
  Tensor construct(const Tensor& x) override { return out->call(relu->call(fc->call(ops::reshape(x, {8, -1})))); }
  std::shared_ptr<nn::Dense> fc, out;
  std::shared_ptr<nn::ReLU> relu;
};

TEST(GraphMode, ANetworkTheLearningRunCannotRunKeepsItsCallsWithAWarning) {
  const Batches b = fashion_batches(6, 8);
  std::vector<std::string> warnings;
  std::vector<float> losses[2];
  for (ExecMode mode : {ExecMode::kPyNative, ExecMode::kGraph}) {
    ExecModeScope in_mode(mode);
    set_seed(3);
    auto net = std::make_shared<FixedBatchNet>();
    auto step = amp::build_train_network(net, std::make_shared<optim::Momentum>(net->trainable_params(), 0.02, 0.9),
                                         std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), Level::kO0);
    step->graphs().set_warning_sink([&](const std::string& m) { warnings.push_back(m); });
    for (size_t i = 0; i < b.x.size(); ++i) losses[mode == ExecMode::kGraph].push_back((*step)(b.x[i], b.y[i]).loss);
    if (mode == ExecMode::kGraph) {
      ASSERT_EQ(step->graphs().plans().size(), 1u);
      EXPECT_EQ(step->graphs().plans()[0].second.rewrites, "");
      EXPECT_GE(step->graphs().stats().replayed_steps, 4);
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("run their layer calls as written: the run that learns which to fuse failed"),
            std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find("layer 'fc' (Dense)"), std::string::npos) << warnings[0];
}

// Graph mode places each parameter's update in backward wherever nothing waits on every gradient (no loss
// scale, clipping, accumulation or data parallelism) and no cell computes in float16: the same weights bit
// for bit (the tests above run these settings), no gradient held past its update, so a lower gradients'
// peak than PYNATIVE's, which keeps .grad readable after the step, and a training peak no higher (lower
// where the gradients make it; where a kernel's workspace in forward makes it, the two are equal: which
// kernel runs is a measured choice: DESIGN.md, "Memory claims are about what no kernel choice moves"). Where float16 may overflow, or the
// caller says false, graph mode updates after backward as PYNATIVE does.
TEST(GraphMode, UpdatesInBackwardWhereNothingWaitsOnEveryGradientWithALowerPeak) {
  const Batches b = fashion_batches(4, 32);
  auto make = [] { return std::make_shared<nn::LeNet>(/*batch_norm=*/false); };
  for (Setting s : {Setting{Level::kO0, DType::kF32, false}, Setting{Level::kO2, DType::kBF16, false},
                    Setting{Level::kO3, DType::kBF16, false}}) {
    SCOPED_TRACE(amp::level_name(s.level));
    const auto eager = train(make, b, s, ExecMode::kPyNative);
    const auto graph = train(make, b, s, ExecMode::kGraph);
    EXPECT_TRUE(eager.grads_kept);
    EXPECT_FALSE(graph.grads_kept) << "each gradient is freed once its parameter is updated";
    EXPECT_LT(graph.gradient_peak, eager.gradient_peak);
    EXPECT_LE(graph.train_peak, eager.train_peak);
    std::printf("LeNet %s training peak: PYNATIVE %lld bytes, GRAPH %lld (gradients' %lld, %lld)\n",
                amp::level_name(s.level), static_cast<long long>(eager.train_peak),
                static_cast<long long>(graph.train_peak), static_cast<long long>(eager.gradient_peak),
                static_cast<long long>(graph.gradient_peak));
    for (size_t k = 0; k < eager.weights.size(); ++k)
      EXPECT_EQ(std::memcmp(eager.weights[k].raw_data(), graph.weights[k].raw_data(), eager.weights[k].nbytes()), 0)
          << "parameter " << k;
  }
  for (Setting s : {Setting{Level::kO3, DType::kF16, false}, Setting{Level::kO2, DType::kF16, false, true},
                    Setting{Level::kO0, DType::kF32, false, false, false}}) {
    SCOPED_TRACE(str_cat(amp::level_name(s.level), " ", dtype_name(s.low)));
    EXPECT_TRUE(train(make, b, s, ExecMode::kGraph).grads_kept) << "updated after backward";
  }
}

// The float16 check behind graph mode's choice is cached per step (it walks every cell), and must follow a
// policy set on a cell after the train step was built: a cell that starts computing in float16 may
// overflow, so the update leaves backward; once it stops, the update moves back.
TEST(GraphMode, TheUpdateLeavesBackwardWhileACellComputesInFloat16) {
  ExecModeScope in_graph(ExecMode::kGraph);
  const Batches b = fashion_batches(3, 16);
  set_seed(3);
  auto net = std::make_shared<nn::LeNet>(/*batch_norm=*/false);
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.02, 0.9);
  auto step = amp::build_train_network(net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                       Level::kO0);
  auto grads_kept = [&] {
    bool kept = false;
    for (const Tensor& p : net->trainable_params()) kept = kept || p.grad().defined();
    return kept;
  };
  EXPECT_TRUE(step->optimizer_in_backward());
  (*step)(b.x[0], b.y[0]);
  EXPECT_FALSE(grads_kept());
  nn::Cell* fc = nullptr;
  for (const auto& [path, cell] : net->cells_and_names())
    if (cell->type_name() == "Dense") fc = cell;
  ASSERT_NE(fc, nullptr);
  fc->set_precision_policy(std::make_shared<amp::AmpPolicy>(Level::kO3, DType::kF16));
  EXPECT_FALSE(step->optimizer_in_backward());
  (*step)(b.x[1], b.y[1]);
  EXPECT_TRUE(grads_kept()) << "updated after backward";
  fc->set_precision_policy(nullptr);
  EXPECT_TRUE(step->optimizer_in_backward());
  (*step)(b.x[2], b.y[2]);
  EXPECT_FALSE(grads_kept());
}

// Every optimizer's update in backward (Optimizer::step_param per parameter, then finish_step) is bit for
// bit its update after backward: graph mode places it there by default, so a difference would make graph
// mode train differently from PYNATIVE with that optimizer.
TEST(GraphMode, EveryOptimizerUpdatesInBackwardBitForBitAsPynative) {
  const Batches b = fashion_batches(3, 16);
  using Make = std::function<std::shared_ptr<optim::Optimizer>(std::vector<Tensor>)>;
  using std::make_shared;
  const std::vector<std::pair<std::string, Make>> optimizers = {
      {"SGD", [](std::vector<Tensor> p) { return make_shared<optim::SGD>(std::move(p), 0.05, 0.01); }},
      {"Momentum", [](std::vector<Tensor> p) { return make_shared<optim::Momentum>(std::move(p), 0.05, 0.9, 0.01); }},
      {"Adam",
       [](std::vector<Tensor> p) { return make_shared<optim::Adam>(std::move(p), 1e-3, optim::AdamOptions{}, 0.01); }},
      {"RMSProp", [](std::vector<Tensor> p) { return make_shared<optim::RMSProp>(std::move(p), 1e-3); }},
      {"Adagrad", [](std::vector<Tensor> p) { return make_shared<optim::Adagrad>(std::move(p), 1e-2); }},
      {"LAMB", [](std::vector<Tensor> p) { return make_shared<optim::LAMB>(std::move(p), 1e-3); }},
      // AdamW with two groups (decay on the first half) and a warm-up + cosine schedule.
      {"AdamW groups cosine",
       [](std::vector<Tensor> p) {
         const auto half = p.begin() + static_cast<std::ptrdiff_t>(p.size() / 2);
         std::vector<optim::ParamGroup> groups = {{{p.begin(), half}, 0.1, 1.0}, {{half, p.end()}, 0.0, 0.5}};
         return make_shared<optim::Adam>(std::move(groups), optim::cosine_lr(1e-3, 3, 1), optim::AdamOptions{},
                                         /*decoupled=*/true);
       }},
  };
  for (const auto& [name, make_opt] : optimizers) {
    for (Level level : {Level::kO0, Level::kO2}) {
      SCOPED_TRACE(str_cat(name, " ", amp::level_name(level)));
      std::vector<std::vector<Tensor>> weights;
      std::vector<bool> grads_kept;
      for (ExecMode mode : {ExecMode::kPyNative, ExecMode::kGraph}) {
        ExecModeScope in_mode(mode);
        set_seed(3);
        auto net = std::make_shared<nn::LeNet>(/*batch_norm=*/false);
        auto opt = make_opt(net->trainable_params());
        auto loss = std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean");
        auto step = amp::build_train_network(net, opt, loss, level, {.low_dtype = DType::kBF16});
        for (size_t i = 0; i < b.x.size(); ++i) (*step)(b.x[i], b.y[i]);
        weights.emplace_back();
        bool kept = false;
        for (const Tensor& p : net->trainable_params()) {
          weights.back().push_back(p.clone());
          kept = kept || p.grad().defined();
        }
        grads_kept.push_back(kept);
      }
      EXPECT_TRUE(grads_kept[0]);
      EXPECT_FALSE(grads_kept[1]) << "graph mode updated in backward";
      for (size_t k = 0; k < weights[0].size(); ++k)
        EXPECT_EQ(std::memcmp(weights[0][k].raw_data(), weights[1][k].raw_data(), weights[0][k].nbytes()), 0)
            << "parameter " << k;
    }
  }
}

// A cell whose forward changes from step to step (host state standing for data-dependent control flow:
// each call runs one more ReLU than the last): graph mode cannot plan it, and says so once, naming the
// layer where the step left its plan; its results stay PYNATIVE's.
class GrowingCell : public nn::Cell {
 public:
  GrowingCell() : Cell("GrowingCell") {}
  Tensor construct(const Tensor& x) override {
    Tensor h = x;
    for (int i = 0; i < calls_; ++i) h = ops::relu(ops::add(h, h));
    ++calls_;
    return h;
  }

 private:
  int calls_ = 0;
};

TEST(GraphMode, AStepThatChangesEveryTimeRunsEagerlyWithAWarningNamingTheLayer) {
  auto make = [] {
    auto net = std::make_shared<nn::SequentialCell>();
    net->append(std::make_shared<nn::Dense>(16, 16));
    net->append(std::make_shared<GrowingCell>());
    net->append(std::make_shared<nn::Dense>(16, 10));
    return net;
  };
  const Batches b = synthetic_batches(16, {4, 16}, false, 10);
  std::vector<float> losses[2];
  std::vector<std::string> warnings;
  for (ExecMode mode : {ExecMode::kPyNative, ExecMode::kGraph}) {
    ExecModeScope in_mode(mode);
    set_seed(4);
    auto net = make();
    auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.001, 0.9);
    auto step = amp::build_train_network(net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                         Level::kO0, {});
    step->graphs().set_warning_sink([&](const std::string& m) { warnings.push_back(m); });
    for (size_t i = 0; i < b.x.size(); ++i) losses[mode == ExecMode::kGraph].push_back((*step)(b.x[i], b.y[i]).loss);
    if (mode == ExecMode::kGraph) {
      EXPECT_EQ(step->graphs().stats().traced_steps, graph::StepGraphs::kMaxRetraces + 1);
      EXPECT_GT(step->graphs().stats().eager_steps, 3);
      // and the plan's summary (the summary line of `demi train`) says so, and why
      ASSERT_EQ(step->graphs().plans().size(), 1u);
      const std::string d = step->graphs().plans()[0].second.describe();
      EXPECT_NE(d.find("; PYNATIVE from step "), std::string::npos) << d;
      EXPECT_NE(d.find("in the forward of layer '1'"), std::string::npos) << d;
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("allocate differently from step to step"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("in the forward of layer '1'"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("run in PYNATIVE mode"), std::string::npos) << warnings[0];
}

// Gradient clipping takes one pass's scratch whether a step clips or not (ops::sum_of_squares_then_scale):
// a run that clips on some steps only stays on its one plan, bit for bit as PYNATIVE. (The GPT's clipped
// steps once left the plan of its unclipped ones, and after 4 traces graph mode ran PYNATIVE, at a higher
// peak.)
TEST(GraphMode, ClippingOnSomeStepsOnlyStaysOnItsPlan) {
  auto make = [] {
    auto net = std::make_shared<nn::SequentialCell>();
    net->append(std::make_shared<nn::Dense>(16, 32));
    net->append(std::make_shared<nn::ReLU>());
    net->append(std::make_shared<nn::Dense>(32, 10));
    return net;
  };
  const Batches b = synthetic_batches(24, {8, 16}, false, 10);
  auto run = [&](ExecMode mode, double clip, std::vector<amp::StepResult>& out) {
    ExecModeScope in_mode(mode);
    set_seed(4);
    auto net = make();
    auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.05, 0.9);
    amp::TrainOptions o;
    o.clip_grad_norm = clip;
    auto step = amp::build_train_network(net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                         Level::kO0, o);
    for (size_t i = 0; i < b.x.size(); ++i) out.push_back((*step)(b.x[i], b.y[i]));
    return std::pair{step->graphs().stats(), step->graphs().plans()};
  };
  std::vector<amp::StepResult> free_run;
  run(ExecMode::kPyNative, 1e9, free_run);  // the norms, to clip at their median
  std::vector<double> norms;
  for (const auto& r : free_run) norms.push_back(r.grad_norm);
  std::nth_element(norms.begin(), norms.begin() + static_cast<std::ptrdiff_t>(norms.size() / 2), norms.end());
  const double clip = norms[norms.size() / 2];
  std::vector<amp::StepResult> eager, graph;
  run(ExecMode::kPyNative, clip, eager);
  const auto [stats, plans] = run(ExecMode::kGraph, clip, graph);
  int clipped = 0;
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_EQ(std::memcmp(&eager[i].loss, &graph[i].loss, sizeof(float)), 0) << "step " << i;
    EXPECT_EQ(eager[i].clipped, graph[i].clipped) << "step " << i;
    clipped += graph[i].clipped ? 1 : 0;
  }
  EXPECT_GT(clipped, 0);
  EXPECT_LT(clipped, static_cast<int>(graph.size()));
  EXPECT_EQ(stats.traced_steps, 1);
  EXPECT_EQ(stats.diverged_steps, 0);
  EXPECT_EQ(stats.replayed_steps, static_cast<int64_t>(graph.size()) - 2);
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(plans[0].second.fallback, "") << plans[0].second.describe();
}

// Model::train with gradient accumulation (micro-batches and updates each under their plans) and
// Model::eval (each batch under its plan; the last, smaller batch gets a plan of its own), in both modes.
struct ModelRun {
  train::TrainSummary summary;
  std::map<std::string, double> metrics;
  std::vector<Tensor> weights;
  graph::StepGraphs::Stats train_stats, eval_stats;
  size_t eval_plans = 0;
};

ModelRun model_run(ExecMode mode, amp::Level level, DType low, int accumulate) {
  ExecModeScope in_mode(mode);
  set_seed(9);
  auto net = std::make_shared<nn::LeNet>(/*batch_norm=*/true);
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.02, 0.9);
  train::ModelOptions o;
  o.amp_level = level;
  o.low_dtype = low;
  o.accumulate = accumulate;
  train::Model model(net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt,
                     {{"Accuracy", std::make_shared<train::Accuracy>()}, {"Loss", std::make_shared<train::Loss>()}}, o);
  std::vector<data::Transform> norm = {data::Rescale(1.0 / 255, 0.0), data::Normalize({0.2860}, {0.3530})};
  auto train_ds = std::make_shared<data::MnistDataset>(kFashion, "train")->map(norm, {"image"})->take(384)->batch(32);
  auto test_ds = std::make_shared<data::MnistDataset>(kFashion, "test")->map(norm, {"image"})->take(300)->batch(64);
  model.train(2, train_ds, {}, /*dataset_sink_mode=*/true);
  ModelRun r;
  r.summary = model.last_summary();
  r.metrics = model.eval(test_ds);
  for (const Tensor& p : net->trainable_params()) r.weights.push_back(p.clone());
  r.train_stats = model.train_graphs().stats();
  r.eval_stats = model.eval_graphs().stats();
  r.eval_plans = model.eval_graphs().plans().size();
  return r;
}

TEST(GraphMode, ModelTrainWithAccumulationAndEvalMatchPynative) {
  for (int accumulate : {1, 3}) {
    for (DType low : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(str_cat("accumulate ", accumulate, ", O2 ", dtype_name(low)));
      ModelRun eager = model_run(ExecMode::kPyNative, Level::kO2, low, accumulate);
      ModelRun graph = model_run(ExecMode::kGraph, Level::kO2, low, accumulate);
      EXPECT_EQ(std::memcmp(&eager.summary.final_loss, &graph.summary.final_loss, sizeof(float)), 0)
          << eager.summary.final_loss << " vs " << graph.summary.final_loss;
      EXPECT_EQ(eager.summary.mean_last_epoch_loss, graph.summary.mean_last_epoch_loss);
      EXPECT_EQ(eager.summary.skipped_steps, graph.summary.skipped_steps);
      for (size_t k = 0; k < eager.weights.size(); ++k)
        EXPECT_EQ(std::memcmp(eager.weights[k].raw_data(), graph.weights[k].raw_data(), eager.weights[k].nbytes()), 0)
            << "parameter " << k;
      EXPECT_EQ(eager.metrics, graph.metrics);
      EXPECT_EQ(eager.train_stats.replayed_steps + eager.eval_stats.replayed_steps, 0);
      EXPECT_GT(graph.train_stats.replayed_steps, 0);
      EXPECT_GT(graph.summary.graph.replayed_steps, 0);
      EXPECT_LE(static_cast<double>(graph.summary.graph_plan.arena_bytes),
                kArenaSanity * static_cast<double>(graph.summary.graph_plan.lower_bound));
      // 300 test images in batches of 64: four full batches (warm-up, trace, two replays), one of 44.
      EXPECT_EQ(graph.eval_stats.traced_steps, 1);
      EXPECT_EQ(graph.eval_stats.replayed_steps, 2);
      EXPECT_EQ(graph.eval_plans, 1u);
    }
  }
}

// Model::forecast probes a step as graph mode runs it: a network written the zoo's way is forecast with its
// layer calls fused, as model B is, below its PYNATIVE step, and its graph-mode training peaks where the
// forecast said. What the fusion saves is activations, which the network and the dtypes fix on every CPU: the
// fused step's activations peak far below PYNATIVE's. (How far the whole training peak drops also depends on
// the workspace of the kernels this CPU chose: a ratio of those is no law, only the order is.)
TEST(GraphMode, TheMemoryForecastOfAZooStyleNetworkIsItsFusedStep) {
  std::vector<data::Transform> norm = {data::Rescale(1.0 / 255, 0.0), data::Normalize({0.2860}, {0.3530})};
  auto ds = std::make_shared<data::MnistDataset>(kFashion, "train")->map(norm, {"image"})->take(256)->batch(32);
  auto first = ds->create_iterator()->next();
  ASSERT_TRUE(first.has_value());
  struct Got {
    int64_t forecast = 0, measured = 0, activations = 0;
  };
  auto run = [&](bool zoo, ExecMode mode) {
    ExecModeScope in_mode(mode);
    set_seed(9);
    std::shared_ptr<nn::Cell> net;
    if (zoo) {
      net = std::make_shared<nn::ZooLeNet>();
    } else {
      net = std::make_shared<nn::LeNet>();
    }
    train::ModelOptions o;
    o.amp_level = Level::kO2;
    o.low_dtype = DType::kBF16;
    train::Model model(net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                       std::make_shared<optim::Momentum>(net->trainable_params(), 0.02, 0.9), {}, o);
    Got g;
    g.forecast = model.forecast((*first)[0], (*first)[1]).train_peak;
    model.train(1, ds);
    g.measured = model.last_summary().peak.train_peak;
    g.activations = model.last_summary().peak.pk(MemCategory::kActivation);
    return g;
  };
  (void)run(true, ExecMode::kGraph);  // (the kernel choices of every shape involved, made before measuring)
  (void)run(false, ExecMode::kGraph);
  const Got zoo = run(true, ExecMode::kGraph), lenet = run(false, ExecMode::kGraph);
  const Got zoo_eager = run(true, ExecMode::kPyNative);
  std::printf("forecast / measured training peak, O2 bf16: zoo LeNet GRAPH %lld / %lld, model B GRAPH %lld / %lld, "
              "zoo LeNet PYNATIVE %lld / %lld bytes\n",
              static_cast<long long>(zoo.forecast), static_cast<long long>(zoo.measured),
              static_cast<long long>(lenet.forecast), static_cast<long long>(lenet.measured),
              static_cast<long long>(zoo_eager.forecast), static_cast<long long>(zoo_eager.measured));
  EXPECT_NEAR(static_cast<double>(zoo.forecast), static_cast<double>(lenet.forecast),
              0.02 * static_cast<double>(lenet.forecast));
  EXPECT_NEAR(static_cast<double>(zoo.forecast), static_cast<double>(zoo.measured),
              0.05 * static_cast<double>(zoo.measured));
  EXPECT_LT(zoo.forecast, zoo_eager.forecast);
  std::printf("activations' peak: zoo LeNet GRAPH %lld, PYNATIVE %lld bytes\n", static_cast<long long>(zoo.activations),
              static_cast<long long>(zoo_eager.activations));
  EXPECT_LT(static_cast<double>(zoo.activations), 0.5 * static_cast<double>(zoo_eager.activations));
}

// Model::eval's steps are rewritten too: the zoo LeNet evaluates with its layer calls fused, to model B's
// metrics bit for bit, after training to model B's weights.
TEST(GraphMode, EvalFusesTheLayerCallsOfAZooStyleNetwork) {
  std::vector<data::Transform> norm = {data::Rescale(1.0 / 255, 0.0), data::Normalize({0.2860}, {0.3530})};
  auto train_ds = std::make_shared<data::MnistDataset>(kFashion, "train")->map(norm, {"image"})->take(128)->batch(32);
  auto test_ds = std::make_shared<data::MnistDataset>(kFashion, "test")->map(norm, {"image"})->take(256)->batch(64);
  ExecModeScope in_graph(ExecMode::kGraph);
  auto run = [&](bool zoo) {
    set_seed(9);
    std::shared_ptr<nn::Cell> net;
    if (zoo) {
      net = std::make_shared<nn::ZooLeNet>();
    } else {
      net = std::make_shared<nn::LeNet>();
    }
    train::ModelOptions o;
    o.amp_level = Level::kO2;
    o.low_dtype = DType::kBF16;
    train::Model model(net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                       std::make_shared<optim::Momentum>(net->trainable_params(), 0.02, 0.9),
                       {{"Accuracy", std::make_shared<train::Accuracy>()}, {"Loss", std::make_shared<train::Loss>()}}, o);
    model.train(1, train_ds);
    auto metrics = model.eval(test_ds);
    std::string rewrites;
    if (!model.eval_graphs().plans().empty()) rewrites = model.eval_graphs().plans()[0].second.rewrites;
    return std::make_pair(metrics, rewrites);
  };
  const auto [zoo_metrics, zoo_rewrites] = run(true);
  const auto [lenet_metrics, lenet_rewrites] = run(false);
  EXPECT_EQ(zoo_rewrites, "fused 3 chains of layer calls: conv1 -> relu -> max_pool2d (Conv2d -> ReLU -> MaxPool2d), "
                          "conv2 -> relu -> max_pool2d (Conv2d -> ReLU -> MaxPool2d), fc1 -> relu (Dense -> ReLU)");
  EXPECT_EQ(lenet_rewrites, "");
  ASSERT_EQ(zoo_metrics.size(), lenet_metrics.size());
  for (const auto& [name, value] : lenet_metrics) {
    ASSERT_TRUE(zoo_metrics.count(name)) << name;
    EXPECT_EQ(zoo_metrics.at(name), value) << name;
  }
}

}  // namespace
}  // namespace demi
