#include "demi/train/report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <regex>

#include "demi/core/test_support.h"
#include "demi/data/data.h"
#include "demi/nn/models.h"
#include "demi/train/internal/test_util.h"
#include "demi/train/internal/svg_chart.h"
#include "demi/train/model.h"
#include "demi/train/report_html.h"

namespace demi::train {
namespace {

using test::Captured;

// Batches of 16 learnable toy rows (the label is the channel with the largest mean); the first row of
// batch `poison_batch` holds an Inf, so that step overflows and its loss is not finite (in every epoch).
std::shared_ptr<data::Dataset> toy_batches(int64_t batches, int64_t poison_batch) {
  data::RandomAccessSource src;
  src.size = batches * 16;
  src.get = [poison_batch](int64_t i) {
    Generator g(99 + static_cast<uint64_t>(i));
    int32_t label = static_cast<int32_t>(g.next_int(3));
    Tensor x = normal({3, 32, 32}, 0.0, 1.0, g);
    float* p = x.data<float>();
    for (int64_t k = 0; k < 32 * 32; ++k) p[label * 32 * 32 + k] += 1.0f;
    if (i == poison_batch * 16) p[3] = INFINITY;
    return data::Row{x, full({}, label, DType::kI32)};
  };
  return std::make_shared<data::GeneratorDataset>(src, std::vector<std::string>{"image", "label"})->batch(16);
}

// What the callbacks saw, to compare the record with.
class Spy : public Callback {
 public:
  void on_step_end(RunContext& ctx) override {
    losses.push_back(ctx.loss);
    scales.push_back(ctx.loss_scale);
    if (!ctx.overflow_op.empty()) overflow_steps.push_back(ctx.cur_step_num);
  }
  std::vector<float> losses;
  std::vector<double> scales;
  std::vector<int64_t> overflow_steps;
};

constexpr int64_t kBatches = 10, kEpochs = 2, kSteps = kBatches * kEpochs, kPoison = 3;

// One short real run at O2 float16 with a dynamic loss scale: 20 steps, of which steps 4 and 14 (batch 3
// of each epoch) overflow. Recorded once, shared by the tests below.
struct RecordedRun {
  RunRecord record, thin;  // `thin`: a recorder holding at most 8 memory samples
  Spy spy;
  int64_t thin_stride = 0;
  TrainSummary summary;

  RecordedRun() {
    Captured quiet;
    set_seed(4);
    auto net = std::make_shared<nn::SimpleCNN>(3);
    auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.001, 0.9);
    ModelOptions o;
    o.amp_level = amp::Level::kO2;
    o.low_dtype = DType::kF16;
    o.loss_scale_manager = std::make_shared<amp::DynamicLossScaleManager>(1024.0, 2.0, 5, amp::DynamicLossScaleOptions{});
    Model model(net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt, {}, o);
    auto recorder = std::make_shared<ReportRecorder>();
    auto thin_recorder = std::make_shared<ReportRecorder>(ReportOptions{.max_memory_samples = 8});
    auto spy_ptr = std::shared_ptr<Spy>(&spy, [](Spy*) {});
    recorder->record().set("model", "<script>alert(1)</script>");
    model.train(static_cast<int>(kEpochs), toy_batches(kBatches, kPoison), {recorder, thin_recorder, spy_ptr}, false);
    summary = model.last_summary();
    recorder->finish(summary, {{"test accuracy", 0.75}, {"test loss", 0.5}});
    record = recorder->record();
    thin = thin_recorder->record();
    thin_stride = thin_recorder->memory_stride();
  }
};

const RecordedRun& run() {
  static const RecordedRun* r = new RecordedRun();
  return *r;
}

TEST(Report, RecordsEveryStepOfARealRunAsTheCallbacksSawIt) {
  const RunRecord& r = run().record;
  ASSERT_EQ(static_cast<int64_t>(r.steps.size()), kSteps);
  ASSERT_EQ(run().spy.losses.size(), r.steps.size());
  for (size_t i = 0; i < r.steps.size(); ++i) {
    EXPECT_EQ(r.steps[i].step, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(r.steps[i].epoch, static_cast<int>(i) / kBatches + 1);
    const float seen = run().spy.losses[i];
    if (std::isnan(seen)) {
      EXPECT_TRUE(std::isnan(r.steps[i].loss)) << i;
    } else {
      EXPECT_EQ(r.steps[i].loss, seen) << i;
    }
    EXPECT_EQ(r.steps[i].loss_scale, run().spy.scales[i]) << i;
    EXPECT_EQ(r.steps[i].samples, 16);
    EXPECT_GT(r.steps[i].step_seconds, 0);
  }
  // The poisoned batches: their steps overflowed, were skipped, and the scale came down after them.
  for (int64_t i : {kPoison, kPoison + kBatches}) {
    const StepSample& bad = r.steps[static_cast<size_t>(i)];
    EXPECT_TRUE(bad.overflow && bad.skipped) << i;
    EXPECT_FALSE(std::isfinite(bad.loss)) << i;
    EXPECT_EQ(r.steps[static_cast<size_t>(i) + 1].loss_scale, bad.loss_scale / 2) << i;
  }
  int64_t skipped = 0;
  for (const StepSample& s : r.steps) skipped += s.skipped;
  EXPECT_EQ(skipped, 2);
  EXPECT_EQ(r.totals->skipped_steps, 2);

  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_EQ(r.epochs[1].epoch, 2);
  EXPECT_TRUE(r.epochs[1].metrics.count("loss"));
  EXPECT_EQ(r.final_metrics.at("test accuracy"), 0.75);
  ASSERT_TRUE(r.totals.has_value());
  EXPECT_EQ(r.totals->steps, kSteps);
  EXPECT_EQ(r.totals->peak_total, run().summary.peak.total_peak);
  // The settings the model knows were filled in; the caller's came first.
  EXPECT_EQ(r.settings.at(0).first, "model");
  ASSERT_NE(r.setting("AMP level"), nullptr);
  EXPECT_EQ(*r.setting("AMP level"), "O2");
  EXPECT_EQ(*r.setting("low dtype"), "float16");
  EXPECT_NE(r.setting("loss scale")->find("Dynamic"), std::string::npos) << *r.setting("loss scale");
  EXPECT_NE(r.setting("CPU"), nullptr);
  EXPECT_NE(r.setting("date"), nullptr);
}

TEST(Report, RecordsTheOverflowAttributionAndTheNonFiniteLossAsEvents) {
  const RunRecord& r = run().record;
  std::vector<std::pair<int, int64_t>> overflows, nonfinite;  // (epoch, step)
  for (const ReportEvent& e : r.events) {
    if (e.kind == ReportEvent::Kind::kOverflow) {
      overflows.emplace_back(e.epoch, e.step);
      EXPECT_FALSE(e.text.empty());
    }
    if (e.kind == ReportEvent::Kind::kNonFiniteLoss) nonfinite.emplace_back(e.epoch, e.step);
  }
  const std::vector<std::pair<int, int64_t>> poisoned = {{1, kPoison + 1}, {2, kBatches + kPoison + 1}};
  EXPECT_EQ(nonfinite, poisoned);
  // Each step the attribution named (every overflow step, with attribute_overflow on by default).
  ASSERT_EQ(overflows.size(), run().spy.overflow_steps.size());
  for (size_t i = 0; i < overflows.size(); ++i) EXPECT_EQ(overflows[i].second, run().spy.overflow_steps[i]);
  EXPECT_EQ(overflows, poisoned);
}

TEST(Report, SamplesMemoryByCategoryAtEachStepsPeak) {
  const RunRecord& r = run().record;
  ASSERT_EQ(static_cast<int64_t>(r.memory.size()), kSteps) << "short runs sample every step";
  for (const MemorySample& m : r.memory) {
    EXPECT_GT(m.bytes[static_cast<int>(MemCategory::kParameter)], 0);
    EXPECT_GT(m.bytes[static_cast<int>(MemCategory::kActivation)], 0) << "at a step's peak activations are live";
    EXPECT_GT(m.bytes[static_cast<int>(MemCategory::kCastCache)], 0) << "O2 casts the weights to float16";
    EXPECT_LE(m.total(), r.totals->peak_total);
  }
  // At most 8 samples: the stride doubled twice (1, 2, 4); samples at steps 1, 5, 9, 13, 17.
  const RunRecord& thin = run().thin;
  EXPECT_EQ(run().thin_stride, 4);
  ASSERT_EQ(thin.memory.size(), 5u);
  for (size_t i = 0; i < thin.memory.size(); ++i) EXPECT_EQ(thin.memory[i].step, 1 + 4 * static_cast<int64_t>(i));
}

TEST(Report, RecordsWarningsPromotionsAndOverflowsWithTheirStep) {
  ReportRecorder rec;
  RunContext ctx;
  ctx.epoch = 3;
  ctx.cur_step_num = 42;
  ctx.loss = 1.5f;
  ctx.warnings = {"12 of the last 200 steps were skipped"};
  ctx.overflow_op = "matmul bwd in 'net.fc' produced Inf";
  ctx.promotions = {"net.fc"};
  rec.on_step_begin(ctx);
  rec.on_step_end(ctx);
  const auto& ev = rec.record().events;
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].kind, ReportEvent::Kind::kWarning);
  EXPECT_EQ(ev[1].kind, ReportEvent::Kind::kOverflow);
  EXPECT_EQ(ev[1].text, ctx.overflow_op);
  EXPECT_EQ(ev[2].kind, ReportEvent::Kind::kPromotion);
  EXPECT_NE(ev[2].text.find("net.fc"), std::string::npos);
  for (const ReportEvent& e : ev) {
    EXPECT_EQ(e.epoch, 3);
    EXPECT_EQ(e.step, 42);
  }
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// The `d` of the path drawing series `name` in the svg with id `id`: how many points it draws.
int points_of(const std::string& html, const std::string& id, const std::string& name) {
  const size_t svg = html.find("<svg id=\"" + id + "\"");
  if (svg == std::string::npos) return -1;
  const size_t end = html.find("</svg>", svg);
  const std::string chart = html.substr(svg, end - svg);
  std::smatch m;
  const std::string quoted = std::regex_replace(name, std::regex(R"([()\[\].*+?^$|{}\\])"), R"(\$&)");
  const std::regex path("<path class=\"(line|area)\" data-series=\"" + quoted + "\" data-n=\"([0-9]+)\" d=\"([^\"]*)\"");
  if (!std::regex_search(chart, m, path)) return -2;
  const std::string d = m[3];
  int commands = 0;
  for (char c : d) commands += c == 'M' || c == 'L' || c == 'H';
  if (m[1] == "area") commands /= 2;  // a closed band: along the top and back along the bottom
  EXPECT_EQ(commands, std::stoi(m[2])) << d;
  return std::stoi(m[2]);
}

TEST(Report, HtmlHasOneSvgPerChartWithEveryStep) {
  const std::string html = render_report_html(run().record);
  EXPECT_EQ(count(html, "<svg"), 4u) << "loss, loss scale, throughput, memory";
  for (const char* id : {"loss", "scale", "throughput", "memory"})
    EXPECT_NE(html.find("<svg id=\"" + std::string(id) + "\""), std::string::npos) << id;
  // Every step but the two non-finite ones is a point of the loss line; those are gaps, marked and said.
  EXPECT_EQ(points_of(html, "loss", "per step"), kSteps - 2);
  EXPECT_NE(html.find("class=\"nonfinite\" data-n=\"2\""), std::string::npos);
  EXPECT_NE(html.find("with a non-finite value"), std::string::npos);
  EXPECT_EQ(points_of(html, "scale", "loss scale"), kSteps);
  EXPECT_EQ(points_of(html, "memory", "parameter"), kSteps);
  EXPECT_EQ(points_of(html, "memory", "activation"), kSteps);
  EXPECT_NE(html.find("data-series=\"overflow, step skipped\" data-n=\"2\""), std::string::npos);
  // The cards.
  EXPECT_NE(html.find(">test accuracy<"), std::string::npos);
  EXPECT_NE(html.find(">skipped steps<"), std::string::npos);
  EXPECT_NE(html.find(">final loss scale<"), std::string::npos);
  EXPECT_NE(html.find("<span class=\"kind overflow\">"), std::string::npos);
}

TEST(Report, HtmlIsSelfContainedAndEscapesEveryStringFromTheRun) {
  const std::string plain = render_report_html(run().record);
  for (const char* outside : {"http://", "https://", " src=", " href=", "<link", "<img", "url(http", "@import"})
    EXPECT_EQ(plain.find(outside), std::string::npos) << outside;
  RunRecord r = run().record;
  r.title = "a \"title\" & <b>more</b>";
  r.events.push_back({ReportEvent::Kind::kWarning, 1, 2, "<img src=x onerror=alert(2)>"});
  const std::string html = render_report_html(r);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("<b>more"), std::string::npos);
  EXPECT_NE(html.find("a &quot;title&quot; &amp; &lt;b&gt;more&lt;/b&gt;"), std::string::npos);
  // A run named like markup, in the comparison page's hover data (a script element): no "</script>" in it.
  RunRecord a = run().record, b = run().record;
  a.name = "</script><script>alert(3)</script>";
  b.name = "O0-fp32";
  const std::string cmp = render_comparison_html({a, b}, {});
  EXPECT_EQ(cmp.find("<script>alert(3)"), std::string::npos);
  EXPECT_NE(cmp.find("\\u003c/script>\\u003cscript>alert(3)"), std::string::npos);
}

TEST(Report, TheRecordRoundTripsThroughJson) {
  RunRecord r = run().record;
  r.name = "O2-fp16";
  r.steps[0].loss_scale = INFINITY;
  r.events.push_back({ReportEvent::Kind::kPromotion, 2, 11, "layer 'a\"b\\c\n' now runs in FP32"});
  const RunRecord back = run_record_from_json(run_record_to_json(r), "test");
  EXPECT_EQ(back.name, r.name);
  EXPECT_EQ(back.title, r.title);
  EXPECT_EQ(back.settings, r.settings);
  ASSERT_EQ(back.steps.size(), r.steps.size());
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const StepSample &x = r.steps[i], &y = back.steps[i];
    EXPECT_TRUE(x.loss == y.loss || (std::isnan(x.loss) && std::isnan(y.loss))) << i;
    EXPECT_EQ(x.loss_scale, y.loss_scale);
    EXPECT_EQ(x.step_seconds, y.step_seconds);
    EXPECT_EQ(x.data_wait_seconds, y.data_wait_seconds);
    EXPECT_EQ(std::tie(x.step, x.epoch, x.overflow, x.skipped, x.samples), std::tie(y.step, y.epoch, y.overflow, y.skipped, y.samples));
  }
  ASSERT_EQ(back.epochs.size(), r.epochs.size());
  EXPECT_EQ(back.epochs[1].metrics, r.epochs[1].metrics);
  EXPECT_EQ(back.epochs[1].samples_per_second, r.epochs[1].samples_per_second);
  ASSERT_EQ(back.memory.size(), r.memory.size());
  for (size_t i = 0; i < r.memory.size(); ++i) {
    EXPECT_EQ(back.memory[i].step, r.memory[i].step);
    EXPECT_EQ(back.memory[i].bytes, r.memory[i].bytes);
  }
  ASSERT_EQ(back.events.size(), r.events.size());
  EXPECT_EQ(back.events.back().text, r.events.back().text);
  EXPECT_EQ(back.events.back().kind, ReportEvent::Kind::kPromotion);
  ASSERT_TRUE(back.totals.has_value());
  EXPECT_EQ(back.totals->at_peak, r.totals->at_peak);
  EXPECT_EQ(back.totals->at_train_peak, r.totals->at_train_peak);
  EXPECT_EQ(back.totals->samples_per_second, r.totals->samples_per_second);
  EXPECT_EQ(back.final_metrics, r.final_metrics);
  test_support::expect_error([] { run_record_from_json("{\"format\":\"other\"}", "x.json"); },
                                        {"x.json", "not a demi run record"});
  test_support::expect_error(
      [&] {
        std::string j = run_record_to_json(r);
        j.replace(j.find("\"loss\":[\""), 9, "\"loss\":[\"oops");
        run_record_from_json(j, "y.json");
      },
      {"y.json", "steps.loss", "oops"});
}

TEST(Report, IsWrittenAtomicallyAndAnUnwritablePathIsNamed) {
  test_support::TempDir dir("demi_report");
  const std::filesystem::path path = dir / "run.html";
  check_report_path(path);
  EXPECT_FALSE(std::filesystem::exists(path)) << "the check leaves nothing behind";
  write_report(path, "<html>one</html>");
  write_report(path, "<html>two</html>");
  const std::vector<uint8_t> bytes = test_support::read_bytes(path);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "<html>two</html>");
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"run.html"}) << "no temporary file is left";

  const std::string missing = (dir / "no/such/dir/run.html").string();
  test_support::expect_error([&] { check_report_path(missing); }, {missing});
  test_support::expect_error([&] { write_report(missing, "x"); }, {missing});
  test_support::expect_error([&] { check_report_path(dir.path()); }, {dir.str(), "is a directory"});
}

TEST(Report, ComparisonHasTheTablesOverlaidCurvesBarsAndOneMemoryChartPerRun) {
  RunRecord a = run().record, b = run().record;
  a.name = "O0-fp32";
  b.name = "O2-fp16";
  ReportTable t{"samples/s and memory", {"setting", "samples/s", "x O0"}, {{"O0-fp32", "100", "1.00x"}, {"O2-fp16", "150", "1.50x"}}, ""};
  const std::string html = render_comparison_html({a, b}, {t});
  EXPECT_NE(html.find("<th>samples/s</th>"), std::string::npos);
  EXPECT_NE(html.find("<td>1.50x</td>"), std::string::npos);
  for (const char* id : {"cmp-loss", "cmp-scale", "cmp-throughput", "cmp-sps", "cmp-memory", "cmp-metric", "cmp-mem-0", "cmp-mem-1"})
    EXPECT_NE(html.find("<svg id=\"" + std::string(id) + "\""), std::string::npos) << id;
  EXPECT_EQ(count(html, "<svg"), 8u);
  // The smoothed lines carry on over the non-finite steps (the faint raw lines have the gaps).
  EXPECT_EQ(points_of(html, "cmp-loss", "O0-fp32"), kSteps);
  EXPECT_EQ(points_of(html, "cmp-loss", "O2-fp16"), kSteps);
  EXPECT_NE(html.find("<g class=\"bars\" data-n=\"2\">"), std::string::npos);
  EXPECT_NE(html.find(">O2-fp16</text>"), std::string::npos) << "bars are labelled by setting";
}

TEST(Report, LongRunsAreDrawnWithAtMost1500PointsPerLine) {
  RunRecord r;
  for (int64_t i = 1; i <= 4000; ++i)
    r.steps.push_back({.step = i, .epoch = 1, .loss = i == 2000 ? NAN : 1.0f / static_cast<float>(i), .loss_scale = 1,
                       .step_seconds = 0.01, .samples = 32});
  const std::string html = render_report_html(r);
  // Means of 3 steps: 1334 points, one of them (the run holding step 2000) a gap.
  EXPECT_EQ(points_of(html, "loss", "per step"), 1333);
  EXPECT_EQ(points_of(html, "throughput", "per step (train step only)"), 1334);
  EXPECT_NE(html.find("4000 steps drawn as 1334 points (means of 3 steps)"), std::string::npos);
  EXPECT_NE(html.find(">final loss<"), std::string::npos) << "the cards come from the steps without a summary";
}

TEST(SvgChart, TicksAreRoundAndLabelsShort) {
  EXPECT_EQ(internal::nice_ticks(0, 1, 5), (std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}));
  EXPECT_EQ(internal::nice_ticks(3, 97, 4), (std::vector<double>{20, 40, 60, 80}));
  EXPECT_EQ(internal::tick_label(0.25, 0.05), "0.25");
  EXPECT_EQ(internal::tick_label(20000, 5000), "20k");
  EXPECT_EQ(internal::tick_label(1500000, 500000), "1.5M");
  EXPECT_EQ(internal::short_number(0.28461), "0.2846");
  EXPECT_EQ(internal::short_number(NAN), "nan");
  EXPECT_EQ(internal::tick_label(6e27, 2e27), "6e+27");
  internal::LineChart c;
  c.id = "s";
  c.y.scale = internal::AxisScale::kLog2;
  c.series.push_back({.name = "scale", .color = "#000", .style = internal::Series::Style::kStep, .x = {1, 2, 3},
                      .y = {65536, 32768, 32768}});
  const std::string svg = internal::render_line_chart(c).svg;
  EXPECT_NE(svg.find(">2<tspan dy=\"-5\" font-size=\"9\">16</tspan>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">2<tspan dy=\"-5\" font-size=\"9\">15</tspan>"), std::string::npos) << svg;
}

}  // namespace
}  // namespace demi::train
