// The language-model commands of the demi tool: train --model gpt (on a text file; the King James Bible by
// default), generate (sample from a GPT checkpoint) and data (prepare a data set in the cache folder).
#pragma once

#include <string>
#include <vector>

#include "tools/demi/args.h"

namespace demi::cli {

// demi train --model gpt: the options of train plus gpt_train_options(). With `plan` (demi plan --model
// gpt): the forecast of the training peak, from a probe of the first batch, instead of training.
int run_train_gpt(const ParsedArgs& args, bool plan = false);
std::vector<Option> gpt_train_options();
// Appends generate and data to the command list.
void add_gpt_commands(std::vector<Command>& cmds);

}  // namespace demi::cli
