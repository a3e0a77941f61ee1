// What the training commands share (train, plan, eval, compare, and the GPT's train): the job a command
// line describes (model, data, batch), the Model built from its options, checks of settings, threads,
// resuming and the exit status of a run.
#include "tools/demi/training.h"

#include <unistd.h>

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

namespace demi::cli {

using io::internal::json_number;
using io::internal::json_object;
using io::internal::json_quote;

// A memory category as the JSON keys of train --json and plan --json name it: "optimizer state" ->
// optimizer_state.
std::string json_category(int c) {
  std::string name = mem_category_name(static_cast<MemCategory>(c));
  std::replace(name.begin(), name.end(), ' ', '_');
  return name;
}

std::shared_ptr<amp::LossScaleManager> parse_loss_scale(const std::string& s) {
  if (s == "default") return nullptr;
  if (s == "none") return nullptr;
  if (s == "dynamic") return std::make_shared<amp::DynamicLossScaleManager>();
  if (s.rfind("fixed:", 0) == 0) {
    std::optional<double> v = parse_real(std::string_view(s).substr(6));
    if (!v || !(*v > 0)) throw UsageError("--loss-scale fixed:N needs a number N > 0, got '" + s + "'");
    return std::make_shared<amp::FixedLossScaleManager>(*v, true);
  }
  throw UsageError("unknown --loss-scale '" + s + "'; expected default, none, fixed:N or dynamic");
}

std::optional<bool> parse_param_grads(const std::string& s) {
  if (s == "auto") return std::nullopt;
  if (s == "bf16") return true;
  if (s == "fp32") return false;
  throw UsageError("unknown --param-grads '" + s + "'; expected auto, bf16 or fp32");
}

F16Products parse_f16_products(const ParsedArgs& args, amp::Level level, DType low) {
  const std::string s = args.get("f16-products");
  if (s != "exact" && s != "bf16") throw UsageError("--f16-products expects exact or bf16, got '" + s + "'");
  if (s == "bf16" && (level == amp::Level::kO0 || low != DType::kF16))
    throw UsageError(str_cat("--f16-products bf16 changes how float16 products multiply, and this run (--amp ",
                             amp::level_name(level), level == amp::Level::kO0 ? "" : " --dtype " + args.get("dtype"),
                             ") has none: use it with --amp O1, O2 or O3 and --dtype fp16"));
  return s == "bf16" ? F16Products::kBf16 : F16Products::kExact;
}

std::optional<bool> parse_optimizer_in_backward(const std::string& s) {
  if (s == "auto") return std::nullopt;
  if (s == "on") return true;
  if (s == "off") return false;
  throw UsageError("unknown --optimizer-in-backward '" + s + "'; expected auto, on or off");
}

DType parse_optimizer_state(const std::string& s) {
  if (s == "fp32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  throw UsageError("unknown --optimizer-state '" + s + "'; expected fp32 or bf16");
}

std::string mib(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", static_cast<double>(bytes) / (1 << 20));
  return b;
}

// The settings a checkpoint's state depends on, stored in every checkpoint the CLI writes, each under
// "cli." and its option's name.
io::Metadata run_settings(const ParsedArgs& args, const Job& job) {
  return {{"cli.model", job.model_key},
          {"cli.data", job.data_name},
          {"cli.batch-size", std::to_string(job.batch_size)},
          {"cli.train-samples", args.get("train-samples")},
          {"cli.lr", args.get("lr")},
          {"cli.seed", args.get("seed")},
          {"cli.sink-size", args.get("sink-size")},
          {"cli.optimizer-state", args.get("optimizer-state")},
          {"cli.f16-products", args.get("f16-products")}};
}

// A resume checks the settings the checkpoint was taken with: mid-epoch, another data set, sample count
// or batch size would misalign the data position (refused, exit 2); another learning rate or seed, or
// those at an epoch's end, merely change the run (a warning).
void check_resume_settings(const io::TrainingMeta& meta, const io::Metadata& now, const std::string& file) {
  const bool mid_epoch = meta.data_position > 0;
  for (const auto& [key, value] : now) {
    auto it = meta.extra.find(key);
    if (it == meta.extra.end() || it->second == value) continue;  // older checkpoints have no cli.* keys
    if (key == "cli.lr" && parse_real(it->second) == parse_real(value)) continue;  // 0.01 and 1e-2
    const std::string option = "--" + key.substr(4);
    const bool positional =
        key == "cli.data" || key == "cli.batch-size" || key == "cli.train-samples" || key == "cli.sink-size";
    if (positional && mid_epoch)
      throw UsageError("--resume: " + file + " was taken mid-epoch (after batch " + std::to_string(meta.data_position) +
                       ") with " + option + " " + it->second + "; resuming with " + value +
                       " would not continue at the same data position. Resume with " + option + " " + it->second +
                       ", or start a new --ckpt-dir");
    std::fprintf(stderr, "demi: warning: resuming %s, taken with %s %s, with %s %s: the run changes from here\n",
                 file.c_str(), option.c_str(), it->second.c_str(), option.c_str(), value.c_str());
  }
}

// Under mpirun / srun: every process joins the job, trains data-parallel, and only rank 0 prints
// (warnings and errors still reach standard error from every process).
void start_data_parallel(const ParsedArgs& args) {
  dist::AutoParallelContext dp;
  dp.parallel_mode = dist::ParallelMode::kDataParallel;
  const std::string wire = args.get("comm-dtype");
  if (wire == "fp32") {
    dp.comm_dtype = DType::kF32;
  } else if (wire == "bf16") {
    dp.comm_dtype = DType::kBF16;
  } else {
    throw UsageError("--comm-dtype must be fp32 or bf16, got '" + wire + "'");
  }
  dp.bucket_cap_mb = args.get_real("bucket-mb");
  if (!dist::launched_as_group()) return;  // one process: nothing travels
  dist::init();
  dist::set_auto_parallel_context(dp);
  if (dist::get_rank() != 0) {
    std::fflush(stdout);
    DEMI_CHECK(std::freopen("/dev/null", "w", stdout) != nullptr, "could not silence rank ", dist::get_rank(),
               "'s standard output");
  } else {
    std::fprintf(stderr, "demi: data-parallel training on %d processes (%s gradients)\n", dist::get_group_size(),
                 wire.c_str());
  }
}

Training build_training(const ParsedArgs& args, bool reporting) {
  Training t{make_job(args)};
  Job& job = t.job;
  if (args.flag("recompute")) {
    auto* d = dynamic_cast<nn::TransformerClassifier*>(job.net.get());
    if (d == nullptr) throw UsageError("--recompute is for --model D (each encoder layer) and gpt (each block)");
    for (auto& layer : d->encoder->layers) layer->recompute();
  }
  if (args.flag("recompute-attention")) {
    auto* d = dynamic_cast<nn::TransformerClassifier*>(job.net.get());
    if (d == nullptr)
      throw UsageError("--recompute-attention is for --model D (each encoder layer) and gpt (each block)");
    for (auto& layer : d->encoder->layers) layer->self_attn->recompute_probabilities = true;
  }
  const amp::Level level = t.level = amp::parse_level(args.get("amp"));
  const DType low = t.low = parse_dtype(args.get("dtype"));
  if (!is_low_precision(low)) throw UsageError("--dtype must be fp16 or bf16, got '" + args.get("dtype") + "'");
  refuse_settings_that_change_nothing(args, level, low);
  double lr = args.get_real("lr");
  auto opt = std::make_shared<optim::Momentum>(job.net->trainable_params(), lr, 0.9);
  opt->set_state_dtype(parse_optimizer_state(args.get("optimizer-state")));
  train::ModelOptions& mo = t.mo;
  mo.amp_level = level;
  mo.low_dtype = low;
  mo.loss_scale_manager = parse_loss_scale(args.get("loss-scale"));
  mo.no_loss_scale = args.get("loss-scale") == "none";  // overrides the level's default manager
  mo.clip_grad_norm = args.get_real("clip-grad-norm");
  mo.low_precision_param_grads = parse_param_grads(args.get("param-grads"));
  mo.optimizer_in_backward = parse_optimizer_in_backward(args.get("optimizer-in-backward"));
  mo.accumulate = static_cast<int>(args.get_int("accumulate"));
  mo.amp_adapt = args.flag("amp-adapt");
  mo.f16_products = parse_f16_products(args, level, low);
  const int64_t step_budget = args.get_int("steps");
  if (step_budget > 0) mo.max_steps = step_budget;
  std::map<std::string, train::MetricPtr> metric_fns = {{"Accuracy", std::make_shared<train::Accuracy>()}};
  if (reporting) metric_fns["Loss"] = std::make_shared<train::Loss>();  // the report shows the test loss too
  t.model = std::make_unique<train::Model>(job.net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                           opt, metric_fns, mo);
  return t;
}

// "512MiB", "2GiB", "1.5GB", "800MB", "65536" (bytes) -> bytes.
int64_t parse_bytes(const std::string& s) {
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(s, &end);
  } catch (...) {
    end = 0;
  }
  const std::string unit = s.substr(end);
  const double mult = unit.empty() || unit == "B" ? 1.0
                      : unit == "KiB"             ? 1024.0
                      : unit == "MiB"             ? 1024.0 * 1024
                      : unit == "GiB"             ? 1024.0 * 1024 * 1024
                      : unit == "KB"              ? 1e3
                      : unit == "MB"              ? 1e6
                      : unit == "GB"              ? 1e9
                                                  : -1.0;
  if (end == 0 || mult < 0 || !(v > 0) || !std::isfinite(v))
    throw UsageError("--max-memory expects a size such as 512MiB, 2GiB or 800MB, got '" + s + "'");
  // (1e30GiB once overflowed to a negative size.)
  if (v * mult > 0x1p60)
    throw UsageError("--max-memory " + s + " is more memory than any machine has (at most 1 EiB)");
  return static_cast<int64_t>(v * mult);
}

// --max-memory: the largest batch size, a multiple of 8, whose forecast training peak fits the budget
// (probes at 8 and 16 give the line, a probe at its prediction and its neighbours settle it).
ParsedArgs with_batch_under_budget(const ParsedArgs& args) {
  const int64_t budget = parse_bytes(args.get("max-memory"));
  if (args.get_int("batch-size") > 0) throw UsageError("give --max-memory or --batch-size, not both");
  if (args.get_int("accumulate") > 1)
    throw UsageError("--max-memory chooses the batch of a one-batch update: not with --accumulate");
  const ParsedArgs base = args.with("max-memory", std::nullopt);
  std::map<int64_t, int64_t> seen;  // batch size -> forecast training peak
  auto peak = [&](int64_t batch) {
    auto it = seen.find(batch);
    if (it != seen.end()) return it->second;
    Training t = build_training(base.with("batch-size", std::to_string(batch)), false);
    auto rows = t.job.train_ds->create_iterator();
    auto first = rows->next();
    DEMI_CHECK(first.has_value(), "--max-memory: the training set is empty");
    const int64_t got = (*first)[0].dim(0);
    DEMI_CHECK(got == batch, "--max-memory: the training set has only ", got, " samples, fewer than a batch of ",
               batch);
    const int64_t p = t.model->forecast((*first)[0], (*first)[1]).train_peak;
    seen.emplace(batch, p);
    return p;
  };
  const int64_t p8 = peak(8);
  if (p8 > budget)
    throw Error(str_cat("--max-memory ", args.get("max-memory"), " (", mib(budget), " MiB) is too little: the ",
                        "smallest batch size it may choose, 8, needs ", mib(p8), " MiB at its peak (demi plan ",
                        "--batch-size 8 shows what of)"));
  const double per_sample = std::max(1.0, static_cast<double>(peak(16) - p8) / 8.0);
  constexpr int64_t kMaxBatch = 1 << 16;
  // fits(b): b's forecast fits; a batch the training set cannot fill does not.
  auto fits = [&](int64_t b) {
    if (b > kMaxBatch) return false;
    try {
      return peak(b) <= budget;
    } catch (const Error&) {
      return false;
    }
  };
  const int64_t predicted = static_cast<int64_t>((static_cast<double>(budget - p8) / per_sample + 8) / 8) * 8;
  int64_t lo = 8, hi = 0;  // lo fits; hi (once found) does not
  int64_t b = std::clamp<int64_t>(predicted, 8, kMaxBatch);
  if (fits(b)) {  // grow from the prediction in doubling steps until one does not fit
    lo = b;
    for (int64_t step = 8; hi == 0; step *= 2) {
      if (fits(lo + step)) lo += step;
      else hi = lo + step;
    }
  } else {  // shrink from it in doubling steps until one fits
    hi = b;
    for (int64_t step = 8; hi - step > 8; step *= 2) {
      if (fits(hi - step)) {
        lo = hi - step;
        break;
      }
      hi -= step;
    }
  }
  while (hi - lo > 8) {  // multiples of 8 between lo (fits) and hi (does not)
    const int64_t mid = (lo + hi) / 16 * 8;
    if (fits(mid)) lo = mid;
    else hi = mid;
  }
  const int64_t batch = lo;
  std::fprintf(stderr, "demi: --max-memory %s MiB: batch size %lld (forecast peak %s MiB; %zu probes)\n",
               mib(budget).c_str(), static_cast<long long>(batch), mib(peak(batch)).c_str(), seen.size());
  return base.with("batch-size", std::to_string(batch));
}

void refuse_settings_that_change_nothing(const ParsedArgs& args, amp::Level level, DType low) {
  if (level == amp::Level::kO0) {
    if (args.get("param-grads") == "bf16")
      throw UsageError("--param-grads bf16 changes nothing at O0, where every gradient is FP32: use it with "
                       "--amp O1, O2 or O3");
    if (args.flag("amp-adapt"))
      throw UsageError("--amp-adapt adapts a mixed-precision run; at O0 nothing runs in low precision: use it "
                       "with --amp O1, O2 or O3");
  }
  const std::string ckpt_dir = args.get("ckpt-dir");
  if (args.has("ckpt-dir") && ckpt_dir.empty())
    throw UsageError("--ckpt-dir is empty: name the folder for the checkpoints, or leave the option out");
  if (args.flag("resume") && args.flag("start-over"))
    throw UsageError("--resume continues the run in --ckpt-dir and --start-over sets it aside to begin anew: "
                     "give one of them");
  for (const char* name : {"ckpt-every", "keep-ckpt", "start-over"})
    if (args.has(name) && ckpt_dir.empty())
      throw UsageError(str_cat("--", name, " says how checkpoints are kept, and this run writes none: give --ckpt-dir DIR"));
}

int print_forecast(train::Model& model, const Tensor& data, const Tensor& label, const ParsedArgs& args,
                   const std::string& model_key, amp::Level level, DType low, int64_t batch_size) {
  const train::MemForecast f = model.forecast(data, label);
  const std::string dtype = level == amp::Level::kO0 ? "float32" : std::string(dtype_name(low));
  if (args.flag("json")) {
    std::printf("{\"kind\":\"plan\",\"model\":\"%s\",\"amp\":\"%s\",\"dtype\":\"%s\",\"batch_size\":%lld,"
                "\"train_peak\":%lld",
                model_key.c_str(), amp::level_name(level), dtype.c_str(), static_cast<long long>(batch_size),
                static_cast<long long>(f.train_peak));
    std::printf(",\"peak_op\":%s", json_quote(f.peak_op).c_str());
    for (int c = 0; c < kNumMemCategories; ++c) {
      if (static_cast<MemCategory>(c) == MemCategory::kData) continue;
      std::printf(",\"at_train_peak_%s\":%lld", json_category(c).c_str(),
                  static_cast<long long>(f.at_peak[static_cast<size_t>(c)]));
    }
    std::printf("}\n");
    return 0;
  }
  std::printf("model %s at %s %s, batch %lld: the training peak, measured by a probe of one batch (forward and "
              "backward twice, nothing trained)\n",
              model_key.c_str(), amp::level_name(level), dtype.c_str(), static_cast<long long>(batch_size));
  for (int c = 0; c < kNumMemCategories; ++c) {
    if (static_cast<MemCategory>(c) == MemCategory::kData) continue;
    std::printf("  %-16s %10.2f MiB\n", mem_category_name(static_cast<MemCategory>(c)),
                static_cast<double>(f.at_peak[static_cast<size_t>(c)]) / (1 << 20));
  }
  std::printf("  %-16s %10.2f MiB\n", "training peak", static_cast<double>(f.train_peak) / (1 << 20));
  std::printf("  %-16s %s\n", "reached in", f.peak_op.c_str());
  return 0;
}

train::CheckpointConfig::OtherRuns checkpoint_other_runs(const ParsedArgs& args) {
  if (args.flag("resume")) return train::CheckpointConfig::OtherRuns::kKeepApart;
  return args.flag("start-over") ? train::CheckpointConfig::OtherRuns::kSetAside
                                 : train::CheckpointConfig::OtherRuns::kRefuse;
}

void refuse_training_only(const ParsedArgs& args) {
  // What only changes how training runs, not what one step holds in memory, has no place in a forecast.
  // (--clip-grad-norm and --amp-adapt do: each needs every gradient before the update, so neither runs
  // the update in backward; the forecast's probe runs the step as they make it run.)
  for (const char* name : {"epochs", "steps", "lr", "ckpt-dir", "ckpt-every", "keep-ckpt", "resume", "start-over",
                           "profile",
                           "report", "report-data", "comm-dtype", "bucket-mb", "sink-size", "eval-every",
                           "eval-windows", "warmup", "weight-decay"})
    if (args.has(name))
      throw UsageError(str_cat("demi plan: --", name, " does not change what a training step holds in memory; ",
                               "leave it out"));
  if (args.get_int("accumulate") > 1)
    throw UsageError("demi plan forecasts a one-batch update: not with --accumulate (its FP32 accumulators)");
}

std::optional<train::LoadedCheckpoint> resume_checkpoint(const std::string& dir, const std::string& prefix) {
  std::vector<train::SkippedCheckpoint> skipped;
  auto last = train::latest_loadable_checkpoint(dir, prefix, &skipped, /*set_aside=*/true);
  for (const train::SkippedCheckpoint& s : skipped)
    std::fprintf(stderr, "demi: warning: --resume skips a checkpoint that does not load, kept as %s: %s\n",
                 s.path.string().c_str(), s.error.c_str());
  if (!last && !skipped.empty())
    throw Error("--resume: no checkpoint in " + dir + " loads (" + std::to_string(skipped.size()) +
                " damaged, set aside as .damaged); --start-over trains from the beginning");
  if (!last) {  // a retried --resume: only the damaged ones set aside by an earlier try remain
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind(prefix + "-", 0) == 0 && name.ends_with(".damaged"))
        throw Error("--resume: the checkpoints in " + dir + " are damaged (" + name +
                    " was set aside by an earlier --resume); nothing loads, so nothing is resumed. "
                    "--start-over trains from the beginning");
    }
  }
  return last;
}

void apply_thread_option(const ParsedArgs& args) {
  ContextOptions ctx = get_context();
  int64_t threads = args.get_int("threads");
  const int64_t hardware = hardware_threads();
  // Processes of one job on this machine share its cores: each takes its part unless told.
  if (threads == 0 && dist::is_initialized()) {
    const int64_t local = dist::get_local_group_size();
    if (local > 1) threads = std::max<int64_t>(1, hardware / local);
  }
  if (threads > hardware) {
    std::fprintf(stderr,
                 "demi: --threads %lld is more than the %lld hardware threads of this machine; using %lld "
                 "(oversubscribed workers would make every step wait)\n",
                 static_cast<long long>(threads), static_cast<long long>(hardware), static_cast<long long>(hardware));
    threads = hardware;
  }
  ctx.num_threads = static_cast<int>(threads);
  if (args.has("mode")) {
    const std::string mode = args.get("mode");
    if (mode == "graph") {
      ctx.mode = ExecMode::kGraph;
    } else if (mode == "pynative") {
      ctx.mode = ExecMode::kPyNative;
    } else {
      throw UsageError("--mode expects graph or pynative, got '" + mode + "'");
    }
  }
  if (args.has("graph-fusion")) {
    const std::string fusion = args.get("graph-fusion");
    if (fusion != "on" && fusion != "off") throw UsageError("--graph-fusion expects on or off, got '" + fusion + "'");
    ctx.graph_fusion = fusion == "on";
  }
  set_context(ctx);
}

int training_exit_status(double first_loss, double last_loss, int64_t skipped, int64_t steps) {
  // Non-finite: an O2-fp16 run without loss scaling, a learning rate far too high. Diverged: a finite loss
  // that grew (a bf16 run at --lr 10 ends near 1e11 with no overflow to skip); the absolute margin keeps a
  // run resumed at a tiny loss from failing on noise.
  std::string failed;
  if (!std::isfinite(last_loss))
    failed = str_cat("the last loss is ", last_loss);
  else if (2 * skipped > steps)
    failed = str_cat(skipped, " of ", steps, " updates were skipped (non-finite gradients)");
  else if (std::isfinite(first_loss) && last_loss > 10 * first_loss && last_loss > first_loss + 1)
    failed = str_cat("the loss diverged, from ", first_loss, " at the first step to ", last_loss, " at the end");
  if (failed.empty()) return 0;
  std::fprintf(stderr, "demi: training failed: %s; the weights did not learn. Lower --lr, keep the level's loss "
               "scaling (--loss-scale default), or use --amp O0 to compare\n", failed.c_str());
  return 3;
}

// --report PATH, --report-data PATH: a report must be writable before the run starts, not after it.
void check_report_option(const ParsedArgs& args, const char* option) {
  const std::string path = args.get(option);
  if (path.empty()) return;
  try {
    train::check_report_path(path);
  } catch (const Error& e) {
    throw Error(std::string("--") + option + ": " + e.what());
  }
}

}  // namespace demi::cli
