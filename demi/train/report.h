// The training report's data: what one run did, step by step. A ReportRecorder (a Callback) fills a
// RunRecord during Model::train — every step's loss, loss scale, overflow and time, every epoch's metrics,
// the tracked memory by category at the peak of sampled steps, and the events (warnings, overflow
// attributions, AMP promotions, non-finite losses) with their epoch and step. report_html.h renders a
// record as one self-contained HTML page; the record also round-trips as JSON, which is how `demi
// compare` collects the histories of the runs it makes in child processes.
//
//   auto recorder = std::make_shared<train::ReportRecorder>();
//   model.train(3, train_ds, {recorder});
//   recorder->finish(model.last_summary(), model.eval(test_ds));  // the summary is complete only now
//   train::write_report("run.html", train::render_report_html(recorder->record()));
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "demi/core/memory.h"
#include "demi/train/callback.h"

namespace demi::train {

struct TrainSummary;

// One train step as the callbacks saw it.
struct StepSample {
  int64_t step = 0;              // 1-based across epochs
  int epoch = 0;                 // 1-based
  float loss = 0;                // the step's unscaled loss; may be NaN or Inf
  double loss_scale = 1;
  bool overflow = false;         // a gradient was not finite
  bool skipped = false;          // the update was skipped
  double step_seconds = 0;       // the train step itself, without the data wait
  double data_wait_seconds = 0;
  int64_t samples = 0;           // samples in the step
};

struct EpochSample {
  int epoch = 0;
  double seconds = 0;
  double samples_per_second = 0;
  std::map<std::string, double> metrics;  // "loss": the epoch's mean train loss; eval metrics when run
};

// The tracked memory of one sampled step at that step's peak: what each category held when the total
// was highest (so the categories sum to the step's peak).
struct MemorySample {
  int64_t step = 0;
  std::array<int64_t, kNumMemCategories> bytes{};
  int64_t total() const;
};

struct ReportEvent {
  enum class Kind : uint8_t { kWarning, kOverflow, kPromotion, kNonFiniteLoss };
  Kind kind = Kind::kWarning;
  int epoch = 0;
  int64_t step = 0;
  std::string text;
};
const char* report_event_kind_name(ReportEvent::Kind k);  // "warning", "overflow", "promotion", "non-finite loss"

// What the whole run measured (TrainSummary's numbers the report shows); present once finish() ran.
struct RunTotals {
  int64_t steps = 0;
  int64_t samples = 0;
  double seconds = 0;
  double samples_per_second = 0;     // steady state (TrainSummary's definition)
  double median_step_seconds = 0;
  double data_wait_fraction = 0;
  double final_loss = 0;             // the last epoch's mean train loss
  int64_t skipped_steps = 0;
  double final_loss_scale = 1;
  std::array<int64_t, kNumMemCategories> peak{};     // each category's own peak
  std::array<int64_t, kNumMemCategories> at_peak{};  // the composition at the total's peak
  int64_t peak_total = 0;
  int64_t train_peak = 0;            // every category but data
  std::array<int64_t, kNumMemCategories> at_train_peak{};  // its composition (data at 0)
  int64_t peak_rss_bytes = 0;
};

struct RunRecord {
  std::string name;   // a short label for legends ("O2-fp16"); the title when empty
  std::string title;  // "model B on fashion-mnist, O2 float16"
  std::vector<std::pair<std::string, std::string>> settings;  // shown in this order
  std::vector<StepSample> steps;
  std::vector<EpochSample> epochs;
  std::vector<MemorySample> memory;
  std::vector<ReportEvent> events;
  std::optional<RunTotals> totals;
  std::map<std::string, double> final_metrics;  // evaluated after training ("Accuracy", "Loss")

  // Sets a setting (replacing one of that key, keeping its place) / only when absent.
  void set(const std::string& key, std::string value);
  void set_default(const std::string& key, std::string value);
  const std::string* setting(std::string_view key) const;
  const std::string& label() const { return name.empty() ? title : name; }
};

struct ReportOptions {
  // Memory is sampled every k-th step, k doubling whenever this many samples are held (so a run of any
  // length keeps between half this and this many, evenly spread). A sampled step holds one more
  // ScopedPeak window (an array update per allocation of that step); the others cost nothing.
  int64_t max_memory_samples = 500;
  // Non-finite losses are all in the steps; this many of them are also listed as events.
  int max_nonfinite_events = 10;
};

class ReportRecorder : public Callback {
 public:
  explicit ReportRecorder(ReportOptions options = {});
  // Fills the settings the model knows (AMP level, low dtype, loss-scale manager), the threads, the CPU
  // and the date, unless already set.
  void on_train_begin(RunContext& ctx) override;
  void on_step_begin(RunContext& ctx) override;
  void on_step_end(RunContext& ctx) override;
  void on_epoch_end(RunContext& ctx) override;

  // After Model::train has returned (TrainSummary is complete only then, after on_train_end): the run's
  // totals, and the metrics evaluated after training.
  void finish(const TrainSummary& summary, const std::map<std::string, double>& final_metrics = {});

  RunRecord& record() { return record_; }
  const RunRecord& record() const { return record_; }
  int64_t memory_stride() const { return memory_stride_; }

 private:
  ReportOptions options_;
  RunRecord record_;
  std::unique_ptr<ScopedPeak> window_;  // a sampled step's memory window, open from its begin to its end
  int64_t seen_steps_ = 0;
  int64_t memory_stride_ = 1;
  int nonfinite_events_ = 0;
};

// The record as JSON and back (the schema is the record's: reals are strings — "%.17g", or nan, inf,
// -inf, which JSON numbers cannot hold — so the strict reader of io/internal/json reads them).
std::string run_record_to_json(const RunRecord& r);
RunRecord run_record_from_json(std::string_view json, std::string_view where);
// A file written by write_report(path, run_record_to_json(r)); errors name the path.
RunRecord read_run_record(const std::filesystem::path& path);

// A demi::Error naming the path unless a report can be written there: its directory exists and a file
// can be created in it (tried, then removed). For a command to say so before a run, not after it.
void check_report_path(const std::filesystem::path& path);
// Writes `text` to `path` atomically (a temporary file beside it, fsync, rename: a reader never sees half
// a report); a failure is a demi::Error naming the path and leaves no temporary file.
void write_report(const std::filesystem::path& path, std::string_view text);

}  // namespace demi::train
