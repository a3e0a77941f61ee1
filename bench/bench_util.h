// Helpers shared by the micro-benchmarks in bench/.
#pragma once

#include <cstdint>
#include <random>
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

}  // namespace demi::bench
