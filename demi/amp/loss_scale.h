// Loss scaling: FP16 spans ~6e-8 to 65504, so small gradients underflow to zero. The loss is multiplied
// by a scale before backward and the gradients divided by it before the update (always — also with
// drop_overflow_update=false, unlike MindSpore, so the seed's program trains as written).
//
// Managers (MindSpore's names and defaults):
//   FixedLossScaleManager(loss_scale=128, drop_overflow_update=true)
//   DynamicLossScaleManager(init_loss_scale=2^24, scale_factor=2, scale_window=2000)
// A dynamic scale divides by scale_factor on an overflow (never below min_scale) and multiplies by it
// after scale_window clean steps in a row (never above max_scale: it never reaches infinity). After
// max_consecutive_overflows overflowing steps in a row the step throws, naming the first parameter whose
// gradient is not finite.
//
// Functional API for custom loops: StaticLossScaler / DynamicLossScaler (scale, unscale, adjust) and
// all_finite(grads).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "demi/core/tensor.h"

namespace demi::amp {

// The fused pass over every gradient: multiplies each by inv_scale in place and checks that every value
// is finite. Returns -1 when all are finite, else the index of the first gradient holding a non-finite
// value (the scaling still runs over all of them). An FP16/BF16 gradient (AMP O2/O3 keeps parameter
// gradients low; AmpPolicy::low_precision_param_grads) with inv_scale != 1 is an error naming it: see its
// message for what to do instead (TrainStep does that itself).
int64_t unscale_and_check(std::vector<Tensor>& grads, float inv_scale);
// Whether every value of every gradient is finite (no scaling).
bool all_finite(const std::vector<Tensor>& grads);

struct LossScaleState {
  double scale = 1;
  int64_t good_steps = 0;            // clean steps since the last change
  int64_t consecutive_overflows = 0;
  int64_t total_overflows = 0;
};

class LossScaleManager {
 public:
  virtual ~LossScaleManager() = default;
  virtual double get_loss_scale() const = 0;
  virtual bool get_drop_overflow_update() const = 0;
  // Called once per step with whether the gradients overflowed.
  virtual void update_loss_scale(bool overflow) = 0;
  virtual LossScaleState state() const = 0;
  virtual void set_state(const LossScaleState& s) = 0;
  virtual std::string describe() const = 0;
  // Steps in a row that may overflow before train steps throw (0: never throw).
  int64_t max_consecutive_overflows() const { return max_consecutive_overflows_; }
  void set_max_consecutive_overflows(int64_t n) { max_consecutive_overflows_ = n; }

 private:
  int64_t max_consecutive_overflows_ = 1000;
};

class FixedLossScaleManager : public LossScaleManager {
 public:
  explicit FixedLossScaleManager(double loss_scale = 128.0, bool drop_overflow_update = true);
  double get_loss_scale() const override { return state_.scale; }
  bool get_drop_overflow_update() const override { return drop_; }
  void update_loss_scale(bool overflow) override;
  LossScaleState state() const override { return state_; }
  void set_state(const LossScaleState& s) override { state_ = s; }
  std::string describe() const override;

 private:
  LossScaleState state_;
  bool drop_;
};

struct DynamicLossScaleOptions {
  double min_scale = 1.0;
  double max_scale = 4294967296.0;  // 2^32
};

class DynamicLossScaleManager : public LossScaleManager {
 public:
  explicit DynamicLossScaleManager(double init_loss_scale = 16777216.0, double scale_factor = 2.0,
                                   int64_t scale_window = 2000, const DynamicLossScaleOptions& options = {});
  double get_loss_scale() const override { return state_.scale; }
  bool get_drop_overflow_update() const override { return true; }
  void update_loss_scale(bool overflow) override;
  LossScaleState state() const override { return state_; }
  void set_state(const LossScaleState& s) override { state_ = s; }
  std::string describe() const override;
  double scale_factor() const { return factor_; }
  int64_t scale_window() const { return window_; }
  double min_scale() const { return options_.min_scale; }

 private:
  LossScaleState state_;
  double factor_;
  int64_t window_;
  DynamicLossScaleOptions options_;
};

// ---- functional API for custom loops ----

class StaticLossScaler {
 public:
  explicit StaticLossScaler(double scale);
  Tensor scale(const Tensor& loss) const;             // loss * scale (recorded for backward)
  void unscale(std::vector<Tensor>& grads) const;     // grads /= scale, in place
  bool adjust(bool grads_finite) { return grads_finite; }
  double scale_value() const { return scale_; }

 private:
  double scale_;
};

class DynamicLossScaler {
 public:
  DynamicLossScaler(double scale, double scale_factor, int64_t scale_window);
  Tensor scale(const Tensor& loss) const;
  void unscale(std::vector<Tensor>& grads) const;
  // Backs the scale off on non-finite gradients, grows it after scale_window finite steps; returns
  // grads_finite.
  bool adjust(bool grads_finite);
  double scale_value() const { return manager_.get_loss_scale(); }

 private:
  DynamicLossScaleManager manager_;
};

}  // namespace demi::amp
