// Fuzz target: what `demi generate` reads from a GPT checkpoint before it builds a network — the
// safetensors file (checksums off, so that mutated metadata still gets through), demi's training metadata
// (tools/demi's caller decodes it with io::decode_training_meta), then the GPT's own keys: the character
// vocabulary (data::TextVocab::parse) and the shape checked against what the tensors could hold
// (cli::gpt_checkpoint_shape). Whatever is accepted must describe a network no larger than the file: a
// shape the file's tensors could not hold, or a vocabulary that does not round-trip, is a finding.
#include <cstdio>
#include <cstdlib>

#include "demi/io/safetensors.h"
#include "demi/io/training_state.h"
#include "fuzz_target.h"
#include "tools/demi/gpt_meta.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  demi::fuzz::run_one(data, size, [](std::span<const uint8_t> bytes) {
    demi::io::SafetensorsFile f = demi::io::decode_safetensors(bytes, "fuzz.safetensors", {.verify_checksum = false});
    demi::io::TrainingState state;
    state.meta = demi::io::decode_training_meta(f.metadata, "fuzz.safetensors");
    state.tensors = std::move(f.tensors);
    const demi::cli::GptCheckpointShape s = demi::cli::gpt_checkpoint_shape(state, "fuzz.safetensors");
    int64_t largest = 0;
    for (const auto& [name, t] : state.tensors) largest = std::max(largest, t.numel());
    const demi::nn::GPTOptions& o = s.options;
    if (o.n_layer > static_cast<int64_t>(state.tensors.size()) || o.n_embd > largest || o.n_head > o.n_embd ||
        o.block_size * o.n_embd > largest || o.vocab_size != s.vocab.size() || o.vocab_size < 1) {
      std::fprintf(stderr, "accepted a shape beyond the file: %lld layers, %lld wide, %lld heads, context %lld\n",
                   static_cast<long long>(o.n_layer), static_cast<long long>(o.n_embd),
                   static_cast<long long>(o.n_head), static_cast<long long>(o.block_size));
      std::abort();
    }
    if (demi::data::TextVocab::parse(s.vocab.to_string()).to_string() != s.vocab.to_string()) std::abort();
  });
  return 0;
}
