// The training report as one self-contained HTML page: nothing is fetched from elsewhere (inline CSS,
// inline SVG charts drawn by C++, a few lines of inline script for hover readouts), so the file can be
// mailed, attached to an issue or opened offline. Every string from the run (settings, layer paths,
// warnings) is HTML-escaped.
//
// One run (render_report_html): a header with the settings and the key numbers as cards; charts of the
// train loss per step (raw and smoothed, with the epoch means and eval losses), the loss scale per step
// on a log2 axis with the overflow steps marked, throughput, and tracked memory by category; a table of
// the epochs and one of the events. Several runs (render_comparison_html): the comparison's tables, the
// loss, loss-scale and throughput curves overlaid, samples/s, peak memory and the first final metric as
// bars, memory over time side by side, and every run's events.
#pragma once

#include <string>
#include <vector>

#include "demi/train/report.h"

namespace demi::train {

// A table as a command prints it: header cells, rows of cells (the first names the run: matched to a
// RunRecord's label, it gets that run's colour), and a note under it.
struct ReportTable {
  std::string title;
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
  std::string note;
};

std::string render_report_html(const RunRecord& run);
// `title`: the page's heading ("" : from the runs' common settings).
std::string render_comparison_html(const std::vector<RunRecord>& runs, const std::vector<ReportTable>& tables,
                                   const std::string& title = "");

}  // namespace demi::train
