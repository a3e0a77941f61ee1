// Fuzz target: the demi command line's option parser (tools/demi/args.h) on arbitrary words. The input's
// lines are the words after the command name, parsed against a command with every kind of option; a
// mistake must be a UsageError, and every numeric value that gets through must parse whole and lie in
// its declared range.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_target.h"
#include "tools/demi/args.h"

namespace {

const demi::cli::Command& command() {
  using namespace demi::cli;
  static const Command cmd{
      .name = "train",
      .summary = "fuzzed",
      .options = {int_option("epochs", "N", "epochs", "1", 1, 1e6), int_option("seed", "S", "seed", "1", 0, 1e18),
                  int_option("threads", "N", "threads", "0", 0, 4096),
                  real_option("lr", "LR", "learning rate", "0.01", 1e-12, 1e3),
                  {"loss-scale", "S", "loss scale", "default"},
                  {"json", "", "a flag", ""}},
      .max_positional = 1};
  return cmd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return demi::fuzz::run_one(data, size, [](std::span<const uint8_t> bytes) {
    std::vector<std::string> words(1);
    for (uint8_t b : bytes) {
      if (b == '\n') {
        if (words.size() == 64) break;
        words.emplace_back();
      } else {
        words.back().push_back(static_cast<char>(b));
      }
    }
    using namespace demi::cli;
    ParsedArgs args;
    try {
      args = parse_options(command(), words);
    } catch (const UsageError&) {
      return;
    }
    for (const Option& o : command().options) {
      if (o.kind == ValueKind::kInt) {
        int64_t v = args.get_int(o.name);
        if (static_cast<double>(v) < o.min || static_cast<double>(v) > o.max) std::abort();
      } else if (o.kind == ValueKind::kReal) {
        double v = args.get_real(o.name);
        if (!std::isfinite(v) || v < o.min || v > o.max) std::abort();
      }
    }
    for (const std::string& w : words) {  // whatever the parsers accept is a finite number
      if (auto r = parse_real(w); r && !std::isfinite(*r)) std::abort();
    }
  });
}
