// demi train and demi plan: train a reference model (or the GPT, tools/demi/gpt.cc) at an AMP level, with
// checkpoints, reports and data parallelism; or forecast its memory peak without training.
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
#include "demi/core/parallel.h"
#include "demi/core/settings.h"
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
#include "tools/demi/gpt.h"

namespace demi::cli {

using io::internal::json_number;
using io::internal::json_object;
using io::internal::json_quote;

namespace {

class JsonEpochs : public train::Callback {
 public:
  void on_epoch_end(train::RunContext& ctx) override {
    std::map<std::string, std::string> f = {{"kind", json_quote("epoch")},
                                            {"epoch", json_number(ctx.epoch)},
                                            {"loss", json_number(ctx.metrics.count("loss") ? ctx.metrics["loss"] : ctx.loss)},
                                            {"loss_scale", json_number(ctx.loss_scale)},
                                            {"seconds", json_number(ctx.epoch_seconds)},
                                            {"samples_per_second", json_number(ctx.epoch_samples_per_second)}};
    std::printf("%s\n", json_object(f).c_str());
    std::fflush(stdout);
  }
};

// Writes --report and --report-data from what the recorder holds; `stopped`: the error that ended the run
// early ("" when it finished).
void write_reports(const ParsedArgs& args, train::ReportRecorder& recorder, const std::string& stopped) {
  train::RunRecord& r = recorder.record();
  if (!stopped.empty()) {
    const int epoch = r.steps.empty() ? 1 : r.steps.back().epoch;
    const int64_t step = (r.steps.empty() ? 0 : r.steps.back().step) + 1;  // the step it stopped in
    r.events.push_back({train::ReportEvent::Kind::kWarning, epoch, step, "training stopped: " + stopped});
    r.title += " (stopped)";
  }
  if (args.has("report-data")) train::write_report(args.get("report-data"), train::run_record_to_json(r));
  if (args.has("report")) train::write_report(args.get("report"), train::render_report_html(r));
}

// The run's settings as the report's header shows them (the recorder adds the AMP level, the low dtype,
// the loss-scale manager, the threads, the CPU and the date).
void describe_run(train::RunRecord& r, const ParsedArgs& args, const Job& job, amp::Level level, DType low,
                  int epochs) {
  r.title = "model " + job.model_key + " on " + job.data_name + ", " + amp::level_name(level) + " " +
            (level == amp::Level::kO0 ? std::string("float32") : std::string(dtype_name(low)));
  r.set("model", job.model_key + " (" + job.net->type_name() + ")");
  r.set("data", job.data_name + (args.get_int("train-samples") > 0 ? ", first " + args.get("train-samples") + " samples"
                                                                     : std::string()));
  r.set("batch size", std::to_string(job.batch_size) + " (" + std::to_string(job.train_ds->get_dataset_size()) +
                          " steps per epoch)");
  r.set("epochs", std::to_string(epochs));
  r.set("optimizer", "Momentum 0.9, lr " + args.get("lr"));
  r.set("seed", args.get("seed"));
  std::string overrides;  // core/settings.h: what the environment changes in the kernels
  for (const std::string& e : env_overrides_in_force()) overrides += (overrides.empty() ? "" : ", ") + e;
  r.set("environment overrides", overrides.empty() ? std::string("none") : overrides);
}

// Data parallel: every setting that changes the result, the same on every process (a rank that differs is
// named, with the setting, before anything trains).
void check_settings_agree(const ParsedArgs& args, const Job& job) {
  std::vector<std::pair<std::string, std::string>> settings;
  for (const auto& [key, value] : run_settings(args, job)) settings.emplace_back("--" + key.substr(4), value);
  for (const char* name : {"amp", "dtype", "loss-scale", "epochs", "steps", "accumulate", "clip-grad-norm",
                           "param-grads", "optimizer-in-backward", "mode", "graph-fusion", "comm-dtype", "bucket-mb"})
    settings.emplace_back(str_cat("--", name), args.get(name));
  for (const char* flag : {"amp-adapt", "batch-norm", "zoo-style", "recompute", "recompute-attention", "resume"})
    settings.emplace_back(str_cat("--", flag), args.flag(flag) ? "on" : "off");
  dist::check_same_settings(settings);
}

// --numerics and --trace-dtypes: what the first batch's step does, before training (on stderr with --json).
void print_before_training(const ParsedArgs& args, Training& built, bool json) {
  const Job& job = built.job;
  const amp::Level level = built.level;
  const DType low = built.low;
  train::Model& model = *built.model;
  if (args.flag("numerics")) {
    // Before training: which layers overflow FP16, which gradients underflow at the step's loss scale.
    auto it = job.train_ds->create_iterator();
    auto batch = it->next();
    DEMI_CHECK(batch.has_value(), "--numerics: the training set is empty");
    double scale = model.loss_scale_manager() ? model.loss_scale_manager()->get_loss_scale() : 1.0;
    nn::SoftmaxCrossEntropyWithLogits loss(true, "mean");
    // (With --json, standard output holds only JSON lines: the table goes to standard error.)
    std::fprintf(json ? stderr : stdout, "%s\n",
                 amp::analyze_numerics(*job.net, loss, (*batch)[0], (*batch)[1], scale).to_string().c_str());
  }
  if (args.flag("trace-dtypes")) {
    // What AMP does to each op, forward and backward, for the first batch (nothing is updated).
    auto it = job.train_ds->create_iterator();
    auto batch = it->next();
    DEMI_CHECK(batch.has_value(), "--trace-dtypes: the training set is empty");
    std::fprintf(json ? stderr : stdout, "ops of one train step, model %s at %s %s:\n%s\n", job.model_key.c_str(),
                 amp::level_name(level),
                level == amp::Level::kO0 ? "float32" : std::string(dtype_name(low)).c_str(),
                amp::trace_dtypes(model.train_step(), (*batch)[0], (*batch)[1]).to_string().c_str());
  }
}

// The run's end: one JSON line (--json) or a few lines of text, and the data-parallel line.
void print_summary(const ParsedArgs& args, const Training& built, std::map<std::string, double>& metrics,
                   int64_t sink_size, bool json) {
  const Job& job = built.job;
  const amp::Level level = built.level;
  const DType low = built.low;
  train::Model& model = *built.model;
  const train::TrainSummary& s = model.last_summary();
  auto pk = [&](MemCategory c) { return s.peak.pk(c); };
  // Whether each update ran in backward (--optimizer-in-backward; auto: graph mode's choice).
  const bool in_backward = args.get_int("accumulate") == 1 && model.train_step().optimizer_in_backward();
  // How its float16 products multiplied: the run's option, unless DEMI_F16_PRODUCTS overrode it.
  const F16Products products = f16_products_override().value_or(built.mo.f16_products);
  if (json) {
    std::map<std::string, std::string> f = {
        {"kind", json_quote("summary")},
        {"model", json_quote(job.model_key)},
        {"data", json_quote(job.data_name)},
        {"amp", json_quote(amp::level_name(level))},
        {"dtype", json_quote(std::string(dtype_name(low)))},
        {"steps", json_number(static_cast<double>(s.steps))},
        {"samples_per_second", json_number(s.samples_per_second)},
        {"median_step_ms", json_number(s.median_step_seconds * 1e3)},
        {"data_wait_fraction", json_number(s.data_wait_fraction)},
        {"final_loss", json_number(s.mean_last_epoch_loss)},
        {"skipped_steps", json_number(static_cast<double>(s.skipped_steps))},
        {"skip_warnings", json_number(static_cast<double>(s.skip_warnings))},
        {"loss_scale", json_number(s.final_loss_scale)},
        {"test_accuracy", json_number(metrics["Accuracy"])},
        {"peak_total", json_number(static_cast<double>(s.peak.total_peak))},
        {"peak_parameter", json_number(static_cast<double>(pk(MemCategory::kParameter)))},
        {"peak_gradient", json_number(static_cast<double>(pk(MemCategory::kGradient)))},
        {"peak_optimizer_state", json_number(static_cast<double>(pk(MemCategory::kOptimizerState)))},
        {"peak_activation", json_number(static_cast<double>(pk(MemCategory::kActivation)))},
        {"peak_cast_cache", json_number(static_cast<double>(pk(MemCategory::kCastCache)))},
        {"peak_workspace", json_number(static_cast<double>(pk(MemCategory::kWorkspace)))},
        {"peak_data", json_number(static_cast<double>(pk(MemCategory::kData)))},
        {"peak_rss", json_number(static_cast<double>(s.peak_rss_bytes))},
        {"steady_steps", json_number(static_cast<double>(s.steady_steps))},
        {"system_allocs_per_step", json_number(s.system_allocs_per_step)},
        {"page_faults_per_step", json_number(s.page_faults_per_step)},
        {"mode", json_quote(exec_mode_name(get_context().mode))},
        {"optimizer_in_backward", in_backward ? "true" : "false"},
        {"f16_products", json_quote(f16_products_name(products))},
        {"sink_size", json_number(static_cast<double>(sink_size))},
        {"graph_replayed_steps", json_number(static_cast<double>(s.graph.replayed_steps))},
        {"graph_diverged_steps", json_number(static_cast<double>(s.graph.diverged_steps))},
        {"graph_arena", json_number(static_cast<double>(s.graph_plan.arena_bytes))},
        {"graph_lower_bound", json_number(static_cast<double>(s.graph_plan.lower_bound))},
        {"graph_upper_bound", json_number(static_cast<double>(s.graph_plan.upper_bound))},
        {"graph_plan_ms", json_number(s.graph_plan.plan_seconds * 1e3)},
        {"graph_trace_ms", json_number(s.graph_plan.trace_seconds * 1e3)},
        {"graph_rewrites", json_quote(s.graph_plan.rewrites)},
        {"graph_allocations", json_number(static_cast<double>(s.graph_plan.allocations))},
        {"reserved_end", json_number(static_cast<double>(s.reserved_end))},
    };
    std::string overrides;  // the environment overrides in force (core/settings.h)
    for (const std::string& e : env_overrides_in_force()) overrides += (overrides.empty() ? "" : ";") + e;
    f.emplace("env_overrides", json_quote(overrides));
    f.emplace("peak_train", json_number(static_cast<double>(s.peak.train_peak)));
    // (kernel tuning's trial runs, a shape's first call on a cold choice cache: in no peak above)
    f.emplace("peak_tuning", json_number(static_cast<double>(s.peak.tuning_peak)));
    int64_t attributed = 0;
    for (const auto& [op, n] : s.overflow_ops) attributed += n;
    f.emplace("attributed_overflows", json_number(static_cast<double>(attributed)));
    std::string ops_list, promoted;
    for (const auto& [op, n] : s.overflow_ops) ops_list += (ops_list.empty() ? "" : "; ") + op + " x" + std::to_string(n);
    for (const auto& p : s.promotions) promoted += (promoted.empty() ? "" : ",") + p.layer;
    f.emplace("overflow_ops", io::internal::json_quote(ops_list));
    f.emplace("promotions", io::internal::json_quote(promoted));
    f.emplace("processes", json_number(static_cast<double>(dist::get_group_size())));
    if (const dist::DataParallel* dp = model.data_parallel(); dp != nullptr && dp->stats().steps > 0) {
      const double steps = static_cast<double>(dp->stats().steps);
      f.emplace("allreduce_ms_per_step", json_number(1e3 * dp->stats().reduce_seconds / steps));
      f.emplace("allreduce_exposed_ms_per_step", json_number(1e3 * dp->stats().exposed_seconds / steps));
    }
    for (int c = 0; c < kNumMemCategories; ++c) {
      const std::string name = json_category(c);
      f.emplace("at_peak_" + name, json_number(static_cast<double>(s.peak.at_peak[c])));
      f.emplace("at_train_peak_" + name, json_number(static_cast<double>(s.peak.at_train_peak[c])));
    }
    std::printf("%s\n", json_object(f).c_str());
  } else {
    const bool bf16_products =
        level != amp::Level::kO0 && low == DType::kF16 && products == F16Products::kBf16;
    std::printf("model %s on %s, %s %s%s: %lld steps, %.0f samples/s (median step %.2f ms), data wait %.2f%%\n",
                job.model_key.c_str(), job.data_name.c_str(), amp::level_name(level),
                level == amp::Level::kO0 ? "float32" : std::string(dtype_name(low)).c_str(),
                bf16_products ? " (products in bfloat16)" : "",
                static_cast<long long>(s.steps), s.samples_per_second, s.median_step_seconds * 1e3,
                100 * s.data_wait_fraction);
    std::printf("final train loss %.4f, test accuracy %.4f, %lld step(s) skipped, loss scale %g\n",
                s.mean_last_epoch_loss, metrics["Accuracy"], static_cast<long long>(s.skipped_steps), s.final_loss_scale);
    for (const auto& [op, n] : s.overflow_ops)
      std::printf("overflow began in %s: %lld step(s), e.g. %s\n", op.c_str(), static_cast<long long>(n),
                  s.overflow_examples.at(op).c_str());
    for (const auto& p : s.promotions)
      std::printf("amp-adapt promoted layer '%s' (%s) to FP32 at step %lld\n", p.layer.c_str(), p.type.c_str(),
                  static_cast<long long>(p.step));
    if (s.graph.traced_steps > 0) {
      // Train-step calls: one per update, or with --accumulate one per micro-batch and one per update.
      const int64_t calls = s.graph.eager_steps + s.graph.traced_steps + s.graph.replayed_steps;
      std::printf("%s: %lld of %lld train-step calls replayed a static memory plan (%lld left it)%s; %s\n",
                  exec_mode_name(get_context().mode), static_cast<long long>(s.graph.replayed_steps),
                  static_cast<long long>(calls), static_cast<long long>(s.graph.diverged_steps),
                  in_backward ? ", each parameter updated in backward" : "", s.graph_plan.describe().c_str());
    }
    std::printf("steady state (%lld steps): %.2f system allocations and %.2f page faults per step\n",
                static_cast<long long>(s.steady_steps), s.system_allocs_per_step, s.page_faults_per_step);
    std::printf("peak tracked memory %s MiB (activations %s, cast cache %s, workspace %s), process peak RSS %s MiB\n",
                mib(s.peak.total_peak).c_str(), mib(pk(MemCategory::kActivation)).c_str(),
                mib(pk(MemCategory::kCastCache)).c_str(), mib(pk(MemCategory::kWorkspace)).c_str(),
                mib(s.peak_rss_bytes).c_str());
  }
  if (const dist::DataParallel* dp = model.data_parallel(); dp != nullptr && !json && dp->stats().steps > 0) {
    const dist::DataParallelStats& d = dp->stats();
    const double steps = static_cast<double>(d.steps);
    std::printf("data parallel, %d processes: per step %.2f ms of gradient all-reduce (%lld bucket(s), %.2f MiB), "
                "%.2f ms of it after backward (%.0f%% hidden behind backward)\n",
                dist::get_group_size(), 1e3 * d.reduce_seconds / steps, static_cast<long long>(dp->num_buckets()),
                static_cast<double>(d.bytes_sent) / steps / (1 << 20), 1e3 * d.exposed_seconds / steps,
                d.reduce_seconds > 0 ? 100 * std::max(0.0, 1 - d.exposed_seconds / d.reduce_seconds) : 0.0);
  }
}

int run_train_or_plan(const ParsedArgs& args, bool plan) {
  start_data_parallel(args);
  if (plan) refuse_training_only(args);
  refuse_settings_that_change_nothing(args, amp::parse_level(args.get("amp")), parse_dtype(args.get("dtype")));
  if (const ModelEntry& m = find_model(args.get("model")); m.run != nullptr) {
    if (args.has("max-memory")) throw UsageError(str_cat("--max-memory takes models A, B, C, D and R; not yet ", m.key));
    if (args.has("sink-size"))
      throw UsageError(str_cat("--sink-size takes models A, B, C, D and R; ", m.key, " trains by --steps, not by epochs"));
    return m.run(args, plan);
  }
  for (const Option& o : gpt_train_options())  // the GPT's own options mean nothing to the other models
    if (args.has(o.name)) throw UsageError("--" + o.name + " is for --model gpt");
  apply_thread_option(args);
  bool json = args.flag("json");
  // Standard output carries only the JSON lines; what callbacks and Model.train report goes to stderr.
  if (json) train::set_callback_stream(&std::cerr);
  // Rank 0 writes the report (every process agrees on the losses, the overflows and the scale).
  const bool reporting = (args.has("report") || args.has("report-data")) && dist::get_rank() == 0;
  if (reporting) {
    check_report_option(args, "report");
    check_report_option(args, "report-data");
  }
  if (args.has("max-memory")) return run_train_or_plan(with_batch_under_budget(args), plan);
  Training built = build_training(args, reporting);
  Job& job = built.job;
  check_settings_agree(args, job);
  if (const int64_t batches = job.train_ds->get_dataset_size(), per_update = dist::get_group_size() * built.mo.accumulate;
      built.mo.accumulate > 1 && batches > 0 && per_update > batches)
    throw UsageError(str_cat("--accumulate ", built.mo.accumulate, " needs ", per_update, " batches per update, and an "
                             "epoch has ", batches, ": no update would be what was asked. Lower --accumulate or "
                             "--batch-size, or give more --train-samples"));
  const amp::Level level = built.level;
  const DType low = built.low;
  const train::ModelOptions& mo = built.mo;
  const int64_t step_budget = args.get_int("steps");
  train::Model& model = *built.model;
  print_before_training(args, built, json);
  if (plan) {
    auto it = job.train_ds->create_iterator();
    auto batch = it->next();
    DEMI_CHECK(batch.has_value(), "plan: the training set is empty");
    return print_forecast(model, (*batch)[0], (*batch)[1], args, job.model_key, level, low, job.batch_size);
  }
  std::vector<train::CallbackPtr> cbs;
  if (json)
    cbs.push_back(std::make_shared<JsonEpochs>());
  else
    cbs.push_back(std::make_shared<train::ProgressBar>(50));
  // A long sink (--sink-size 10^6) is not silence: a line on stderr every 30 s inside it.
  model.add_hook(std::make_shared<train::SinkProgress>(std::cerr, 30.0));
  if (args.flag("profile")) ops::set_profiling(true);
  int epochs = static_cast<int>(args.get_int("epochs"));
  const int64_t sink_size = args.get_int("sink-size");
  if (step_budget > 0) {
    // --steps N: as many epochs as N updates need (the last one cut short), whatever --epochs says.
    const int64_t batches = job.train_ds->get_dataset_size();
    if (batches <= 0) throw Error("--steps: the training set's size is unknown, so its epochs cannot be counted");
    const int64_t per_update = static_cast<int64_t>(dist::get_group_size()) * mo.accumulate;
    // (With --sink-size N an epoch is one sink of N batches.)
    const int64_t updates_per_epoch =
        sink_size > 0 ? std::max<int64_t>(sink_size / mo.accumulate, 1) : (batches + per_update - 1) / per_update;
    epochs = static_cast<int>(std::min<int64_t>((step_budget + updates_per_epoch - 1) / updates_per_epoch, 1000000));
  }
  std::string ckpt_dir = args.get("ckpt-dir");
  if (args.flag("resume")) {
    if (ckpt_dir.empty()) throw UsageError("--resume needs --ckpt-dir DIR (where the run's checkpoints are)");
    auto last = resume_checkpoint(ckpt_dir, "model" + job.model_key);
    if (last) {
      const io::TrainingState& state = last->state;
      check_resume_settings(state.meta, run_settings(args, job), last->path.string());
      train::restore_checkpoint(state, model);
      if (!json)
        std::printf("resumed from %s: epoch %lld, step %lld\n", last->path.string().c_str(),
                    static_cast<long long>(state.meta.epochs_done + 1), static_cast<long long>(state.meta.step));
    } else if (!json) {
      std::printf("no checkpoint in %s yet: starting from the beginning\n", ckpt_dir.c_str());
    }
  }
  if (!ckpt_dir.empty()) {
    train::CheckpointConfig cc;
    cc.save_checkpoint_steps = args.get_int("ckpt-every");
    cc.save_checkpoint_epochs = 1;  // and at the end of every epoch
    cc.keep_checkpoint_max = static_cast<int>(args.get_int("keep-ckpt"));
    cc.extra = run_settings(args, job);
    cc.other_runs = checkpoint_other_runs(args);
    cbs.push_back(std::make_shared<train::ModelCheckpoint>("model" + job.model_key, ckpt_dir, cc));
  }
  std::shared_ptr<train::ReportRecorder> recorder;
  if (reporting) {
    recorder = std::make_shared<train::ReportRecorder>();
    describe_run(recorder->record(), args, job, level, low, epochs);
    cbs.push_back(recorder);
  }
  int remaining = epochs - static_cast<int>(model.epochs_done());
  if (step_budget > 0 && model.steps_done() >= step_budget) remaining = 0;
  if (remaining < 1) {
    if (!json) {
      if (step_budget > 0) {
        std::printf("the checkpoint already has the %lld step(s) of --steps: nothing left to train\n",
                    static_cast<long long>(step_budget));
      } else {
        std::printf("the checkpoint already has %d epoch(s): nothing left to train\n", epochs);
      }
    }
  } else {
    try {
      model.train(remaining, job.train_ds, cbs, true, sink_size);
    } catch (const Error& e) {
      // A run that stopped (a NaN loss at O0, bad input data) is reported too, up to where it stopped.
      if (recorder) write_reports(args, *recorder, e.what());
      throw;
    }
  }
  auto metrics = model.eval(job.test_ds);
  const train::TrainSummary& s = model.last_summary();
  print_summary(args, built, metrics, sink_size, json);
  if (args.flag("profile")) std::printf("\n%s", ops::profile_report().c_str());
  if (recorder) {
    recorder->finish(s, {{"test accuracy", metrics["Accuracy"]}, {"test loss", metrics["Loss"]}});
    write_reports(args, *recorder, "");
    if (args.has("report") && !json) std::printf("report: %s\n", args.get("report").c_str());
  }
  // A run that did not train is not a success (training_failure).
  if (remaining >= 1 && s.steps > 0)
    return training_exit_status(s.first_loss, s.mean_last_epoch_loss, s.skipped_steps, s.steps);
  return 0;
}

int run_train(const ParsedArgs& args) { return run_train_or_plan(args, false); }

int run_plan(const ParsedArgs& args) { return run_train_or_plan(args, true); }

}  // namespace

void add_train_commands(std::vector<Command>& cmds) {
  std::vector<Option> train_opts = training_options();
  for (Option& o : gpt_train_options()) train_opts.push_back(std::move(o));
  train_opts.push_back({"amp", "LEVEL", "AMP level: O0, O1, O2, O3", "O0"});
  train_opts.push_back({"dtype", "T", "low-precision dtype: fp16 or bf16", "fp16"});
  train_opts.push_back({"json", "", "print one JSON object per epoch and a summary", ""});
  train_opts.push_back({"profile", "", "print time, calls and bytes per op, forward and backward", ""});
  train_opts.push_back({"ckpt-dir", "DIR", "save checkpoints (safetensors) in DIR", ""});
  train_opts.push_back(int_option("ckpt-every", "N", "save every N steps (0: at the end of each epoch)", "0", 0, 1e12));
  train_opts.push_back(int_option("keep-ckpt", "K", "keep the last K checkpoints (0: all)", "3", 0, 1e6));
  train_opts.push_back({"resume", "", "continue from the latest checkpoint in --ckpt-dir", ""});
  train_opts.push_back({"start-over", "", "train from the beginning in a --ckpt-dir that holds another run's "
                                          "checkpoints, moving them aside into a subfolder (never deleted)", ""});
  train_opts.push_back(real_option("clip-grad-norm", "X", "clip the gradients to global L2 norm X after unscaling "
                                                          "(0: off)", "0", 0, 1e12));
  train_opts.push_back(int_option("accumulate", "N", "batches per update (gradient accumulation)", "1", 1, 1 << 20));
  train_opts.push_back(int_option("sink-size", "N", "sink mode, MindSpore's sink_size: the callbacks (progress, "
                                                    "checkpoints) see each sink of steps once; -1: one sink per "
                                                    "epoch; N > 0: each --epochs is one sink of N batches, the data "
                                                    "running on across the data set's epochs; 0: every step", "0", -1,
                                  1e12));
  train_opts.push_back({"max-memory", "SIZE", "choose the largest batch size (a multiple of 8) whose training peak "
                                             "fits SIZE (512MiB, 2GiB, 800MB), forecast by probes", ""});
  train_opts.push_back({"recompute", "", "recompute each encoder layer (D) or block (gpt) in backward instead of "
                                         "keeping its activations", ""});
  train_opts.push_back({"recompute-attention", "", "recompute the attention probabilities in backward instead of "
                                                   "keeping them (D, gpt): the same gradients, less memory", ""});
  train_opts.push_back({"optimizer-in-backward", "WHEN", "update each parameter as soon as backward completes its "
                                                         "gradient, and free the gradient: on (no loss scale, "
                                                         "clipping or --accumulate), off, or auto (graph mode "
                                                         "wherever nothing waits on every gradient)", "auto"});
  train_opts.push_back({"param-grads", "P", "parameter gradients: bf16 (half the bytes of FP32, FP32's range), fp32, "
                                            "or auto (bf16 at O2/O3, fp32 at O0/O1)", "auto"});
  train_opts.push_back({"optimizer-state", "T", "the optimizer's state (momentum, Adam's moments): fp32, or bf16 "
                                                "(half the bytes; rounded after each update: changes the numerics)",
                        "fp32"});
  train_opts.push_back(int_option("steps", "N", "stop after N updates in all (0: --epochs decides; --model gpt: the run's "
                                               "length, which the learning-rate schedule spans, default 2000)", "0", 0, 1e15));
  train_opts.push_back({"comm-dtype", "T", "under mpirun: gradients travel as fp32 or bf16 (summed in FP32, "
                                            "rounded once)", "fp32"});
  train_opts.push_back(real_option("bucket-mb", "MB", "under mpirun: gradient bucket size in MiB (0: a quarter of "
                                                     "the gradients, within 1..25)", "0", 0, 1e6));
  train_opts.push_back({"amp-adapt", "", "adaptive AMP: a layer that keeps overflowing where the loss scale cannot "
                                         "help is promoted to FP32 for the rest of training", ""});
  train_opts.push_back({"trace-dtypes", "", "before training, print every op of one step (forward and backward) by "
                                            "layer with its compute and output dtypes, and ops and FLOPs per dtype", ""});
  train_opts.push_back({"numerics", "", "before training, report FP16 overflow per layer and gradient underflow "
                                        "per parameter at the loss scale", ""});
  train_opts.push_back({"report", "PATH", "write a self-contained HTML report of the run: settings, key numbers, "
                                          "charts of loss, loss scale, throughput and memory, events", ""});
  train_opts.push_back({"report-data", "PATH", "write the report's data (every step, epoch, memory sample and "
                                               "event) as JSON", ""});
  std::vector<Option> plan_opts = train_opts;
  cmds.push_back({.name = "train",
                  .summary = "Train a reference model at an AMP level, then evaluate it on the test split.",
                  .options = std::move(train_opts),
                  .run = run_train});
  cmds.push_back({.name = "plan",
                  .summary = "Say what training would take at its memory peak, per category, without training.",
                  .options = std::move(plan_opts),
                  .run = run_plan});
}

}  // namespace demi::cli
