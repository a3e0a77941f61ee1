// The HTML pages of report_html.h, built from the record's data with the SVG charts of
// internal/svg_chart.h. Long runs are drawn with at most kMaxPoints points per line (means of equal runs
// of steps; a run holding a non-finite value stays a gap), the smoothing is computed on every step first.
#include "demi/train/report_html.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <set>

#include "demi/core/memory.h"
#include "demi/train/internal/svg_chart.h"

namespace demi::train {
namespace {

using internal::html_escape;
using internal::short_number;

constexpr size_t kMaxPoints = 1500;
constexpr size_t kMaxEventRows = 300;

// Run colours (a colour-blind-friendly qualitative palette) and one fixed colour per memory category.
constexpr const char* kPalette[] = {"#3b6fb6", "#e8772e", "#3a9a5b", "#c5463f", "#7b5ea7",
                                    "#2a9d9a", "#c99a16", "#d16aa4", "#8a6a4f", "#6b7280"};
constexpr const char* kMemColors[kNumMemCategories] = {"#3b6fb6", "#e8772e", "#3a9a5b", "#c5463f",
                                                       "#7b5ea7", "#c99a16", "#9ca3af", "#8a6a4f"};
static_assert(sizeof(kMemColors) / sizeof(kMemColors[0]) == kNumMemCategories, "one colour per MemCategory");
constexpr const char* kOverflowColor = "#c0392b";
constexpr size_t kData = static_cast<size_t>(MemCategory::kData);

const char* run_color(size_t i) { return kPalette[i % (sizeof(kPalette) / sizeof(kPalette[0]))]; }

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

std::string fixed(double v, int decimals) {
  if (!std::isfinite(v) || std::fabs(v) >= 1e7) return short_number(v);  // 7.3e+32, not 33 digits
  char b[48];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

// "2<sup>15</sup>" for exact powers of two, else the number.
std::string scale_html(double v) {
  if (v > 0 && std::isfinite(v)) {
    const double e = std::log2(v);
    if (e == std::round(e) && std::fabs(e) < 1024) return "2<sup>" + std::to_string(static_cast<int>(e)) + "</sup>";
  }
  return html_escape(short_number(v));
}

// Debiased exponential moving average over the finite values, its window growing with the run's length
// (a run of a few dozen steps is drawn as it is).
std::vector<double> smoothed(const std::vector<double>& y) {
  const double window = std::clamp(static_cast<double>(y.size()) / 15.0, 1.0, 60.0);
  const double beta = 1.0 - 1.0 / window;
  std::vector<double> out(y.size(), std::nan(""));
  double m = 0, c = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (std::isfinite(y[i])) {
      m = beta * m + (1 - beta) * y[i];
      c = beta * c + (1 - beta);
    }
    if (c > 0) out[i] = m / c;
  }
  return out;
}

// At most kMaxPoints points: means of equal runs of consecutive points; a run with a non-finite y is NaN.
struct Points {
  std::vector<double> x, y;
  size_t per_point = 1;
};
Points thinned(const std::vector<double>& x, const std::vector<double>& y) {
  Points p;
  if (x.size() <= kMaxPoints) {
    p.x = x;
    p.y = y;
    return p;
  }
  p.per_point = (x.size() + kMaxPoints - 1) / kMaxPoints;
  for (size_t i = 0; i < x.size(); i += p.per_point) {
    const size_t end = std::min(x.size(), i + p.per_point);
    double sx = 0, sy = 0;
    bool finite = true;
    for (size_t k = i; k < end; ++k) {
      sx += x[k];
      sy += y[k];
      finite = finite && std::isfinite(y[k]);
    }
    const double n = static_cast<double>(end - i);
    p.x.push_back(sx / n);
    p.y.push_back(finite ? sy / n : std::nan(""));
  }
  return p;
}

std::vector<double> step_x(const RunRecord& r) {
  std::vector<double> x;
  for (const StepSample& s : r.steps) x.push_back(static_cast<double>(s.step));
  return x;
}
std::vector<double> step_loss(const RunRecord& r) {
  std::vector<double> y;
  for (const StepSample& s : r.steps) y.push_back(s.loss);
  return y;
}
std::vector<double> step_rate(const RunRecord& r) {
  std::vector<double> y;
  for (const StepSample& s : r.steps)
    y.push_back(s.step_seconds > 0 ? static_cast<double>(s.samples) / s.step_seconds : std::nan(""));
  return y;
}

// The numbers the cards show, from the totals when finish() ran, else from the steps.
struct KeyNumbers {
  double final_loss = std::nan("");
  bool loss_of_last_step = false;  // no epoch was completed: the last step's loss stands in
  double samples_per_second = 0;
  double median_step_ms = 0;
  int64_t skipped = 0;
  int64_t steps = 0;
  double final_scale = 1;
  int64_t peak = -1, rss = -1;
  double seconds = 0;
};

KeyNumbers key_numbers(const RunRecord& r) {
  KeyNumbers k;
  k.steps = static_cast<int64_t>(r.steps.size());
  for (const StepSample& s : r.steps) k.skipped += s.skipped;
  if (!r.steps.empty()) k.final_scale = r.steps.back().loss_scale;
  if (!r.epochs.empty() && r.epochs.back().metrics.count("loss")) {
    k.final_loss = r.epochs.back().metrics.at("loss");
  } else if (!r.steps.empty()) {
    k.final_loss = r.steps.back().loss;
    k.loss_of_last_step = true;
  }
  double sec = 0;
  int64_t samples = 0;
  std::vector<double> times;
  for (const StepSample& s : r.steps) {
    sec += s.step_seconds;
    samples += s.samples;
    times.push_back(s.step_seconds);
  }
  k.seconds = sec;
  if (sec > 0) k.samples_per_second = static_cast<double>(samples) / sec;
  if (!times.empty()) {
    std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
    k.median_step_ms = 1e3 * times[times.size() / 2];
  }
  if (r.totals && !r.epochs.empty()) k.final_loss = r.totals->final_loss;
  if (r.totals) {
    const RunTotals& t = *r.totals;
    k.samples_per_second = t.samples_per_second;
    k.median_step_ms = 1e3 * t.median_step_seconds;
    k.skipped = t.skipped_steps;
    k.final_scale = t.final_loss_scale;
    k.peak = t.peak_total;
    k.rss = t.peak_rss_bytes;
    k.seconds = t.seconds;
  } else if (!r.memory.empty()) {
    k.peak = 0;
    for (const MemorySample& m : r.memory) k.peak = std::max(k.peak, m.total());
  }
  return k;
}

// ---- page parts ----

constexpr const char* kStyle = R"css(
:root{--ink:#1f2933;--muted:#667085;--line:#e4e7ec;--bg:#f5f6f8;--card:#fff;--accent:#3b6fb6}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1380px;margin:0 auto;padding:28px 28px 40px}
header.top{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:20px 24px;margin-bottom:18px}
header.top h1{margin:0 0 2px;font-size:22px;font-weight:650;letter-spacing:-.01em}
header.top .sub{color:var(--muted);margin:0 0 14px}
dl.settings{display:grid;grid-template-columns:repeat(auto-fill,minmax(380px,1fr));gap:6px 28px;margin:0}
dl.settings div{display:flex;gap:10px;min-width:0;border-top:1px solid var(--line);padding-top:6px}
dl.settings dt{color:var(--muted);flex:0 0 96px}
dl.settings dd{margin:0;overflow-wrap:anywhere}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(128px,1fr));gap:12px;margin-bottom:18px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 14px;min-width:0}
.card .v{font-size:24px;font-weight:650;letter-spacing:-.02em;font-variant-numeric:tabular-nums;white-space:nowrap;
  overflow:hidden;text-overflow:ellipsis}
.card .v small{font-size:14px;font-weight:500;color:var(--muted);margin-left:3px}
.card .k{color:var(--ink);font-weight:550;margin-top:2px}
.card .n{color:var(--muted);font-size:12px;overflow-wrap:anywhere}
.card.warn{border-color:#f0b4ad;background:#fff8f7}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:16px;margin-bottom:18px}
.charts.small{grid-template-columns:repeat(auto-fill,minmax(400px,1fr))}
figure{margin:0;background:var(--card);border:1px solid var(--line);border-radius:10px;padding:14px 16px 10px;min-width:0}
figure.wide{grid-column:1/-1}
figcaption h3{margin:0;font-size:15px;font-weight:620}
figcaption p{margin:2px 0 6px;color:var(--muted);font-size:12.5px}
figure p.note{margin:4px 0 0;color:#9a3412;font-size:12.5px}
svg.chart{width:100%;height:auto;display:block;font-size:11px;font-family:inherit}
svg.chart text{fill:#475467}
svg.chart .label{fill:#344054;font-size:12px;font-weight:550}
svg.chart .legend text{font-size:12px;fill:#344054}
svg.chart .grid line{stroke:#eef0f3}
svg.chart .axis .base,svg.chart .axis .tick{stroke:#98a2b3}
svg.chart .mark line{stroke:#c3c8d0;stroke-dasharray:3 3}
svg.chart .mark text{fill:#98a2b3;font-size:10.5px}
svg.chart .clipnote{fill:#9a3412;font-size:10.5px}
svg.chart .value{fill:#344054;font-size:11.5px;font-weight:600}
svg.chart .guide{stroke:#667085;stroke-width:1;stroke-dasharray:2 2}
section.block{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 18px;margin-bottom:18px}
section.block h2{margin:0 0 10px;font-size:16px;font-weight:620}
section.block p.empty{color:var(--muted);margin:0}
section.block p.note{color:var(--muted);font-size:12.5px;margin:8px 0 0}
.tablewrap{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:6px 10px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap}
th{color:var(--muted);font-weight:600;font-size:12.5px;background:#fafbfc}
th:first-child,td:first-child,th.l,td.l{text-align:left}
table.compact{width:auto}table.compact th,table.compact td{padding:6px 22px 6px 10px}
td.text{text-align:left;white-space:normal;overflow-wrap:anywhere;min-width:320px}
tbody tr:nth-child(even){background:#fbfcfd}
.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:7px;vertical-align:-1px}
.kind{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600}
.kind.warning{background:#fef0c7;color:#93370d}.kind.overflow{background:#fee4e2;color:#b42318}
.kind.promotion{background:#e0eaff;color:#2d3fa8}.kind.non-finite{background:#f2e6ff;color:#6927a6}
.chips{display:flex;flex-wrap:wrap;gap:8px 16px;margin-top:12px}
.chips span{white-space:nowrap}
footer{color:var(--muted);font-size:12px;text-align:center;margin-top:8px}
#tip{position:fixed;pointer-events:none;background:rgba(255,255,255,.97);border:1px solid #d0d5dd;border-radius:8px;
  box-shadow:0 4px 14px rgba(16,24,40,.12);padding:7px 10px;font-size:12px;display:none;z-index:10;min-width:120px}
#tip b{display:block;margin-bottom:3px;font-weight:600}
#tip div{display:flex;align-items:center;gap:6px;white-space:nowrap}
#tip i{display:inline-block;width:9px;height:9px;border-radius:2px}
#tip span.v{margin-left:auto;padding-left:12px;font-variant-numeric:tabular-nums;font-weight:600}
)css";

// Hover readouts: for each chart with data, the nearest x of every series under the pointer. Builds its
// tooltip with textContent only (no markup from the data).
constexpr const char* kScript = R"js(
(function(){
  var tip=document.getElementById('tip');
  function fmt(v,pow2){if(typeof v==='string')return v;var a=Math.abs(v),e=Math.log2(a);
    if(pow2&&a>0&&e===Math.round(e))return '2^'+e+' = '+v.toLocaleString('en-US');
    if(a!==0&&(a<1e-3||a>=1e7))return v.toExponential(2);if(a>=1000)return Math.round(v).toLocaleString('en-US');
    return String(+v.toPrecision(4));}
  function near(xs,x){var lo=0,hi=xs.length-1;if(hi<0)return -1;while(hi-lo>1){var m=(lo+hi)>>1;if(xs[m]<x)lo=m;else hi=m;}
    return Math.abs(xs[lo]-x)<=Math.abs(xs[hi]-x)?lo:hi;}
  document.querySelectorAll('svg.chart[data-hover]').forEach(function(svg){
    var el=document.getElementById(svg.id+'-data');if(!el)return;
    var d=JSON.parse(el.textContent),guide=svg.querySelector('.guide');
    function hide(){tip.style.display='none';if(guide)guide.setAttribute('visibility','hidden');}
    svg.addEventListener('mouseleave',hide);
    svg.addEventListener('mousemove',function(ev){
      var pt=svg.createSVGPoint();pt.x=ev.clientX;pt.y=ev.clientY;var p=pt.matrixTransform(svg.getScreenCTM().inverse());
      if(p.x<d.px0-4||p.x>d.px1+4){hide();return;}
      var x=d.x0+(p.x-d.px0)/(d.px1-d.px0)*(d.x1-d.x0),gx=null,rows=[];
      // The first series (the densest) says which x; the others are listed when they have a point there.
      var tol=0.01*(d.x1-d.x0);
      d.series.forEach(function(s){var i=near(s.x,x);if(i<0)return;if(gx===null)gx=s.x[i];
        if(Math.abs(s.x[i]-gx)<=tol)rows.push([s.name,s.color,s.y[i]]);});
      if(gx===null){hide();return;}
      tip.textContent='';var b=document.createElement('b');b.textContent=d.xlabel+' '+fmt(gx);tip.appendChild(b);
      rows.forEach(function(r){var row=document.createElement('div'),sw=document.createElement('i'),n=document.createElement('span'),
        v=document.createElement('span');sw.style.background=r[1];n.textContent=r[0];v.className='v';v.textContent=fmt(r[2],d.pow2)+d.unit;
        row.appendChild(sw);row.appendChild(n);row.appendChild(v);tip.appendChild(row);});
      tip.style.display='block';var w=tip.offsetWidth,h=tip.offsetHeight,left=ev.clientX+14,top=ev.clientY+14;
      if(left+w>window.innerWidth-8)left=ev.clientX-w-14;if(top+h>window.innerHeight-8)top=ev.clientY-h-14;
      tip.style.left=left+'px';tip.style.top=top+'px';
      if(guide){var gp=d.px0+(gx-d.x0)/(d.x1-d.x0)*(d.px1-d.px0);guide.setAttribute('x1',gp);guide.setAttribute('x2',gp);
        guide.setAttribute('visibility','visible');}
    });
  });
})();
)js";

class Page {
 public:
  std::string body;

  void figure(const std::string& title, const std::string& caption, const internal::Rendered& r, const std::string& id,
              bool wide = false, std::string extra_note = "") {
    body += std::string("<figure") + (wide ? " class=\"wide\"" : "") + "><figcaption><h3>" + html_escape(title) +
            "</h3>";
    if (!caption.empty()) body += "<p>" + html_escape(caption) + "</p>";
    body += "</figcaption>" + r.svg;
    const std::string note = r.note + extra_note;
    if (!note.empty()) body += "<p class=\"note\">" + html_escape(note) + "</p>";
    body += "</figure>";
    if (!r.hover_json.empty())
      scripts_ += "<script type=\"application/json\" id=\"" + html_escape(id) + "-data\">" + r.hover_json + "</script>\n";
  }

  std::string html(const std::string& title) const {
    return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
           "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>" +
           html_escape(title) + "</title><style>" + kStyle + "</style></head>\n<body><main>\n" + body +
           "<footer>demi training report \xC2\xB7 one self-contained file: the charts are inline SVG, nothing is "
           "loaded from elsewhere</footer>\n</main><div id=\"tip\"></div>\n" +
           scripts_ + "<script>" + kScript + "</script></body></html>\n";
  }

 private:
  std::string scripts_;
};

std::string card(const std::string& value_html, const std::string& label, const std::string& note, bool warn = false) {
  return std::string("<div class=\"card") + (warn ? " warn" : "") + "\"><div class=\"v\">" + value_html +
         "</div><div class=\"k\">" + html_escape(label) + "</div><div class=\"n\">" + html_escape(note) + "</div></div>";
}

std::string settings_html(const std::vector<std::pair<std::string, std::string>>& settings) {
  std::string s = "<dl class=\"settings\">";
  for (const auto& [k, v] : settings) s += "<div><dt>" + html_escape(k) + "</dt><dd>" + html_escape(v) + "</dd></div>";
  return s + "</dl>";
}

std::string date_of(const RunRecord& r) {
  const std::string* d = r.setting("date");
  return d ? *d : std::string();
}

// The first step of every epoch after the first: where the charts draw a faint line.
std::vector<std::pair<double, std::string>> epoch_marks(const RunRecord& r) {
  std::vector<std::pair<double, std::string>> marks;
  for (size_t i = 1; i < r.steps.size(); ++i)
    if (r.steps[i].epoch != r.steps[i - 1].epoch)
      marks.emplace_back(static_cast<double>(r.steps[i].step) - 0.5, "epoch " + std::to_string(r.steps[i].epoch));
  return marks;
}

// The last step of each epoch (where its per-epoch values are drawn).
std::map<int, double> epoch_end_steps(const RunRecord& r) {
  std::map<int, double> out;
  for (const StepSample& s : r.steps) out[s.epoch] = static_cast<double>(s.step);
  return out;
}

bool is_loss_name(const std::string& k) {
  std::string l = k;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  return l.find("loss") != std::string::npos;
}

std::string thinning_note(const Points& p, size_t steps) {
  if (p.per_point <= 1) return "";
  return std::to_string(steps) + " steps drawn as " + std::to_string(p.x.size()) + " points (means of " +
         std::to_string(p.per_point) + " steps). ";
}

// The per-step line (thinned to the chart's points) and, from 8 steps on, its smoothed line; *note says
// how the steps were thinned.
void add_step_lines(internal::LineChart& c, const std::vector<double>& x, const std::vector<double>& y,
                    const std::string& raw_name, const char* raw_color, const char* smooth_color, std::string* note) {
  Points raw = thinned(x, y), smooth = thinned(x, smoothed(y));
  *note = thinning_note(raw, x.size());
  c.series.push_back({.name = raw_name, .color = raw_color, .x = raw.x, .y = raw.y, .width = 1.2});
  if (x.size() >= 8)
    c.series.push_back({.name = "smoothed", .color = smooth_color, .x = smooth.x, .y = smooth.y, .width = 2.4});
}

// ---- one run's charts ----

internal::Rendered loss_chart(const RunRecord& r, const std::string& id, std::string* note) {
  internal::LineChart c;
  c.id = id;
  c.x = {.label = "step", .integer = true};
  c.y = {.label = "loss", .robust_max = true};
  c.x_marks = epoch_marks(r);
  c.nonfinite_label = "non-finite loss";
  add_step_lines(c, step_x(r), step_loss(r), "per step", "#9db7de", kPalette[0], note);
  // Per-epoch losses at each epoch's last step: the train mean, and eval losses when they were run.
  const std::map<int, double> ends = epoch_end_steps(r);
  std::map<std::string, internal::Series> per_epoch;
  size_t colour = 1;
  for (const EpochSample& e : r.epochs) {
    auto end = ends.find(e.epoch);
    if (end == ends.end()) continue;
    for (const auto& [k, v] : e.metrics) {
      if (!is_loss_name(k)) continue;
      auto [it, fresh] = per_epoch.try_emplace(k);
      if (fresh) {
        it->second.name = k == "loss" ? "epoch mean" : k;
        it->second.color = k == "loss" ? "#1d3f73" : run_color(colour++);
        it->second.style = internal::Series::Style::kDots;
        it->second.width = 4.5;
      }
      it->second.x.push_back(end->second);
      it->second.y.push_back(v);
      it->second.titles.push_back("epoch " + std::to_string(e.epoch) + " " + it->second.name + ": " + short_number(v));
    }
  }
  for (auto& [k, s] : per_epoch) c.series.push_back(std::move(s));
  for (const auto& [k, v] : r.final_metrics) {
    if (!is_loss_name(k) || r.steps.empty()) continue;
    c.series.push_back({.name = k, .color = run_color(colour++), .style = internal::Series::Style::kRing,
                        .x = {static_cast<double>(r.steps.back().step)}, .y = {v}, .width = 5,
                        .titles = {k + ": " + short_number(v)}});
  }
  return internal::render_line_chart(c);
}

// Overflow steps of one run as dots on its loss-scale line (skipped: filled; applied anyway: a ring),
// each with its attribution when there was one.
void overflow_series(const RunRecord& r, const std::string& color, const std::string& prefix,
                     std::vector<internal::Series>& out) {
  std::map<int64_t, std::string> why;
  for (const ReportEvent& e : r.events)
    if (e.kind == ReportEvent::Kind::kOverflow && !why.count(e.step)) why[e.step] = e.text;
  internal::Series skipped{.name = prefix + "overflow, step skipped", .color = color,
                           .style = internal::Series::Style::kDots, .width = 3.6, .hover = false};
  internal::Series applied{.name = prefix + "overflow, update applied", .color = color,
                           .style = internal::Series::Style::kRing, .width = 3.6, .hover = false};
  for (const StepSample& s : r.steps) {
    if (!s.overflow && !s.skipped) continue;
    internal::Series& dst = s.skipped ? skipped : applied;
    dst.x.push_back(static_cast<double>(s.step));
    dst.y.push_back(s.loss_scale);
    auto w = why.find(s.step);
    dst.titles.push_back("step " + std::to_string(s.step) + " (epoch " + std::to_string(s.epoch) + "), loss scale " +
                         short_number(s.loss_scale) + (s.skipped ? ": skipped" : ": applied") +
                         (w != why.end() ? " \xE2\x80\x94 " + w->second : std::string()));
  }
  if (!skipped.x.empty()) out.push_back(std::move(skipped));
  if (!applied.x.empty()) out.push_back(std::move(applied));
}

internal::Rendered loss_scale_chart(const RunRecord& r, const std::string& id) {
  internal::LineChart c;
  c.id = id;
  c.x = {.label = "step", .integer = true};
  c.y = {.label = "loss scale", .scale = internal::AxisScale::kLog2};
  c.x_marks = epoch_marks(r);
  std::vector<double> x = step_x(r), y;
  for (const StepSample& s : r.steps) y.push_back(s.loss_scale);
  c.series.push_back({.name = "loss scale", .color = kPalette[0], .style = internal::Series::Style::kStep, .x = x,
                      .y = y, .width = 2});
  overflow_series(r, kOverflowColor, "", c.series);
  return internal::render_line_chart(c);
}

internal::Rendered throughput_chart(const RunRecord& r, const std::string& id, std::string* note) {
  internal::LineChart c;
  c.id = id;
  c.x = {.label = "step", .integer = true};
  c.y = {.label = "samples/s", .from_zero = true, .robust_max = true};
  c.x_marks = epoch_marks(r);
  c.nonfinite_label = "not timed";
  add_step_lines(c, step_x(r), step_rate(r), "per step (train step only)", "#a8d5b5", kPalette[2], note);
  const std::map<int, double> ends = epoch_end_steps(r);
  internal::Series epochs{.name = "epoch average (with data waits)", .color = "#1f5f35",
                          .style = internal::Series::Style::kDots, .width = 4.5};
  for (const EpochSample& e : r.epochs) {
    auto end = ends.find(e.epoch);
    if (end == ends.end() || !(e.samples_per_second > 0)) continue;
    epochs.x.push_back(end->second);
    epochs.y.push_back(e.samples_per_second);
    epochs.titles.push_back("epoch " + std::to_string(e.epoch) + ": " + short_number(e.samples_per_second) +
                            " samples/s over " + fixed(e.seconds, 2) + " s");
  }
  if (!epochs.x.empty()) c.series.push_back(std::move(epochs));
  return internal::render_line_chart(c);
}

internal::StackedArea memory_area(const RunRecord& r, const std::string& id) {
  internal::StackedArea c;
  c.id = id;
  c.x = {.label = "step", .integer = true};
  c.y = {.label = "MiB"};
  c.hover_unit = " MiB";
  for (const MemorySample& m : r.memory) c.x_values.push_back(static_cast<double>(m.step));
  for (int k = 0; k < kNumMemCategories; ++k) {
    if (static_cast<size_t>(k) == kData) continue;
    internal::Layer l{mem_category_name(static_cast<MemCategory>(k)), kMemColors[k], {}};
    for (const MemorySample& m : r.memory) l.values.push_back(mib(m.bytes[static_cast<size_t>(k)]));
    c.layers.push_back(std::move(l));
  }
  return c;
}

// The data set's memory (left out of the memory charts: a data set held whole is tens of MiB, the same at
// every AMP level, and would flatten the training's own memory into a thin band).
std::string data_note(const RunRecord& r) {
  int64_t lo = INT64_MAX, hi = 0;
  for (const MemorySample& m : r.memory) {
    lo = std::min(lo, m.bytes[kData]);
    hi = std::max(hi, m.bytes[kData]);
  }
  if (hi == 0) return "";
  return " The data set and its batches (" + fixed(mib(lo), 1) + (hi != lo ? "\xE2\x80\x93" + fixed(mib(hi), 1) : "") +
         " MiB) are left out.";
}

std::string memory_caption(const RunRecord& r) {
  if (r.memory.empty()) return "No step was sampled.";
  int64_t stride = r.memory.size() >= 2 ? r.memory[1].step - r.memory[0].step : 1;
  return "Tracked tensor memory at the peak of " + std::string(stride > 1 ? "every " + std::to_string(stride) + "th step"
                                                                              : "every step") +
         ": what each category held when the step's total was highest." + data_note(r);
}

std::string events_table(const std::vector<std::pair<std::string, const ReportEvent*>>& events, bool with_run,
                         const std::map<std::string, std::string>& colors) {
  if (events.empty()) return "<p class=\"empty\">No warnings, overflow attributions, AMP promotions or non-finite losses.</p>";
  std::string s = "<div class=\"tablewrap\"><table><thead><tr>";
  if (with_run) s += "<th>setting</th>";
  s += std::string("<th") + (with_run ? " class=\"l\"" : "") + ">kind</th><th>epoch</th><th>step</th><th class=\"l\">what</th>"
       "</tr></thead><tbody>";
  size_t shown = 0;
  for (const auto& [run, e] : events) {
    if (shown++ == kMaxEventRows) break;
    std::string kind = report_event_kind_name(e->kind);
    std::string css = e->kind == ReportEvent::Kind::kNonFiniteLoss ? "non-finite" : kind;
    s += "<tr>";
    if (with_run) {
      auto c = colors.find(run);
      s += "<td>" + (c != colors.end() ? "<span class=\"sw\" style=\"background:" + c->second + "\"></span>" : std::string()) +
           html_escape(run) + "</td>";
    }
    s += std::string("<td") + (with_run ? " class=\"l\"" : "") + "><span class=\"kind " + css + "\">" + html_escape(kind) + "</span></td><td>" + std::to_string(e->epoch) +
         "</td><td>" + std::to_string(e->step) + "</td><td class=\"text\">" + html_escape(e->text) + "</td></tr>";
  }
  s += "</tbody></table></div>";
  if (events.size() > kMaxEventRows)
    s += "<p class=\"note\">" + std::to_string(events.size() - kMaxEventRows) +
         " more events are not shown (the run record holds them all).</p>";
  return s;
}

std::string epochs_table(const RunRecord& r) {
  if (r.epochs.empty()) return "<p class=\"empty\">No epoch was completed.</p>";
  std::set<std::string> keys;
  for (const EpochSample& e : r.epochs)
    for (const auto& [k, v] : e.metrics) keys.insert(k);
  std::map<int, int64_t> steps;
  for (const StepSample& s : r.steps) ++steps[s.epoch];
  std::string s = "<div class=\"tablewrap\"><table class=\"compact\"><thead><tr><th>epoch</th><th>steps</th><th>seconds</th>"
                  "<th>samples/s</th>";
  for (const std::string& k : keys) s += "<th>" + html_escape(k == "loss" ? "train loss (mean)" : k) + "</th>";
  s += "</tr></thead><tbody>";
  for (const EpochSample& e : r.epochs) {
    s += "<tr><td>" + std::to_string(e.epoch) + "</td><td>" + std::to_string(steps[e.epoch]) + "</td><td>" +
         fixed(e.seconds, 2) + "</td><td>" + fixed(e.samples_per_second, 0) + "</td>";
    for (const std::string& k : keys) {
      auto it = e.metrics.find(k);
      s += "<td>" + (it == e.metrics.end() ? std::string("\xE2\x80\x94") : html_escape(short_number(it->second))) + "</td>";
    }
    s += "</tr>";
  }
  return s + "</tbody></table></div>";
}

std::string cards_html(const RunRecord& r) {
  const KeyNumbers k = key_numbers(r);
  std::string s = "<section class=\"cards\">";
  s += card(html_escape(fixed(k.final_loss, 4)), "final loss",
            k.loss_of_last_step ? "the last step's (no epoch was completed)" : "mean train loss of the last epoch",
            !std::isfinite(k.final_loss));
  for (const auto& [name, v] : r.final_metrics) {
    const bool fraction = !is_loss_name(name) && v >= 0 && v <= 1;
    s += card(fraction ? fixed(100 * v, 2) + "<small>%</small>" : html_escape(fixed(v, 4)), name, "after training");
  }
  s += card(html_escape(fixed(k.samples_per_second, 0)), "samples/s",
            r.totals ? "steady state, over " + std::to_string(k.steps) + " steps" : "over the train steps");
  s += card(html_escape(fixed(k.median_step_ms, 2)) + "<small>ms</small>", "median step", "the train step, without data waits");
  if (k.peak >= 0)
    s += card(html_escape(fixed(mib(k.peak), 1)) + "<small>MiB</small>", "peak memory",
              k.rss > 0 ? "tracked tensors; process peak RSS " + fixed(mib(k.rss), 0) + " MiB" : "tracked tensors");
  const double share = k.steps > 0 ? 100.0 * static_cast<double>(k.skipped) / static_cast<double>(k.steps) : 0;
  s += card(std::to_string(k.skipped) + "<small>of " + std::to_string(k.steps) + "</small>", "skipped steps",
            k.skipped > 0 ? fixed(share, 1) + "% of the updates were lost to overflow" : "every update was applied",
            share > 5);
  // "DynamicLossScaleManager(scale=..., ...)" -> "dynamic scale" (the header has the whole description).
  std::string manager = r.setting("loss scale") ? *r.setting("loss scale") : std::string();
  manager = manager.starts_with("Dynamic") ? "dynamic scale"
            : manager.starts_with("Fixed") ? "fixed scale"
            : manager == "none"            ? "no loss scaling"
                                           : manager.substr(0, manager.find('('));
  s += card(scale_html(k.final_scale), "final loss scale", manager);
  s += card(html_escape(fixed(k.seconds, 1)) + "<small>s</small>", "wall time",
            std::to_string(r.epochs.size()) + " epoch" + (r.epochs.size() == 1 ? "" : "s"));
  return s + "</section>";
}

std::vector<std::pair<std::string, const ReportEvent*>> events_of(const RunRecord& r) {
  std::vector<std::pair<std::string, const ReportEvent*>> out;
  for (const ReportEvent& e : r.events) out.emplace_back(r.label(), &e);
  return out;
}

}  // namespace

std::string render_report_html(const RunRecord& r) {
  Page page;
  const std::string title = r.title.empty() ? std::string("demi training report") : r.title;
  const std::string date = date_of(r);
  page.body += "<header class=\"top\"><h1>" + html_escape(title) + "</h1><p class=\"sub\">demi training report" +
               (date.empty() ? std::string() : " \xC2\xB7 " + html_escape(date)) + "</p>" + settings_html(r.settings) +
               "</header>\n";
  page.body += cards_html(r) + "\n<section class=\"charts\">";

  std::string note;
  internal::Rendered loss = loss_chart(r, "loss", &note);
  page.figure("Training loss", "Per step, smoothed, and the mean of each epoch.", loss, "loss", false, note);
  bool scaled = false;
  for (const StepSample& s : r.steps) scaled = scaled || s.loss_scale != 1 || s.overflow;
  page.figure("Loss scale",
              scaled ? "Per step on a log2 axis; overflow steps marked (hover a dot for the op that overflowed)."
                     : "No loss scaling in this run: the scale is 1 throughout.",
              loss_scale_chart(r, "scale"), "scale");
  internal::Rendered rate = throughput_chart(r, "throughput", &note);
  page.figure("Throughput", "Samples per second of each train step, and of each epoch as a whole.", rate, "throughput",
              false, note);
  page.figure("Memory by category", memory_caption(r), internal::render_stacked_area(memory_area(r, "memory")), "memory");

  // Per-epoch metrics that are not losses (accuracy and the like from an eval callback), when there are some.
  std::map<std::string, internal::Series> metric_series;
  size_t colour = 0;
  for (const EpochSample& e : r.epochs)
    for (const auto& [k, v] : e.metrics) {
      if (is_loss_name(k)) continue;
      auto [it, fresh] = metric_series.try_emplace(k);
      if (fresh) it->second = {.name = k, .color = run_color(colour++), .width = 2.2};
      it->second.x.push_back(e.epoch);
      it->second.y.push_back(v);
    }
  if (!metric_series.empty()) {
    internal::LineChart c;
    c.id = "metrics";
    c.x = {.label = "epoch", .integer = true};
    c.y = {.label = "value"};
    for (auto& [k, s] : metric_series) {
      internal::Series dots = s;
      dots.name = "";
      dots.style = internal::Series::Style::kDots;
      dots.width = 3.5;
      c.series.push_back(std::move(s));
      c.series.push_back(std::move(dots));
    }
    page.figure("Metrics per epoch", "Evaluated at the end of each epoch.", internal::render_line_chart(c), "metrics", true);
  }
  page.body += "</section>\n";
  page.body += "<section class=\"block\"><h2>Epochs</h2>" + epochs_table(r) + "</section>\n";
  page.body += "<section class=\"block\"><h2>Events</h2>" + events_table(events_of(r), false, {}) + "</section>\n";
  return page.html(title);
}

std::string render_comparison_html(const std::vector<RunRecord>& runs, const std::vector<ReportTable>& tables,
                                   const std::string& title_in) {
  Page page;
  // The settings every run shares go in the header; the rest tell the runs apart (they are in the tables).
  std::vector<std::pair<std::string, std::string>> common;
  if (!runs.empty())
    for (const auto& [k, v] : runs[0].settings) {
      bool same = k != "date";
      for (const RunRecord& r : runs) {
        const std::string* o = r.setting(k);
        same = same && o != nullptr && *o == v;
      }
      if (same) common.emplace_back(k, v);
    }
  std::string title = title_in;
  if (title.empty()) {
    title = "demi compare";
    for (const auto& [k, v] : common)
      if (k == "model" || k == "data") title += (title == "demi compare" ? ": " : ", ") + k + " " + v;
  }
  const std::string date = runs.empty() ? std::string() : date_of(runs[0]);
  std::map<std::string, std::string> colors;
  std::string chips = "<div class=\"chips\">";
  for (size_t i = 0; i < runs.size(); ++i) {
    colors[runs[i].label()] = run_color(i);
    chips += "<span><span class=\"sw\" style=\"background:" + std::string(run_color(i)) + "\"></span>" +
             html_escape(runs[i].label()) + "</span>";
  }
  chips += "</div>";
  page.body += "<header class=\"top\"><h1>" + html_escape(title) + "</h1><p class=\"sub\">demi comparison report \xC2\xB7 " +
               std::to_string(runs.size()) + " settings, each trained in its own process" +
               (date.empty() ? std::string() : " \xC2\xB7 " + html_escape(date)) + "</p>" + settings_html(common) + chips +
               "</header>\n";

  for (const ReportTable& t : tables) {
    page.body += "<section class=\"block\"><h2>" + html_escape(t.title) + "</h2><div class=\"tablewrap\"><table><thead><tr>";
    for (const std::string& c : t.columns) page.body += "<th>" + html_escape(c) + "</th>";
    page.body += "</tr></thead><tbody>";
    for (const auto& row : t.rows) {
      page.body += "<tr>";
      for (size_t i = 0; i < row.size(); ++i) {
        page.body += "<td>";
        if (i == 0)
          if (auto c = colors.find(row[0]); c != colors.end())
            page.body += "<span class=\"sw\" style=\"background:" + c->second + "\"></span>";
        page.body += html_escape(row[i]) + "</td>";
      }
      page.body += "</tr>";
    }
    page.body += "</tbody></table></div>";
    if (!t.note.empty()) page.body += "<p class=\"note\">" + html_escape(t.note) + "</p>";
    page.body += "</section>\n";
  }

  page.body += "<section class=\"charts\">";
  // Loss: every run's smoothed curve over its raw one.
  {
    internal::LineChart c;
    c.id = "cmp-loss";
    c.x = {.label = "step", .integer = true};
    c.y = {.label = "loss", .robust_max = true};
    c.nonfinite_label = "non-finite loss";
    std::string note;
    for (size_t i = 0; i < runs.size(); ++i) {
      const std::vector<double> x = step_x(runs[i]), y = step_loss(runs[i]);
      Points raw = thinned(x, y), smooth = thinned(x, smoothed(y));
      c.series.push_back({.color = run_color(i), .x = raw.x, .y = raw.y, .width = 1, .opacity = 0.22, .hover = false});
      c.series.push_back({.name = runs[i].label(), .color = run_color(i), .x = smooth.x, .y = smooth.y, .width = 2.2});
      if (note.empty()) note = thinning_note(raw, x.size());
    }
    page.figure("Training loss", "Smoothed per setting, over the raw per-step loss (faint).", internal::render_line_chart(c),
                c.id, false, note);
  }
  // Loss scale: one step line per run, its overflows as dots in its colour.
  {
    internal::LineChart c;
    c.id = "cmp-scale";
    c.x = {.label = "step", .integer = true};
    c.y = {.label = "loss scale", .scale = internal::AxisScale::kLog2};
    std::vector<internal::Series> dots;
    for (size_t i = 0; i < runs.size(); ++i) {
      std::vector<double> y;
      for (const StepSample& s : runs[i].steps) y.push_back(s.loss_scale);
      c.series.push_back({.name = runs[i].label(), .color = run_color(i), .style = internal::Series::Style::kStep,
                          .x = step_x(runs[i]), .y = y, .width = 2});
      std::vector<internal::Series> own;
      overflow_series(runs[i], run_color(i), runs[i].label() + ": ", own);
      for (auto& s : own) s.name = "";  // the run's colour says whose; the legend would be long
      for (auto& s : own) dots.push_back(std::move(s));
    }
    for (auto& s : dots) c.series.push_back(std::move(s));
    page.figure("Loss scale", "Per step on a log2 axis; overflow steps as dots (filled: skipped, ring: applied).",
                internal::render_line_chart(c), c.id);
  }
  // Throughput over the steps.
  {
    internal::LineChart c;
    c.id = "cmp-throughput";
    c.x = {.label = "step", .integer = true};
    c.y = {.label = "samples/s", .from_zero = true, .robust_max = true};
    c.nonfinite_label = "not timed";
    for (size_t i = 0; i < runs.size(); ++i) {
      const std::vector<double> x = step_x(runs[i]);
      Points smooth = thinned(x, smoothed(step_rate(runs[i])));
      c.series.push_back({.name = runs[i].label(), .color = run_color(i), .x = smooth.x, .y = smooth.y, .width = 2.2});
    }
    page.figure("Throughput per step", "Samples per second of the train step, smoothed.", internal::render_line_chart(c),
                c.id);
  }
  std::vector<std::string> names, cols;
  for (size_t i = 0; i < runs.size(); ++i) {
    names.push_back(runs[i].label());
    cols.push_back(run_color(i));
  }
  {
    internal::BarChart b{
        .id = "cmp-sps", .y_label = "samples/s", .categories = names, .category_colors = cols, .decimals = 0};
    internal::Layer l{"samples/s", kPalette[0], {}};
    for (const RunRecord& r : runs) l.values.push_back(key_numbers(r).samples_per_second);
    b.layers.push_back(std::move(l));
    page.figure("Samples per second", "Steady state of each setting's run.", internal::render_bar_chart(b), b.id);
  }
  {
    internal::BarChart b{.id = "cmp-memory", .y_label = "MiB", .categories = names, .unit = "MiB", .decimals = 2};
    for (int k = 0; k < kNumMemCategories; ++k) {
      if (static_cast<size_t>(k) == kData) continue;
      internal::Layer l{mem_category_name(static_cast<MemCategory>(k)), kMemColors[k], {}};
      for (const RunRecord& r : runs) {
        int64_t bytes = 0;
        if (r.totals) {
          bytes = r.totals->at_train_peak[static_cast<size_t>(k)];
        } else {
          const MemorySample* top = nullptr;
          for (const MemorySample& m : r.memory)
            if (top == nullptr || m.total() > top->total()) top = &m;
          if (top) bytes = top->bytes[static_cast<size_t>(k)];
        }
        l.values.push_back(mib(bytes));
      }
      b.layers.push_back(std::move(l));
    }
    page.figure("Peak training memory", "The composition of each run's own peak (every category but the data set, "
                "which is the same in every run), by category.", internal::render_bar_chart(b), b.id);
  }
  // The first final metric every run has (the test accuracy of `demi compare`).
  std::string metric;
  if (!runs.empty())
    for (const auto& [k, v] : runs[0].final_metrics) {
      bool all = !is_loss_name(k);
      for (const RunRecord& r : runs) all = all && r.final_metrics.count(k);
      if (all) {
        metric = k;
        break;
      }
    }
  if (!metric.empty()) {
    internal::BarChart b{
        .id = "cmp-metric", .y_label = metric, .categories = names, .category_colors = cols, .decimals = 4};
    internal::Layer l{metric, kPalette[0], {}};
    for (const RunRecord& r : runs) l.values.push_back(r.final_metrics.at(metric));
    b.layers.push_back(std::move(l));
    page.figure(metric, "After training.", internal::render_bar_chart(b), b.id);
  }
  page.body += "</section>\n";

  // Memory over time, side by side on one y range.
  page.body += "<section class=\"block\"><h2>Memory by category over the run</h2><p class=\"note\" style=\"margin:0 0 10px\">"
               "Tracked tensor memory at the peak of the sampled steps (without the data set), one chart per setting on "
               "the same scale.</p>"
               "<div class=\"charts small\">";
  double top = 0;
  for (const RunRecord& r : runs)
    for (const MemorySample& m : r.memory) top = std::max(top, mib(m.total() - m.bytes[kData]));
  for (size_t i = 0; i < runs.size(); ++i) {
    internal::StackedArea a = memory_area(runs[i], "cmp-mem-" + std::to_string(i));
    a.y_max = top;
    a.width = 470;
    a.height = 270;
    page.figure(runs[i].label(), "", internal::render_stacked_area(a), a.id);
  }
  page.body += "</div></section>\n";

  std::vector<std::pair<std::string, const ReportEvent*>> events;
  for (const RunRecord& r : runs)
    for (const ReportEvent& e : r.events) events.emplace_back(r.label(), &e);
  page.body += "<section class=\"block\"><h2>Events</h2>" + events_table(events, true, colors) + "</section>\n";
  return page.html(title);
}

}  // namespace demi::train
