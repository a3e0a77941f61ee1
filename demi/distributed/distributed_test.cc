// demi/distributed in one process without MPI started: a world of one, the context's checks, the gradient
// buckets' layout and its one rebuild from the order backward produced the gradients. The collectives
// across processes are tested under mpirun (tests/dist).
#include "demi/distributed/distributed.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "demi/autograd/autograd.h"
#include "demi/core/rng.h"
#include "demi/core/test_support.h"
#include "demi/distributed/data_parallel.h"
#include "demi/nn/layers.h"
#include "demi/optim/optimizer.h"

namespace demi::dist {
namespace {

using test_support::expect_error;

TEST(Dist, WithoutInitIsAWorldOfOne) {
  EXPECT_FALSE(is_initialized());
  EXPECT_EQ(get_rank(), 0);
  EXPECT_EQ(get_group_size(), 1);
  EXPECT_EQ(get_local_rank(), 0);
  EXPECT_FALSE(data_parallel());
  std::vector<double> v = {1.5, 2};
  all_reduce_sum(std::span<double>(v));
  EXPECT_EQ(v, (std::vector<double>{1.5, 2}));
  int x = 7;
  broadcast(&x, sizeof x);
  barrier();
  EXPECT_EQ(x, 7);
}

TEST(Dist, ContextRejectsWhatItCannotDo) {
  expect_error([] { set_auto_parallel_context({.bucket_cap_mb = -1}); }, {"bucket sizes must be positive"});
  expect_error([] { set_auto_parallel_context({.first_bucket_mb = 0}); }, {"bucket sizes must be positive"});
  expect_error([] { set_auto_parallel_context({.comm_dtype = DType::kF16}); }, {"comm_dtype must be float32 or bfloat16",
                                                                                "float16"});
  expect_error([] { set_auto_parallel_context({.timeout_seconds = -1}); }, {"timeout_seconds must be positive"});
  setenv("DEMI_DIST_TIMEOUT", "soon", 1);
  expect_error([] { set_auto_parallel_context({}); }, {"DEMI_DIST_TIMEOUT must be a positive number", "'soon'"});
  unsetenv("DEMI_DIST_TIMEOUT");
  set_auto_parallel_context({.parallel_mode = ParallelMode::kDataParallel});
  EXPECT_FALSE(data_parallel());  // not initialized: one process trains alone
  reset_auto_parallel_context();
}

struct Net {
  std::shared_ptr<nn::SequentialCell> net;
  std::shared_ptr<optim::Momentum> opt;
  std::shared_ptr<amp::TrainStep> step;
  std::vector<std::string> names;
};

// Three Dense layers, 4->300->300->3: weights of 1200, 90000 and 900 values.
Net make_net() {
  set_seed(5);
  Net n;
  n.net = std::make_shared<nn::SequentialCell>(std::vector<nn::CellPtr>{
      std::make_shared<nn::Dense>(4, 300), std::make_shared<nn::Dense>(300, 300), std::make_shared<nn::Dense>(300, 3)});
  n.opt = std::make_shared<optim::Momentum>(n.net->trainable_params(), 0.1, 0.9);
  n.step = amp::build_train_network(n.net, n.opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                    amp::Level::kO0);
  n.names = n.step->parameter_names();
  return n;
}

TEST(DataParallel, BucketsFollowReverseRegistrationWithASmallFirstOne) {
  Net n = make_net();  // parameters: w0 b0 w1 b1 w2 b2
  AutoParallelContext ctx;
  ctx.first_bucket_mb = 4000.0 / (1 << 20);  // 4000 bytes: b2 w2 (3612) fit, b1 does not
  ctx.bucket_cap_mb = 363000.0 / (1 << 20);  // b1 w1 b0 (362400); w0 no longer
  DataParallel dp(n.opt->parameters(), n.names, ctx);
  EXPECT_EQ(dp.bucket_layout(), (std::vector<std::vector<int>>{{5, 4}, {3, 2, 1}, {0}}));
}

TEST(DataParallel, TheAutomaticBucketCapIsAQuarterOfTheGradientsWithin1And25MiB) {
  Net n = make_net();  // 92703 parameters, 0.35 MiB: below 1 MiB
  AutoParallelContext ctx;
  ctx.first_bucket_mb = 4000.0 / (1 << 20);
  DataParallel small(n.opt->parameters(), n.names, ctx);
  EXPECT_EQ(small.bucket_layout(), (std::vector<std::vector<int>>{{5, 4}, {3, 2, 1, 0}}));  // 1 MiB after the first
  set_seed(6);
  nn::Dense big(1024, 2048);  // 8 MiB of weight
  std::vector<Tensor> params = {big.weight, big.bias};
  for (int k = 0; k < 7; ++k) {
    Tensor t = zeros({512, 1024});  // 2 MiB each
    params.push_back(t.set_requires_grad(true));
  }
  DataParallel auto_cap(params, std::vector<std::string>(params.size(), "p"), ctx);
  // 8 MiB + 8 KiB + 7·2 MiB: a 5.5 MiB cap. The first bucket takes the last parameter alone (a bucket
  // always takes one), the bias joins two 2 MiB ones, the weight fills one of its own.
  EXPECT_EQ(auto_cap.bucket_layout(), (std::vector<std::vector<int>>{{8}, {7, 6}, {5, 4}, {3, 2, 1}, {0}}));
}

TEST(DataParallel, AWorldOfOneTrainsExactlyAsWithoutAReducer) {
  Generator g(1);
  Tensor x = normal({16, 4}, 0.0, 1.0, g);
  Tensor y = zeros({16}, DType::kI32);
  for (DType wire : {DType::kF32, DType::kBF16}) {
    Net alone = make_net(), reduced = make_net();
    AutoParallelContext ctx;
    ctx.comm_dtype = wire;
    ctx.first_bucket_mb = 0.001;
    ctx.bucket_cap_mb = 0.01;
    auto dp = std::make_shared<DataParallel>(reduced.opt->parameters(), reduced.names, ctx);
    reduced.step->set_grad_reducer(dp);
    for (int s = 0; s < 3; ++s) {
      amp::StepResult a = (*alone.step)(x, y);
      dp->begin_step(16);
      amp::StepResult b = (*reduced.step)(x, y);
      if (wire == DType::kF32) {
        EXPECT_EQ(a.loss, b.loss) << "step " << s;
      } else {
        EXPECT_NEAR(a.loss, b.loss, 1e-2) << "step " << s;  // gradients rounded to bfloat16
      }
    }
    auto pa = alone.net->parameters_and_names(), pb = reduced.net->parameters_and_names();
    for (size_t i = 0; i < pa.size(); ++i) {
      if (wire == DType::kF32) {
        EXPECT_EQ(pa[i].second.to_vector(), pb[i].second.to_vector()) << pa[i].first;
      }
    }
    EXPECT_EQ(dp->stats().steps, 3);
    EXPECT_GE(dp->stats().buckets_reduced, 3 * dp->num_buckets());
  }
}

TEST(DataParallel, WithoutOverlapEveryBucketIsReducedAfterBackwardWithTheSameResult) {
  Generator g(4);
  Tensor x = normal({16, 4}, 0.0, 1.0, g);
  Tensor y = zeros({16}, DType::kI32);
  Net alone = make_net(), reduced = make_net();
  AutoParallelContext ctx;
  ctx.overlap = false;
  ctx.first_bucket_mb = 0.001;
  auto dp = std::make_shared<DataParallel>(reduced.opt->parameters(), reduced.names, ctx);
  reduced.step->set_grad_reducer(dp);
  const std::vector<std::vector<int>> layout = dp->bucket_layout();
  for (int s = 0; s < 2; ++s) {
    (*alone.step)(x, y);
    dp->begin_step(16);
    (*reduced.step)(x, y);
  }
  EXPECT_EQ(alone.net->parameters_and_names()[2].second.to_vector(), reduced.net->parameters_and_names()[2].second.to_vector());
  EXPECT_EQ(dp->bucket_layout(), layout);  // no overlap: nothing to lay out again
  EXPECT_EQ(dp->stats().buckets_reduced, 2 * dp->num_buckets());
}

TEST(DataParallel, BucketsAreLaidOutOnceInTheOrderBackwardCompletedThem) {
  Net n = make_net();
  AutoParallelContext ctx;
  ctx.first_bucket_mb = 0.0001;  // one parameter per bucket
  ctx.bucket_cap_mb = 0.0001;
  auto dp = std::make_shared<DataParallel>(n.opt->parameters(), n.names, ctx);
  n.step->set_grad_reducer(dp);
  Generator g(2);
  Tensor x = normal({8, 4}, 0.0, 1.0, g);
  Tensor y = zeros({8}, DType::kI32);
  dp->begin_step(8);
  (*n.step)(x, y);
  // The order backward completes the gradients in, heard on a twin network.
  Net twin = make_net();
  std::vector<Tensor> params = twin.opt->parameters();
  std::vector<std::vector<int>> expected;
  {
    autograd::LeafReadyScope hear([&](const Tensor& leaf) {
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].is_same(leaf)) expected.push_back({static_cast<int>(i)});
    });
    autograd::backward(nn::SoftmaxCrossEntropyWithLogits(true, "mean")(twin.net->call(x), y));
  }
  ASSERT_EQ(expected.size(), 6u);
  std::vector<std::vector<int>> layout = dp->bucket_layout();
  EXPECT_EQ(layout, expected);
  dp->begin_step(8);
  (*n.step)(x, y);
  EXPECT_EQ(dp->bucket_layout(), layout);  // laid out once
}

TEST(DataParallel, AStepWithoutABatchNeedsAReducer) {
  Net n = make_net();
  expect_error([&] { n.step->step_without_batch(); }, {"only a data-parallel step"});
}

}  // namespace
}  // namespace demi::dist
