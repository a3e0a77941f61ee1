// What the training commands of the demi tool share: train and plan (train.cc), eval (eval.cc), compare and
// the demo (compare.cc), and the GPT's train (gpt.cc) — the job a command line describes, the Model its
// options build, the checks of its settings, threads, resuming, and how a run's end becomes an exit status.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "demi/amp/policy.h"
#include "demi/io/training_state.h"
#include "demi/data/dataset.h"
#include "demi/nn/cell.h"
#include "demi/train/checkpoint.h"
#include "demi/train/model.h"
#include "tools/demi/args.h"

namespace demi::cli {

// The model and data a command line names, with its batch size resolved.
struct Job {
  std::string model_key;  // A, B, C, D, R
  std::shared_ptr<nn::Cell> net;
  std::shared_ptr<data::Dataset> train_ds, test_ds;
  std::string data_name;
  int64_t batch_size = 0;  // resolved (0 on the command line: the model's reference batch)
};
// --model, --data, --batch-size, --train-samples, --seed (and the reference models' variants) -> the job.
Job make_job(const ParsedArgs& args);
// A model the CLI trains: registered here once (job.cc's models()), not switched on by name.
enum class ModelInputs { kImages3, kImages1, kTokens, kText };  // 3x32x32, 1x28x28, tokens, a text file
struct ModelEntry {
  std::string_view key;   // "A": what --model, checkpoints and the JSON name it by
  std::string_view name;  // "simplecnn": the other name --model takes (the key in any case too)
  std::string_view summary;
  int64_t batch = 0;      // the reference batch (--batch-size 0)
  ModelInputs inputs;
  std::shared_ptr<nn::Cell> (*build)(const ParsedArgs& args) = nullptr;  // the network, for make_job
  int (*run)(const ParsedArgs& args, bool plan) = nullptr;  // a model with its own train/plan (the GPT)
};
const std::vector<ModelEntry>& models();
// "A", "a", "simplecnn" -> A's entry; an unknown name is a UsageError listing the models.
const ModelEntry& find_model(const std::string& name);
// "A (simplecnn), B (lenet), ..., R (resnet18) or gpt": for --model's help and its errors.
std::string model_list();
// The options train, plan, eval and compare share (model, data, batch, learning rate, seed, threads, ...).
std::vector<Option> training_options();

// What train and plan build from their options: the job, the precision and the Model.
struct Training {
  Job job;
  amp::Level level = amp::Level::kO0;
  DType low = DType::kF16;
  train::ModelOptions mo;
  std::unique_ptr<train::Model> model;
};
// `reporting`: the Model also measures the test loss (the report shows it).
Training build_training(const ParsedArgs& args, bool reporting);
// --loss-scale: default (null: the level's), none (null; ModelOptions::no_loss_scale), fixed:N or dynamic.
std::shared_ptr<amp::LossScaleManager> parse_loss_scale(const std::string& s);
// "512MiB", "2GiB", "1.5GB", "800MB", "65536" (bytes) -> bytes.
int64_t parse_bytes(const std::string& s);
// --max-memory: the arguments with --batch-size set to the largest multiple of 8 whose forecast training
// peak fits the budget (probes at 8 and 16 give the line, a probe at its prediction and its neighbours
// settle it).
ParsedArgs with_batch_under_budget(const ParsedArgs& args);
// Under mpirun / srun: every process joins the job, trains data-parallel, and only rank 0 prints
// (warnings and errors still reach standard error from every process).
void start_data_parallel(const ParsedArgs& args);
// The settings a checkpoint's state depends on, stored in every checkpoint the CLI writes, each under
// "cli." and its option's name.
io::Metadata run_settings(const ParsedArgs& args, const Job& job);
// A resume checks the settings the checkpoint was taken with: mid-epoch, another data set, sample count
// or batch size would misalign the data position (refused, exit 2); another learning rate or seed, or
// those at an epoch's end, merely change the run (a warning).
void check_resume_settings(const io::TrainingMeta& meta, const io::Metadata& now, const std::string& file);
// A memory category as the JSON keys of train --json and plan --json name it: "optimizer state" ->
// optimizer_state.
std::string json_category(int c);
// --report PATH, --report-data PATH: the path must be writable before the run starts, not after it (a
// UsageError naming the option).
void check_report_option(const ParsedArgs& args, const char* option);
// Bytes as MiB with two decimals: "12.34".
std::string mib(int64_t bytes);

// Sets demi's thread count from --threads (0: every core). More threads than the machine has hardware
// threads would make each step wait on oversubscribed workers (hundreds of times slower): clamped to the
// hardware threads, with a warning on stderr.
void apply_thread_option(const ParsedArgs& args);
// --resume: the newest checkpoint `prefix`-* in `dir` that verifies (a damaged newer one is skipped, kept
// as .damaged, with a warning naming its error); nullopt when there is none; an error when every one is
// damaged.
std::optional<train::LoadedCheckpoint> resume_checkpoint(const std::string& dir, const std::string& prefix);
// --param-grads: "bf16" -> true, "fp32" -> false, "auto" -> nullopt (the AMP policy's default).
std::optional<bool> parse_param_grads(const std::string& s);
// --f16-products: exact or bf16 (refused where the run has no float16 product: O0, or --dtype bf16).
F16Products parse_f16_products(const ParsedArgs& args, amp::Level level, DType low);
// --optimizer-in-backward: auto (graph mode's choice) -> nullopt, on -> true, off -> false.
std::optional<bool> parse_optimizer_in_backward(const std::string& s);
// --optimizer-state: fp32 or bf16.
DType parse_optimizer_state(const std::string& s);
// Refuses (UsageError) a setting that would change nothing for this run: --param-grads bf16 or --amp-adapt at
// O0, --f16-products bf16 where no product is float16, --ckpt-every / --keep-ckpt without --ckpt-dir, an
// empty --ckpt-dir. (A setting stored and ignored is a silent lie about the run.)
void refuse_settings_that_change_nothing(const ParsedArgs& args, amp::Level level, DType low);
// How a run's ModelCheckpoint treats another run's checkpoints in --ckpt-dir: kept apart when resuming,
// set aside with --start-over, refused otherwise.
train::CheckpointConfig::OtherRuns checkpoint_other_runs(const ParsedArgs& args);
// demi plan: refuses the options that change how training runs but not what one step holds in memory.
void refuse_training_only(const ParsedArgs& args);
// The forecast of `demi plan` for a Model built for batches like (data, label), as text or (--json) one
// JSON line; `what` names the run ("model A at O2 bfloat16, batch 32").
int print_forecast(train::Model& model, const Tensor& data, const Tensor& label, const ParsedArgs& args,
                   const std::string& model_key, amp::Level level, DType low, int64_t batch_size);
// 0 when a training run learned; else says why not on stderr ("demi: training failed: ...") and returns 3:
// its last loss is not finite, most of its updates were skipped (non-finite gradients), or it diverged
// (its last loss above 10 times, and 1 nat more than, the loss it started from).
int training_exit_status(double first_loss, double last_loss, int64_t skipped, int64_t steps);
// Append their commands to the list: train and plan (train.cc), eval (eval.cc), compare (compare.cc).
void add_train_commands(std::vector<Command>& cmds);
void add_eval_command(std::vector<Command>& cmds);
void add_compare_command(std::vector<Command>& cmds);
// `demi demo`: the seed's comparison, O0 against O2, on model A (random data) and model B (Fashion-MNIST).
int run_training_demo(const ParsedArgs& args);

}  // namespace demi::cli
