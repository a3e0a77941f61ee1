#include "demi/train/callback.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>

#include "demi/core/error.h"

namespace demi::train {
namespace {

std::ostream* g_stream = nullptr;

std::string format_seconds(double s) {
  char buf[32];
  if (s < 0 || !std::isfinite(s)) return "?";
  int total = static_cast<int>(s + 0.5);
  std::snprintf(buf, sizeof buf, "%d:%02d", total / 60, total % 60);
  return buf;
}

}  // namespace

void set_callback_stream(std::ostream* os) { g_stream = os; }
std::ostream& callback_stream() { return g_stream ? *g_stream : std::cout; }

// ---- TimeMonitor ----
void TimeMonitor::on_epoch_begin(RunContext&) { start_ = std::chrono::steady_clock::now(); }

void TimeMonitor::on_epoch_end(RunContext& ctx) {
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  int64_t steps = std::max<int64_t>(ctx.step_in_epoch, 1);
  callback_stream() << std::fixed << std::setprecision(3) << "epoch time: " << ms
                    << " ms, per step time: " << ms / static_cast<double>(steps) << " ms" << std::defaultfloat
                    << std::endl;
}

// ---- LossMonitor ----
LossMonitor::LossMonitor(int64_t per_print_times) : every_(per_print_times) {
  DEMI_CHECK(per_print_times >= 1, "LossMonitor: per_print_times must be >= 1, got ", per_print_times);
}

void LossMonitor::on_step_end(RunContext& ctx) {
  // A skipped step trained nothing on the non-finite loss (a loss-scale manager, or adaptive AMP, is
  // handling the overflow); one that was applied would train on garbage.
  DEMI_CHECK(std::isfinite(ctx.loss) || ctx.skipped, "LossMonitor: the loss is ", ctx.loss, " at epoch ", ctx.epoch,
             " step ", ctx.step_in_epoch, "; training stopped (lower the learning rate, or use a loss scale manager)",
             ctx.overflow_op.empty() ? "" : "; the first op to produce a non-finite value: " + ctx.overflow_op);
  if (!ctx.passes_multiple_of(every_)) return;  // every per_print_times steps of the run, as MindSpore counts
  callback_stream() << "epoch: " << ctx.epoch << " step: " << ctx.step_in_epoch << ", loss is "
                    << std::setprecision(6) << ctx.loss << std::defaultfloat << std::endl;
}

// ---- ProgressBar ----
ProgressBar::ProgressBar(int64_t line_every, bool force_terminal)
    : line_every_(line_every), terminal_(force_terminal || (g_stream == nullptr && isatty(STDOUT_FILENO))) {}

void ProgressBar::on_epoch_begin(RunContext& ctx) {
  start_ = std::chrono::steady_clock::now();
  samples_ = 0;
  last_step_ = ctx.step_in_epoch;
}

void ProgressBar::on_step_end(RunContext& ctx) {
  samples_ += ctx.batch_size;
  const int64_t previous = ctx.step_in_epoch >= last_step_ ? last_step_ : 0;
  last_step_ = ctx.step_in_epoch;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = elapsed > 0 ? static_cast<double>(samples_) / elapsed : 0;
  double per_step = elapsed / static_cast<double>(ctx.step_in_epoch);
  double eta = ctx.steps_per_epoch > 0 ? per_step * static_cast<double>(ctx.steps_per_epoch - ctx.step_in_epoch) : -1;
  char line[200];
  if (terminal_) {
    int width = 30;
    int filled = ctx.steps_per_epoch > 0
                     ? static_cast<int>(width * ctx.step_in_epoch / std::max<int64_t>(ctx.steps_per_epoch, 1))
                     : 0;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(static_cast<size_t>(width), '.');
    std::snprintf(line, sizeof line, "\r\033[Kepoch %d/%d [%s] %lld/%lld  %.0f samples/s  ETA %s  loss %.4f",
                  ctx.epoch, ctx.epochs, bar.c_str(), static_cast<long long>(ctx.step_in_epoch),
                  static_cast<long long>(ctx.steps_per_epoch), rate, format_seconds(eta).c_str(), ctx.loss);
    callback_stream() << line << std::flush;
  } else if (ctx.step_in_epoch / line_every_ != previous / line_every_) {  // a sink may pass several
    std::snprintf(line, sizeof line, "epoch %d/%d step %lld/%lld  %.0f samples/s  ETA %s  loss %.4f", ctx.epoch,
                  ctx.epochs, static_cast<long long>(ctx.step_in_epoch), static_cast<long long>(ctx.steps_per_epoch),
                  rate, format_seconds(eta).c_str(), ctx.loss);
    callback_stream() << line << std::endl;
  }
}

void ProgressBar::on_epoch_end(RunContext& ctx) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  char line[160];
  std::snprintf(line, sizeof line, "epoch %d/%d done in %s  %.0f samples/s  loss %.4f", ctx.epoch, ctx.epochs,
                format_seconds(elapsed).c_str(), elapsed > 0 ? static_cast<double>(samples_) / elapsed : 0.0,
                ctx.loss);
  if (terminal_) callback_stream() << "\r\033[K";
  callback_stream() << line << std::endl;
}

// ---- LossScaleMonitor ----
void LossScaleMonitor::on_step_end(RunContext& ctx) {
  // (A hand-written loop may set only `skipped`.)
  const int64_t skipped = ctx.sink_steps > 1 ? ctx.sink_skipped : static_cast<int64_t>(ctx.skipped);
  if (skipped > 0) {
    skipped_ += skipped;
    if (ctx.sink_steps == 1) {
      callback_stream() << "epoch: " << ctx.epoch << " step: " << ctx.step_in_epoch
                        << ", gradients overflowed at loss scale " << ctx.loss_scale << ": update skipped" << std::endl;
    } else {
      callback_stream() << "epoch: " << ctx.epoch << " step: " << ctx.step_in_epoch << ", " << skipped
                        << " of the sink's " << ctx.sink_steps
                        << " updates skipped for overflowing gradients (loss scale now " << ctx.loss_scale << ")"
                        << std::endl;
    }
  }
  if (last_scale_ >= 0 && ctx.loss_scale != last_scale_)
    callback_stream() << "epoch: " << ctx.epoch << " step: " << ctx.step_in_epoch << ", loss scale " << last_scale_
                      << " -> " << ctx.loss_scale << std::endl;
  last_scale_ = ctx.loss_scale;
}

void LossScaleMonitor::on_train_end(RunContext& ctx) {
  callback_stream() << "loss scale: final " << ctx.loss_scale << ", " << skipped_ << " step(s) skipped" << std::endl;
}

// ---- HistoryLogger ----
HistoryLogger::HistoryLogger(std::string path, Format format, bool per_step)
    : path_(std::move(path)), format_(format), per_step_(per_step) {}

void HistoryLogger::on_train_begin(RunContext&) {
  out_.open(path_, std::ios::out | std::ios::trunc);
  DEMI_CHECK(out_.good(), "HistoryLogger: cannot open '", path_, "' for writing");
  header_written_ = false;
}

void HistoryLogger::write(const RunContext& ctx, const char* kind) {
  if (format_ == Format::kCsv) {
    if (!header_written_) {
      out_ << "kind,epoch,step,loss,loss_scale,overflow,step_seconds,epoch_seconds,samples_per_second";
      for (const auto& [k, v] : ctx.metrics) out_ << "," << k;
      out_ << "\n";
      header_written_ = true;
    }
    out_ << kind << "," << ctx.epoch << "," << ctx.cur_step_num << "," << std::setprecision(9) << ctx.loss << ","
         << ctx.loss_scale << "," << (ctx.overflow ? 1 : 0) << "," << ctx.step_seconds << "," << ctx.epoch_seconds
         << "," << ctx.epoch_samples_per_second;
    for (const auto& [k, v] : ctx.metrics) out_ << "," << v;
    out_ << "\n";
  } else {
    out_ << "{\"kind\":\"" << kind << "\",\"epoch\":" << ctx.epoch << ",\"step\":" << ctx.cur_step_num
         << ",\"loss\":" << std::setprecision(9) << (std::isfinite(ctx.loss) ? ctx.loss : 0.0f)
         << ",\"loss_scale\":" << ctx.loss_scale << ",\"overflow\":" << (ctx.overflow ? "true" : "false")
         << ",\"step_seconds\":" << ctx.step_seconds;
    if (std::string(kind) == "epoch")
      out_ << ",\"epoch_seconds\":" << ctx.epoch_seconds << ",\"samples_per_second\":" << ctx.epoch_samples_per_second;
    for (const auto& [k, v] : ctx.metrics) out_ << ",\"" << k << "\":" << v;
    out_ << "}\n";
  }
  out_.flush();
}

void HistoryLogger::on_step_end(RunContext& ctx) {
  if (per_step_) write(ctx, "step");
}
void HistoryLogger::on_epoch_end(RunContext& ctx) { write(ctx, "epoch"); }
void HistoryLogger::on_train_end(RunContext&) { out_.close(); }

// ---- EarlyStopping ----
EarlyStopping::EarlyStopping(std::string monitor, int patience, double min_delta, bool maximize)
    : monitor_(std::move(monitor)), patience_(patience), min_delta_(min_delta), maximize_(maximize) {
  DEMI_CHECK(patience >= 1, "EarlyStopping: patience must be >= 1, got ", patience);
}

void EarlyStopping::on_epoch_end(RunContext& ctx) {
  auto it = ctx.metrics.find(monitor_);
  DEMI_CHECK(it != ctx.metrics.end(), "EarlyStopping: no metric '", monitor_, "' at the end of epoch ", ctx.epoch);
  double v = it->second;
  bool better = !has_best_ || (maximize_ ? v > best_ + min_delta_ : v < best_ - min_delta_);
  if (better) {
    best_ = v;
    has_best_ = true;
    bad_epochs_ = 0;
    return;
  }
  if (++bad_epochs_ >= patience_) {
    ctx.stop_requested = true;
    stopped_epoch_ = ctx.epoch;
    callback_stream() << "early stopping at epoch " << ctx.epoch << ": " << monitor_ << " has not improved for "
                      << patience_ << " epoch(s) (best " << best_ << ")" << std::endl;
  }
}

}  // namespace demi::train
