// What every demi fuzz target shares: the libFuzzer entry point's signature and the rule that a
// demi::Error is the expected answer to a malformed input. Anything else that escapes (another
// exception, a crash, a sanitizer report, an allocation beyond libFuzzer's -malloc_limit_mb) is a finding.
//
// The same entry points are compiled twice: with clang and -fsanitize=fuzzer by fuzz/build.sh, to
// search for inputs, and with the project's compiler beside fuzz/replay_main.cc, which CTest runs over
// the committed corpora in fuzz/corpus/<target>/ so CI replays every finding without libFuzzer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "demi/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace demi::fuzz {

// Runs `f` on the input, swallowing demi::Error (the refusal a malformed input must get). An
// InternalError is demi's own bug and is rethrown, so it counts as a finding.
template <typename F>
int run_one(const uint8_t* data, size_t size, F&& f) {
  try {
    f(std::span<const uint8_t>(data, size));
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace demi::fuzz
