#include "demi/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "demi/core/error.h"

namespace demi::optim {
namespace {

void check_rate(double lr, const char* what) {
  DEMI_CHECK(std::isfinite(lr) && lr >= 0, what, ": the learning rate must be finite and >= 0, got ", lr);
}

class Fixed : public LrSchedule {
 public:
  explicit Fixed(double lr) : lr_(lr) {}
  double lr(int64_t) const override { return lr_; }

 private:
  double lr_;
};

class Step : public LrSchedule {
 public:
  Step(double lr, int64_t step_size, double gamma) : lr_(lr), step_size_(step_size), gamma_(gamma) {}
  double lr(int64_t step) const override {
    return lr_ * std::pow(gamma_, static_cast<double>(step / step_size_));
  }

 private:
  double lr_;
  int64_t step_size_;
  double gamma_;
};

class Cosine : public LrSchedule {
 public:
  Cosine(double max_lr, int64_t total, int64_t warmup, double min_lr)
      : max_(max_lr), min_(min_lr), total_(total), warmup_(warmup) {}
  double lr(int64_t step) const override {
    if (step < warmup_) return max_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
    if (step >= total_) return min_;
    double progress = static_cast<double>(step - warmup_) / static_cast<double>(std::max<int64_t>(total_ - warmup_, 1));
    return min_ + 0.5 * (max_ - min_) * (1.0 + std::cos(std::numbers::pi * progress));
  }

 private:
  double max_, min_;
  int64_t total_, warmup_;
};

}  // namespace

LrSchedulePtr fixed_lr(double lr) {
  check_rate(lr, "fixed_lr");
  return std::make_shared<Fixed>(lr);
}

LrSchedulePtr step_lr(double lr, int64_t step_size, double gamma) {
  check_rate(lr, "step_lr");
  DEMI_CHECK(step_size >= 1, "step_lr: step_size must be >= 1, got ", step_size);
  DEMI_CHECK(std::isfinite(gamma) && gamma > 0, "step_lr: gamma must be finite and > 0, got ", gamma);
  return std::make_shared<Step>(lr, step_size, gamma);
}

LrSchedulePtr cosine_lr(double max_lr, int64_t total_steps, int64_t warmup_steps, double min_lr) {
  check_rate(max_lr, "cosine_lr");
  check_rate(min_lr, "cosine_lr (min_lr)");
  DEMI_CHECK(total_steps >= 1 && warmup_steps >= 0 && warmup_steps <= total_steps,
             "cosine_lr: expected 0 <= warmup_steps <= total_steps and total_steps >= 1, got warmup_steps=",
             warmup_steps, " total_steps=", total_steps);
  return std::make_shared<Cosine>(max_lr, total_steps, warmup_steps, min_lr);
}

}  // namespace demi::optim
