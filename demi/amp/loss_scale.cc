#include "demi/amp/loss_scale.h"

#include <cmath>
#include <sstream>

#include "demi/ops/ops.h"

namespace demi::amp {
namespace {

void check_scale(double s, const char* who) {
  DEMI_CHECK(std::isfinite(s) && s > 0, who, ": the loss scale must be finite and > 0, got ", s);
}

}  // namespace

// ---- Fixed ----
FixedLossScaleManager::FixedLossScaleManager(double loss_scale, bool drop_overflow_update)
    : drop_(drop_overflow_update) {
  check_scale(loss_scale, "FixedLossScaleManager");
  state_.scale = loss_scale;
}

void FixedLossScaleManager::update_loss_scale(bool overflow) {
  if (overflow) {
    ++state_.consecutive_overflows;
    ++state_.total_overflows;
    state_.good_steps = 0;
  } else {
    state_.consecutive_overflows = 0;
    ++state_.good_steps;
  }
}

std::string FixedLossScaleManager::describe() const {
  return str_cat("FixedLossScaleManager(", state_.scale, ", drop_overflow_update=", drop_ ? "true" : "false", ")");
}

// ---- Dynamic ----
DynamicLossScaleManager::DynamicLossScaleManager(double init_loss_scale, double scale_factor, int64_t scale_window,
                                                 const DynamicLossScaleOptions& options)
    : factor_(scale_factor), window_(scale_window), options_(options) {
  check_scale(init_loss_scale, "DynamicLossScaleManager");
  DEMI_CHECK(std::isfinite(scale_factor) && scale_factor > 1, "DynamicLossScaleManager: scale_factor must be > 1, got ",
             scale_factor);
  DEMI_CHECK(scale_window >= 1, "DynamicLossScaleManager: scale_window must be >= 1, got ", scale_window);
  DEMI_CHECK(std::isfinite(options.max_scale) && options.min_scale > 0 && options.min_scale <= options.max_scale,
             "DynamicLossScaleManager: expected 0 < min_scale <= max_scale < inf, got min_scale=", options.min_scale,
             " max_scale=", options.max_scale);
  state_.scale = std::min(std::max(init_loss_scale, options.min_scale), options.max_scale);
}

void DynamicLossScaleManager::update_loss_scale(bool overflow) {
  if (overflow) {
    state_.scale = std::max(state_.scale / factor_, options_.min_scale);
    state_.good_steps = 0;
    ++state_.consecutive_overflows;
    ++state_.total_overflows;
    return;
  }
  state_.consecutive_overflows = 0;
  if (++state_.good_steps >= window_) {
    state_.scale = std::min(state_.scale * factor_, options_.max_scale);
    state_.good_steps = 0;
  }
}

std::string DynamicLossScaleManager::describe() const {
  return str_cat("DynamicLossScaleManager(scale=", state_.scale, ", factor=", factor_, ", window=", window_, ")");
}

// ---- functional API ----
StaticLossScaler::StaticLossScaler(double scale) : scale_(scale) { check_scale(scale, "StaticLossScaler"); }

Tensor StaticLossScaler::scale(const Tensor& loss) const { return ops::mul_scalar(loss, scale_); }

void StaticLossScaler::unscale(std::vector<Tensor>& grads) const {
  unscale_and_check(grads, static_cast<float>(1.0 / scale_));
}

DynamicLossScaler::DynamicLossScaler(double scale, double scale_factor, int64_t scale_window)
    : manager_(scale, scale_factor, scale_window) {}

Tensor DynamicLossScaler::scale(const Tensor& loss) const { return ops::mul_scalar(loss, manager_.get_loss_scale()); }

void DynamicLossScaler::unscale(std::vector<Tensor>& grads) const {
  unscale_and_check(grads, static_cast<float>(1.0 / manager_.get_loss_scale()));
}

bool DynamicLossScaler::adjust(bool grads_finite) {
  manager_.update_loss_scale(!grads_finite);
  return grads_finite;
}

}  // namespace demi::amp
