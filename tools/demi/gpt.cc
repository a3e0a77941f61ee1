// demi train --model gpt, demi generate, demi data: a character-level GPT (nn/gpt.h) trained on a text
// file, the King James Bible (Debian's bible-kjv) by default, and sampled from its checkpoint.
#include "tools/demi/gpt.h"


#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <limits>
#include <optional>
#include <string>

#include "demi/amp/policy.h"
#include "demi/core/files.h"
#include "demi/core/settings.h"
#include "demi/core/context.h"
#include "demi/core/rng.h"
#include "demi/data/iterator.h"
#include "demi/data/text.h"
#include "demi/distributed/distributed.h"
#include "demi/io/atomic_file.h"
#include "demi/io/internal/json.h"
#include "demi/nn/gpt.h"
#include "demi/ops/ops.h"
#include "demi/optim/optimizer.h"
#include "demi/optim/param_groups.h"
#include "demi/train/checkpoint.h"
#include "demi/train/model.h"
#include "tools/demi/gpt_meta.h"
#include "tools/demi/training.h"
#include "tools/demi/subprocess.h"

namespace demi::cli {
namespace {

namespace fs = std::filesystem;

const char* kBibleRange = "Gen1:1-Rev22:21";

fs::path kjv_path() { return fs::path(cache_dir()) / "kjv.txt"; }

// The whole King James Bible from Debian's bible-kjv (`bible -f`), written once (atomically) to the cache.
fs::path ensure_kjv(bool verbose) {
  const fs::path path = kjv_path();
  std::error_code ec;
  if (fs::is_regular_file(path, ec) && fs::file_size(path, ec) > 0) return path;
  std::string text;
  try {
    ChildResult bible = run_child({"bible", "-f", kBibleRange}, /*capture_stdout=*/true, /*discard_stderr=*/true);
    if (bible.ok()) text = std::move(bible.out);
  } catch (const Error&) {  // not installed: said below
  }
  if (text.size() < 1000000)
    throw Error("the default text is the King James Bible from Debian's bible-kjv package, and `bible -f " +
                std::string(kBibleRange) + "` did not print it (" +
                (text.empty() ? "is the package installed? scripts/setup installs it; apt-get install bible-kjv"
                              : "only " + std::to_string(text.size()) + " bytes") +
                "); or train on any UTF-8 file with --data text:PATH");
  fs::create_directories(path.parent_path(), ec);
  if (ec) throw Error("cannot create the cache folder " + path.parent_path().string() + ": " + ec.message());
  io::write_file_atomic(path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  if (verbose) std::fprintf(stderr, "demi: wrote the King James Bible (%zu bytes) to %s\n", text.size(), path.c_str());
  return path;
}

// --data: "default" (the Bible) or "text:PATH".
std::string text_path(const std::string& data) {
  if (data == "default" || data == "kjv") return ensure_kjv(true).string();
  if (data.rfind("text:", 0) == 0 && data.size() > 5) return data.substr(5);
  throw UsageError("--model gpt trains on text: --data text:PATH (any UTF-8 file) or default (the King James "
                   "Bible), got '" + data + "'");
}

nn::GPTOptions gpt_options(const ParsedArgs& args, int64_t vocab_size) {
  nn::GPTOptions o;
  o.vocab_size = vocab_size;
  o.block_size = args.get_int("block-size");
  o.n_layer = args.get_int("layers");
  o.n_head = args.get_int("heads");
  o.n_embd = args.get_int("dim");
  o.dropout = args.get_real("dropout");
  return o;
}

// What `demi generate` needs to rebuild the network, stored in every checkpoint of a GPT run.
io::Metadata gpt_metadata(const nn::GPTOptions& o, const data::TextVocab& vocab, const std::string& text) {
  return {{"gpt.vocab", vocab.to_string()},         {"gpt.block_size", std::to_string(o.block_size)},
          {"gpt.n_layer", std::to_string(o.n_layer)}, {"gpt.n_head", std::to_string(o.n_head)},
          {"gpt.n_embd", std::to_string(o.n_embd)},   {"gpt.bias", o.bias ? "1" : "0"},
          {"gpt.text", text}};
}

// One evaluation: the step it followed, the mean training loss since the previous one, the validation loss.
struct EvalPoint {
  int64_t step;
  double train_loss, valid_loss;
};

// Options of `demi train` that mean nothing for the GPT (the reference models' data and reports): refused,
// never silently ignored.
void refuse_unsupported(const ParsedArgs& args) {
  for (const char* o :
       {"epochs", "train-samples", "batch-norm", "zoo-style", "report", "report-data", "numerics", "trace-dtypes"})
    if (args.has(o))
      throw UsageError(std::string("--") + o + " is not supported with --model gpt (use --steps and --eval-every)");
}

// The metadata keys that fix the network's shape: a resumed run must have the same.
void check_resume_shape(const io::Metadata& saved, const io::Metadata& now, const std::string& file) {
  for (const char* key : {"gpt.vocab", "gpt.block_size", "gpt.n_layer", "gpt.n_head", "gpt.n_embd", "gpt.bias"}) {
    auto it = saved.find(key);
    if (it == saved.end())
      throw Error("--resume: " + file + " is not a checkpoint of `demi train --model gpt` (no '" + key + "')");
    if (it->second != now.at(key))
      throw UsageError("--resume: " + file + " was trained with another " + std::string(key).substr(4) +
                       (std::string(key) == "gpt.vocab" ? " (another text)" : " (" + it->second + ", now " +
                                                                                   now.at(key) + ")") +
                       "; resume with the same model options and text, or start a new --ckpt-dir");
  }
}

}  // namespace

// AdamW (0.9, 0.99) with decoupled decay on the weight matrices only (not biases, norms, embeddings),
// cosine decay to lr / 10 after a linear warm-up: nanoGPT's Shakespeare-char recipe.
std::shared_ptr<optim::AdamW> gpt_optimizer(const ParsedArgs& args, nn::GPT& net, int64_t steps) {
  const double lr = args.has("lr") ? args.get_real("lr") : 1e-3;
  const double wd = args.get_real("weight-decay");
  const int64_t warmup = std::min(args.get_int("warmup"), steps);
  auto groups = optim::weight_decay_groups(net.parameters_and_names(), wd, {"wte", "wpe"});
  auto opt = std::make_shared<optim::AdamW>(groups, optim::cosine_lr(lr, steps, warmup, lr / 10),
                                            optim::AdamOptions{.beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8});
  opt->set_state_dtype(parse_optimizer_state(args.get("optimizer-state")));
  return opt;
}

// The GPT's AMP and training options (clipping at 1.0 unless told otherwise, the step budget).
train::ModelOptions gpt_model_options(const ParsedArgs& args, int64_t steps) {
  train::ModelOptions mo;
  mo.amp_level = amp::parse_level(args.get("amp"));
  mo.low_dtype = parse_dtype(args.get("dtype"));
  if (!is_low_precision(mo.low_dtype)) throw UsageError("--dtype must be fp16 or bf16, got '" + args.get("dtype") + "'");
  mo.loss_scale_manager = parse_loss_scale(args.get("loss-scale"));
  mo.no_loss_scale = args.get("loss-scale") == "none";  // overrides the level's default manager
  mo.accumulate = static_cast<int>(args.get_int("accumulate"));
  mo.amp_adapt = args.flag("amp-adapt");
  mo.f16_products = parse_f16_products(args, mo.amp_level, mo.low_dtype);
  mo.low_precision_param_grads = parse_param_grads(args.get("param-grads"));
  mo.optimizer_in_backward = parse_optimizer_in_backward(args.get("optimizer-in-backward"));
  mo.clip_grad_norm = args.has("clip-grad-norm") ? args.get_real("clip-grad-norm") : 1.0;
  mo.max_steps = steps;
  return mo;
}

int run_train_gpt(const ParsedArgs& args, bool plan) {
  apply_thread_option(args);
  const bool json = args.flag("json");
  // Standard output carries only the JSON lines; what callbacks and Model.train report goes to stderr.
  if (json) train::set_callback_stream(&std::cerr);
  refuse_unsupported(args);
  if (args.get_int("dim") % args.get_int("heads") != 0)
    throw UsageError("--dim (" + args.get("dim") + ") must be a multiple of --heads (" + args.get("heads") + ")");
  const std::string path = text_path(args.get("data"));
  const uint64_t seed = static_cast<uint64_t>(args.get_int("seed"));
  set_seed(seed);
  data::TextVocab vocab = data::TextVocab::chars_of_file(path);
  nn::GPTOptions o = gpt_options(args, vocab.size());
  const int64_t batch = args.get_int("batch-size") > 0 ? args.get_int("batch-size") : 32;
  const int64_t steps = args.get_int("steps") > 0 ? args.get_int("steps") : 2000;
  const int64_t eval_every = std::min(args.get_int("eval-every"), steps);
  const int64_t eval_windows = args.get_int("eval-windows");
  auto net = std::make_shared<nn::GPT>(o);
  if (args.flag("recompute"))
    for (auto& block : net->h) block->recompute();
  if (args.flag("recompute-attention"))
    for (auto& block : net->h) block->attn->recompute_probabilities = true;
  // Each epoch is eval_every updates of fresh random windows (each update takes --accumulate batches per
  // process); the validation windows are fixed by the seed.
  const int64_t batches_per_update = args.get_int("accumulate") * dist::get_group_size();
  auto train_text = std::make_shared<data::TextDataset>(
      path, vocab,
      data::TextDatasetOptions{
          .block_size = o.block_size, .split = "train", .windows = eval_every * batch * batches_per_update, .seed = seed});
  auto valid_text = std::make_shared<data::TextDataset>(
      path, vocab,
      data::TextDatasetOptions{.block_size = o.block_size, .split = "valid", .windows = eval_windows, .seed = seed + 1});
  auto train_ds = train_text->batch(batch);
  auto valid_ds = valid_text->batch(std::min(batch, eval_windows));
  auto opt = gpt_optimizer(args, *net, steps);
  const train::ModelOptions mo = gpt_model_options(args, steps);
  train::Model model(net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt,
                     {{"Loss", std::make_shared<train::Loss>()}}, mo);
  if (plan) {
    auto first = train_ds->create_iterator()->next();
    DEMI_CHECK(first.has_value(), "plan: the text yields no batch of windows");
    return print_forecast(model, (*first)[0], (*first)[1], args, "gpt", mo.amp_level, mo.low_dtype, batch);
  }
  const std::string level = amp::level_name(mo.amp_level);
  const std::string dtype = mo.amp_level == amp::Level::kO0 ? "float32" : std::string(dtype_name(mo.low_dtype));
  std::vector<train::CallbackPtr> cbs;
  const std::string ckpt_dir = args.get("ckpt-dir");
  const io::Metadata meta = gpt_metadata(o, vocab, path);
  if (args.flag("resume")) {
    if (ckpt_dir.empty()) throw UsageError("--resume needs --ckpt-dir DIR (where the run's checkpoints are)");
    auto last = resume_checkpoint(ckpt_dir, "gpt");
    if (last) {
      check_resume_shape(last->state.meta.extra, meta, last->path.string());
      train::restore_checkpoint(last->state, model);
      if (!json)
        std::printf("resumed from %s: step %lld\n", last->path.string().c_str(),
                    static_cast<long long>(model.steps_done()));
    } else if (!json) {
      std::printf("no checkpoint in %s yet: starting from the beginning\n", ckpt_dir.c_str());
    }
  }
  if (!ckpt_dir.empty()) {
    train::CheckpointConfig cc;
    cc.save_checkpoint_steps = args.get_int("ckpt-every");
    cc.save_checkpoint_epochs = 1;  // at every evaluation
    cc.keep_checkpoint_max = static_cast<int>(args.get_int("keep-ckpt"));
    cc.extra = meta;
    cc.other_runs = checkpoint_other_runs(args);
    cbs.push_back(std::make_shared<train::ModelCheckpoint>("gpt", ckpt_dir, cc));
  }
  if (!json)
    std::printf("GPT %lld layers x %lld heads x %lld wide, context %lld, %.2fM parameters; %s of %s (%lld train, "
                "%lld validation tokens); %s %s, batch %lld, %lld steps\n",
                static_cast<long long>(o.n_layer), static_cast<long long>(o.n_head), static_cast<long long>(o.n_embd),
                static_cast<long long>(o.block_size), static_cast<double>(net->num_parameters()) / 1e6,
                vocab.describe().c_str(), path.c_str(), static_cast<long long>(train_text->num_tokens()),
                static_cast<long long>(valid_text->num_tokens()), level.c_str(), dtype.c_str(),
                static_cast<long long>(batch), static_cast<long long>(steps));
  std::fflush(stdout);
  if (args.flag("profile")) ops::set_profiling(true);
  std::optional<EvalPoint> last;  // the latest evaluation
  double train_seconds = 0;
  int64_t peak_train = 0, skipped = 0, peak_rss = 0;
  std::vector<double> chunk_tps;
  const int64_t first_step = model.steps_done();
  double first_loss = std::numeric_limits<double>::quiet_NaN();  // the run's first finite step loss
  while (model.steps_done() < steps) {
    const auto t0 = std::chrono::steady_clock::now();
    model.train(1, train_ds, cbs, true, /*sink_size=*/0);  // its callbacks count steps: no sinking
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const train::TrainSummary& s = model.last_summary();
    chunk_tps.push_back(s.samples_per_second * static_cast<double>(o.block_size));
    peak_train = std::max(peak_train, s.peak.train_peak);
    peak_rss = std::max(peak_rss, s.peak_rss_bytes);
    skipped += s.skipped_steps;
    if (std::isnan(first_loss)) first_loss = s.first_loss;
    const double valid = model.eval(valid_ds)["Loss"];
    last = EvalPoint{model.steps_done(), s.mean_last_epoch_loss, valid};
    if (json)
      std::printf("{\"kind\":\"eval\",\"step\":%lld,\"train_loss\":%.6f,\"valid_loss\":%.6f,\"tokens_per_second\":%.1f,"
                  "\"loss_scale\":%g}\n",
                  static_cast<long long>(model.steps_done()), s.mean_last_epoch_loss, valid, chunk_tps.back(),
                  s.final_loss_scale);
    else
      std::printf("step %5lld  train loss %.4f  valid loss %.4f  (nats per character)  %.0f tokens/s%s\n",
                  static_cast<long long>(model.steps_done()), s.mean_last_epoch_loss, valid, chunk_tps.back(),
                  s.skipped_steps > 0 ? str_cat("  ", s.skipped_steps, " step(s) skipped").c_str() : "");
    std::fflush(stdout);
  }
  if (!last) {
    if (!json)
      std::printf("the checkpoint already has the %lld step(s) of --steps: nothing left to train\n",
                  static_cast<long long>(steps));
    return 0;
  }
  std::sort(chunk_tps.begin(), chunk_tps.end());
  const double median_tps = chunk_tps[chunk_tps.size() / 2];
  // Graph mode over the whole run (every train() chunk): how many steps replayed a plan, and any fallback
  // (the summary gathers every key's, and the plans outlive the chunks).
  const graph::StepGraphs::Stats g = model.train_graphs().stats();
  const std::string& fallback = model.last_summary().graph_plan.fallback;
  if (json) {
    std::printf("{\"kind\":\"summary\",\"model\":\"gpt\",\"amp\":\"%s\",\"dtype\":\"%s\",\"steps\":%lld,"
                "\"train_loss\":%.6f,\"valid_loss\":%.6f,\"tokens_per_second\":%.1f,\"peak_train\":%lld,"
                "\"peak_rss\":%lld,\"skipped_steps\":%lld,\"seconds\":%.2f,\"mode\":%s,\"graph_replayed\":%lld,"
                "\"graph_diverged\":%lld,\"graph_fallback\":%s}\n",
                level.c_str(), dtype.c_str(), static_cast<long long>(last->step), last->train_loss, last->valid_loss,
                median_tps, static_cast<long long>(peak_train), static_cast<long long>(peak_rss),
                static_cast<long long>(skipped), train_seconds, io::internal::json_quote(exec_mode_name(get_context().mode)).c_str(),
                static_cast<long long>(g.replayed_steps), static_cast<long long>(g.diverged_steps),
                io::internal::json_quote(fallback).c_str());
  } else {
    std::printf("GPT %s %s: %lld steps, valid loss %.4f, %.0f tokens/s (median over evaluations), training peak "
                "%.2f MiB, %lld step(s) skipped, %.1f s training\n",
                level.c_str(), dtype.c_str(), static_cast<long long>(last->step), last->valid_loss, median_tps,
                static_cast<double>(peak_train) / (1 << 20), static_cast<long long>(skipped), train_seconds);
    if (g.traced_steps > 0)
      std::printf("%s: %lld of %lld train-step calls replayed a static memory plan (%lld left it)%s%s\n",
                  exec_mode_name(get_context().mode), static_cast<long long>(g.replayed_steps),
                  static_cast<long long>(g.eager_steps + g.traced_steps + g.replayed_steps),
                  static_cast<long long>(g.diverged_steps), fallback.empty() ? "" : "; ", fallback.c_str());
    if (!ckpt_dir.empty())
      std::printf("checkpoint: %s (demi generate --checkpoint %s/gpt-latest)\n", ckpt_dir.c_str(), ckpt_dir.c_str());
  }
  if (args.flag("profile")) std::printf("\n%s", ops::profile_report().c_str());
  return training_exit_status(first_loss, last->train_loss, skipped, model.steps_done() - first_step);
}

int run_generate(const ParsedArgs& args) {
  apply_thread_option(args);
  if (!args.has("checkpoint")) throw UsageError("generate needs --checkpoint FILE (from demi train --model gpt)");
  std::string file = args.get("checkpoint");
  // "DIR/gpt-latest" names the newest checkpoint in a one-line text file (train::ModelCheckpoint).
  if (file.ends_with("-latest")) {
    std::error_code ec;
    if (fs::exists(file, ec) && !fs::is_regular_file(file, ec))
      throw Error(file + " is not a regular file (a -latest file names the newest checkpoint)");
    FILE* f = std::fopen(file.c_str(), "r");
    if (f == nullptr) throw Error("cannot open " + file);
    char line[4096] = {};
    const bool ok = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    std::string name = ok ? std::string(line) : std::string();
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
    if (name.empty()) throw Error(file + " names no checkpoint");
    file = (fs::path(file).parent_path() / fs::path(name).filename()).string();
  }
  io::TrainingState state = train::load_checkpoint(file);
  const GptCheckpointShape shape = gpt_checkpoint_shape(state, file);
  const data::TextVocab& vocab = shape.vocab;
  nn::GPT net(shape.options);
  train::load_param_into_net(net, state.tensors, /*strict=*/true, args.flag("allow-non-finite"));
  const std::string prompt = args.get("prompt");
  if (prompt.empty()) throw UsageError("--prompt must not be empty");
  std::vector<int32_t> ids;
  try {
    ids = vocab.encode(prompt);
  } catch (const Error& e) {
    if (args.has("prompt")) throw Error(str_cat("--prompt: ", e.what()));
    throw UsageError(str_cat("the default prompt \"", prompt, "\" does not fit this checkpoint: ", e.what(),
                             ". Give --prompt with text of the checkpoint's own characters"));
  }
  nn::SampleOptions so;
  so.max_new_tokens = args.get_int("tokens");
  so.temperature = args.get_real("temperature");
  so.top_k = args.get_int("top-k");
  // Printed as it is sampled (a long generation shows its text from the first token on, and holds none).
  int64_t generated = 0;
  std::fputs(prompt.c_str(), stdout);
  std::fflush(stdout);
  so.on_token = [&](int32_t id) {
    const int32_t one[1] = {id};
    const std::string text = vocab.decode(one);
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (++generated % 64 == 0 || text.find('\n') != std::string::npos) std::fflush(stdout);
  };
  Generator gen(static_cast<uint64_t>(args.get_int("seed")));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    net.generate(ids, so, gen);
  } catch (...) {
    std::fputs("\n", stdout);  // (the error goes on a line of its own)
    std::fflush(stdout);
    throw;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fputs("\n", stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "demi: %lld tokens in %.2f s (%.0f tokens/s, KV-cached), step %lld of %s\n",
               static_cast<long long>(generated), seconds, seconds > 0 ? static_cast<double>(generated) / seconds : 0.0,
               static_cast<long long>(state.meta.global_step), file.c_str());
  return 0;
}

int run_data(const ParsedArgs& args) {
  const std::vector<std::string>& pos = args.positional();
  if (pos.empty() || pos[0] != "kjv")
    throw UsageError("demi data: expected the name of a data set to prepare: kjv (the King James Bible)");
  const fs::path p = ensure_kjv(false);
  std::printf("%s\n", p.c_str());
  return 0;
}

std::vector<Option> gpt_train_options() {
  return {
      int_option("block-size", "N", "--model gpt: context length in characters", "128", 1, 1 << 16),
      int_option("layers", "N", "--model gpt: Transformer blocks", "4", 1, 1024),
      int_option("heads", "N", "--model gpt: attention heads", "4", 1, 1024),
      int_option("dim", "N", "--model gpt: embedding width", "256", 1, 1 << 16),
      real_option("dropout", "P", "--model gpt: dropout on the embeddings and residual branches", "0", 0, 0.99),
      int_option("eval-every", "N", "--model gpt: evaluate (and checkpoint) every N steps", "250", 1, 1e12),
      int_option("eval-windows", "N", "--model gpt: validation windows per evaluation", "256", 1, 1e9),
      real_option("weight-decay", "W", "--model gpt: AdamW decoupled decay on the weight matrices", "0.1", 0, 10),
      int_option("warmup", "N", "--model gpt: linear learning-rate warm-up steps before the cosine decay", "100", 0,
                 1e12),
  };
}

void add_gpt_commands(std::vector<Command>& cmds) {
  std::vector<Option> gen = {
      {"checkpoint", "FILE", "a checkpoint of demi train --model gpt (or DIR/gpt-latest)", ""},
      {"prompt", "TEXT", "the text to continue", "In the beginning"},
      int_option("tokens", "N", "characters to generate", "300", 0, 1e9),
      real_option("temperature", "T", "sampling temperature (lower: more conservative)", "0.8", 1e-6, 100),
      int_option("top-k", "K", "sample among the K most likely characters (0: all)", "40", 0, 1e9),
      int_option("seed", "S", "random seed of the sampling", "1", 0, 1e18),
      int_option("threads", "N", "threads (0: every core)", "0", 0, 4096),
      {"allow-non-finite", "", "load NaN or infinite weights (to inspect a diverged run) instead of refusing them",
       ""},
  };
  cmds.push_back({.name = "generate",
                  .summary = "Sample text from a GPT checkpoint (KV-cached, deterministic per seed).",
                  .options = std::move(gen),
                  .run = run_generate});
  cmds.push_back({.name = "data",
                  .summary = "Prepare a data set once in the cache folder: kjv (the King James Bible, from bible-kjv).",
                  .options = {},
                  .run = run_data,
                  .max_positional = 1,
                  .positional_usage = "kjv"});
}

}  // namespace demi::cli
