#include "demi/optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "demi/core/convert.h"
#include "demi/core/parallel.h"
#include "demi/ops/ops.h"

namespace demi::optim {
namespace {

constexpr int64_t kUpdateGrain = 1 << 15;
constexpr size_t kMaxSlots = 4;  // state slots per parameter (RMSProp centered and LAMB take 3)

std::vector<ParamGroup> one_group(std::vector<Tensor> params, double weight_decay) {
  return {ParamGroup{std::move(params), weight_decay, 1.0}};
}

void check_hyper(const char* opt, const char* what, double v, bool allow_zero = true) {
  DEMI_CHECK(std::isfinite(v) && (v > 0 || (allow_zero && v == 0)), opt, ": ", what,
             " must be finite and ", allow_zero ? ">= 0" : "> 0", ", got ", v);
}

}  // namespace

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, LrSchedulePtr lr)
    : name_(std::move(name)), groups_(std::move(groups)), lr_(std::move(lr)) {
  DEMI_CHECK(lr_ != nullptr, name_, ": no learning-rate schedule");
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    check_hyper(name_.c_str(), "weight_decay", g.weight_decay);
    check_hyper(name_.c_str(), "lr_scale", g.lr_scale);
    for (const Tensor& p : g.params) {
      DEMI_CHECK(p.defined() && p.dtype() == DType::kF32, name_, ": parameters must be FP32 master weights, got ",
                 p.defined() ? p.describe() : std::string("an undefined tensor"));
      flat_.push_back(p);
      group_of_.push_back(gi);
    }
  }
  DEMI_CHECK(!flat_.empty(), name_, ": no parameters to optimize (pass net.trainable_params())");
}

void Optimizer::add_state_slots(const std::vector<std::string>& slot_names) {
  DEMI_CHECK(state_.size() + slot_names.size() <= kMaxSlots, name_, ": at most ", kMaxSlots, " state slots");
  MemCategoryScope cat(MemCategory::kOptimizerState);
  for (const auto& s : slot_names) {
    slot_names_.push_back(s);
    std::vector<Tensor> per;
    per.reserve(flat_.size());
    for (const Tensor& p : flat_) per.push_back(zeros(p.shape(), DType::kF32));
    state_.push_back(std::move(per));
  }
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t s = 0; s < state_.size(); ++s)
    for (size_t i = 0; i < state_[s].size(); ++i) out.emplace_back(str_cat(slot_names_[s], ".", i), state_[s][i]);
  return out;
}

void Optimizer::step(float low_grad_multiplier) {
  for (size_t i = 0; i < flat_.size(); ++i) step_param(i, low_grad_multiplier);
  finish_step();
}

void Optimizer::step_param(size_t i, float low_grad_multiplier) {
  DEMI_CHECK(i < flat_.size(), name_, ": parameter index ", i, " out of range (", flat_.size(), " parameters)");
  const double base_lr = lr_->lr(step_);
  DEMI_CHECK(std::isfinite(base_lr) && base_lr >= 0, name_, ": the learning rate at step ", step_,
             " is not a finite non-negative number: ", base_lr);
  DEMI_CHECK(std::isfinite(low_grad_multiplier), name_, ": low_grad_multiplier must be finite, got ",
             low_grad_multiplier);
  Tensor& p = flat_[i];
  Tensor g = p.grad();
  if (!g.defined()) return;
  DEMI_CHECK(g.numel() == p.numel(), name_, ": gradient of ", p.describe(), " has shape ", g.shape());
  DEMI_CHECK(g.dtype() == DType::kF32 || is_low_precision(g.dtype()), name_, ": gradient of ", p.describe(),
             " is ", g.describe(), "; expected FP32, FP16 or BF16");
  bool low = g.dtype() != DType::kF32;
  if (low && reads_whole_gradient()) {
    g = g.to(DType::kF32);
    if (low_grad_multiplier != 1.0f) {
      float* w = g.data<float>();
      for (int64_t k = 0; k < g.numel(); ++k) w[k] *= low_grad_multiplier;
    }
    low = false;
  }
  const ParamGroup& group = groups_[group_of_[i]];
  float* pp = p.data<float>();
  const float* gp = low ? nullptr : g.data<float>();
  const char* glow = low ? static_cast<const char*>(g.raw_data()) : nullptr;
  const DType gdtype = g.dtype();
  const size_t gsize = dtype_size(gdtype);
  double wd = group.weight_decay;
  const size_t slots = state_.size();  // at most kMaxSlots (add_state_slots)
  // BF16 state is widened a chunk at a time beside the gradient, or, for an optimizer whose prepare() reads
  // the whole parameter, widened whole into FP32 copies (one parameter's) and rounded back after the update.
  const bool narrow = state_dtype_ != DType::kF32;
  std::vector<Tensor> whole;
  float* base[kMaxSlots] = {};
  if (narrow && reads_whole_gradient()) {
    MemCategoryScope cat(MemCategory::kWorkspace);
    for (size_t s = 0; s < slots; ++s) whole.push_back(state_[s][i].to(DType::kF32));
  }
  for (size_t s = 0; s < slots; ++s)
    base[s] = !whole.empty() ? whole[s].data<float>() : narrow ? nullptr : state_[s][i].data<float>();
  const bool chunked = low || (narrow && whole.empty());  // a chunk at a time through stack buffers
  // (or, where the optimizer updates them as stored, one pass: one state slot, nothing widened whole)
  const bool mixed = chunked && slots == 1 && has_update_mixed();
  double lr = prepare(chunked ? nullptr : base, pp, gp, p.numel(), base_lr * group.lr_scale, wd);
  // A current low-precision copy (AMP O2/O3) is rewritten chunk by chunk while the chunk is in cache:
  // the next forward reads it instead of casting the parameter again.
  AutogradMeta& meta = p.autograd_meta();
  Tensor* low_copy = meta.low_copy && meta.low_version == meta.version && meta.low_copy->numel() == p.numel()
                         ? meta.low_copy.get()
                         : nullptr;
  char* lp = low_copy ? static_cast<char*>(low_copy->raw_data()) : nullptr;
  const size_t lsize = low_copy ? dtype_size(low_copy->dtype()) : 0;
  auto bf16_state = [&](size_t s, int64_t c) { return state_[s][i].data<BFloat16>() + c; };
  // (Written per chunk of at most kChunk values right after its update, while the chunk is in L1: once per
  // thread's range, the copy re-read every parameter from memory, 4 bytes of the ~20 an update moves.)
  constexpr int64_t kChunk = 1024;
  parallel_for(0, p.numel(), kUpdateGrain, [&](int64_t b, int64_t e) {
    if (!chunked || mixed) {
      const int64_t step = low_copy ? kChunk : e - b;  // (no copy: the range in one call)
      for (int64_t c = b; c < e; c += step) {
        const int64_t n = std::min(step, e - c);
        if (mixed) {  // the gradient and state as stored, in one pass (the bits of the widening below)
          update_mixed({.g = gp ? static_cast<const void*>(gp + c) : glow + static_cast<size_t>(c) * gsize,
                        .g_dtype = gdtype,
                        .g_scale = low ? low_grad_multiplier : 1.0f,
                        .v = base[0] ? static_cast<void*>(base[0] + c) : static_cast<void*>(bf16_state(0, c)),
                        .v_dtype = base[0] ? DType::kF32 : DType::kBF16},
                       pp + c, n, lr, wd);
        } else {
          float* st[kMaxSlots];
          for (size_t s = 0; s < slots; ++s) st[s] = base[s] + c;
          update(st, pp + c, gp + c, n, lr, wd);
        }
        if (low_copy) convert(pp + c, DType::kF32, lp + static_cast<size_t>(c) * lsize, low_copy->dtype(), n);
      }
    } else {
      // The low-precision gradient (widened and multiplied) and BF16 state, a chunk at a time on the stack.
      float wide[kChunk];
      float wide_state[kMaxSlots][kChunk];
      for (int64_t c = b; c < e; c += kChunk) {
        const int64_t n = std::min(kChunk, e - c);
        const float* gc = gp ? gp + c : wide;
        if (low) {
          convert(glow + static_cast<size_t>(c) * gsize, gdtype, wide, DType::kF32, n);
          if (low_grad_multiplier != 1.0f)
            for (int64_t k = 0; k < n; ++k) wide[k] *= low_grad_multiplier;
        }
        float* st[kMaxSlots];
        for (size_t s = 0; s < slots; ++s) {
          if (base[s]) {
            st[s] = base[s] + c;
          } else {
            convert(bf16_state(s, c), DType::kBF16, wide_state[s], DType::kF32, n);
            st[s] = wide_state[s];
          }
        }
        update(st, pp + c, gc, n, lr, wd);
        for (size_t s = 0; s < slots; ++s)
          if (!base[s]) convert(wide_state[s], DType::kF32, bf16_state(s, c), DType::kBF16, n);
        if (low_copy) convert(pp + c, DType::kF32, lp + static_cast<size_t>(c) * lsize, low_copy->dtype(), n);
      }
    }
  });
  for (size_t s = 0; s < whole.size(); ++s)
    convert(whole[s].data<float>(), DType::kF32, state_[s][i].raw_data(), state_dtype_, whole[s].numel());
  ++meta.version;
  if (low_copy) meta.low_version = meta.version;
}

void Optimizer::set_state_dtype(DType dtype) {
  DEMI_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, name_,
             ": the state dtype must be float32 or bfloat16, got ", dtype_name(dtype));
  DEMI_CHECK(dtype == DType::kF32 || allows_bf16_state(), name_,
             ": its state cannot be bfloat16 (its sums only grow, and increments below 2^-9 of a sum would be lost)");
  if (dtype == state_dtype_) return;
  MemCategoryScope cat(MemCategory::kOptimizerState);
  for (auto& per : state_)
    for (Tensor& t : per) t = t.to(dtype);
  state_dtype_ = dtype;
}

void Optimizer::zero_grad() {
  for (Tensor& p : flat_)
    if (p.has_autograd_meta()) p.autograd_meta().grad.reset();
}

// ---- Momentum ----
Momentum::Momentum(std::vector<Tensor> params, double learning_rate, double momentum, double weight_decay,
                   bool nesterov)
    : Momentum(one_group(std::move(params), weight_decay), fixed_lr(learning_rate), momentum, nesterov) {}

Momentum::Momentum(std::vector<ParamGroup> groups, LrSchedulePtr lr, double momentum, bool nesterov)
    : Optimizer("Momentum", std::move(groups), std::move(lr)), momentum_(momentum), nesterov_(nesterov) {
  check_hyper("Momentum", "momentum", momentum);
  add_state_slots({"moments"});
}

void Momentum::update(float* const* state, float* p, const float* g, int64_t n, double lr, double weight_decay) {
  ops::momentum_update({static_cast<float>(momentum_), static_cast<float>(lr), static_cast<float>(weight_decay),
                        nesterov_},
                       state[0], p, g, n);
}

void Momentum::update_mixed(const ops::MixedOperands& x, float* p, int64_t n, double lr, double weight_decay) {
  ops::momentum_update_mixed(
      {static_cast<float>(momentum_), static_cast<float>(lr), static_cast<float>(weight_decay), nesterov_}, x, p, n);
}

// ---- SGD ----
SGD::SGD(std::vector<Tensor> params, double learning_rate, double weight_decay)
    : SGD(one_group(std::move(params), weight_decay), fixed_lr(learning_rate)) {}

SGD::SGD(std::vector<ParamGroup> groups, LrSchedulePtr lr) : Optimizer("SGD", std::move(groups), std::move(lr)) {}

void SGD::update(float* const*, float* p, const float* g, int64_t n, double lr, double weight_decay) {
  ops::sgd_update({static_cast<float>(lr), static_cast<float>(weight_decay)}, p, g, n);
}

// ---- Adam / AdamW ----
Adam::Adam(std::vector<Tensor> params, double learning_rate, const AdamOptions& options, double weight_decay)
    : Adam(one_group(std::move(params), weight_decay), fixed_lr(learning_rate), options, false) {}

Adam::Adam(std::vector<ParamGroup> groups, LrSchedulePtr lr, const AdamOptions& options, bool decoupled)
    : Optimizer(decoupled ? "AdamW" : "Adam", std::move(groups), std::move(lr)), options_(options),
      decoupled_(decoupled) {
  DEMI_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
             name(), ": betas must be in [0, 1), got (", options.beta1, ", ", options.beta2, ")");
  check_hyper(name().c_str(), "eps", options.eps, false);
  add_state_slots({"moment1", "moment2"});
}

void Adam::update(float* const* state, float* p, const float* g, int64_t n, double lr, double weight_decay) {
  const double t = static_cast<double>(global_step() + 1);
  ops::AdamStep s;
  s.beta1 = static_cast<float>(options_.beta1);
  s.beta2 = static_cast<float>(options_.beta2);
  s.step = static_cast<float>(lr) / static_cast<float>(1.0 - std::pow(options_.beta1, t));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(options_.beta2, t)));
  s.eps = static_cast<float>(options_.eps);
  const float wd = static_cast<float>(weight_decay);
  s.decay = decoupled_ ? 1.0f - static_cast<float>(lr) * wd : 1.0f;
  s.l2 = decoupled_ ? 0.0f : wd;
  ops::adam_update(s, state[0], state[1], p, g, n);
}

AdamW::AdamW(std::vector<Tensor> params, double learning_rate, const AdamOptions& options, double weight_decay)
    : Adam(one_group(std::move(params), weight_decay), fixed_lr(learning_rate), options, true) {}

AdamW::AdamW(std::vector<ParamGroup> groups, LrSchedulePtr lr, const AdamOptions& options)
    : Adam(std::move(groups), std::move(lr), options, true) {}

// ---- RMSProp ----
RMSProp::RMSProp(std::vector<Tensor> params, double learning_rate, const RMSPropOptions& options, double weight_decay)
    : RMSProp(one_group(std::move(params), weight_decay), fixed_lr(learning_rate), options) {}

RMSProp::RMSProp(std::vector<ParamGroup> groups, LrSchedulePtr lr, const RMSPropOptions& options)
    : Optimizer("RMSProp", std::move(groups), std::move(lr)), options_(options) {
  DEMI_CHECK(options.decay >= 0 && options.decay < 1, "RMSProp: decay must be in [0, 1), got ", options.decay);
  check_hyper("RMSProp", "momentum", options.momentum);
  check_hyper("RMSProp", "epsilon", options.epsilon, false);
  if (options.centered)
    add_state_slots({"mean_square", "moment", "mean_grad"});
  else
    add_state_slots({"mean_square", "moment"});
}

void RMSProp::update(float* const* state, float* p, const float* g, int64_t n, double lr, double weight_decay) {
  float* ms = state[0];
  float* mom = state[1];
  float* mg = options_.centered ? state[2] : nullptr;
  const float d = static_cast<float>(options_.decay), m = static_cast<float>(options_.momentum);
  const float eps = static_cast<float>(options_.epsilon), l = static_cast<float>(lr);
  const float wd = static_cast<float>(weight_decay);
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] + wd * p[i];
    ms[i] = d * ms[i] + (1 - d) * gi * gi;
    float var = ms[i];
    if (mg) {
      mg[i] = d * mg[i] + (1 - d) * gi;
      var -= mg[i] * mg[i];
    }
    mom[i] = m * mom[i] + l * gi / std::sqrt(var + eps);
    p[i] -= mom[i];
  }
}

// ---- Adagrad ----
Adagrad::Adagrad(std::vector<Tensor> params, double learning_rate, double initial_accum, double weight_decay)
    : Adagrad(one_group(std::move(params), weight_decay), fixed_lr(learning_rate), initial_accum) {}

Adagrad::Adagrad(std::vector<ParamGroup> groups, LrSchedulePtr lr, double initial_accum)
    : Optimizer("Adagrad", std::move(groups), std::move(lr)) {
  check_hyper("Adagrad", "initial_accum", initial_accum, false);
  add_state_slots({"accum"});
  const std::vector<Tensor> params = parameters();
  for (size_t i = 0; i < params.size(); ++i) std::fill_n(slot(0, i), params[i].numel(), static_cast<float>(initial_accum));
}

void Adagrad::update(float* const* state, float* p, const float* g, int64_t n, double lr, double weight_decay) {
  float* acc = state[0];
  const float l = static_cast<float>(lr), wd = static_cast<float>(weight_decay);
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] + wd * p[i];
    acc[i] += gi * gi;
    p[i] -= l * gi / std::sqrt(acc[i]);
  }
}

// ---- LAMB ----
LAMB::LAMB(std::vector<Tensor> params, double learning_rate, const AdamOptions& options, double weight_decay)
    : LAMB(one_group(std::move(params), weight_decay), fixed_lr(learning_rate), options) {}

LAMB::LAMB(std::vector<ParamGroup> groups, LrSchedulePtr lr, const AdamOptions& options)
    : Optimizer("LAMB", std::move(groups), std::move(lr)), options_(options) {
  DEMI_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
             "LAMB: betas must be in [0, 1), got (", options.beta1, ", ", options.beta2, ")");
  check_hyper("LAMB", "eps", options.eps, false);
  add_state_slots({"moment1", "moment2", "update"});
}

double LAMB::prepare(float* const* state, const float* p, const float* g, int64_t n, double lr, double weight_decay) {
  float* m = state[0];
  float* v = state[1];
  float* u = state[2];
  const double t = static_cast<double>(global_step() + 1);
  const float b1 = static_cast<float>(options_.beta1), b2 = static_cast<float>(options_.beta2);
  const float bc1 = static_cast<float>(1.0 - std::pow(options_.beta1, t));
  const float bc2 = static_cast<float>(1.0 - std::pow(options_.beta2, t));
  const float eps = static_cast<float>(options_.eps), wd = static_cast<float>(weight_decay);
  double w2 = 0, u2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    u[i] = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps) + wd * p[i];
    w2 += static_cast<double>(p[i]) * p[i];
    u2 += static_cast<double>(u[i]) * u[i];
  }
  const double ratio = w2 > 0 && u2 > 0 ? std::sqrt(w2) / std::sqrt(u2) : 1.0;
  return lr * ratio;
}

bool LAMB::reads_whole_gradient() const { return true; }

void LAMB::update(float* const* state, float* p, const float*, int64_t n, double lr, double) {
  const float* u = state[2];
  const float l = static_cast<float>(lr);
  for (int64_t i = 0; i < n; ++i) p[i] -= l * u[i];
}

}  // namespace demi::optim
