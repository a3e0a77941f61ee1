// The training commands of the demi tool: train, eval, compare (and the demo built on compare).
#pragma once

#include <vector>

#include "tools/demi/args.h"

namespace demi::cli {

// Appends train, eval and compare to the command list.
void add_training_commands(std::vector<Command>& cmds);
// `demi demo`: the seed's comparison, O0 against O2, on model A (random data) and model B (Fashion-MNIST).
int run_training_demo(const ParsedArgs& args);

}  // namespace demi::cli
