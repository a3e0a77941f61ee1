// Train-step objects: one call runs forward, loss, scaled backward, the fused unscale + all-finite
// check, and (unless the step overflowed and the manager drops such steps) the optimizer update.
//
//   auto train_step = amp::build_train_network(net, optimizer, loss_fn, amp::Level::kO2);
//   for (auto& [data, label] : batches) {
//     amp::StepResult r = train_step(data, label);   // {loss, overflow, loss_scale}
//   }
//
// MindSpore's per-level defaults: O2 -> DynamicLossScaleManager and BatchNorm kept FP32; O3 -> no loss
// scale, BatchNorm low too; O0/O1 -> no loss scale. With bfloat16 (same exponent range as FP32) no loss
// scale is needed, so O2-bf16 defaults to none as well.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "demi/amp/loss_scale.h"
#include "demi/amp/policy.h"
#include "demi/nn/cell.h"
#include "demi/optim/optimizer.h"

namespace demi::amp {

struct StepResult {
  float loss = 0;           // the unscaled loss (FP32)
  bool overflow = false;    // a gradient was not finite
  bool skipped = false;     // the update was not applied (overflow with drop_overflow_update)
  double loss_scale = 1;    // the scale this step used
  std::string first_nonfinite;  // parameter path of the first non-finite gradient, when overflow
};

struct TrainOptions {
  DType low_dtype = DType::kF16;                       // the seed's float16; kBF16 for bfloat16
  std::shared_ptr<LossScaleManager> loss_scale_manager;  // null: the level's default
  bool no_loss_scale = false;                          // force no loss scaling (overrides the default)
  std::optional<bool> keep_batchnorm_fp32;             // default: true at O2, false at O3
};

// Wraps a network and a loss: construct(data) -> logits; loss(logits, label) -> FP32 loss.
class TrainStep {
 public:
  TrainStep(std::shared_ptr<nn::Cell> net, std::shared_ptr<nn::LossCell> loss_fn,
            std::shared_ptr<optim::Optimizer> optimizer, std::shared_ptr<LossScaleManager> manager);

  StepResult operator()(const Tensor& data, const Tensor& label);

  nn::Cell& network() { return *net_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  LossScaleManager* loss_scale_manager() { return manager_.get(); }
  // The last step's logits (FP32), for metrics without a second forward pass.
  const Tensor& last_logits() const { return last_logits_; }

 private:
  std::shared_ptr<nn::Cell> net_;
  std::shared_ptr<nn::LossCell> loss_fn_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<LossScaleManager> manager_;
  std::vector<std::string> param_names_;
  Tensor last_logits_;
};

// MindSpore's amp.build_train_network(network, optimizer, loss_fn, level): attaches the level's precision
// policy to `net` and returns its train step.
std::shared_ptr<TrainStep> build_train_network(std::shared_ptr<nn::Cell> net,
                                               std::shared_ptr<optim::Optimizer> optimizer,
                                               std::shared_ptr<nn::LossCell> loss_fn, Level level,
                                               const TrainOptions& options = {});

// The level's default loss-scale manager for a low dtype (null when none is needed).
std::shared_ptr<LossScaleManager> default_loss_scale_manager(Level level, DType low_dtype);

}  // namespace demi::amp
