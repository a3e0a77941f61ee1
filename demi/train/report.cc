// The report's data (report.h): the recorder, the record's JSON form, and writing a report to disk.
#include "demi/train/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "demi/amp/policy.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/io/atomic_file.h"
#include "demi/io/internal/json.h"
#include "demi/train/model.h"

namespace demi::train {

int64_t MemorySample::total() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

const char* report_event_kind_name(ReportEvent::Kind k) {
  switch (k) {
    case ReportEvent::Kind::kWarning: return "warning";
    case ReportEvent::Kind::kOverflow: return "overflow";
    case ReportEvent::Kind::kPromotion: return "promotion";
    case ReportEvent::Kind::kNonFiniteLoss: return "non-finite loss";
  }
  return "?";
}

void RunRecord::set(const std::string& key, std::string value) {
  for (auto& [k, v] : settings) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  settings.emplace_back(key, std::move(value));
}

void RunRecord::set_default(const std::string& key, std::string value) {
  if (setting(key) == nullptr) settings.emplace_back(key, std::move(value));
}

const std::string* RunRecord::setting(std::string_view key) const {
  for (const auto& [k, v] : settings)
    if (k == key) return &v;
  return nullptr;
}

// ---- ReportRecorder ----

namespace {

std::string local_date() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char b[64];
  std::strftime(b, sizeof b, "%Y-%m-%d %H:%M %Z", &tm);
  return b;
}

}  // namespace

ReportRecorder::ReportRecorder(ReportOptions options) : options_(options) {
  DEMI_CHECK(options_.max_memory_samples >= 2, "ReportRecorder: max_memory_samples must be >= 2, got ",
             options_.max_memory_samples);
}

void ReportRecorder::on_train_begin(RunContext& ctx) {
  if (Model* m = ctx.model; m != nullptr) {
    const bool o0 = m->amp_level() == amp::Level::kO0;
    record_.set_default("AMP level", amp::level_name(m->amp_level()));
    record_.set_default("low dtype", o0 ? std::string("none (O0 runs in float32)") : std::string(dtype_name(m->low_dtype())));
    amp::LossScaleManager* lsm = m->loss_scale_manager();
    record_.set_default("loss scale", lsm ? lsm->describe() : std::string("none"));
  }
  record_.set_default("threads", str_cat(num_threads(), " of ", hardware_threads(), " hardware threads"));
  record_.set_default("CPU", str_cat(cpu_id().name, " (kernels: ", cpu_level_name(cpu_level()), ")"));
  record_.set_default("date", local_date());
}

void ReportRecorder::on_step_begin(RunContext&) {
  if (seen_steps_ % memory_stride_ == 0) window_ = std::make_unique<ScopedPeak>();
}

void ReportRecorder::on_step_end(RunContext& ctx) {
  StepSample s;
  s.step = ctx.cur_step_num;
  s.epoch = ctx.epoch;
  s.loss = ctx.loss;
  s.loss_scale = ctx.loss_scale;
  s.overflow = ctx.overflow;
  s.skipped = ctx.skipped;
  s.step_seconds = ctx.step_seconds;
  s.data_wait_seconds = ctx.data_wait_seconds;
  s.samples = ctx.batch_size;
  record_.steps.push_back(s);

  const auto event = [&](ReportEvent::Kind kind, std::string text) {
    record_.events.push_back({kind, ctx.epoch, ctx.cur_step_num, std::move(text)});
  };
  for (const std::string& w : ctx.warnings) event(ReportEvent::Kind::kWarning, w);
  if (!ctx.overflow_op.empty()) event(ReportEvent::Kind::kOverflow, ctx.overflow_op);
  for (const std::string& layer : ctx.promotions)
    event(ReportEvent::Kind::kPromotion, str_cat("layer '", layer, "' now runs in FP32"));
  if (!std::isfinite(ctx.loss) && nonfinite_events_ < options_.max_nonfinite_events) {
    ++nonfinite_events_;
    event(ReportEvent::Kind::kNonFiniteLoss,
          str_cat("the loss is ", ctx.loss, ctx.skipped ? " (the update was skipped)" : "",
                  nonfinite_events_ == options_.max_nonfinite_events ? "; later ones are in the loss chart only" : ""));
  }

  if (window_) {
    MemorySample m;
    m.step = ctx.cur_step_num;
    m.bytes = window_->peak().at_peak;
    window_.reset();
    record_.memory.push_back(m);
    if (static_cast<int64_t>(record_.memory.size()) >= options_.max_memory_samples) {
      // Keep every other sample (those at multiples of twice the stride) and sample half as often.
      size_t kept = 0;
      for (size_t i = 0; i < record_.memory.size(); i += 2) record_.memory[kept++] = record_.memory[i];
      record_.memory.resize(kept);
      memory_stride_ *= 2;
    }
  }
  ++seen_steps_;
}

void ReportRecorder::on_epoch_end(RunContext& ctx) {
  record_.epochs.push_back({ctx.epoch, ctx.epoch_seconds, ctx.epoch_samples_per_second, ctx.metrics});
}

void ReportRecorder::finish(const TrainSummary& s, const std::map<std::string, double>& final_metrics) {
  RunTotals t;
  t.steps = s.steps;
  t.samples = s.samples;
  t.seconds = s.seconds;
  t.samples_per_second = s.samples_per_second;
  t.median_step_seconds = s.median_step_seconds;
  t.data_wait_fraction = s.data_wait_fraction;
  t.final_loss = s.mean_last_epoch_loss;
  t.skipped_steps = s.skipped_steps;
  t.final_loss_scale = s.final_loss_scale;
  t.peak = s.peak.peak;
  t.at_peak = s.peak.at_peak;
  t.peak_total = s.peak.total_peak;
  t.train_peak = s.peak.train_peak;
  t.at_train_peak = s.peak.at_train_peak;
  t.peak_rss_bytes = s.peak_rss_bytes;
  record_.totals = t;
  for (const auto& [k, v] : final_metrics) record_.final_metrics[k] = v;
}

// ---- JSON ----

namespace {

using io::internal::json_quote;
using io::internal::JsonValue;

std::string real_text(double v, int digits) {
  if (std::isnan(v)) return "\"nan\"";
  if (std::isinf(v)) return v > 0 ? "\"inf\"" : "\"-inf\"";
  char b[40];
  std::snprintf(b, sizeof b, "\"%.*g\"", digits, v);
  return b;
}
std::string real_text(double v) { return real_text(v, 17); }

// "[a,b,...]" of f(x) for every x.
template <typename T, typename F>
std::string array_of(const std::vector<T>& xs, F f) {
  std::string out = "[";
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) out += ',';
    out += f(xs[i]);
  }
  return out + "]";
}

std::string int_text(int64_t v) { return std::to_string(v); }

std::string metrics_json(const std::map<std::string, double>& m) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : m) {
    out += (first ? "" : ",") + json_quote(k) + ":" + real_text(v);
    first = false;
  }
  return out + "}";
}

std::string bytes_json(const std::array<int64_t, kNumMemCategories>& b) {
  return array_of(std::vector<int64_t>(b.begin(), b.end()), int_text);
}

// Reading: each accessor names what it expected and where.
class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}

  const JsonValue& member(const JsonValue& obj, std::string_view key) const {
    DEMI_CHECK(obj.kind == JsonValue::Kind::kObject, where_, ": expected an object holding '", key, "', found ",
               io::internal::json_kind_name(obj.kind));
    const JsonValue* v = obj.find(key);
    DEMI_CHECK(v != nullptr, where_, ": '", key, "' is missing");
    return *v;
  }
  const JsonValue& typed(const JsonValue& v, JsonValue::Kind kind, std::string_view what) const {
    DEMI_CHECK(v.kind == kind, where_, ": '", what, "' should be a JSON ", io::internal::json_kind_name(kind),
               ", found ", io::internal::json_kind_name(v.kind));
    return v;
  }
  int64_t integer(const JsonValue& v, std::string_view what) const {
    return typed(v, JsonValue::Kind::kInteger, what).integer;
  }
  std::string string(const JsonValue& v, std::string_view what) const {
    return typed(v, JsonValue::Kind::kString, what).string;
  }
  double real(const JsonValue& v, std::string_view what) const {
    const std::string& s = typed(v, JsonValue::Kind::kString, what).string;
    if (s == "nan") return std::nan("");
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    DEMI_CHECK(!s.empty() && end == s.c_str() + s.size(), where_, ": '", what, "' should be a number, found \"", s, "\"");
    return d;
  }
  const std::vector<JsonValue>& array(const JsonValue& v, std::string_view what, size_t size = SIZE_MAX) const {
    const auto& items = typed(v, JsonValue::Kind::kArray, what).items;
    DEMI_CHECK(size == SIZE_MAX || items.size() == size, where_, ": '", what, "' has ", items.size(),
               " entries, expected ", size);
    return items;
  }
  std::map<std::string, double> metrics(const JsonValue& v, std::string_view what) const {
    typed(v, JsonValue::Kind::kObject, what);
    std::map<std::string, double> out;
    for (size_t i = 0; i < v.keys.size(); ++i) out[v.keys[i]] = real(v.values[i], v.keys[i]);
    return out;
  }
  std::array<int64_t, kNumMemCategories> bytes(const JsonValue& v, std::string_view what) const {
    std::array<int64_t, kNumMemCategories> out{};
    const auto& items = array(v, what, kNumMemCategories);
    for (int c = 0; c < kNumMemCategories; ++c) out[static_cast<size_t>(c)] = integer(items[static_cast<size_t>(c)], what);
    return out;
  }

 private:
  std::string where_;
};

constexpr const char* kFormat = "demi-run-record";
constexpr int64_t kVersion = 1;

}  // namespace

std::string run_record_to_json(const RunRecord& r) {
  std::string o = "{\"format\":" + json_quote(kFormat) + ",\"version\":" + int_text(kVersion);
  o += ",\"name\":" + json_quote(r.name) + ",\"title\":" + json_quote(r.title);
  o += ",\"settings\":" + array_of(r.settings, [](const auto& kv) {
         return "[" + json_quote(kv.first) + "," + json_quote(kv.second) + "]";
       });
  const auto& st = r.steps;
  o += ",\n\"steps\":{\"step\":" + array_of(st, [](const StepSample& s) { return int_text(s.step); });
  o += ",\"epoch\":" + array_of(st, [](const StepSample& s) { return int_text(s.epoch); });
  o += ",\"loss\":" + array_of(st, [](const StepSample& s) { return real_text(s.loss, 9); });
  o += ",\"loss_scale\":" + array_of(st, [](const StepSample& s) { return real_text(s.loss_scale); });
  o += ",\"overflow\":" + array_of(st, [](const StepSample& s) { return int_text(s.overflow); });
  o += ",\"skipped\":" + array_of(st, [](const StepSample& s) { return int_text(s.skipped); });
  o += ",\"step_seconds\":" + array_of(st, [](const StepSample& s) { return real_text(s.step_seconds); });
  o += ",\"data_wait_seconds\":" + array_of(st, [](const StepSample& s) { return real_text(s.data_wait_seconds); });
  o += ",\"samples\":" + array_of(st, [](const StepSample& s) { return int_text(s.samples); }) + "}";
  o += ",\n\"epochs\":" + array_of(r.epochs, [](const EpochSample& e) {
         return "{\"epoch\":" + int_text(e.epoch) + ",\"seconds\":" + real_text(e.seconds) +
                ",\"samples_per_second\":" + real_text(e.samples_per_second) + ",\"metrics\":" + metrics_json(e.metrics) +
                "}";
       });
  o += ",\n\"memory\":{\"step\":" + array_of(r.memory, [](const MemorySample& m) { return int_text(m.step); });
  o += ",\"bytes\":" + array_of(r.memory, [](const MemorySample& m) { return bytes_json(m.bytes); }) + "}";
  o += ",\n\"events\":" + array_of(r.events, [](const ReportEvent& e) {
         return "{\"kind\":" + json_quote(report_event_kind_name(e.kind)) + ",\"epoch\":" + int_text(e.epoch) +
                ",\"step\":" + int_text(e.step) + ",\"text\":" + json_quote(e.text) + "}";
       });
  if (r.totals) {
    const RunTotals& t = *r.totals;
    o += ",\n\"totals\":{\"steps\":" + int_text(t.steps) + ",\"samples\":" + int_text(t.samples) +
         ",\"seconds\":" + real_text(t.seconds) + ",\"samples_per_second\":" + real_text(t.samples_per_second) +
         ",\"median_step_seconds\":" + real_text(t.median_step_seconds) +
         ",\"data_wait_fraction\":" + real_text(t.data_wait_fraction) + ",\"final_loss\":" + real_text(t.final_loss) +
         ",\"skipped_steps\":" + int_text(t.skipped_steps) + ",\"final_loss_scale\":" + real_text(t.final_loss_scale) +
         ",\"peak\":" + bytes_json(t.peak) + ",\"at_peak\":" + bytes_json(t.at_peak) +
         ",\"peak_total\":" + int_text(t.peak_total) + ",\"train_peak\":" + int_text(t.train_peak) +
         ",\"at_train_peak\":" + bytes_json(t.at_train_peak) +
         ",\"peak_rss_bytes\":" + int_text(t.peak_rss_bytes) + "}";
  }
  o += ",\n\"final_metrics\":" + metrics_json(r.final_metrics) + "}\n";
  return o;
}

RunRecord run_record_from_json(std::string_view json, std::string_view where) {
  const JsonValue doc = io::internal::parse_json(json, where);
  const Reader rd{std::string(where)};
  DEMI_CHECK(doc.kind == JsonValue::Kind::kObject && doc.find("format") != nullptr &&
                 doc.find("format")->kind == JsonValue::Kind::kString && doc.find("format")->string == kFormat,
             where, ": not a demi run record (no \"format\":\"", kFormat, "\")");
  const int64_t version = rd.integer(rd.member(doc, "version"), "version");
  DEMI_CHECK(version == kVersion, where, ": run record version ", version, ", this demi reads version ", kVersion);
  RunRecord r;
  r.name = rd.string(rd.member(doc, "name"), "name");
  r.title = rd.string(rd.member(doc, "title"), "title");
  for (const JsonValue& kv : rd.array(rd.member(doc, "settings"), "settings")) {
    const auto& pair = rd.array(kv, "settings entry", 2);
    r.settings.emplace_back(rd.string(pair[0], "setting"), rd.string(pair[1], "setting"));
  }

  const JsonValue& st = rd.member(doc, "steps");
  const size_t n = rd.array(rd.member(st, "step"), "steps.step").size();
  const auto column = [&](const char* key) -> const std::vector<JsonValue>& {
    return rd.array(rd.member(st, key), str_cat("steps.", key), n);
  };
  const auto &step = column("step"), &epoch = column("epoch"), &loss = column("loss"), &scale = column("loss_scale"),
             &overflow = column("overflow"), &skipped = column("skipped"), &secs = column("step_seconds"),
             &wait = column("data_wait_seconds"), &samples = column("samples");
  r.steps.resize(n);
  for (size_t i = 0; i < n; ++i) {
    StepSample& s = r.steps[i];
    s.step = rd.integer(step[i], "steps.step");
    s.epoch = static_cast<int>(rd.integer(epoch[i], "steps.epoch"));
    s.loss = static_cast<float>(rd.real(loss[i], "steps.loss"));
    s.loss_scale = rd.real(scale[i], "steps.loss_scale");
    s.overflow = rd.integer(overflow[i], "steps.overflow") != 0;
    s.skipped = rd.integer(skipped[i], "steps.skipped") != 0;
    s.step_seconds = rd.real(secs[i], "steps.step_seconds");
    s.data_wait_seconds = rd.real(wait[i], "steps.data_wait_seconds");
    s.samples = rd.integer(samples[i], "steps.samples");
  }

  for (const JsonValue& e : rd.array(rd.member(doc, "epochs"), "epochs")) {
    r.epochs.push_back({static_cast<int>(rd.integer(rd.member(e, "epoch"), "epochs.epoch")),
                        rd.real(rd.member(e, "seconds"), "epochs.seconds"),
                        rd.real(rd.member(e, "samples_per_second"), "epochs.samples_per_second"),
                        rd.metrics(rd.member(e, "metrics"), "epochs.metrics")});
  }

  const JsonValue& mem = rd.member(doc, "memory");
  const auto& mstep = rd.array(rd.member(mem, "step"), "memory.step");
  const auto& mbytes = rd.array(rd.member(mem, "bytes"), "memory.bytes", mstep.size());
  for (size_t i = 0; i < mstep.size(); ++i)
    r.memory.push_back({rd.integer(mstep[i], "memory.step"), rd.bytes(mbytes[i], "memory.bytes")});

  for (const JsonValue& e : rd.array(rd.member(doc, "events"), "events")) {
    const std::string name = rd.string(rd.member(e, "kind"), "events.kind");
    std::optional<ReportEvent::Kind> kind;
    for (auto k : {ReportEvent::Kind::kWarning, ReportEvent::Kind::kOverflow, ReportEvent::Kind::kPromotion,
                   ReportEvent::Kind::kNonFiniteLoss})
      if (name == report_event_kind_name(k)) kind = k;
    DEMI_CHECK(kind.has_value(), where, ": unknown event kind \"", name, "\"");
    r.events.push_back({*kind, static_cast<int>(rd.integer(rd.member(e, "epoch"), "events.epoch")),
                        rd.integer(rd.member(e, "step"), "events.step"), rd.string(rd.member(e, "text"), "events.text")});
  }

  if (const JsonValue* tv = doc.find("totals"); tv != nullptr) {
    const JsonValue& t = *tv;
    RunTotals x;
    x.steps = rd.integer(rd.member(t, "steps"), "totals.steps");
    x.samples = rd.integer(rd.member(t, "samples"), "totals.samples");
    x.seconds = rd.real(rd.member(t, "seconds"), "totals.seconds");
    x.samples_per_second = rd.real(rd.member(t, "samples_per_second"), "totals.samples_per_second");
    x.median_step_seconds = rd.real(rd.member(t, "median_step_seconds"), "totals.median_step_seconds");
    x.data_wait_fraction = rd.real(rd.member(t, "data_wait_fraction"), "totals.data_wait_fraction");
    x.final_loss = rd.real(rd.member(t, "final_loss"), "totals.final_loss");
    x.skipped_steps = rd.integer(rd.member(t, "skipped_steps"), "totals.skipped_steps");
    x.final_loss_scale = rd.real(rd.member(t, "final_loss_scale"), "totals.final_loss_scale");
    x.peak = rd.bytes(rd.member(t, "peak"), "totals.peak");
    x.at_peak = rd.bytes(rd.member(t, "at_peak"), "totals.at_peak");
    x.peak_total = rd.integer(rd.member(t, "peak_total"), "totals.peak_total");
    x.train_peak = rd.integer(rd.member(t, "train_peak"), "totals.train_peak");
    x.at_train_peak = rd.bytes(rd.member(t, "at_train_peak"), "totals.at_train_peak");
    x.peak_rss_bytes = rd.integer(rd.member(t, "peak_rss_bytes"), "totals.peak_rss_bytes");
    r.totals = x;
  }
  r.final_metrics = rd.metrics(rd.member(doc, "final_metrics"), "final_metrics");
  return r;
}

RunRecord read_run_record(const std::filesystem::path& path) {
  const std::vector<uint8_t> bytes = io::read_file(path, uint64_t{1} << 30);
  return run_record_from_json(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                              "run record '" + path.string() + "'");
}

// ---- writing ----

void check_report_path(const std::filesystem::path& path) {
  std::error_code ec;
  DEMI_CHECK(!std::filesystem::is_directory(path, ec), "cannot write the report '", path.string(),
             "': that is a directory; give a file name such as '", (path / "run.html").string(), "'");
  io::AtomicFile probe(path, {.sync = false});  // throws, naming the path and the directory, when it cannot
  probe.abort();
}

void write_report(const std::filesystem::path& path, std::string_view text) {
  io::write_file_atomic(path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

}  // namespace demi::train
