// Fuzz target: the safetensors reader (demi/io/safetensors.h) on arbitrary bytes, with checksum
// verification on (the path every load takes) and off (so that mutated data still reaches the
// per-dtype checks). Whatever decodes must re-encode and decode to the same names, dtypes, shapes and
// bytes: the reader and the writer agree on every file the reader accepts.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "demi/io/safetensors.h"
#include "fuzz_target.h"

namespace {

// A demi::Error here is a finding too (the writer refusing what the reader accepted), so it aborts
// instead of being taken for the expected refusal of a malformed input.
void check_round_trip(const demi::io::SafetensorsFile& f) {
  demi::io::SafetensorsFile g;
  try {
    std::vector<uint8_t> again = demi::io::encode_safetensors(f.tensors, f.metadata);
    g = demi::io::decode_safetensors(again, "re-encoded");
  } catch (const demi::Error& e) {
    std::fprintf(stderr, "round trip failed: %s\n", e.what());
    std::abort();
  }
  if (g.tensors.size() != f.tensors.size()) std::abort();
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const auto& [na, a] = f.tensors[i];
    const auto& [nb, b] = g.tensors[i];
    if (na != nb || a.dtype() != b.dtype() || a.shape() != b.shape()) std::abort();
    if (a.nbytes() > 0 && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (bool verify : {true, false}) {
    demi::fuzz::run_one(data, size, [verify](std::span<const uint8_t> bytes) {
      auto f = demi::io::decode_safetensors(bytes, "fuzz.safetensors", {.verify_checksum = verify});
      if (!verify) check_round_trip(f);
    });
  }
  return 0;
}
