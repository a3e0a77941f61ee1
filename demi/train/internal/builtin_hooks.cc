#include "demi/train/internal/builtin_hooks.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <ostream>

#include "demi/amp/underflow.h"
#include "demi/distributed/distributed.h"
#include "demi/train/model.h"

namespace demi::train::internal {
namespace {

class OverflowLog : public TrainHook {
 public:
  void on_after_update(TrainLoop& loop) override {
    const amp::StepResult& r = loop.step.result;
    if (!r.overflow_source.found) return;
    RunContext& ctx = loop.context;
    const amp::OverflowSource& src = r.overflow_source;
    ctx.overflow_op = src.describe();
    const std::string key = str_cat(ops::op_name(src.op), src.backward ? " bwd" : " fwd", " in ",
                                    src.layer.empty() ? std::string("the network") : "'" + src.layer + "'");
    const bool fresh = loop.summary.overflow_ops.count(key) == 0;
    if (fresh) loop.summary.overflow_examples[key] = ctx.overflow_op;
    const int64_t seen = ++loop.summary.overflow_ops[key];
    if (fresh || (seen & (seen - 1)) == 0)  // each new op, then at its 2nd, 4th, 8th, ... overflow
      callback_stream() << "Model.train: overflow at epoch " << ctx.epoch << " step " << ctx.cur_step_num
                        << " (loss scale " << r.loss_scale << ", " << seen << (seen == 1 ? " time" : " times")
                        << "): " << ctx.overflow_op << std::endl;
  }
};

class AmpAdaptHook : public TrainHook {
 public:
  void on_train_begin(TrainLoop& loop) override {
    layer_paths_.clear();  // data parallel: the candidates travel between processes as indices
    if (loop.model.data_parallel() != nullptr)
      for (auto& [path, cell] : loop.model.network().cells_and_names()) layer_paths_.push_back(path);
  }

  void on_after_update(TrainLoop& loop) override {
    amp::AmpAdapter& adapter = *loop.model.amp_adapter();
    const amp::StepResult& r = loop.step.result;
    RunContext& ctx = loop.context;
    std::vector<amp::Promotion> promoted;
    if (loop.model.data_parallel() == nullptr) {
      promoted = adapter.observe(r, loop.model.loss_scale_manager(), ctx.cur_step_num);
      loop.step.adapt_acting = adapter.last_counted();
    } else {
      // A layer any process would promote is promoted on every process, the same one everywhere (the
      // highest-numbered candidate this step; another process's candidate comes back when it recurs).
      const std::string mine = adapter.candidate(r, loop.model.loss_scale_manager(), ctx.cur_step_num);
      int64_t pick = -1;
      for (size_t i = 0; i < layer_paths_.size(); ++i)
        if (!mine.empty() && layer_paths_[i] == mine) pick = static_cast<int64_t>(i);
      int64_t agreed[2] = {pick, adapter.last_counted() ? 1 : 0};
      dist::all_reduce_max(std::span<int64_t>(agreed, 2), "the all-reduce of adaptive AMP's promotion candidates");
      pick = agreed[0];
      loop.step.adapt_acting = agreed[1] > 0;
      if (pick >= 0) {
        const std::string& layer = layer_paths_[static_cast<size_t>(pick)];
        promoted.push_back(
            adapter.promote(layer, ctx.cur_step_num, layer == mine ? std::string() : "agreed: another process's overflows"));
      }
    }
    if (!promoted.empty()) loop.model.forget_graph_plans();  // the program changed: trace it again
    for (const amp::Promotion& p : promoted) {
      callback_stream() << "Model.train: amp-adapt: "
                        << str_cat("layer '", p.layer, "' (", p.type, ") now runs in FP32 (", p.reason, ")")
                        << std::endl;
      ctx.promotions.push_back(p.layer);
    }
  }

 private:
  std::vector<std::string> layer_paths_;
};

// Without a loss scale a non-finite loss is garbage, not an overflow to skip (and not while adaptive AMP
// is acting on the update's overflow: the step was skipped, and the layer is promoted).
class LossStop : public TrainHook {
 public:
  void on_after_update(TrainLoop& loop) override {
    Model& model = loop.model;
    const amp::StepResult& r = loop.step.result;
    if (model.loss_scale_manager() != nullptr || loop.step.adapt_acting || std::isfinite(r.loss)) return;
    const RunContext& ctx = loop.context;
    const amp::Level level = model.amp_level();
    DEMI_CHECK(false, "the loss became ", r.loss, " at epoch ", ctx.epoch, " step ", ctx.step_in_epoch, " (",
               amp::level_name(level), ", no loss scale); training stopped instead of continuing on garbage. Lower the ",
               "learning rate, check the input data for NaN/Inf, or use a loss-scale manager.",
               r.overflow_source.found ? " The first op to produce a non-finite value: " + r.overflow_source.describe() + "."
                                       : std::string(),
               r.overflow_source.found && model.amp_adapter() == nullptr && level != amp::Level::kO0
                   ? " Adaptive AMP (ModelOptions::amp_adapt, demi train --amp-adapt) would run that layer in FP32."
                   : "");
  }
};

// The last kWindow updates' overflow skips: when most of them were skipped the run is barely training, and
// the user hears it then, not from a count at the end (once per epoch).
class SkipWatch : public TrainHook {
 public:
  static constexpr int kWindow = 50, kWarn = 40;

  void on_train_begin(TrainLoop&) override {
    ring_.assign(kWindow, 0);
    in_window_ = 0;
    steps_ = 0;
  }
  void on_epoch_begin(TrainLoop&) override { warned_ = false; }
  void on_after_update(TrainLoop& loop) override {
    const amp::StepResult& r = loop.step.result;
    uint8_t& slot = ring_[static_cast<size_t>(steps_++ % kWindow)];
    in_window_ += static_cast<int>(r.skipped) - slot;
    slot = r.skipped;
    if (warned_ || steps_ < kWindow || in_window_ < kWarn) return;
    warned_ = true;
    ++loop.summary.skip_warnings;
    amp::LossScaleManager* m = loop.model.loss_scale_manager();
    loop.warn(str_cat(in_window_, " of the last ", kWindow, " steps were skipped for non-finite gradients (epoch ",
                      loop.context.epoch, ", step ", loop.context.step_in_epoch, ", loss scale ", r.loss_scale, ", ",
                      m ? m->describe() : std::string("no loss-scale manager"),
                      "): the run is barely training. Lower the (fixed) loss scale or use a DynamicLossScaleManager; "
                      "check the learning rate and the input data."));
  }

 private:
  std::vector<uint8_t> ring_;
  int in_window_ = 0;
  int64_t steps_ = 0;
  bool warned_ = false;
};

// One update in kEvery is watched for float16 gradients in the subnormal range (reading them only: a pass
// over the backward's float16 outputs).
class UnderflowHook : public TrainHook {
 public:
  static constexpr int64_t kEvery = 100;
  static constexpr double kWarn = 0.01;

  void on_train_begin(TrainLoop&) override { warned_ = false; }
  void on_step_begin(TrainLoop& loop) override {
    if (warned_ || loop.context.cur_step_num % kEvery != 1) return;
    watch_.emplace();
    watching_.emplace(&*watch_);
  }
  void on_after_update(TrainLoop& loop) override {
    watching_.reset();
    if (!watch_) return;
    const std::optional<amp::UnderflowWatch> watched = std::move(watch_);
    watch_.reset();
    const amp::UnderflowWatch& u = *watched;
    const amp::StepResult& r = loop.step.result;
    if (r.overflow || u.nonzero() == 0 || u.subnormal_share() < kWarn) return;
    warned_ = true;
    loop.warn(str_cat(static_cast<int>(std::lround(100 * u.subnormal_share())),
                      "% of the float16 gradient values of step ", loop.context.cur_step_num,
                      " are subnormal (below 2^-14: they lose precision, and those below 2^-24 become zero) at loss "
                      "scale ", r.loss_scale, "; the worst is the ", u.worst(), " (",
                      static_cast<int>(std::lround(100 * u.worst_share())),
                      "%). Gradients are underflowing: use a (larger) loss scale — a DynamicLossScaleManager finds "
                      "one — or bfloat16."));
  }

 private:
  bool warned_ = false;
  std::optional<amp::UnderflowWatch> watch_;
  std::optional<ops::OpObserverScope> watching_;
};

// The loss scale's early warnings, each said once per train() call at the step it becomes true:
//   - more than 5% of the last 200 steps skipped for overflow (counted from the first applied step, so a
//     dynamic scale's first back-off from 2^24 does not count)
//   - a dynamic scale at its floor that still overflows: the overflow is not a scaling problem
//   - a dynamic scale that has not grown for 10 scale windows: overflows keep it down
class ScaleWatch : public TrainHook {
 public:
  static constexpr int kWindow = 200;
  static constexpr int kMaxSkips = 10;  // 5% of kWindow

  void on_after_update(TrainLoop& loop) override {
    const amp::StepResult& r = loop.step.result;
    amp::LossScaleManager* m = loop.model.loss_scale_manager();
    const RunContext& ctx = loop.context;
    const auto where = [&] {
      return str_cat("(epoch ", ctx.epoch, ", step ", ctx.cur_step_num, ", loss scale ", r.loss_scale,
                     m ? ", " + m->describe() : std::string(), ")");
    };
    if (!r.skipped) applied_ = true;
    if (applied_) {
      uint8_t& slot = ring_[static_cast<size_t>(seen_++ % kWindow)];
      skips_ += static_cast<int>(r.skipped) - slot;
      slot = r.skipped;
      if (!rate_warned_ && skips_ > kMaxSkips) {
        rate_warned_ = true;
        loop.warn(str_cat(skips_, " of the last ", std::min<int64_t>(seen_, kWindow),
                          " steps were skipped for non-finite gradients, above 5% ", where(),
                          ": each skip is a lost batch. With a fixed scale lower it; with a dynamic one raise "
                          "scale_window or use bfloat16; or check the learning rate and the data."));
      }
    }
    const auto* dyn = dynamic_cast<const amp::DynamicLossScaleManager*>(m);
    if (dyn == nullptr) return;
    const double now = m->get_loss_scale();
    if (!floor_warned_ && r.overflow && r.loss_scale <= dyn->min_scale()) {
      floor_warned_ = true;
      loop.warn(str_cat("the gradients overflow even at the loss scale's floor (", dyn->min_scale(), ") ", where(),
                        ": scaling cannot fix this — a value overflows float16 by itself (an activation or an input "
                        "beyond 65504, or Inf/NaN in the data). Run `demi train --numerics`, use bfloat16, or keep "
                        "that layer in FP32.",
                        r.overflow_source.found ? " The op: " + r.overflow_source.describe() + "." : std::string()));
    }
    if (first_step_ < 0) first_step_ = ctx.cur_step_num;
    if (now > last_scale_) last_growth_ = ctx.cur_step_num;
    last_scale_ = now;
    const int64_t since = ctx.cur_step_num - std::max(last_growth_, first_step_);
    if (!growth_warned_ && dyn->scale_window() > 0 && since >= 10 * dyn->scale_window()) {
      growth_warned_ = true;
      loop.warn(str_cat("the loss scale has not grown in ", since, " steps (10 scale windows of ", dyn->scale_window(),
                        ") ", where(), ": an overflow in every window keeps it down (", m->state().total_overflows,
                        " overflows so far), so some steps are lost and small gradients may underflow. Find the op "
                        "with `demi train --numerics`, or use bfloat16."));
    }
  }

 private:
  std::vector<uint8_t> ring_ = std::vector<uint8_t>(kWindow, 0);
  int64_t seen_ = 0;
  int skips_ = 0;
  bool applied_ = false, rate_warned_ = false, floor_warned_ = false, growth_warned_ = false;
  int64_t first_step_ = -1, last_growth_ = -1;
  double last_scale_ = 0;
};

// MindSpore's callbacks: their "step" is a sink (an update without sinking).
class CallbackHook : public TrainHook {
 public:
  explicit CallbackHook(std::vector<CallbackPtr> callbacks) : callbacks_(std::move(callbacks)) {}
  void on_train_begin(TrainLoop& loop) override {
    for (auto& cb : callbacks_) cb->on_train_begin(loop.context);
  }
  void on_epoch_begin(TrainLoop& loop) override {
    for (auto& cb : callbacks_) cb->on_epoch_begin(loop.context);
  }
  void on_sink_begin(TrainLoop& loop) override {
    for (auto& cb : callbacks_) cb->on_step_begin(loop.context);
  }
  void on_sink_end(TrainLoop& loop) override {
    for (auto& cb : callbacks_) cb->on_step_end(loop.context);
  }
  void on_epoch_end(TrainLoop& loop) override {
    for (auto& cb : callbacks_) cb->on_epoch_end(loop.context);
  }
  void on_train_end(TrainLoop& loop) override {
    for (auto& cb : callbacks_) cb->on_train_end(loop.context);
  }

 private:
  std::vector<CallbackPtr> callbacks_;
};

}  // namespace

std::vector<TrainHookPtr> builtin_hooks(Model& model, std::vector<CallbackPtr> callbacks) {
  const ModelOptions& o = model.options();
  std::vector<TrainHookPtr> hooks;
  hooks.push_back(std::make_shared<OverflowLog>());
  if (model.amp_adapter() != nullptr) hooks.push_back(std::make_shared<AmpAdaptHook>());
  if (o.stop_on_nonfinite_loss) hooks.push_back(std::make_shared<LossStop>());
  hooks.push_back(std::make_shared<SkipWatch>());
  if (o.amp_level != amp::Level::kO0 && o.low_dtype == DType::kF16) hooks.push_back(std::make_shared<UnderflowHook>());
  hooks.push_back(std::make_shared<ScaleWatch>());
  hooks.push_back(std::make_shared<CallbackHook>(std::move(callbacks)));
  return hooks;
}

}  // namespace demi::train::internal
