// Charts as inline SVG for the HTML training report (report_html.h): line charts (with gaps for non-finite
// values, a log2 axis, markers), stacked areas and bar charts, each with axes, "nice" ticks, labels and a
// legend, drawn by C++ alone. A chart with hover data carries it in a JSON script element that the page's
// small script reads (report_html.cc); the SVG itself needs no script.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace demi::train::internal {

// s with &, <, >, " and ' escaped: safe as HTML text and inside a quoted attribute.
std::string html_escape(std::string_view s);

// About `target` round ticks (1, 2 or 5 times a power of ten apart) within [lo, hi], lo <= hi.
std::vector<double> nice_ticks(double lo, double hi, int target);
// v as a tick label for ticks `step` apart: as few decimals as the step needs, 12k / 3.4M for large values.
std::string tick_label(double v, double step);
// v with about 4 significant digits ("0.2846", "1234", "1.23e-05"); "nan", "inf" for those.
std::string short_number(double v);

enum class AxisScale : unsigned char { kLinear, kLog2 };

struct Axis {
  std::string label;
  AxisScale scale = AxisScale::kLinear;
  bool integer = false;        // integer ticks only (steps, epochs)
  bool from_zero = false;      // the range includes 0
  // Clip the range's top at a high quantile when a few values are far above the rest (a first step's
  // loss, a spike), so the rest stays readable; the chart says where it clipped.
  bool robust_max = false;
};

struct Series {
  enum class Style : unsigned char { kLine, kStep, kDots, kRing };
  std::string name;            // in the legend and the hover readout; "" for neither
  std::string color;
  Style style = Style::kLine;
  std::vector<double> x, y;    // a non-finite y is a gap in a line (marked at the plot's top), skipped by dots
  double width = 2;            // line width, or dot radius
  double opacity = 1;
  bool hover = true;           // listed in the hover readout
  std::vector<std::string> titles;  // dots: a native tooltip per point (optional)
};

struct LineChart {
  std::string id;              // unique in the page: the svg's id
  Axis x, y;
  std::vector<Series> series;
  std::vector<std::pair<double, std::string>> x_marks;  // faint vertical lines with a label (epoch starts)
  std::string nonfinite_label = "non-finite";            // the markers' name in the legend
  std::string hover_unit;                                // after the values in the hover readout
  int width = 640, height = 300;
};

struct Layer {
  std::string name;
  std::string color;
  std::vector<double> values;  // one per x (stacked areas) or per category (bars)
};

struct StackedArea {
  std::string id;
  Axis x, y;
  std::vector<double> x_values;
  std::vector<Layer> layers;   // bottom first
  double y_max = 0;            // the y range reaches at least this (charts side by side share one); 0: auto
  std::string hover_unit;
  int width = 640, height = 300;
};

struct BarChart {
  std::string id;
  std::string y_label;
  std::vector<std::string> categories;        // one bar each
  std::vector<std::string> category_colors;   // a single-layer chart's bar colours ("" for the layer's)
  std::vector<Layer> layers;                  // stacked, bottom first
  std::string unit;                           // in the bars' tooltips
  int decimals = -1;                          // of the value labels on top of the bars (-1: short_number)
  int width = 640, height = 300;
};

// What a rendered chart holds, for the page and its tests.
struct Rendered {
  std::string svg;             // <svg ...>...</svg>
  std::string hover_json;      // the hover data ("" when none), for <script type="application/json">
  std::string note;            // what the reader should know: clipped values, non-finite values
};

Rendered render_line_chart(const LineChart& c);
Rendered render_stacked_area(const StackedArea& c);
Rendered render_bar_chart(const BarChart& c);

}  // namespace demi::train::internal
