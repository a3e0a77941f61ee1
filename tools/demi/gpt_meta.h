// What a checkpoint of `demi train --model gpt` says about its network: the character vocabulary and the
// shape (layers, width, heads, context), read from its metadata and checked against what its tensors could
// hold before anything is built. Kept apart from the command so that the fuzz target gpt_meta_fuzz drives
// exactly the code `demi generate` runs on a file it was given.
#pragma once

#include <string>

#include "demi/data/text.h"
#include "demi/io/training_state.h"
#include "demi/nn/gpt.h"

namespace demi::cli {

struct GptCheckpointShape {
  data::TextVocab vocab;
  nn::GPTOptions options;  // vocab_size from the vocabulary; dropout 0
};

// The network `state` (loaded from `file`) was saved from. A file without the GPT's keys, a value that is
// not a positive integer, or one beyond what the file's tensors could hold (10^8 layers in a file of 20
// tensors) is a demi::Error naming `file` and the key: a damaged or hostile file is refused before a
// network of its claimed size is allocated.
GptCheckpointShape gpt_checkpoint_shape(const io::TrainingState& state, const std::string& file);

}  // namespace demi::cli
