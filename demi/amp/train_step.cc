#include "demi/amp/train_step.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>

#include "demi/autograd/autograd.h"
#include "demi/core/context.h"
#include "demi/nn/call_fusion.h"
#include "demi/ops/dispatch.h"
#include "demi/ops/ops.h"

namespace demi::amp {

TrainStep::TrainStep(std::shared_ptr<nn::Cell> net, std::shared_ptr<nn::LossCell> loss_fn,
                     std::shared_ptr<optim::Optimizer> optimizer, std::shared_ptr<LossScaleManager> manager)
    : net_(std::move(net)), loss_fn_(std::move(loss_fn)), optimizer_(std::move(optimizer)), manager_(std::move(manager)) {
  DEMI_CHECK(net_ && loss_fn_ && optimizer_, "TrainStep: network, loss and optimizer are required");
  // Name each optimizer parameter by its path in the network, for overflow reports.
  auto named = net_->parameters_and_names();
  for (const Tensor& p : optimizer_->parameters()) {
    param_index_.emplace(p.impl_ptr().get(), param_names_.size());
    std::string name = p.name();
    for (const auto& [path, q] : named)
      if (q.is_same(p) || q.same_storage(p)) name = path;
    param_names_.push_back(name);
  }
  generators_ = nn::generators_of(*net_);
  graphs_.set_rewrites(make_call_fusions);
}

namespace {

// The network's running statistics and generators, set aside and put back (a forward that must leave no
// trace).
class NetStateSnapshot {
 public:
  NetStateSnapshot(nn::Cell& net, const std::vector<std::pair<std::string, Generator*>>& generators)
      : generators_(generators) {
    for (auto& [name, b] : net.buffers_and_names()) buffers_.emplace_back(b, b.clone());
    for (const auto& [name, g] : generators_) states_.emplace_back(g->seed(), g->offset());
  }
  void restore() {
    autograd::NoGradGuard no_grad;
    for (auto& [b, copy] : buffers_) b.copy_(copy);
    for (size_t i = 0; i < generators_.size(); ++i)
      generators_[i].second->set_state(states_[i].first, states_[i].second);
  }

 private:
  const std::vector<std::pair<std::string, Generator*>>& generators_;
  std::vector<std::pair<Tensor, Tensor>> buffers_;
  std::vector<std::pair<uint64_t, uint64_t>> states_;
};

class CallFusionRewrite final : public graph::StepRewrite {
 public:
  void begin_learning() override { fusions_.begin_learning(); }
  void end_learning(bool learnt) override { fusions_.end_learning(learnt); }
  void begin_applying() override { fusions_.begin_applying(); }
  void end_applying() override { fusions_.end_applying(); }
  std::string describe() const override { return fusions_.describe(); }

 private:
  nn::CallFusions fusions_;
};

}  // namespace

std::unique_ptr<graph::StepRewrite> make_call_fusions() { return std::make_unique<CallFusionRewrite>(); }

void TrainStep::forward_leaving_no_trace(const Tensor& data) {
  if (!nn::CallFusions::could_fuse(*net_)) return;  // nothing to learn: no second run of construct
  NetStateSnapshot state(*net_, generators_);
  try {
    autograd::NoGradGuard no_grad;
    // A probe before the step, as a kernel's tuning runs are: what it holds (a kernel's workspace at its
    // two-sample shapes) raises no training peak (core/memory.h's MemTuningScope; peak_tuning shows it).
    MemTuningScope probe;
    net_->set_train(true);
    (void)net_->call(nn::CallFusions::learning_batch(data));
  } catch (...) {
    state.restore();
    throw;
  }
  state.restore();
}

// The key of a plan: what changes a step's allocations besides the network and the AMP level, which a
// TrainStep fixes.
const std::string& TrainStep::graph_key(graph::SignatureKey& key, std::string_view kind, const Tensor* data,
                                        const Tensor* label, bool in_backward) {
  return key.get(kind, data, label,
                 {{in_backward, "optimizer in backward"}, {clip_grad_norm_ > 0, "clipping"},
                  {reducer_ != nullptr, "data parallel"}, {attribute_overflow_, "attribution"}});
}

// Whether a cell of the network computes in float16 (an AMP policy of a level above O0 with float16 as its
// low dtype): its steps may overflow without a bug, and an overflow must then skip the whole update and be
// attributed to its op, as PYNATIVE_MODE does.
bool TrainStep::computes_in_float16() const {
  const uint64_t version = nn::Cell::structure_version();
  if (computes_in_float16_ && computes_in_float16_->first == version) return computes_in_float16_->second;
  bool f16 = false;
  for (const auto& [name, cell] : net_->cells_and_names()) {
    const auto* policy = dynamic_cast<const AmpPolicy*>(cell->precision_policy());
    if (policy != nullptr && policy->mode() != AmpPolicy::Mode::kNone && policy->low_dtype() == DType::kF16) {
      f16 = true;
      break;
    }
  }
  computes_in_float16_ = std::pair{version, f16};
  return f16;
}

bool TrainStep::optimizer_in_backward() const {
  if (optimizer_in_backward_.has_value()) return *optimizer_in_backward_;
  // Graph mode's choice: the update placed in backward wherever nothing waits on every gradient, and no
  // step is expected to overflow (FP32 and bfloat16 have FP32's range; a non-finite gradient there is a bug,
  // whose parameter the step still names).
  return get_context().mode == ExecMode::kGraph && manager_ == nullptr && clip_grad_norm_ <= 0 &&
         reducer_ == nullptr && micro_batches_ == 0 && !computes_in_float16();
}

StepResult TrainStep::operator()(const Tensor& data, const Tensor& label) {
  F16ProductsScope products(f16_products_);
  const bool in_backward = optimizer_in_backward();
  if (get_context().mode != ExecMode::kGraph) return update(data, label, in_backward);
  StepResult r;
  graphs_.run(
      graph_key(update_key_, "update", &data, &label, in_backward),
      [&] {
        r = update(data, label, in_backward);
        return !r.overflow;  // an overflow step (skipped, attributed) is not the step to plan from
      },
      [&] { forward_leaving_no_trace(data); });
  return r;
}

float TrainStep::accumulate(const Tensor& data, const Tensor& label) {
  F16ProductsScope products(f16_products_);
  if (get_context().mode != ExecMode::kGraph) return accumulate_micro_batch(data, label);
  // The first micro-batch of an update clears the gradients; the others add to them.
  float loss = 0;
  // (micro-batches never update in backward: accumulate_micro_batch refuses that setting)
  const std::string& key = micro_batches_ == 0
                               ? graph_key(first_micro_key_, "first micro-batch", &data, &label, false)
                               : graph_key(micro_key_, "micro-batch", &data, &label, false);
  graphs_.run(
      key,
      [&] {
        loss = accumulate_micro_batch(data, label);
        return true;
      },
      [&] { forward_leaving_no_trace(data); });
  return loss;
}

StepResult TrainStep::step() {
  F16ProductsScope products(f16_products_);
  if (get_context().mode != ExecMode::kGraph) return apply_update();
  StepResult r;
  const std::string& key =
      graph_key(apply_key_, str_cat("update of ", micro_batches_, " micro-batches"), nullptr, nullptr, false);
  graphs_.run(key, [&] {
    r = apply_update();
    return !r.overflow;
  });
  return r;
}

StepResult TrainStep::update(const Tensor& data, const Tensor& label, bool in_backward) {
  DEMI_CHECK(micro_batches_ == 0, "TrainStep: ", micro_batches_, " micro-batch(es) accumulated but not applied; ",
             "call step() before a whole-batch train step");
  if (in_backward) return step_in_backward(data, label);
  reduce_in_backward_ = reducer_ != nullptr;
  try {
    accumulate_micro_batch(data, label);
  } catch (...) {
    reduce_in_backward_ = false;
    throw;
  }
  reduce_in_backward_ = false;
  return apply_update();
}

StepResult TrainStep::step_in_backward(const Tensor& data, const Tensor& label) {
  const char* why = manager_ ? "a loss scale (its unscale and skip decision need every gradient first)"
                    : clip_grad_norm_ > 0 ? "gradient clipping (the global norm needs every gradient first)"
                    : reducer_ ? "data parallelism (the gradients are combined across processes first)"
                               : nullptr;
  DEMI_CHECK(why == nullptr, "TrainStep: the optimizer in backward updates each parameter as soon as its gradient ",
             "is complete, which cannot be combined with ", why, "; turn one of them off");
  const std::vector<Tensor>& params = optimizer_->parameters();
  StepResult r;
  r.loss_scale = 1.0;
  optimizer_->zero_grad();
  micro_scale_ = 1.0;  // forward_backward scales the loss by it: no loss scale here
  bool updated = false;
  std::vector<char>& done = updated_in_backward_;
  done.assign(params.size(), 0);
  // Each parameter's update as soon as its gradient is final; the gradient is freed right after.
  autograd::LeafReadyHook update = [&](const Tensor& leaf) {
    auto it = param_index_.find(leaf.impl_ptr().get());
    if (it == param_index_.end()) return;
    DEMI_CHECK(!done[it->second], "TrainStep: parameter '", param_names_[it->second], "' got its gradient in two ",
               "parts (a recomputed cell shares it with the rest of the network), which the optimizer in backward ",
               "cannot update once; turn one of them off");
    done[it->second] = 1;
    Tensor p = params[it->second];  // (a handle: set_grad below is not const)
    const Tensor g = p.grad();
    if (!g.defined()) return;
    if (ops::unscale_and_check_finite(std::span<const Tensor>(&g, 1), 1.0f, "optimizer in backward") >= 0) {
      if (!r.overflow) r.first_nonfinite = param_names_[it->second];
      r.overflow = true;
    } else {
      autograd::NoGradGuard no_grad;
      optimizer_->step_param(it->second);
      updated = true;
    }
    p.set_grad(Tensor());
  };
  {
    autograd::LeafReadyScope ready(update);
    r.loss = forward_backward(data, label, /*notify_reducer=*/false);
  }
  if (updated) optimizer_->finish_step();
  r.micro_batches = 1;
  return r;
}

float TrainStep::accumulate_micro_batch(const Tensor& data, const Tensor& label) {
  DEMI_CHECK(optimizer_in_backward_ != true, "TrainStep::accumulate: the optimizer in backward updates each ",
             "parameter as its gradient completes, so micro-batches cannot be accumulated; turn one of them off");
  if (micro_batches_ == 0) {
    micro_scale_ = manager_ ? manager_->get_loss_scale() : 1.0;
    micro_loss_sum_ = 0;
    optimizer_->zero_grad();
  }
  if (attribute_overflow_) {
    MicroBatch m{data, label, {}};
    for (const auto& [name, g] : generators_) m.generators.emplace_back(g->seed(), g->offset());
    micro_inputs_.push_back(std::move(m));
  }
  const float loss_value = forward_backward(data, label, reduce_in_backward_);
  micro_loss_sum_ += loss_value;
  ++micro_batches_;
  return loss_value;
}

float TrainStep::forward_backward(const Tensor& data, const Tensor& label, bool notify_reducer) {
  net_->set_train(true);
  nn::CallFusions::begin_forward();  // (a step's attribution re-runs its forward)
  float loss_value = 0;
  {
    ops::CastCacheScope cast_cache;  // each parameter is cast to the low dtype once in this micro-batch
    Tensor logits, loss;
    {
      MemCategoryScope activations(MemCategory::kActivation);  // what forward makes (and backward saves)
      logits = net_->call(data);
      loss = (*loss_fn_)(logits, label);
    }
    DEMI_CHECK(loss.numel() == 1, "TrainStep: the loss must be a scalar (reduction \"mean\" or \"sum\"), got ",
               loss.describe());
    loss_value = static_cast<float>(loss.item());
    if (phase_observer_ && !rerunning_) phase_observer_(Phase::kAfterForward, loss_value);
    {
      autograd::NoGradGuard no_grad;
      last_logits_ = logits.dtype() == DType::kF32 ? logits : logits.to(DType::kF32);
    }
    Tensor scaled = micro_scale_ != 1.0 ? ops::mul_scalar(loss, micro_scale_) : loss;
    if (notify_reducer) {
      autograd::LeafReadyScope ready([this](const Tensor& leaf) { reducer_->gradient_ready(leaf); });
      autograd::backward(scaled);
    } else {
      autograd::backward(scaled);  // adds into the gradients of the earlier micro-batches
    }
  }
  if (phase_observer_ && !rerunning_) phase_observer_(Phase::kAfterBackward, loss_value);
  return loss_value;
}

void TrainStep::set_f16_products(F16Products mode) {
  { F16ProductsScope available(mode); }  // refuses kBf16 where the CPU has no AVX512-BF16
  f16_products_ = mode;
}

void TrainStep::set_clip_grad_norm(double max_norm) {
  DEMI_CHECK(max_norm >= 0 && std::isfinite(max_norm), "TrainStep: clip_grad_norm must be finite and >= 0 (0: off), got ",
             max_norm);
  clip_grad_norm_ = max_norm;
}

StepResult TrainStep::apply_update() {
  DEMI_CHECK(micro_batches_ > 0, "TrainStep::step: no micro-batch accumulated (call accumulate(data, label) first)");
  StepResult r;
  r.loss_scale = micro_scale_;
  r.micro_batches = micro_batches_;
  r.loss = static_cast<float>(micro_loss_sum_ / static_cast<double>(micro_batches_));
  micro_batches_ = 0;
  std::vector<MicroBatch> micro;
  micro.swap(micro_inputs_);
  StepResult out = finish(r, micro);
  micro.clear();
  micro_inputs_.swap(micro);  // keeps its capacity: no allocation per step
  return out;
}

StepResult TrainStep::step_without_batch() {
  DEMI_CHECK(reducer_ != nullptr, "TrainStep::step_without_batch: only a data-parallel step (with a GradReducer) ",
             "can update without a batch");
  DEMI_CHECK(micro_batches_ == 0, "TrainStep::step_without_batch: ", micro_batches_,
             " micro-batch(es) accumulated but not applied");
  optimizer_->zero_grad();
  micro_inputs_.clear();
  StepResult r;
  r.loss_scale = manager_ ? manager_->get_loss_scale() : 1.0;
  r.micro_batches = 0;
  return finish(r);
}

StepResult TrainStep::finish(StepResult r, const std::vector<MicroBatch>& batches) {
  std::vector<Tensor> params = optimizer_->parameters();
  if (reducer_) reducer_->reduce(params, r.micro_batches);  // the reducer averages the micro-batches
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (const Tensor& p : params) grads.push_back(p.grad());
  // One pass: undo the loss scale and average the micro-batches. FP32 gradients are unscaled in place;
  // low-precision ones (AmpPolicy::low_precision_param_grads) are checked as unscaled and multiplied as the
  // optimizer reads them (low_multiplier), so that no FP32 copy of them is made and no small value the loss
  // scale saved is flushed: each value gets the one f32 multiplication an in-place unscale would give it.
  const double micro = reducer_ ? 1.0 : static_cast<double>(std::max<int64_t>(r.micro_batches, 1));
  const float inv_scale = static_cast<float>(1.0 / (r.loss_scale * micro));
  float low_multiplier = inv_scale;
  int64_t bad = ops::unscale_and_check_finite(grads, inv_scale, "unscale");
  r.overflow = bad >= 0;
  if (r.overflow) r.first_nonfinite = param_names_[static_cast<size_t>(bad)];
  if (reducer_) {
    reducer_->agree(r.loss, r.overflow);
    if (r.overflow && bad < 0) r.first_nonfinite = "(a gradient of another process)";
  }
  // Only this process's own overflow can be found by re-running its batches.
  if (r.overflow && bad >= 0 && !batches.empty()) {
    // Gradients an overflow drops are garbage: freed before the re-run, so that it peaks no higher than
    // the step itself did.
    if (manager_ == nullptr || manager_->get_drop_overflow_update()) {
      grads.clear();
      for (Tensor& p : params) p.set_grad(Tensor());
    }
    r.overflow_source = find_overflow_source(batches, r.loss_scale);
  }
  if (!r.overflow && clip_grad_norm_ > 0) {  // on the true (unscaled) gradients
    // (One pass's scratch whether it clips or not: a step that clips allocates as one that does not, and
    // graph mode's plan holds for both.)
    std::vector<double> per(grads.size());
    const float coef = ops::sum_of_squares_then_scale(grads, "clip_grad_norm", per.data(), [&](const double* sums) {
      double sum = 0;
      for (size_t i = 0; i < grads.size(); ++i) {
        const bool low = grads[i].defined() && grads[i].dtype() != DType::kF32;
        sum += low ? sums[i] * (static_cast<double>(inv_scale) * inv_scale) : sums[i];
      }
      r.grad_norm = std::sqrt(sum);
      r.clipped = r.grad_norm > clip_grad_norm_;
      return r.clipped ? static_cast<float>(clip_grad_norm_ / (r.grad_norm + 1e-6)) : 1.0f;  // FP32 ones in place
    });
    if (r.clipped) low_multiplier *= coef;
  }
  bool drop = r.overflow && (manager_ == nullptr || manager_->get_drop_overflow_update());
  if (!drop) {
    autograd::NoGradGuard no_grad;
    optimizer_->step(low_multiplier);
  }
  r.skipped = drop;
  if (manager_) {
    manager_->update_loss_scale(r.overflow);
    int64_t limit = manager_->max_consecutive_overflows();
    DEMI_CHECK(limit <= 0 || manager_->state().consecutive_overflows < limit, "training diverged: ",
               manager_->state().consecutive_overflows, " steps in a row had non-finite gradients (loss scale now ",
               manager_->get_loss_scale(), "); the first non-finite gradient in the last step was '",
               r.first_nonfinite, "'. Lower the learning rate or the initial loss scale, or check the input data.");
  }
  return r;
}

void TrainStep::replay(const std::vector<MicroBatch>& micro, double loss_scale, ops::OpObserver& observer,
                       const std::function<bool()>& done) {
  // Set aside everything the re-run would change: gradients, running statistics, generators, logits,
  // the accumulation state.
  std::vector<Tensor> params = optimizer_->parameters();
  std::vector<Tensor> grads;
  for (Tensor& p : params) {
    grads.push_back(p.grad());
    p.set_grad(Tensor());
  }
  NetStateSnapshot state(*net_, generators_);
  const auto& gens = generators_;
  Tensor logits = last_logits_;
  const double saved_scale = micro_scale_;
  const double saved_sum = micro_loss_sum_;
  auto restore = [&] {
    for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(grads[i]);
    state.restore();
    last_logits_ = logits;
    micro_scale_ = saved_scale;
    micro_loss_sum_ = saved_sum;
    rerunning_ = false;
  };
  rerunning_ = true;
  try {
    micro_scale_ = loss_scale;
    for (const MicroBatch& m : micro) {
      if (m.generators.size() == gens.size())
        for (size_t i = 0; i < gens.size(); ++i) gens[i].second->set_state(m.generators[i].first, m.generators[i].second);
      {
        ops::ObserverIsolationScope isolated;  // a trace held around the step records it once
        ops::OpObserverScope observe(&observer);
        // With the optimizer in backward each gradient lives only until it is complete, in the re-run too
        // (Model::forecast measures it): freed there, nothing updated.
        std::optional<autograd::LeafReadyScope> drop;
        if (optimizer_in_backward()) drop.emplace([](const Tensor& leaf) { Tensor(leaf).set_grad(Tensor()); });
        forward_backward(m.data, m.label, /*notify_reducer=*/false);
      }
      for (Tensor& p : params) p.set_grad(Tensor());
      if (done && done()) break;
    }
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

void TrainStep::run_observed(const Tensor& data, const Tensor& label, ops::OpObserver& observer) {
  F16ProductsScope products(f16_products_);
  MicroBatch m{data, label, {}};
  for (const auto& [name, g] : generators_) m.generators.emplace_back(g->seed(), g->offset());
  // In graph mode, with the layer calls a graph-mode step would fuse fused (its memory, its ops).
  // (forward_leaving_no_trace runs nothing where there is nothing to learn)
  std::optional<nn::CallFusions> fused;
  if (get_context().mode == ExecMode::kGraph) {
    fused.emplace();
    fused->begin_learning();
    try {
      forward_leaving_no_trace(data);
    } catch (...) {
      fused->end_learning(false);
      throw;
    }
    fused->end_learning(true);
  }
  struct Applying {
    std::optional<nn::CallFusions>& f;
    explicit Applying(std::optional<nn::CallFusions>& fused) : f(fused) {
      if (f) f->begin_applying();
    }
    ~Applying() {
      if (f) f->end_applying();
    }
  } applying(fused);
  replay({m}, manager_ ? manager_->get_loss_scale() : 1.0, observer, nullptr);
}

OverflowSource TrainStep::find_overflow_source(const std::vector<MicroBatch>& micro, double loss_scale) {
  OverflowFinder finder;
  replay(micro, loss_scale, finder, [&] { return finder.found(); });
  OverflowSource src = finder.source();
  if (src.found) {
    for (auto& [path, cell] : net_->cells_and_names())
      if (path == src.layer) src.layer_type = cell->type_name();
  }
  return src;
}

double clip_grad_norm(std::vector<Tensor>& grads, double max_norm) {
  DEMI_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, got ", max_norm);
  const double norm = std::sqrt(ops::sum_of_squares(grads, "clip_grad_norm"));
  if (norm > max_norm) {
    const float coef = static_cast<float>(max_norm / (norm + 1e-6));
    ops::unscale_and_check_finite(grads, coef, "clip_grad_norm");  // FP32 ones in place
    autograd::NoGradGuard no_grad;
    for (Tensor& g : grads)  // low-precision ones rounded to their dtype
      if (g.defined() && g.dtype() != DType::kF32) g.copy_(ops::mul_scalar(g, coef));
  }
  return norm;
}

std::shared_ptr<LossScaleManager> default_loss_scale_manager(Level level, DType low_dtype) {
  if (level == Level::kO2 && low_dtype == DType::kF16) return std::make_shared<DynamicLossScaleManager>();
  return nullptr;
}

std::shared_ptr<TrainStep> build_train_network(std::shared_ptr<nn::Cell> net,
                                               std::shared_ptr<optim::Optimizer> optimizer,
                                               std::shared_ptr<nn::LossCell> loss_fn, Level level,
                                               const TrainOptions& options) {
  DEMI_CHECK(net != nullptr, "build_train_network: no network");
  DEMI_CHECK(options.keep_batchnorm_fp32.value_or(true) || level == Level::kO2 || level == Level::kO3,
             "build_train_network: keep_batchnorm_fp32=false at ", level_name(level), " would change nothing: ",
             level == Level::kO0 ? "O0 runs every op in FP32" : "O1 runs only its white list low, never BatchNorm",
             "; it lowers BatchNorm at O2 (O3 lowers it by default)");
  DEMI_CHECK(options.f16_products == F16Products::kExact ||
                 (level != Level::kO0 && options.low_dtype == DType::kF16),
             "build_train_network: f16_products=bf16 changes how float16 products multiply, and ", level_name(level),
             level == Level::kO0 ? "" : str_cat(" with low_dtype ", dtype_name(options.low_dtype)),
             " computes none: use it at O1, O2 or O3 with low_dtype float16");
  bool keep_bn = options.keep_batchnorm_fp32.value_or(level != Level::kO3);
  auto_mixed_precision(*net, level, options.low_dtype, keep_bn, options.low_precision_param_grads);
  std::shared_ptr<LossScaleManager> manager = options.loss_scale_manager;
  if (!manager && !options.no_loss_scale) manager = default_loss_scale_manager(level, options.low_dtype);
  if (options.no_loss_scale) manager = nullptr;
  auto step = std::make_shared<TrainStep>(std::move(net), std::move(loss_fn), std::move(optimizer), std::move(manager));
  step->set_clip_grad_norm(options.clip_grad_norm);
  step->set_optimizer_in_backward(options.optimizer_in_backward);
  step->set_f16_products(options.f16_products);
  return step;
}

}  // namespace demi::amp
