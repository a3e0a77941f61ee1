// demi compare and demi demo: the same model trained from the same seed at each setting, each in a fresh
// process (this same binary, `demi train --json`, so that each one's process peak RSS is its own), in one
// table.
#include "tools/demi/training.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "demi/amp/dtype_trace.h"
#include "demi/amp/numerics.h"
#include "demi/core/context.h"
#include "demi/core/files.h"
#include "demi/core/parallel.h"
#include "demi/data/data.h"
#include "demi/data/iterator.h"
#include "demi/distributed/distributed.h"
#include "demi/io/internal/json.h"
#include "demi/nn/models.h"
#include "demi/ops/dispatch.h"
#include "demi/train/checkpoint.h"
#include "demi/train/model.h"
#include "demi/train/report.h"
#include "demi/train/report_html.h"
#include "tools/demi/subprocess.h"

namespace demi::cli {

using io::internal::json_number;
using io::internal::json_object;
using io::internal::json_quote;

namespace {

// Minimal reader for the flat JSON summary line run_train prints.
std::map<std::string, std::string> parse_flat_json(const std::string& line) {
  std::map<std::string, std::string> out;
  size_t i = line.find('{');
  if (i == std::string::npos) return out;
  ++i;
  while (i < line.size() && line[i] != '}') {
    size_t k0 = line.find('"', i), k1 = line.find('"', k0 + 1);
    if (k0 == std::string::npos || k1 == std::string::npos) break;
    std::string key = line.substr(k0 + 1, k1 - k0 - 1);
    size_t v0 = line.find(':', k1) + 1;
    size_t v1 = v0;
    if (line[v0] == '"') {
      std::string v;  // unescaped (\" and \\; other escapes kept as written)
      v1 = v0 + 1;
      while (v1 < line.size() && line[v1] != '"') {
        if (line[v1] == '\\' && v1 + 1 < line.size() && (line[v1 + 1] == '"' || line[v1 + 1] == '\\')) ++v1;
        v += line[v1++];
      }
      ++v1;
      out[key] = v;
    } else {
      while (v1 < line.size() && line[v1] != ',' && line[v1] != '}') ++v1;
      out[key] = line.substr(v0, v1 - v0);
    }
    i = v1;
    if (i < line.size() && line[i] == ',') ++i;
  }
  return out;
}

std::string self_path() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("demi") : p.string();
}

// Runs `demi train --json ...` for one setting and returns its summary; with `report_data`, the child
// also writes its run record (every step) there. The child gets an argument vector, never a shell line.
std::map<std::string, std::string> run_setting(const ParsedArgs& args, const std::string& level, const std::string& dtype,
                                               const std::string& report_data = "") {
  std::vector<std::string> argv = {self_path(), "train", "--json"};
  for (const char* name : {"model", "data", "epochs", "batch-size", "lr", "seed", "threads", "train-samples",
                           "loss-scale", "mode", "graph-fusion"}) {
    argv.push_back(str_cat("--", name));
    argv.push_back(args.get(name));
  }
  argv.insert(argv.end(), {"--amp", level, "--dtype", dtype});
  // How float16 products multiply means something only where they are float16 (a low level at fp16).
  if (args.has("f16-products") && level != "O0" && dtype == "fp16")
    argv.insert(argv.end(), {"--f16-products", args.get("f16-products")});
  if (args.flag("batch-norm")) argv.push_back("--batch-norm");
  if (args.flag("zoo-style")) argv.push_back("--zoo-style");
  if (!report_data.empty()) argv.insert(argv.end(), {"--report-data", report_data});
  const ChildResult child = run_child(argv, /*capture_stdout=*/true);
  std::map<std::string, std::string> summary;
  std::istringstream lines(child.out);
  for (std::string line; std::getline(lines, line);)
    if (line.find("\"kind\":\"summary\"") != std::string::npos) summary = parse_flat_json(line);
  DEMI_CHECK(child.ok() && !summary.empty(), "compare: the run at ", level, " ", dtype, " failed (",
             child.describe(), "); run it alone to see why: ", command_line(argv));
  return summary;
}

double as_double(const std::map<std::string, std::string>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? 0.0 : std::atof(it->second.c_str());
}

std::string cell(const char* format, double v) {
  char b[64];
  std::snprintf(b, sizeof b, format, v);
  return b;
}

// A table printed in fixed-width columns (the first left-aligned), the same cells the HTML report shows.
void print_table(const train::ReportTable& t, const std::vector<int>& widths) {
  const auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t i = 0; i < cells.size(); ++i) {
      const int w = i < widths.size() ? widths[i] : 9;
      char b[128];
      std::snprintf(b, sizeof b, i == 0 ? "%-*s" : " %*s", w, cells[i].c_str());
      out += b;
    }
    std::printf("%s\n", out.c_str());
  };
  line(t.columns);
  for (const auto& r : t.rows) line(r);
}

int run_compare(const ParsedArgs& args) {
  std::vector<std::string> levels, dtypes;
  {
    std::stringstream a(args.get("levels")), b(args.get("dtypes"));
    for (std::string x; std::getline(a, x, ',');) levels.push_back(amp::level_name(amp::parse_level(x)));
    for (std::string x; std::getline(b, x, ',');) dtypes.push_back(x);
  }
  if (levels.empty()) throw UsageError("--levels is empty: name the AMP levels to compare, e.g. O0,O2");
  if (dtypes.empty()) throw UsageError("--dtypes is empty: name the low-precision dtypes, e.g. fp16,bf16");
  const bool reporting = args.has("report");
  if (reporting) check_report_option(args, "report");
  std::optional<ScratchDir> scratch;  // the children's run records, removed with everything in it
  if (reporting) scratch.emplace("demi-compare");
  struct Row {
    std::string level, dtype;
    std::map<std::string, std::string> s;
    std::string name() const { return level == "O0" ? "O0-fp32" : level + "-" + dtype; }
  };
  std::vector<Row> rows;
  std::vector<std::string> records;  // the children's run records, one per row
  const auto run_one = [&](const std::string& l, const std::string& shown, const std::string& d) {
    std::string data = reporting ? (scratch->path() / (std::to_string(rows.size()) + ".json")).string() : "";
    rows.push_back({l, shown, run_setting(args, l, d, data)});
    records.push_back(data);
  };
  for (const auto& l : levels) {
    if (l == "O0") {
      run_one(l, "fp32", dtypes.empty() ? "bf16" : dtypes[0]);
      continue;
    }
    for (const auto& d : dtypes) run_one(l, d, d);
  }
  const Row* base = nullptr;
  for (const auto& r : rows)
    if (r.level == "O0") base = &r;
  std::string model = rows.empty() ? "" : rows[0].s["model"], data = rows.empty() ? "" : rows[0].s["data"];
  const std::string heading = "model " + model + " on " + data + ", " + args.get("epochs") + " epoch(s), batch " +
                              (args.get_int("batch-size") > 0 ? args.get("batch-size") : std::string("default"));
  std::printf("\n%s — O0 against mixed precision, measured in this run\n\n", heading.c_str());
  const auto ratio = [](double v, double b) { return cell("%.2fx", b > 0 ? v / b : 0); };
  train::ReportTable main_table{"samples/s, memory, loss and accuracy",
                                {"setting", "samples/s", "x O0", "peak MiB", "x O0", "activ.", "cast", "work",
                                 "RSS MiB", "x O0", "loss", "test acc"},
                                {},
                                "peak MiB: tracked tensor memory (parameters, gradients, optimizer state, activations, "
                                "cast cache, workspace, data); activ./cast/work: its activation, cast-cache and "
                                "workspace parts; RSS: the process's peak resident set (each setting runs in its own "
                                "process)."};
  for (const auto& r : rows) {
    double sps = as_double(r.s, "samples_per_second"), peak = as_double(r.s, "peak_total"),
           rss = as_double(r.s, "peak_rss");
    double bsps = base ? as_double(base->s, "samples_per_second") : 0, bpeak = base ? as_double(base->s, "peak_total") : 0,
           brss = base ? as_double(base->s, "peak_rss") : 0;
    main_table.rows.push_back({r.name(), cell("%.0f", sps), ratio(sps, bsps), cell("%.2f", peak / (1 << 20)),
                               ratio(peak, bpeak), cell("%.2f", as_double(r.s, "peak_activation") / (1 << 20)),
                               cell("%.2f", as_double(r.s, "peak_cast_cache") / (1 << 20)),
                               cell("%.2f", as_double(r.s, "peak_workspace") / (1 << 20)), cell("%.1f", rss / (1 << 20)),
                               ratio(rss, brss), cell("%.5f", as_double(r.s, "final_loss")),
                               cell("%.4f", as_double(r.s, "test_accuracy"))});
  }
  print_table(main_table, {9, 10, 7, 10, 7, 9, 9, 9, 9, 7, 8, 9});

  train::ReportTable by_category{"peak tracked memory by category, MiB",
                                 {"setting", "param", "grad", "optim", "activ.", "cast", "work", "data", "total"},
                                 {},
                                 "each column is that category's own peak; total is the peak of the sum"};
  for (const auto& r : rows) {
    auto m = [&](const char* k) { return cell("%.2f", as_double(r.s, k) / (1 << 20)); };
    by_category.rows.push_back({r.name(), m("peak_parameter"), m("peak_gradient"), m("peak_optimizer_state"),
                                m("peak_activation"), m("peak_cast_cache"), m("peak_workspace"), m("peak_data"),
                                m("peak_total")});
  }
  std::printf("\n%s\n", by_category.title.c_str());
  print_table(by_category, {9, 9, 9, 9, 9, 9, 9, 9, 9});
  std::printf("(%s)\n", by_category.note.c_str());

  train::ReportTable train_peak{"the training's own peak (every category but data) and what it is made of, MiB",
                                {"setting", "param", "grad", "optim", "activ.", "cast", "work", "train", "x O0"},
                                {},
                                ""};
  for (const auto& r : rows) {
    auto m = [&](const char* k) { return cell("%.2f", as_double(r.s, std::string("at_train_peak_") + k) / (1 << 20)); };
    double train = as_double(r.s, "peak_train"), btrain = base ? as_double(base->s, "peak_train") : 0;
    train_peak.rows.push_back({r.name(), m("parameter"), m("gradient"), m("optimizer_state"), m("activation"),
                               m("cast_cache"), m("workspace"), cell("%.2f", train / (1 << 20)), ratio(train, btrain)});
  }
  std::printf("\n%s\n", train_peak.title.c_str());
  print_table(train_peak, {9, 9, 9, 9, 9, 9, 9, 9, 7});
  std::printf("\npeak MiB: tracked tensor memory (parameters, gradients, optimizer state, activations, cast cache,\n"
              "workspace, data); activ./cast/work: its activation, cast-cache and workspace parts; RSS: the\n"
              "process's peak resident set (each setting runs in its own process).\n");
  if (reporting) {
    std::vector<train::RunRecord> runs;
    for (size_t i = 0; i < rows.size(); ++i) {
      runs.push_back(train::read_run_record(records[i]));
      runs.back().name = rows[i].name();
    }
    train::write_report(args.get("report"),
                        train::render_comparison_html(runs, {main_table, by_category, train_peak}, "demi compare: " + heading));
    std::printf("report: %s\n", args.get("report").c_str());
  }
  return 0;
}

}  // namespace

int run_training_demo(const ParsedArgs& args) {
  (void)args;
  std::string self = self_path();
  std::printf("demi demo: the seed's comparison — the same network trained from the same seed at O0 and at O2\n"
              "(float16 with loss scaling, and bfloat16), measured side by side.\n");
  std::fflush(stdout);
  if (!run_child({self, "compare", "--model", "A", "--data", "synthetic", "--epochs", "3", "--train-samples", "1000"},
                 /*capture_stdout=*/false)
           .ok())
    return 1;
  return run_child({self, "compare", "--model", "B", "--data", "fashion-mnist", "--epochs", "1"}, false).ok() ? 0 : 1;
}

void add_compare_command(std::vector<Command>& cmds) {
  std::vector<Option> cmp = training_options();
  cmp.push_back({"levels", "L", "comma-separated AMP levels", "O0,O2"});
  cmp.push_back({"dtypes", "T", "comma-separated low dtypes for levels above O0", "fp16,bf16"});
  cmp.push_back({"report", "PATH", "write a self-contained HTML page comparing the settings: the tables, their "
                                   "loss, loss-scale and throughput curves, samples/s and memory", ""});
  cmds.push_back({.name = "compare",
                  .summary = "Train the same model from the same seed at each setting; print one table.",
                  .options = std::move(cmp),
                  .run = run_compare});
}

}  // namespace demi::cli
