// RMSProp and Adagrad against PyTorch (scripts/make_golden.py optimizers), LAMB against its paper's update
// written out in f64 there: four steps from the same weights with the same gradients, the weights after
// every step; plus their argument checks and checkpointed state.
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "demi/optim/optimizer.h"
#include "golden_util.h"

namespace demi {
namespace {

TEST(OptimizerGolden, RMSPropAdagradAndLambMatchTheirReferences) {
  auto g = testing::read_golden("optimizers");
  using Make = std::function<std::unique_ptr<optim::Optimizer>(Tensor)>;
  const std::pair<const char*, Make> cases[] = {
      {"rmsprop", [](Tensor p) { return std::make_unique<optim::RMSProp>(std::vector<Tensor>{p}, 0.01); }},
      {"rmsprop_momentum_wd",
       [](Tensor p) {
         return std::make_unique<optim::RMSProp>(std::vector<Tensor>{p}, 0.01,
                                                 optim::RMSPropOptions{.momentum = 0.5}, 0.1);
       }},
      {"rmsprop_centered",
       [](Tensor p) {
         return std::make_unique<optim::RMSProp>(std::vector<Tensor>{p}, 0.01,
                                                 optim::RMSPropOptions{.momentum = 0.5, .centered = true});
       }},
      {"adagrad", [](Tensor p) { return std::make_unique<optim::Adagrad>(std::vector<Tensor>{p}, 0.1); }},
      {"adagrad_wd", [](Tensor p) { return std::make_unique<optim::Adagrad>(std::vector<Tensor>{p}, 0.1, 0.1, 0.1); }},
      {"lamb",
       [](Tensor p) {
         return std::make_unique<optim::LAMB>(std::vector<Tensor>{p}, 0.01,
                                              optim::AdamOptions{.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-6}, 0.1);
       }},
  };
  for (const auto& [name, make] : cases) {
    SCOPED_TRACE(name);
    Tensor p = g["w0"].to(DType::kF32, true).set_requires_grad(true);
    auto opt = make(p);
    for (int i = 0; i < 4; ++i) {
      p.set_grad(g[str_cat("g", i)].to(DType::kF32));
      opt->step();
      testing::expect_close(p, g[str_cat(name, ".w", i)], testing::tolerance_for_terms(DType::kF32, 16 * (i + 1)),
                            str_cat("w after step ", i + 1));
    }
    EXPECT_EQ(opt->global_step(), 4);
    EXPECT_FALSE(opt->state().empty()) << "the state is checkpointed";
  }
}

TEST(OptimizerGolden, BadHyperparametersAreRefused) {
  Tensor p = ones({2}).set_requires_grad(true);
  EXPECT_THROW(optim::RMSProp({p}, 0.01, optim::RMSPropOptions{.decay = 1.0}), Error);
  EXPECT_THROW(optim::RMSProp({p}, 0.01, optim::RMSPropOptions{.epsilon = 0}), Error);
  EXPECT_THROW(optim::RMSProp({p}, 0.01, optim::RMSPropOptions{.momentum = -1}), Error);
  EXPECT_THROW(optim::Adagrad({p}, 0.1, 0.0), Error);
  EXPECT_THROW(optim::LAMB({p}, 0.1, optim::AdamOptions{.beta1 = 1.0}), Error);
}

}  // namespace
}  // namespace demi
