// Replays fuzz inputs through a target's LLVMFuzzerTestOneInput without libFuzzer, so that CI (built with
// the project's compiler, no clang needed) runs every committed corpus file and every past finding:
//
//   demi_safetensors_fuzz_replay fuzz/corpus/safetensors_fuzz [more files or directories...]
//
// An input passes when the target returns (a demi::Error is caught inside the target: refusing a
// malformed input is the expected outcome). A crash, an abort or any other exception fails the run,
// naming the input that caused it.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_target.h"

namespace {

int replay(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", file.c_str());
    return 1;
  }
  std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  try {
    // A copy on the heap of exactly the input's size, as libFuzzer passes it (so ASan sees overreads).
    std::vector<uint8_t> exact(bytes);
    LLVMFuzzerTestOneInput(exact.empty() ? nullptr : exact.data(), exact.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "replay: %s: unexpected exception: %s\n", file.c_str(), e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  int failures = 0, inputs = 0;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path p = argv[i];
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.push_back(p);
    }
    if (files.empty()) {
      std::fprintf(stderr, "replay: no inputs in %s\n", p.c_str());
      ++failures;
    }
    for (const auto& f : files) {
      ++inputs;
      failures += replay(f);
    }
  }
  std::printf("replayed %d inputs, %d failed\n", inputs, failures);
  return failures == 0 ? 0 : 1;
}
