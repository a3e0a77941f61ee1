#include "demi/train/hooks.h"

#include <cstdio>
#include <ostream>

#include "demi/core/error.h"
#include "demi/train/model.h"

namespace demi::train {

void TrainLoop::warn(std::string w) {
  callback_stream() << "Model.train: warning: " << w << std::endl;
  context.warnings.push_back(w);
  summary.warnings.push_back(std::move(w));
}

SinkProgress::SinkProgress(std::ostream& out, double every_seconds) : out_(out), every_(every_seconds) {
  DEMI_CHECK(every_seconds >= 0, "SinkProgress: every_seconds must be >= 0, got ", every_seconds);
}

void SinkProgress::on_sink_begin(TrainLoop&) {
  since_ = std::chrono::steady_clock::now();
  updates_ = 0;
  at_last_line_ = 0;
}

void SinkProgress::on_step_end(TrainLoop& loop) {
  ++updates_;
  if (!loop.sinking) return;
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - since_).count();
  if (seconds < every_) return;
  char line[200];
  std::snprintf(line, sizeof line,
                "Model.train: sink in progress: update %lld of the sink (step %lld of the run), loss %.4f, %.1f updates/s",
                static_cast<long long>(updates_), static_cast<long long>(loop.context.cur_step_num),
                static_cast<double>(loop.step.result.loss),
                seconds > 0 ? static_cast<double>(updates_ - at_last_line_) / seconds : 0.0);
  out_ << line << std::endl;
  since_ = now;
  at_last_line_ = updates_;
}

}  // namespace demi::train
