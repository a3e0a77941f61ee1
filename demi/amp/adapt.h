// Adaptive AMP: layers found responsible for overflow are promoted to FP32 for the rest of training.
//
//   ModelOptions{.amp_level = amp::Level::kO3, .amp_adapt = true}      // or `demi train --amp-adapt`
//
// Every overflowing step is attributed to the op that first produced Inf/NaN (amp/attribution.h). An
// attribution *counts* when lowering the loss scale cannot cure it: a forward overflow (activations do
// not depend on the loss scale), or a backward one when the scale cannot go lower (no loss-scale
// manager, a fixed one, or a dynamic one at its floor). A dynamic scale's own probing (one overflow per
// growth attempt, and the back-off from its initial 2^24) never counts. A layer with `promote_after`
// counted attributions within the last `window` steps (defaults 2 of 50: one is a warning, two in a short
// window are a pattern, and a forward overflow that recurs is never a fluke of the scale) is promoted:
// from the next step on, every op that runs in that layer or below computes in FP32.
//
// The policy is composed, never mutated: PromotedPolicy(base, layers) answers FP32 for ops in a promoted
// layer and asks `base` (the level's lists with the user's edits) for the rest; each promotion attaches a
// new one to the network. A cell's to_float pin still wins over both. Promotions are logged, reported in
// TrainSummary, saved in checkpoints ("demi.amp.promotions") and restored on resume. Ops that run
// directly in the root network (not in a sub-layer) cannot be promoted without promoting everything:
// such attributions are reported and not acted on. Data parallel (train::Model does it): each process
// counts its own batches' attributions, and a layer any process would promote is promoted on all of them
// at once (one all-reduce of the candidate per step).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "demi/amp/loss_scale.h"
#include "demi/amp/train_step.h"
#include "demi/nn/cell.h"
#include "demi/ops/dispatch.h"

namespace demi::amp {

// `base` (may be null: no AMP) with the ops of `layers` (dotted paths; a layer and its sub-layers) in FP32.
class PromotedPolicy : public ops::PrecisionPolicy {
 public:
  PromotedPolicy(std::shared_ptr<const ops::PrecisionPolicy> base, std::vector<std::string> layers);
  DType compute_dtype(ops::Op op, DType natural) const override;
  bool outputs_to_fp32(ops::Op op) const override;
  bool low_precision_param_grads() const override { return base_ && base_->low_precision_param_grads(); }
  const std::vector<std::string>& layers() const { return layers_; }
  bool promoted(const char* layer) const;

 private:
  std::shared_ptr<const ops::PrecisionPolicy> base_;
  std::vector<std::string> layers_;
};

struct AdaptOptions {
  int window = 50;        // steps
  int promote_after = 2;  // counted attributions of one layer within the window
};

struct Promotion {
  std::string layer;   // path
  std::string type;    // "Dense"
  int64_t step = 0;    // the step after which it was promoted (0: restored from a checkpoint)
  std::string reason;  // the attribution that triggered it
};

class AmpAdapter {
 public:
  AmpAdapter(std::shared_ptr<nn::Cell> net, AdaptOptions options = {});

  // After each step (1-based step number): counts the step's attribution and promotes the layer when
  // the rule says so; returns the promotions made (usually none).
  std::vector<Promotion> observe(const StepResult& r, const LossScaleManager* manager, int64_t step);
  // observe() in two halves, for processes that must agree (data parallelism): counts the step's
  // attribution and returns the layer the rule would promote (empty: none), without promoting it; then
  // promote() makes a promotion (every process the same, in the same order).
  std::string candidate(const StepResult& r, const LossScaleManager* manager, int64_t step);
  Promotion promote(const std::string& layer, int64_t step, std::string reason);
  // Promotes `layers` at once (a resumed run's); unknown paths are an error naming them.
  void restore(const std::vector<std::string>& layers);
  const std::vector<Promotion>& promotions() const { return promotions_; }
  // Whether the last observe() counted its step's attribution toward a promotion (the overflow is one
  // adaptive AMP is acting on, so a training loop need not stop for it).
  bool last_counted() const { return last_counted_; }
  std::vector<std::string> promoted_layers() const;

 private:
  void apply();

  std::shared_ptr<nn::Cell> net_;
  std::shared_ptr<const ops::PrecisionPolicy> base_;
  AdaptOptions options_;
  std::deque<std::pair<int64_t, std::string>> counted_;  // (step, layer) within the window
  std::vector<Promotion> promotions_;
  bool last_counted_ = false;
  std::string reason_;  // why the last candidate() named its layer
};

}  // namespace demi::amp
