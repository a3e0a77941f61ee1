// The training commands of the demi tool: train, eval, compare (and the demo built on compare).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "demi/amp/policy.h"
#include "demi/train/checkpoint.h"
#include "demi/train/model.h"
#include "tools/demi/args.h"

namespace demi::cli {

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
// Appends train, eval and compare to the command list.
void add_training_commands(std::vector<Command>& cmds);
// `demi demo`: the seed's comparison, O0 against O2, on model A (random data) and model B (Fashion-MNIST).
int run_training_demo(const ParsedArgs& args);

}  // namespace demi::cli
