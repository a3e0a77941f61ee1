// The training commands of the demi tool: train, eval, compare (and the demo built on compare).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "demi/train/checkpoint.h"
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
// Appends train, eval and compare to the command list.
void add_training_commands(std::vector<Command>& cmds);
// `demi demo`: the seed's comparison, O0 against O2, on model A (random data) and model B (Fashion-MNIST).
int run_training_demo(const ParsedArgs& args);

}  // namespace demi::cli
