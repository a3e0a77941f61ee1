// demi eval: evaluate saved weights (a demi checkpoint or PyTorch safetensors) on the test split.
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

namespace {

int run_eval(const ParsedArgs& args) {
  apply_thread_option(args);
  if (!args.has("checkpoint")) throw UsageError("eval needs --checkpoint FILE (a demi or PyTorch safetensors file)");
  for (const char* name : {"epochs", "lr", "loss-scale", "train-samples"})  // (accepted before, and ignored)
    if (args.has(name))
      throw UsageError(str_cat("demi eval: --", name, " changes training, and eval trains nothing: leave it out"));
  Job job = make_job(args);
  io::TrainingState state = train::load_checkpoint(args.get("checkpoint"));
  // Every parameter and buffer must come from the file: another model's checkpoint, or one with unrelated
  // tensors, would otherwise report the accuracy of random weights. --allow-partial loads what matches
  // and says what did not.
  const bool partial = args.flag("allow-partial");
  train::LoadReport report;
  try {
    report = train::load_param_into_net(*job.net, state.tensors, /*strict=*/!partial, args.flag("allow-non-finite"));
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "; 'demi eval --allow-partial' loads what matches and lists the rest");
  }
  if (partial) {
    auto list = [](const std::vector<std::string>& names) {
      std::string out;
      for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
      return out.empty() ? std::string("none") : out;
    };
    std::printf("--allow-partial: %zu tensor(s) loaded; not in the file (left at their initial values): %s; in the "
                "file but not in model %s: %s\n",
                report.loaded.size(), list(report.missing).c_str(), job.model_key.c_str(),
                list(report.unexpected).c_str());
    if (report.loaded.empty()) throw Error("--allow-partial: nothing in '" + args.get("checkpoint") +
                                           "' matches a parameter of model " + job.model_key);
  }
  amp::Level level = amp::parse_level(args.get("amp"));
  DType low = parse_dtype(args.get("dtype"));
  if (level != amp::Level::kO0) amp::auto_mixed_precision(*job.net, level, low);
  auto opt = std::make_shared<optim::SGD>(job.net->trainable_params(), 0.0);
  train::Model model(job.net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt,
                     {{"Accuracy", std::make_shared<train::Accuracy>()}, {"Loss", std::make_shared<train::Loss>()}},
                     {.amp_level = level, .low_dtype = low, .f16_products = parse_f16_products(args, level, low)});
  auto metrics = model.eval(job.test_ds);
  std::printf("model %s on %s (test split), %s: accuracy %.4f, loss %.4f\n", job.model_key.c_str(),
              job.data_name.c_str(), amp::level_name(level), metrics["Accuracy"], metrics["Loss"]);
  return 0;
}

}  // namespace

void add_eval_command(std::vector<Command>& cmds) {
  std::vector<Option> eval_opts = training_options();
  eval_opts.push_back({"checkpoint", "FILE", "weights to evaluate (a demi checkpoint or PyTorch safetensors)", ""});
  eval_opts.push_back({"amp", "LEVEL", "AMP level to evaluate at", "O0"});
  eval_opts.push_back({"dtype", "T", "low-precision dtype: fp16 or bf16", "bf16"});
  eval_opts.push_back({"allow-partial", "", "load what matches when the file lacks some parameters (listed) "
                                            "instead of refusing it", ""});
  eval_opts.push_back({"allow-non-finite", "", "load NaN or infinite weights (to inspect a diverged run) instead "
                                               "of refusing them", ""});
  cmds.push_back({.name = "eval",
                  .summary = "Evaluate saved weights on the test split (accuracy and loss).",
                  .options = std::move(eval_opts),
                  .run = run_eval});
}

}  // namespace demi::cli
