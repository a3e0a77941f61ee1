// The report's SVG charts (svg_chart.h). Every chart is a frame — a legend on top, y ticks on the left,
// x ticks and the axis label below — around a plot area clipped to itself, so a value beyond the range
// runs off the edge instead of over the labels. Text widths are estimated (6.4 px per character of the
// 11-12 px sans-serif the page uses) to size the margins and keep tick labels apart.
#include "demi/train/internal/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "demi/core/error.h"
#include "demi/io/internal/json.h"

namespace demi::train::internal {

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> out;
  if (!(std::isfinite(lo) && std::isfinite(hi)) || hi < lo) return out;
  if (hi == lo) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    out.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return out;
}

std::string tick_label(double v, double step) {
  char b[48];
  const double a = std::fabs(v);
  const auto scaled = [&](double div, const char* suffix) {
    const double s = step / div;
    const int dec = s >= 1 ? 0 : std::min(6, static_cast<int>(std::ceil(-std::log10(s) - 1e-9)));
    std::snprintf(b, sizeof b, "%.*f%s", dec, v / div, suffix);
    return std::string(b);
  };
  if (a >= 1e12 || std::fabs(step) >= 1e12) {
    std::snprintf(b, sizeof b, "%.2g", v);
    return b;
  }
  if (a >= 1e9) return scaled(1e9, "G");
  if (a >= 1e6) return scaled(1e6, "M");
  if (a >= 1e4) return scaled(1e3, "k");
  if (step > 0 && step < 1e-4) {
    std::snprintf(b, sizeof b, "%.2g", v);
    return b;
  }
  return scaled(1, "");
}

std::string short_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char b[48];
  const double a = std::fabs(v);
  if (a != 0 && (a < 1e-3 || a >= 1e7)) {
    std::snprintf(b, sizeof b, "%.3g", v);
  } else if (a >= 1000) {
    std::snprintf(b, sizeof b, "%.0f", v);
  } else {
    std::snprintf(b, sizeof b, "%.4g", v);
  }
  return b;
}

namespace {

constexpr double kCharWidth = 6.4;
constexpr const char* kNonFiniteColor = "#c0392b";

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string fixed_text(double v, int decimals) {
  char b[48];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

double text_width(std::string_view s) { return kCharWidth * static_cast<double>(s.size()); }

// A JSON number, or a string for what JSON numbers cannot hold.
std::string json_number(double v) {
  if (std::isnan(v)) return "\"nan\"";
  if (std::isinf(v)) return v > 0 ? "\"inf\"" : "\"-inf\"";
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

// A JSON string that is also safe inside an HTML <script> element: no '<' (so no "</script>").
std::string json_text(std::string_view s) {
  std::string q = io::internal::json_quote(s), out;
  for (char c : q) out += c == '<' ? std::string("\\u003c") : std::string(1, c);
  return out;
}

struct LegendItem {
  std::string name, color;
  enum class Mark { kLine, kDot, kRing, kBox, kTriangle } mark = Mark::kLine;
};

// The frame: the plot area is [px0, px1] x [py1, py0] (py0 is the bottom).
struct Frame {
  double width = 640, height = 300;
  double px0 = 0, px1 = 0, py0 = 0, py1 = 0;
  std::vector<std::vector<LegendItem>> legend_rows;
};

Frame make_frame(int width, int height, const std::vector<LegendItem>& legend, double y_label_width, bool has_x_label) {
  Frame f;
  f.width = width;
  f.height = height;
  f.px0 = 22 + y_label_width + 8;
  f.px1 = width - 18;
  double x = f.px0;
  f.legend_rows.emplace_back();
  for (const LegendItem& it : legend) {
    const double w = 22 + text_width(it.name) + 16;
    if (x + w > f.px1 && !f.legend_rows.back().empty()) {
      f.legend_rows.emplace_back();
      x = f.px0;
    }
    f.legend_rows.back().push_back(it);
    x += w;
  }
  if (f.legend_rows.back().empty()) f.legend_rows.pop_back();
  f.py1 = 12 + 18.0 * static_cast<double>(f.legend_rows.size()) + (f.legend_rows.empty() ? 4 : 8);
  f.py0 = height - (has_x_label ? 44 : 28);
  return f;
}

std::string svg_open(const std::string& id, const Frame& f, bool hover, std::string_view aria) {
  std::string s = "<svg id=\"" + html_escape(id) + "\" class=\"chart\" viewBox=\"0 0 " + fmt(f.width) + " " +
                  fmt(f.height) + "\" role=\"img\" aria-label=\"" + html_escape(aria) + "\"";
  if (hover) s += " data-hover=\"1\"";
  s += ">";
  s += "<defs><clipPath id=\"" + html_escape(id) + "-clip\"><rect x=\"" + fmt(f.px0 - 3) + "\" y=\"" + fmt(f.py1 - 3) +
       "\" width=\"" + fmt(f.px1 - f.px0 + 6) + "\" height=\"" + fmt(f.py0 - f.py1 + 6) + "\"/></clipPath></defs>";
  return s;
}

std::string legend_svg(const Frame& f) {
  std::string s = "<g class=\"legend\">";
  double y = 14;
  for (const auto& row : f.legend_rows) {
    double x = f.px0;
    for (const LegendItem& it : row) {
      const std::string c = html_escape(it.color);
      switch (it.mark) {
        case LegendItem::Mark::kLine:
          s += "<line x1=\"" + fmt(x) + "\" y1=\"" + fmt(y) + "\" x2=\"" + fmt(x + 16) + "\" y2=\"" + fmt(y) +
               "\" stroke=\"" + c + "\" stroke-width=\"2.5\"/>";
          break;
        case LegendItem::Mark::kDot:
          s += "<circle cx=\"" + fmt(x + 8) + "\" cy=\"" + fmt(y) + "\" r=\"4\" fill=\"" + c + "\"/>";
          break;
        case LegendItem::Mark::kRing:
          s += "<circle cx=\"" + fmt(x + 8) + "\" cy=\"" + fmt(y) + "\" r=\"4\" fill=\"#fff\" stroke=\"" + c +
               "\" stroke-width=\"1.5\"/>";
          break;
        case LegendItem::Mark::kBox:
          s += "<rect x=\"" + fmt(x + 2) + "\" y=\"" + fmt(y - 5) + "\" width=\"12\" height=\"10\" rx=\"2\" fill=\"" + c +
               "\"/>";
          break;
        case LegendItem::Mark::kTriangle:
          s += "<path d=\"M" + fmt(x + 3) + "," + fmt(y - 4) + "L" + fmt(x + 13) + "," + fmt(y - 4) + "L" + fmt(x + 8) +
               "," + fmt(y + 4) + "Z\" fill=\"" + c + "\"/>";
          break;
      }
      s += "<text x=\"" + fmt(x + 22) + "\" y=\"" + fmt(y + 4) + "\">" + html_escape(it.name) + "</text>";
      x += 22 + text_width(it.name) + 16;
    }
    y += 18;
  }
  return s + "</g>";
}

// A value axis: its range, ticks and mapping to pixels.
struct Scale {
  AxisScale kind = AxisScale::kLinear;
  double lo = 0, hi = 1;     // data range (for kLog2: exponents)
  double p0 = 0, p1 = 1;     // pixels of lo and hi
  std::vector<double> ticks; // data values (kLog2: exponents)
  double step = 1;
  bool clipped = false;      // robust_max cut the top

  double to_px(double v) const {
    const double t = kind == AxisScale::kLog2 ? std::log2(v) : v;
    return p0 + (t - lo) / (hi - lo) * (p1 - p0);
  }
  std::string label(double tick) const {
    if (kind == AxisScale::kLog2) return "2^" + std::to_string(static_cast<int>(tick));
    return tick_label(tick, step);
  }
  double top_value() const { return kind == AxisScale::kLog2 ? std::exp2(hi) : hi; }
};

// A value (y) scale over `values` (finite ones; for kLog2 positive ones).
Scale value_scale(const Axis& a, std::vector<double> values, int target_ticks) {
  Scale s;
  s.kind = a.scale;
  std::erase_if(values, [&](double v) { return !std::isfinite(v) || (a.scale == AxisScale::kLog2 && v <= 0); });
  if (a.scale == AxisScale::kLog2) {
    double lo = 1, hi = 1;
    if (!values.empty()) {
      auto [mn, mx] = std::minmax_element(values.begin(), values.end());
      lo = std::floor(std::log2(*mn));
      hi = std::ceil(std::log2(*mx));
    }
    if (hi <= lo) lo -= 1, hi += 1;
    s.lo = lo;
    s.hi = hi;
    const int span = static_cast<int>(hi - lo);
    const int stride = std::max(1, (span + target_ticks - 1) / target_ticks);
    for (int e = static_cast<int>(lo); e <= static_cast<int>(hi); ++e)
      if ((e - static_cast<int>(lo)) % stride == 0) s.ticks.push_back(e);
    s.step = stride;
    return s;
  }
  double lo = 0, hi = 1;
  if (!values.empty()) {
    std::sort(values.begin(), values.end());
    lo = values.front();
    hi = values.back();
    if (a.robust_max && values.size() >= 20) {
      const double q = values[static_cast<size_t>(0.98 * static_cast<double>(values.size() - 1))];
      if (hi - q > 2 * (q - lo) && q > lo) {
        hi = q + 0.25 * (q - lo);
        s.clipped = true;
      }
    }
  }
  if (a.from_zero) lo = std::min(lo, 0.0), hi = std::max(hi, 0.0);
  if (hi <= lo) {
    const double d = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= d;
    hi += d;
    if (a.from_zero && lo < 0 && values.size() > 0 && values.front() >= 0) lo = 0;
  }
  std::vector<double> t = nice_ticks(lo, hi, target_ticks);
  s.step = t.size() >= 2 ? t[1] - t[0] : (hi - lo);
  if (a.integer) s.step = std::max(1.0, std::round(s.step));
  lo = std::floor(lo / s.step + 1e-9) * s.step;
  if (!s.clipped) hi = std::ceil(hi / s.step - 1e-9) * s.step;
  if (hi <= lo) hi = lo + s.step;
  s.lo = lo;
  s.hi = hi;
  for (double v = lo; v <= hi + s.step * 1e-9; v += s.step) s.ticks.push_back(std::fabs(v) < s.step * 1e-9 ? 0.0 : v);
  return s;
}

// An x scale over [lo, hi] exactly (no rounding out), with ticks that fit `pixels` apart.
Scale x_scale(const Axis& a, double lo, double hi, double p0, double p1) {
  Scale s;
  if (!(std::isfinite(lo) && std::isfinite(hi))) lo = 0, hi = 1;
  if (hi <= lo) {
    lo -= a.integer ? 1 : 0.5;
    hi += a.integer ? 1 : 0.5;
  }
  s.lo = lo;
  s.hi = hi;
  s.p0 = p0;
  s.p1 = p1;
  for (int target = std::max(2, static_cast<int>((p1 - p0) / 90)); target >= 1; --target) {
    std::vector<double> t = nice_ticks(lo, hi, target);
    double step = t.size() >= 2 ? t[1] - t[0] : hi - lo;
    if (a.integer && step < 1) {
      step = 1;
      t.clear();
      for (double v = std::ceil(lo); v <= hi; v += 1) t.push_back(v);
    }
    s.ticks = t;
    s.step = step;
    double widest = 0;
    for (double v : t) widest = std::max(widest, text_width(s.label(v)));
    if (step / (hi - lo) * (p1 - p0) >= widest + 14) break;
  }
  return s;
}

double widest_label(const Scale& s) {
  double w = 0;
  for (double t : s.ticks) w = std::max(w, text_width(s.label(t)) + (s.kind == AxisScale::kLog2 ? 2 : 0));
  return w;
}

// Tick label text: "2^k" is drawn as 2 with a superscript k.
std::string tick_text_svg(const Scale& s, double tick) {
  if (s.kind != AxisScale::kLog2) return html_escape(s.label(tick));
  return "2<tspan dy=\"-5\" font-size=\"9\">" + std::to_string(static_cast<int>(tick)) + "</tspan>";
}

std::string axes_svg(const Frame& f, const Scale& xs, const Scale* ys, const Axis& xa, const std::string& y_label) {
  std::string s = "<g class=\"grid\">";
  if (ys != nullptr)
    for (double t : ys->ticks) {
      const double y = ys->p0 + (t - ys->lo) / (ys->hi - ys->lo) * (ys->p1 - ys->p0);
      s += "<line x1=\"" + fmt(f.px0) + "\" y1=\"" + fmt(y) + "\" x2=\"" + fmt(f.px1) + "\" y2=\"" + fmt(y) + "\"/>";
    }
  s += "</g><g class=\"axis\">";
  s += "<line class=\"base\" x1=\"" + fmt(f.px0) + "\" y1=\"" + fmt(f.py0) + "\" x2=\"" + fmt(f.px1) + "\" y2=\"" +
       fmt(f.py0) + "\"/>";
  if (ys != nullptr) {
    for (double t : ys->ticks) {
      const double y = ys->p0 + (t - ys->lo) / (ys->hi - ys->lo) * (ys->p1 - ys->p0);
      s += "<text class=\"ytick\" x=\"" + fmt(f.px0 - 6) + "\" y=\"" + fmt(y + 4) + "\" text-anchor=\"end\">" +
           tick_text_svg(*ys, t) + "</text>";
    }
  }
  for (double t : xs.ticks) {
    const double x = xs.to_px(t);
    s += "<line class=\"tick\" x1=\"" + fmt(x) + "\" y1=\"" + fmt(f.py0) + "\" x2=\"" + fmt(x) + "\" y2=\"" +
         fmt(f.py0 + 4) + "\"/>";
    s += "<text class=\"xtick\" x=\"" + fmt(x) + "\" y=\"" + fmt(f.py0 + 17) + "\" text-anchor=\"middle\">" +
         html_escape(xs.label(t)) + "</text>";
  }
  if (!xa.label.empty())
    s += "<text class=\"label\" x=\"" + fmt((f.px0 + f.px1) / 2) + "\" y=\"" + fmt(f.height - 8) +
         "\" text-anchor=\"middle\">" + html_escape(xa.label) + "</text>";
  if (!y_label.empty())
    s += "<text class=\"label\" transform=\"translate(14," + fmt((f.py0 + f.py1) / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">" + html_escape(y_label) + "</text>";
  return s + "</g>";
}

std::string guide_svg(const Frame& f) {
  return "<line class=\"guide\" x1=\"0\" y1=\"" + fmt(f.py1) + "\" x2=\"0\" y2=\"" + fmt(f.py0) +
         "\" visibility=\"hidden\"/>";
}

struct HoverSeries {
  std::string name, color;
  const std::vector<double>* x;
  const std::vector<double>* y;
};

std::string hover_json(const std::string& x_label, const Scale& xs, const std::vector<HoverSeries>& ss,
                       const std::string& unit, bool pow2) {
  std::string o = "{\"xlabel\":" + json_text(x_label) + ",\"unit\":" + json_text(unit) +
                  ",\"pow2\":" + (pow2 ? "1" : "0") + ",\"x0\":" + json_number(xs.lo) +
                  ",\"x1\":" + json_number(xs.hi) + ",\"px0\":" + json_number(xs.p0) + ",\"px1\":" + json_number(xs.p1) +
                  ",\"series\":[";
  for (size_t i = 0; i < ss.size(); ++i) {
    o += (i ? ",{" : "{") + std::string("\"name\":") + json_text(ss[i].name) + ",\"color\":" + json_text(ss[i].color) +
         ",\"x\":[";
    for (size_t k = 0; k < ss[i].x->size(); ++k) o += (k ? "," : "") + json_number((*ss[i].x)[k]);
    o += "],\"y\":[";
    for (size_t k = 0; k < ss[i].y->size(); ++k) o += (k ? "," : "") + json_number((*ss[i].y)[k]);
    o += "]}";
  }
  return o + "]}";
}

std::pair<double, double> x_extent(const std::vector<const std::vector<double>*>& xs) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto* x : xs)
    for (double v : *x)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  return {lo, hi};
}

}  // namespace

Rendered render_line_chart(const LineChart& c) {
  Rendered out;
  std::vector<double> ys;
  std::vector<const std::vector<double>*> xs;
  for (const Series& s : c.series) {
    DEMI_ASSERT(s.x.size() == s.y.size(), "chart ", c.id, ": series '", s.name, "' has ", s.x.size(), " x and ",
                s.y.size(), " y values");
    ys.insert(ys.end(), s.y.begin(), s.y.end());
    xs.push_back(&s.x);
  }
  Scale ysc = value_scale(c.y, ys, std::max(3, (c.height - 90) / 45));
  bool any_nonfinite = false;
  for (const Series& s : c.series)
    if (s.style == Series::Style::kLine || s.style == Series::Style::kStep)
      for (double v : s.y) any_nonfinite = any_nonfinite || !std::isfinite(v);

  std::vector<LegendItem> legend;
  for (const Series& s : c.series) {
    if (s.name.empty()) continue;
    const auto mark = s.style == Series::Style::kDots   ? LegendItem::Mark::kDot
                      : s.style == Series::Style::kRing ? LegendItem::Mark::kRing
                                                        : LegendItem::Mark::kLine;
    legend.push_back({s.name, s.color, mark});
  }
  if (any_nonfinite) legend.push_back({c.nonfinite_label, kNonFiniteColor, LegendItem::Mark::kTriangle});
  Frame f = make_frame(c.width, c.height, legend, widest_label(ysc), !c.x.label.empty());
  ysc.p0 = f.py0;
  ysc.p1 = f.py1;
  auto [xlo, xhi] = x_extent(xs);
  // Room on the right for a marker at the last x (an epoch's mean at its last step).
  Scale xsc = x_scale(c.x, xlo, xhi, f.px0, f.px1 - 8);

  std::vector<HoverSeries> hover;
  for (const Series& s : c.series)
    if (s.hover && !s.name.empty()) hover.push_back({s.name, s.color, &s.x, &s.y});

  std::string& svg = out.svg;
  svg = svg_open(c.id, f, !hover.empty(), c.y.label);
  svg += axes_svg(f, xsc, &ysc, c.x, c.y.label);
  for (const auto& [x, label] : c.x_marks) {
    if (!(x > xsc.lo && x < xsc.hi)) continue;
    const double px = xsc.to_px(x);
    svg += "<g class=\"mark\"><line x1=\"" + fmt(px) + "\" y1=\"" + fmt(f.py1) + "\" x2=\"" + fmt(px) + "\" y2=\"" +
           fmt(f.py0) + "\"/><text x=\"" + fmt(px + 3) + "\" y=\"" + fmt(f.py0 - 4) + "\">" + html_escape(label) +
           "</text></g>";
  }
  const auto y_px = [&](double v) {
    if (ysc.kind == AxisScale::kLog2 && v <= 0) return f.py0 + 4;  // below the axis (clipped)
    return ysc.to_px(v);
  };
  svg += "<g clip-path=\"url(#" + html_escape(c.id) + "-clip)\">";
  std::vector<double> nonfinite_x;
  for (const Series& s : c.series) {
    const std::string color = html_escape(s.color);
    if (s.style == Series::Style::kDots || s.style == Series::Style::kRing) {
      std::string g;
      int n = 0;
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!std::isfinite(s.y[i]) || !std::isfinite(s.x[i])) continue;
        ++n;
        g += "<circle cx=\"" + fmt(xsc.to_px(s.x[i])) + "\" cy=\"" + fmt(y_px(s.y[i])) + "\" r=\"" + fmt(s.width) + "\"";
        g += s.style == Series::Style::kDots ? " fill=\"" + color + "\""
                                             : " fill=\"#fff\" stroke=\"" + color + "\" stroke-width=\"1.5\"";
        if (i < s.titles.size()) {
          g += "><title>" + html_escape(s.titles[i]) + "</title></circle>";
        } else {
          g += "/>";
        }
      }
      svg += "<g class=\"dots\" data-series=\"" + html_escape(s.name) + "\" data-n=\"" + std::to_string(n) + "\"" +
             (s.opacity < 1 ? " opacity=\"" + fmt(s.opacity) + "\"" : std::string()) + ">" + g + "</g>";
      continue;
    }
    std::string d;
    int n = 0;
    bool pen = false;
    double last_y = 0;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) {
        if (std::isfinite(s.x[i])) nonfinite_x.push_back(s.x[i]);
        pen = false;
        continue;
      }
      const double px = xsc.to_px(s.x[i]), py = y_px(s.y[i]);
      if (!pen) {
        d += "M" + fmt(px) + "," + fmt(py);
      } else if (s.style == Series::Style::kStep) {
        d += "H" + fmt(px);
        if (py != last_y) d += "V" + fmt(py);
      } else {
        d += "L" + fmt(px) + "," + fmt(py);
      }
      pen = true;
      last_y = py;
      ++n;
    }
    svg += "<path class=\"line\" data-series=\"" + html_escape(s.name) + "\" data-n=\"" + std::to_string(n) +
           "\" d=\"" + d + "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"" + fmt(s.width) +
           "\" stroke-linejoin=\"round\"" + (s.opacity < 1 ? " opacity=\"" + fmt(s.opacity) + "\"" : std::string()) +
           "/>";
  }
  svg += "</g>";
  if (!nonfinite_x.empty()) {
    std::sort(nonfinite_x.begin(), nonfinite_x.end());
    nonfinite_x.erase(std::unique(nonfinite_x.begin(), nonfinite_x.end()), nonfinite_x.end());
    svg += "<g class=\"nonfinite\" data-n=\"" + std::to_string(nonfinite_x.size()) + "\" fill=\"" + kNonFiniteColor + "\">";
    constexpr size_t kMaxMarkers = 400;  // more are one red band anyway
    for (size_t i = 0; i < nonfinite_x.size() && i < kMaxMarkers; ++i) {
      const double px = xsc.to_px(nonfinite_x[i]);
      svg += "<path d=\"M" + fmt(px - 4) + "," + fmt(f.py1 - 1) + "L" + fmt(px + 4) + "," + fmt(f.py1 - 1) + "L" +
             fmt(px) + "," + fmt(f.py1 + 7) + "Z\"><title>" + html_escape(c.x.label) + " " + short_number(nonfinite_x[i]) +
             ": not finite</title></path>";
    }
    svg += "</g>";
    out.note += std::to_string(nonfinite_x.size()) + " " + (c.x.label.empty() ? "point" : c.x.label) +
                (nonfinite_x.size() == 1 ? "" : "s") + " with a non-finite value (NaN or Inf): gaps in the line, " +
                "marked \xE2\x96\xBC at the top. ";
  }
  if (ysc.clipped) {
    svg += "<text class=\"clipnote\" x=\"" + fmt(f.px1) + "\" y=\"" + fmt(f.py1 + 11) + "\" text-anchor=\"end\">axis cut at " +
           short_number(ysc.top_value()) + "</text>";
    out.note += "The y axis is cut at " + short_number(ysc.top_value()) + ": the few values above it run off the top. ";
  }
  svg += legend_svg(f) + guide_svg(f) + "</svg>";
  if (!hover.empty()) out.hover_json = hover_json(c.x.label, xsc, hover, c.hover_unit, c.y.scale == AxisScale::kLog2);
  return out;
}

Rendered render_stacked_area(const StackedArea& c) {
  Rendered out;
  std::vector<const Layer*> layers;
  for (const Layer& l : c.layers) {
    DEMI_ASSERT(l.values.size() == c.x_values.size(), "chart ", c.id, ": layer '", l.name, "' has ", l.values.size(),
                " values for ", c.x_values.size(), " x");
    bool any = false;
    for (double v : l.values) any = any || (std::isfinite(v) && v != 0);
    if (any) layers.push_back(&l);
  }
  const size_t n = c.x_values.size();
  // A single sample is drawn as a band of width 1 around it.
  std::vector<double> x = c.x_values;
  std::vector<std::vector<double>> vals;
  for (const Layer* l : layers) vals.push_back(l->values);
  if (n == 1) {
    x = {c.x_values[0] - 0.5, c.x_values[0] + 0.5};
    for (auto& v : vals) v = {v[0], v[0]};
  }
  std::vector<double> totals(x.size(), 0.0);
  for (const auto& v : vals)
    for (size_t i = 0; i < x.size(); ++i) totals[i] += std::isfinite(v[i]) ? v[i] : 0;
  Axis ya = c.y;
  ya.from_zero = true;
  std::vector<double> range = totals;
  if (c.y_max > 0) range.push_back(c.y_max);
  Scale ysc = value_scale(ya, range, std::max(3, (c.height - 90) / 45));
  // A layer too thin to see (a few bytes of "other") stays out of the legend; the hover readout has it.
  std::vector<LegendItem> legend;
  for (const Layer* l : layers) {
    double most = 0;
    for (double v : l->values) most = std::max(most, std::isfinite(v) ? v : 0);
    if (most >= 0.002 * ysc.top_value()) legend.push_back({l->name, l->color, LegendItem::Mark::kBox});
  }
  Frame f = make_frame(c.width, c.height, legend, widest_label(ysc), !c.x.label.empty());
  ysc.p0 = f.py0;
  ysc.p1 = f.py1;
  Scale xsc = x_scale(c.x, x.empty() ? 0 : x.front(), x.empty() ? 1 : x.back(), f.px0, f.px1);

  std::vector<HoverSeries> hover;
  for (const Layer* l : layers) hover.push_back({l->name, l->color, &c.x_values, &l->values});
  out.svg = svg_open(c.id, f, !hover.empty(), c.y.label);
  out.svg += axes_svg(f, xsc, &ysc, c.x, c.y.label);
  out.svg += "<g class=\"areas\" clip-path=\"url(#" + html_escape(c.id) + "-clip)\">";
  std::vector<double> below(x.size(), 0.0);
  for (size_t k = 0; k < layers.size(); ++k) {
    std::vector<double> top = below;
    for (size_t i = 0; i < x.size(); ++i) top[i] += std::isfinite(vals[k][i]) ? vals[k][i] : 0;
    std::string d;
    for (size_t i = 0; i < x.size(); ++i) d += (i ? "L" : "M") + fmt(xsc.to_px(x[i])) + "," + fmt(ysc.to_px(top[i]));
    for (size_t i = x.size(); i-- > 0;) d += "L" + fmt(xsc.to_px(x[i])) + "," + fmt(ysc.to_px(below[i]));
    out.svg += "<path class=\"area\" data-series=\"" + html_escape(layers[k]->name) + "\" data-n=\"" +
               std::to_string(n) + "\" d=\"" + d + "Z\" fill=\"" + html_escape(layers[k]->color) +
               "\" fill-opacity=\"0.85\" stroke=\"#fff\" stroke-width=\"0.6\"/>";
    below = top;
  }
  out.svg += "</g>" + legend_svg(f) + guide_svg(f) + "</svg>";
  if (!hover.empty()) out.hover_json = hover_json(c.x.label, xsc, hover, c.hover_unit, false);
  if (layers.empty()) out.note = "Nothing was tracked. ";
  return out;
}

Rendered render_bar_chart(const BarChart& c) {
  Rendered out;
  const size_t n = c.categories.size();
  std::vector<double> totals(n, 0.0);
  for (const Layer& l : c.layers) {
    DEMI_ASSERT(l.values.size() == n, "chart ", c.id, ": layer '", l.name, "' has ", l.values.size(), " values for ", n,
                " bars");
    for (size_t i = 0; i < n; ++i) totals[i] += std::isfinite(l.values[i]) ? l.values[i] : 0;
  }
  Axis ya;
  ya.from_zero = true;
  std::vector<double> range = totals;
  for (double t : totals) range.push_back(t * 1.12);  // room for the value labels
  Scale ysc = value_scale(ya, range, std::max(3, (c.height - 90) / 45));
  std::vector<LegendItem> legend;
  if (c.layers.size() > 1)
    for (const Layer& l : c.layers) {
      double most = 0;
      for (double v : l.values) most = std::max(most, std::isfinite(v) ? v : 0);
      if (most > 0 && most >= 0.002 * ysc.top_value()) legend.push_back({l.name, l.color, LegendItem::Mark::kBox});
    }
  Frame f = make_frame(c.width, c.height, legend, widest_label(ysc), false);
  ysc.p0 = f.py0;
  ysc.p1 = f.py1;
  Scale xsc;  // categories: no numeric ticks
  xsc.p0 = f.px0;
  xsc.p1 = f.px1;
  xsc.ticks.clear();
  out.svg = svg_open(c.id, f, false, c.y_label);
  out.svg += axes_svg(f, xsc, &ysc, Axis{}, c.y_label);
  const double slot = (f.px1 - f.px0) / static_cast<double>(std::max<size_t>(1, n));
  const double bw = std::min(64.0, slot * 0.62);
  out.svg += "<g class=\"bars\" data-n=\"" + std::to_string(n) + "\">";
  for (size_t i = 0; i < n; ++i) {
    const double cx = f.px0 + slot * (static_cast<double>(i) + 0.5);
    double base = 0;
    for (const Layer& l : c.layers) {
      const double v = std::isfinite(l.values[i]) ? l.values[i] : 0;
      if (v <= 0) continue;
      const double y1 = ysc.to_px(base + v), y0 = ysc.to_px(base);
      const std::string color =
          c.layers.size() == 1 && i < c.category_colors.size() && !c.category_colors[i].empty() ? c.category_colors[i] : l.color;
      out.svg += "<rect x=\"" + fmt(cx - bw / 2) + "\" y=\"" + fmt(y1) + "\" width=\"" + fmt(bw) + "\" height=\"" +
                 fmt(std::max(0.0, y0 - y1)) + "\" fill=\"" + html_escape(color) + "\"><title>" +
                 html_escape(c.categories[i]) + (c.layers.size() > 1 ? " \xC2\xB7 " + html_escape(l.name) : std::string()) + ": " +
                 html_escape(short_number(v)) + (c.unit.empty() ? "" : " " + html_escape(c.unit)) + "</title></rect>";
      base += v;
    }
    out.svg += "<text class=\"value\" x=\"" + fmt(cx) + "\" y=\"" + fmt(ysc.to_px(totals[i]) - 5) +
               "\" text-anchor=\"middle\">" + html_escape(c.decimals < 0 ? short_number(totals[i]) : fixed_text(totals[i], c.decimals)) +
               "</text>";
    out.svg += "<text class=\"xtick\" x=\"" + fmt(cx) + "\" y=\"" + fmt(f.py0 + 17) + "\" text-anchor=\"middle\">" +
               html_escape(c.categories[i]) + "</text>";
  }
  out.svg += "</g>" + legend_svg(f) + "</svg>";
  return out;
}

}  // namespace demi::train::internal
