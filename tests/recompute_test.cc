// Recomputation (Cell::recompute, autograd::recompute): a recomputed cell keeps no activations and runs
// again in backward; gradients, dropout masks and running statistics are bit for bit those without it,
// at every AMP level, for less activation memory.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "demi/amp/train_step.h"
#include "demi/core/memory.h"
#include "demi/core/rng.h"
#include "demi/nn/models.h"
#include "demi/nn/transformer.h"
#include "demi/ops/ops.h"

namespace demi {
namespace {

using amp::Level;

nn::TransformerClassifierOptions small_transformer() {
  nn::TransformerClassifierOptions o;
  o.vocab_size = 50;
  o.d_model = 32;
  o.num_layers = 3;
  o.nhead = 2;
  o.dim_feedforward = 64;
  o.seq_len = 16;
  o.num_classes = 5;
  o.dropout = 0.1;  // the re-run must draw the same masks
  return o;
}

struct Trainer {
  std::shared_ptr<nn::TransformerClassifier> net;
  std::shared_ptr<optim::Momentum> opt;
  std::shared_ptr<amp::TrainStep> step;
};

Trainer make_trainer(Level level, DType low, bool recompute) {
  set_seed(21);
  Trainer r;
  r.net = std::make_shared<nn::TransformerClassifier>(small_transformer());
  if (recompute)
    for (auto& layer : r.net->encoder->layers) layer->recompute();
  r.opt = std::make_shared<optim::Momentum>(r.net->trainable_params(), 0.05, 0.9);
  amp::TrainOptions o;
  o.low_dtype = low;
  o.no_loss_scale = true;
  r.step = amp::build_train_network(r.net, r.opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                    level, o);
  return r;
}

std::pair<Tensor, Tensor> tokens(uint64_t seed) {
  Generator g(seed);
  std::vector<int32_t> ids(8 * 16), labels(8);
  for (auto& v : ids) v = static_cast<int32_t>(g.next_int(50));
  for (auto& v : labels) v = static_cast<int32_t>(g.next_int(5));
  return {from_vector(ids, {8, 16}), from_vector(labels, {8})};
}

TEST(Recompute, TransformerLayersTrainBitForBitWithLessActivationMemory) {
  struct Setting {
    Level level;
    DType low;
  };
  for (Setting s : {Setting{Level::kO0, DType::kF16}, Setting{Level::kO2, DType::kBF16},
                    Setting{Level::kO2, DType::kF16}}) {
    const std::string what = std::string(amp::level_name(s.level)) + " " + std::string(dtype_name(s.low));
    Trainer plain = make_trainer(s.level, s.low, false), recomputed = make_trainer(s.level, s.low, true);
    int64_t act_plain = 0, act_recomputed = 0;
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = tokens(40 + static_cast<uint64_t>(step));
      mem_reset_peak();
      const float l_plain = plain.step->accumulate(x, y);
      act_plain = std::max(act_plain, mem_stats().peak[static_cast<size_t>(MemCategory::kActivation)]);
      mem_reset_peak();
      const float l_recomputed = recomputed.step->accumulate(x, y);
      act_recomputed = std::max(act_recomputed, mem_stats().peak[static_cast<size_t>(MemCategory::kActivation)]);
      ASSERT_EQ(l_plain, l_recomputed) << what << " step " << step;
      auto gp = plain.net->parameters_and_names(), gr = recomputed.net->parameters_and_names();
      for (size_t i = 0; i < gp.size(); ++i) {
        const Tensor a = gp[i].second.grad(), b = gr[i].second.grad();
        ASSERT_TRUE(a.defined() && b.defined()) << gp[i].first;
        ASSERT_EQ(a.dtype(), b.dtype()) << gp[i].first;
        ASSERT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << what << " " << gp[i].first;
      }
      plain.step->step();
      recomputed.step->step();
      plain.opt->zero_grad();  // one process tracks both runs
    }
    EXPECT_LT(act_recomputed * 3, act_plain * 2) << what << ": activations " << act_recomputed << " vs " << act_plain;
  }
}

TEST(Recompute, RunningStatisticsAreUpdatedOnceAndEvalRunsPlainly) {
  auto train = [](bool recompute) {
    set_seed(4);
    auto net = std::make_shared<nn::LeNet>(/*batch_norm=*/true);
    if (recompute) net->features->recompute();
    auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.05, 0.9);
    auto step = amp::build_train_network(net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                         Level::kO2, {.low_dtype = DType::kBF16});
    Generator g(8);
    for (int s = 0; s < 2; ++s) {
      Tensor x = normal({4, 1, 28, 28}, 0, 1, g);
      (*step)(x, from_vector(std::vector<int32_t>{1, 2, 3, 4}, {4}));
    }
    net->set_train(false);
    Tensor logits = net->call(normal({2, 1, 28, 28}, 0, 1, g));
    return std::make_pair(net, logits);
  };
  auto [plain, y_plain] = train(false);
  auto [recomputed, y_recomputed] = train(true);
  auto bp = plain->buffers_and_names(), br = recomputed->buffers_and_names();
  ASSERT_FALSE(bp.empty());
  for (size_t i = 0; i < bp.size(); ++i)
    ASSERT_EQ(std::memcmp(bp[i].second.raw_data(), br[i].second.raw_data(), bp[i].second.nbytes()), 0) << bp[i].first;
  ASSERT_EQ(std::memcmp(y_plain.raw_data(), y_recomputed.raw_data(), y_plain.nbytes()), 0);
}

TEST(Recompute, AnAttentionCellAloneIsRefusedNamingItsEnclosingLayer) {
  set_seed(2);
  nn::TransformerEncoderLayer layer(16, 2, 32, 0.0);
  layer.self_attn->recompute();
  Tensor x = normal({2, 4, 16}, 0, 1, default_generator()).set_requires_grad(true);
  try {
    layer.call(x);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recompute the layer that encloses it"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace demi
