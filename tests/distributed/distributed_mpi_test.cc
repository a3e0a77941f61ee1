// Data parallelism across real processes: this binary runs under `mpirun -np N` (ctest launches it with
// 2 and 3 processes). Every process runs every test in the same order, so their collectives match.
//   - the collectives (sum, max, broadcast; the bf16 all-reduce within one bfloat16 rounding)
//   - N processes with batch b make the updates of one process with batch N·b (losses and weights within
//     FP32 rounding after 20 steps, a ragged last step where some processes have no batch included), and
//     every process ends with bit-identical weights
//   - an overflow on one process only: every process skips the step and keeps the same loss scale
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "demi/amp/loss_scale.h"
#include "demi/core/context.h"
#include "demi/core/rng.h"
#include "demi/data/sources.h"
#include "demi/distributed/data_parallel.h"
#include "demi/distributed/distributed.h"
#include "demi/distributed/internal/comm.h"
#include "demi/nn/layers.h"
#include "demi/ops/ops.h"
#include "demi/optim/optimizer.h"
#include "demi/train/model.h"

namespace demi {
namespace {

class DistEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    ContextOptions c = get_context();
    c.num_threads = 1;  // the processes share this machine's cores
    set_context(c);
    dist::init();
    dist::set_auto_parallel_context({.parallel_mode = dist::ParallelMode::kDataParallel, .timeout_seconds = 60});
  }
  void TearDown() override { dist::release(); }
};

// Process r's values for a test: deterministic from (seed, r), so any process can compute any other's.
std::vector<float> values_of(int rank, int64_t n, uint64_t seed) {
  Generator g(seed + static_cast<uint64_t>(rank) * 7919);
  Tensor t = normal({n}, 0.0, 1e-3, g);
  return t.to_vector();
}

TEST(Collectives, SumMaxAndBroadcast) {
  const int p = dist::get_group_size(), r = dist::get_rank();
  ASSERT_GT(p, 1) << "run under mpirun -np 2 or more";
  std::vector<double> v = {1.0 * r, 2.0};
  dist::all_reduce_sum(std::span<double>(v));
  EXPECT_EQ(v[0], p * (p - 1) / 2.0);
  EXPECT_EQ(v[1], 2.0 * p);
  std::vector<int64_t> m = {r, -r};
  dist::all_reduce_max(std::span<int64_t>(m));
  EXPECT_EQ(m[0], p - 1);
  EXPECT_EQ(m[1], 0);
  std::vector<float> b(5, static_cast<float>(r + 1));
  dist::broadcast(b.data(), b.size() * sizeof(float), p - 1);
  for (float x : b) EXPECT_EQ(x, static_cast<float>(p));
}

TEST(Collectives, Bf16AllReduceRoundsOnceInFp32) {
  const int p = dist::get_group_size(), r = dist::get_rank();
  const int64_t n = 10007;  // not a multiple of the process count
  std::vector<float> mine = values_of(r, n, 11);
  dist::internal::run_on_comm_thread([&] { dist::internal::all_reduce_bf16_sum(mine.data(), n); }, "bf16 test");
  // The exact sum of every process's bf16-rounded values, then one bf16 rounding.
  std::vector<double> exact(static_cast<size_t>(n), 0.0);
  for (int q = 0; q < p; ++q) {
    std::vector<float> x = values_of(q, n, 11);
    for (int64_t i = 0; i < n; ++i)
      exact[static_cast<size_t>(i)] += static_cast<float>(BFloat16(x[static_cast<size_t>(i)]));
  }
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = mine[static_cast<size_t>(i)] - exact[static_cast<size_t>(i)];
    err += d * d;
    ref += exact[static_cast<size_t>(i)] * exact[static_cast<size_t>(i)];
    // One rounding: within half a bfloat16 ulp of the (FP32-summed) value.
    ASSERT_LE(std::abs(d), std::abs(exact[static_cast<size_t>(i)]) * (1.0 / 256) + 1e-30) << "element " << i;
  }
  EXPECT_LT(std::sqrt(err / ref), 2.5e-3);  // relative RMS error of one bf16 rounding (~1.6e-3)
  // Every process holds the same result.
  std::vector<float> zero = mine;
  dist::broadcast(zero.data(), zero.size() * sizeof(float), 0);
  EXPECT_EQ(std::memcmp(zero.data(), mine.data(), mine.size() * sizeof(float)), 0);
}

// A small classifier and its data: 12 features, 5 classes, deterministic from the seed.
struct Problem {
  std::shared_ptr<nn::SequentialCell> net;
  std::shared_ptr<data::Dataset> data;
};

Problem problem(int64_t samples, int64_t batch) {
  set_seed(1234);
  auto net = std::make_shared<nn::SequentialCell>(std::vector<nn::CellPtr>{
      std::make_shared<nn::Dense>(12, 32, nn::DenseOptions{.activation = "relu"}), std::make_shared<nn::Dense>(32, 5)});
  Generator g(99);
  Tensor x = normal({samples, 12}, 0.0, 1.0, g);
  Tensor y = empty({samples}, DType::kI32);
  for (int64_t i = 0; i < samples; ++i) y.set(i, static_cast<double>(i % 5));
  auto ds = std::make_shared<data::NumpySlicesDataset>(std::vector<Tensor>{x, y}, std::vector<std::string>{"x", "y"})
                ->shuffle(samples, 5)
                ->batch(batch);
  return {net, ds};
}

std::vector<float> flat_weights(nn::Cell& net) {
  std::vector<float> w;
  for (const auto& [name, t] : net.parameters_and_names()) {
    auto v = t.to_vector();
    w.insert(w.end(), v.begin(), v.end());
  }
  return w;
}

// Per-step losses of a Model's training.
class Losses : public train::Callback {
 public:
  void on_step_end(train::RunContext& ctx) override { losses.push_back(ctx.loss); }
  std::vector<float> losses;
};

struct TrainRun {
  std::vector<float> losses, weights;
  int64_t skipped = 0;
};

// `epochs` of training with batch `batch` per process; data parallel unless `alone`.
TrainRun train_run(int64_t samples, int64_t batch, int epochs, bool alone, amp::Level level = amp::Level::kO0,
                   DType low = DType::kBF16, int accumulate = 1) {
  auto saved = dist::get_auto_parallel_context();
  if (alone) dist::set_auto_parallel_context({.parallel_mode = dist::ParallelMode::kStandAlone});
  Problem pr = problem(samples, batch);
  auto opt = std::make_shared<optim::Momentum>(pr.net->trainable_params(), 0.05, 0.9);
  train::Model model(pr.net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt, {},
                     {.amp_level = level, .low_dtype = low, .accumulate = accumulate});
  EXPECT_EQ(model.data_parallel() != nullptr, !alone);
  auto losses = std::make_shared<Losses>();
  model.train(epochs, pr.data, {losses}, /*dataset_sink_mode=*/false);
  dist::set_auto_parallel_context(saved);
  return {losses->losses, flat_weights(*pr.net), model.last_summary().skipped_steps};
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rel, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double err = 0, ref = 0, worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    ref += static_cast<double>(b[i]) * b[i];
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / (std::abs(b[i]) + 1e-3));
  }
  EXPECT_LT(std::sqrt(err / std::max(ref, 1e-30)), rel) << what << " (worst element " << worst << ")";
}

void expect_same_on_every_process(const std::vector<float>& w) {
  std::vector<float> root = w;
  dist::broadcast(root.data(), root.size() * sizeof(float), 0);
  EXPECT_EQ(std::memcmp(root.data(), w.data(), w.size() * sizeof(float)), 0) << "weights differ from rank 0's";
}

TEST(DataParallel, NProcessesWithBatchBEqualOneWithBatchNB) {
  const int p = dist::get_group_size();
  const int64_t b = 8;
  // 20 full global steps and a ragged last one (3 batches of b: with 3 processes, one has no batch).
  const int64_t samples = 20 * p * b + 2 * b + 3;
  TrainRun dp = train_run(samples, b, 1, /*alone=*/false);
  TrainRun one = train_run(samples, p * b, 1, /*alone=*/true);
  ASSERT_EQ(dp.losses.size(), one.losses.size());
  expect_close(dp.losses, one.losses, 1e-5, "losses");
  expect_close(dp.weights, one.weights, 1e-5, "weights");
  expect_same_on_every_process(dp.weights);
}

TEST(DataParallel, AccumulatingNProcessesTimesKBatchesEqualsOneProcessWithBatchNKB) {
  const int p = dist::get_group_size();
  const int64_t b = 4;
  // 10 updates of 2 batches per process, then 5 more batches of b: ragged updates where some processes
  // have one batch or none.
  const int64_t samples = 10 * 2 * p * b + 5 * b;
  TrainRun dp = train_run(samples, b, 1, false, amp::Level::kO0, DType::kBF16, /*accumulate=*/2);
  TrainRun one = train_run(samples, 2 * p * b, 1, true);
  ASSERT_EQ(dp.losses.size(), one.losses.size());
  ASSERT_GT(dp.losses.size(), 10u);
  expect_close(dp.weights, one.weights, 1e-5, "weights");
  expect_same_on_every_process(dp.weights);
}

TEST(DataParallel, Bf16GradientsAtO2StayCloseToOneProcess) {
  const int p = dist::get_group_size();
  const int64_t b = 8, samples = 20 * p * b;
  auto saved = dist::get_auto_parallel_context();
  auto ctx = saved;
  ctx.comm_dtype = DType::kBF16;
  ctx.bucket_cap_mb = 0.001;  // several buckets, reduced while backward goes on
  ctx.first_bucket_mb = 0.0005;
  dist::set_auto_parallel_context(ctx);
  TrainRun dp = train_run(samples, b, 1, false, amp::Level::kO2, DType::kBF16);
  dist::set_auto_parallel_context(saved);
  TrainRun one = train_run(samples, p * b, 1, true, amp::Level::kO2, DType::kBF16);
  expect_close(dp.losses, one.losses, 2e-2, "losses");
  expect_close(dp.weights, one.weights, 2e-2, "weights");
  expect_same_on_every_process(dp.weights);
}

// Asks training to stop after `step`, on rank 1 only.
class StopOnRankOne : public train::Callback {
 public:
  explicit StopOnRankOne(int64_t step) : step_(step) {}
  void on_step_end(train::RunContext& ctx) override {
    if (dist::get_rank() == 1 && ctx.cur_step_num == step_) ctx.stop_requested = true;
  }

 private:
  int64_t step_;
};

TEST(DataParallel, ACallbackStoppingOneProcessStopsThemAll) {
  Problem pr = problem(640, 8);
  auto opt = std::make_shared<optim::Momentum>(pr.net->trainable_params(), 0.05, 0.9);
  train::Model model(pr.net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt);
  model.train(2, pr.data, {std::make_shared<StopOnRankOne>(3)}, false);
  EXPECT_EQ(model.last_summary().steps, 3) << "rank " << dist::get_rank();
}

// Sink mode with one sink per epoch (sink_size -1), data parallel: every process calls its callbacks once
// per epoch, at the same step, with the same weights as the steps seen one by one; a stop one process
// asks for at the end of a sink stops them all there.
class Sinks : public train::Callback {
 public:
  void on_step_end(train::RunContext& ctx) override {
    ++calls;
    steps += ctx.sink_steps;
    if (stop_on_rank_one && dist::get_rank() == 1) ctx.stop_requested = true;
  }
  int64_t calls = 0, steps = 0;
  bool stop_on_rank_one = false;
};

TEST(DataParallel, OneSinkPerEpochCallsTheCallbacksOncePerEpochOnEveryProcess) {
  const int p = dist::get_group_size();
  const int64_t b = 8, samples = 10 * p * b + 3 * b + 5;  // a ragged last global step
  std::vector<float> weights[2];
  int64_t steps[2] = {0, 0};
  for (int sunk = 0; sunk < 2; ++sunk) {
    Problem pr = problem(samples, b);
    auto opt = std::make_shared<optim::Momentum>(pr.net->trainable_params(), 0.05, 0.9);
    train::Model model(pr.net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt);
    auto sinks = std::make_shared<Sinks>();
    model.train(2, pr.data, {sinks}, /*dataset_sink_mode=*/true, /*sink_size=*/sunk ? -1 : 0);
    weights[sunk] = flat_weights(*pr.net);
    steps[sunk] = model.last_summary().steps;
    if (sunk) {
      EXPECT_EQ(sinks->calls, 2) << "rank " << dist::get_rank();
      EXPECT_EQ(sinks->steps, steps[sunk]);
    } else {
      EXPECT_EQ(sinks->calls, steps[sunk]);
    }
  }
  EXPECT_EQ(steps[0], steps[1]);
  EXPECT_EQ(weights[0], weights[1]);
  expect_same_on_every_process(weights[1]);

  Problem pr = problem(samples, b);
  auto opt = std::make_shared<optim::Momentum>(pr.net->trainable_params(), 0.05, 0.9);
  train::Model model(pr.net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt);
  auto stopper = std::make_shared<Sinks>();
  stopper->stop_on_rank_one = true;
  model.train(2, pr.data, {stopper}, true, -1);
  EXPECT_EQ(model.last_summary().steps, steps[0] / 2) << "rank " << dist::get_rank();
  EXPECT_EQ(stopper->calls, 1);
  // Sinks of N batches running on across the data set's epochs are single-process for now: refused on
  // every process, before anything is trained.
  const int64_t before = model.steps_done();
  try {
    model.train(1, pr.data, {}, true, 4);
    ADD_FAILURE() << "sink_size 4 was accepted data parallel";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not supported data-parallel yet"), std::string::npos) << e.what();
  }
  EXPECT_EQ(model.steps_done(), before);
}

TEST(DataParallel, EvalSplitOverTheProcessesEqualsOneProcessEvaluatingItAll) {
  const int p = dist::get_group_size();
  Problem pr = problem(8 * p * 6 + 11, 8);  // ragged: the last batch has 3 rows
  auto opt = std::make_shared<optim::Momentum>(pr.net->trainable_params(), 0.05, 0.9);
  auto metrics = [] {
    return std::map<std::string, train::MetricPtr>{{"Accuracy", std::make_shared<train::Accuracy>()},
                                                   {"Loss", std::make_shared<train::Loss>()}};
  };
  auto loss = std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean");
  train::Model dp(pr.net, loss, opt, metrics());
  ASSERT_NE(dp.data_parallel(), nullptr);
  dp.train(1, pr.data, {}, false);
  std::map<std::string, double> split = dp.eval(pr.data, false);
  auto saved = dist::get_auto_parallel_context();
  dist::set_auto_parallel_context({.parallel_mode = dist::ParallelMode::kStandAlone});
  train::Model alone(pr.net, loss, opt, metrics());
  dist::set_auto_parallel_context(saved);
  std::map<std::string, double> whole = alone.eval(pr.data, false);
  EXPECT_EQ(split["Accuracy"], whole["Accuracy"]);
  EXPECT_NEAR(split["Loss"], whole["Loss"], 1e-6 * std::abs(whole["Loss"]));
}

TEST(DataParallel, ProcessesWithDifferentNetworksFailTogetherWithAClearError) {
  set_seed(1);
  const int64_t hidden = dist::get_rank() == 1 ? 33 : 32;
  nn::SequentialCell net({std::make_shared<nn::Dense>(12, hidden), std::make_shared<nn::Dense>(hidden, 5)});
  try {
    dist::broadcast_state(net);
    ADD_FAILURE() << "rank " << dist::get_rank() << ": no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the processes hold different networks (4 tensors each, between"),
              std::string::npos)
        << e.what();
  }
}

TEST(DataParallel, AnOverflowOnOneProcessSkipsTheStepEverywhere) {
  const int r = dist::get_rank();
  Problem pr = problem(64, 8);
  auto opt = std::make_shared<optim::Momentum>(pr.net->trainable_params(), 0.05, 0.9);
  auto manager = std::make_shared<amp::DynamicLossScaleManager>(1024.0, 2.0, 1000);
  auto step = amp::build_train_network(pr.net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                       amp::Level::kO2, {.low_dtype = DType::kF16, .loss_scale_manager = manager});
  std::vector<std::string> names = step->parameter_names();
  auto dp = std::make_shared<dist::DataParallel>(opt->parameters(), names, dist::get_auto_parallel_context());
  step->set_grad_reducer(dp);
  dist::broadcast_state(*pr.net);
  const std::vector<float> before = flat_weights(*pr.net);
  Generator g(3);
  Tensor x = normal({8, 12}, 0.0, 1.0, g);
  if (r == 1) x.set(5, INFINITY);  // non-finite gradients on this process only
  Tensor y = zeros({8}, DType::kI32);
  dp->begin_step(8);
  amp::StepResult res = (*step)(x, y);
  EXPECT_TRUE(res.overflow) << "rank " << r;
  EXPECT_TRUE(res.skipped) << "rank " << r;
  EXPECT_EQ(manager->get_loss_scale(), 512.0) << "rank " << r;
  EXPECT_EQ(flat_weights(*pr.net), before) << "rank " << r << " updated its weights";
  // The next, finite step updates everywhere, identically.
  x.set(5, 0.5);
  dp->begin_step(8);
  res = (*step)(x, y);
  EXPECT_FALSE(res.overflow);
  EXPECT_NE(flat_weights(*pr.net), before);
  expect_same_on_every_process(flat_weights(*pr.net));
  EXPECT_GT(dp->stats().buckets_reduced, 0);
}

TEST(DataParallel, AdaptiveAmpPromotesTheSameLayerOnEveryProcess) {
  // Regression onto targets past float16's range: the output Dense overflows at O3 float16 once it has
  // learnt them, on whichever process's batch holds the large ones; every process promotes it together.
  set_seed(3);
  auto net = std::make_shared<nn::SequentialCell>(std::vector<nn::CellPtr>{
      std::make_shared<nn::Dense>(128, 64), std::make_shared<nn::ReLU>(), std::make_shared<nn::Dense>(64, 1)});
  Generator g(11);
  Tensor x = uniform({640, 128}, 0.0, 1.0, g);
  Tensor y = ops::mul_scalar(ops::sum(x, {1}, true), 1.2e3);
  auto ds = std::make_shared<data::NumpySlicesDataset>(std::vector<Tensor>{x, y}, std::vector<std::string>{"x", "y"})
                ->batch(16, true);
  train::Model model(net, std::make_shared<nn::MSELoss>("mean"), std::make_shared<optim::Adam>(net->trainable_params(), 0.1),
                     {}, {.amp_level = amp::Level::kO3, .low_dtype = DType::kF16, .amp_adapt = true});
  ASSERT_NE(model.data_parallel(), nullptr);
  std::ostringstream log;
  train::set_callback_stream(&log);
  model.train(3 * dist::get_group_size(), ds, {}, /*dataset_sink_mode=*/false);  // as many steps at any size
  train::set_callback_stream(nullptr);
  const auto& s = model.last_summary();
  ASSERT_FALSE(s.promotions.empty()) << "rank " << dist::get_rank() << ": " << log.str();
  EXPECT_EQ(s.promotions[0].layer, "2");
  std::vector<int64_t> mine{static_cast<int64_t>(s.promotions.size()), s.promotions[0].step};
  std::vector<int64_t> most = mine;
  dist::all_reduce_max(std::span<int64_t>(most), "test");
  EXPECT_EQ(mine, most) << "every process made the same promotions at the same step";
  expect_same_on_every_process(flat_weights(*net));
}

}  // namespace
}  // namespace demi

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new demi::DistEnvironment);
  return RUN_ALL_TESTS();
}
