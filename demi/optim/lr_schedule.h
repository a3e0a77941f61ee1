// Learning-rate schedules: the learning rate as a function of the optimizer's step (0-based, counting
// applied updates only: a step skipped for a loss-scale overflow does not advance the schedule).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace demi::optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double lr(int64_t step) const = 0;
};
using LrSchedulePtr = std::shared_ptr<const LrSchedule>;

// The same rate at every step.
LrSchedulePtr fixed_lr(double lr);
// lr * gamma^(step / step_size)
LrSchedulePtr step_lr(double lr, int64_t step_size, double gamma);
// Linear warm-up from 0 to max_lr over warmup_steps, then cosine decay to min_lr at total_steps (and
// min_lr after).
LrSchedulePtr cosine_lr(double max_lr, int64_t total_steps, int64_t warmup_steps = 0, double min_lr = 0);

}  // namespace demi::optim
