// Helpers shared by the micro-benchmarks in bench/.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/dtype.h"

namespace demi::bench {

// A buffer of n elements of dtype t holding normal(0, 1) values (never all zero), touched once up front.
struct Buffer {
  std::vector<double> storage;
  Buffer(DType t, int64_t n, uint64_t seed) {
    storage.resize(static_cast<size_t>((n * static_cast<int64_t>(dtype_size(t)) + 7) / 8 + 8));
    std::vector<float> v(static_cast<size_t>(n));
    std::mt19937 gen(static_cast<uint32_t>(seed));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float& x : v) x = dist(gen);
    convert(v.data(), DType::kF32, storage.data(), t, n);
  }
  void* data() { return storage.data(); }
};

// Mean seconds per call of f over reps calls.
inline double seconds_of(const std::function<void()>& f, int reps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// Interleaved comparison: each run called once (warm-up), then `rounds` rounds calling every run in turn,
// each measurement repeating it to ~30 ms (sized on runs[1], demi's); the best seconds per call of each.
// `each_round` (optional) runs at the start of every round: a ceiling measured between the runs sees the
// machine in the state they see (a shared host's AMX tile unit swings ~2x from one second to the next).
inline std::vector<double> best_seconds(const std::vector<std::function<void()>>& runs, int rounds,
                                        const std::function<void()>& each_round = {}) {
  for (const auto& r : runs) r();
  const int reps = std::max(1, static_cast<int>(0.03 / std::max(1e-6, seconds_of(runs[1], 1))));
  std::vector<double> best(runs.size(), 1e30);
  for (int round = 0; round < rounds; ++round) {
    if (each_round) each_round();
    for (size_t i = 0; i < runs.size(); ++i) best[i] = std::min(best[i], seconds_of(runs[i], reps));
  }
  return best;
}

// The options of the interleaved comparison benchmarks: --rounds N, --filter SUBSTRING, --threads N.
struct CompareOptions {
  int rounds = 5;
  std::string filter;
  int threads = 0;  // 0: demi's default
};
inline CompareOptions parse_compare_options(int argc, char** argv) {
  CompareOptions o;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0) o.rounds = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--filter") == 0) o.filter = argv[++i];
    else if (std::strcmp(argv[i], "--threads") == 0) o.threads = std::max(1, std::atoi(argv[++i]));
  }
  return o;
}

}  // namespace demi::bench
