#include "tools/demi/gpt_meta.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#include "demi/core/error.h"
#include "tools/demi/args.h"

namespace demi::cli {
namespace {

// `key`'s value, at least 1 and at most `max` (what the checkpoint's own tensors could hold: a hostile or
// damaged file claiming 10^8 layers would otherwise build them before anything is compared).
int64_t meta_int(const io::Metadata& m, const std::string& key, const std::string& file, int64_t max,
                 const char* max_is) {
  auto it = m.find(key);
  std::optional<int64_t> v = it == m.end() ? std::nullopt : parse_int(it->second);
  if (!v || *v < 1)
    throw Error(file + " is not a checkpoint of `demi train --model gpt` (its metadata has no valid '" + key + "')");
  if (*v > max)
    throw Error(str_cat(file, ": its metadata's '", key, "' is ", *v, ", more than ", max, " (", max_is,
                        "): the file is damaged or not what it claims"));
  return *v;
}

}  // namespace

GptCheckpointShape gpt_checkpoint_shape(const io::TrainingState& state, const std::string& file) {
  const io::Metadata& m = state.meta.extra;
  auto vit = m.find("gpt.vocab");
  if (vit == m.end())
    throw Error(file + " is not a checkpoint of `demi train --model gpt` (its metadata has no vocabulary)");
  GptCheckpointShape shape{.vocab = data::TextVocab::parse(vit->second), .options = {}};
  nn::GPTOptions& o = shape.options;
  o.vocab_size = shape.vocab.size();
  int64_t largest = 0;  // the most values one of its tensors holds
  for (const auto& [name, t] : state.tensors) largest = std::max(largest, t.numel());
  const auto tensors = static_cast<int64_t>(state.tensors.size());
  o.n_layer = meta_int(m, "gpt.n_layer", file, tensors, "the number of tensors in the file");
  o.n_embd = meta_int(m, "gpt.n_embd", file, largest, "the values of its largest tensor");
  o.n_head = meta_int(m, "gpt.n_head", file, o.n_embd, "gpt.n_embd");
  o.block_size = meta_int(m, "gpt.block_size", file, largest / o.n_embd, "the rows of its largest tensor");
  o.bias = m.count("gpt.bias") == 0 || m.at("gpt.bias") == "1";
  return shape;
}

}  // namespace demi::cli
