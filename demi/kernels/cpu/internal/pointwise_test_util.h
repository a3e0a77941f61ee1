// Helpers for the pooling, activation and dropout tests (pool_test.cc, activation_test.cc,
// dropout_test.cc): random non-zero data rounded to a storage type, comparisons in ulps, and the
// dtype <-> C++ type plumbing. Test code only.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "demi/core/cpu.h"
#include "demi/core/dtype.h"
#include "demi/core/half.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels::test {

// Uniform in [lo, hi], never exactly zero, rounded to T.
template <typename T>
std::vector<T> random_values(int64_t n, uint64_t seed, double lo = -3.0, double hi = 3.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& e : v) {
    double d = dist(gen);
    if (static_cast<float>(d) == 0.0f) d = 0.125;
    if constexpr (std::is_same_v<T, double>)
      e = d;
    else
      e = T(static_cast<float>(d));
  }
  return v;
}

template <typename T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, double>)
    return v;
  else
    return static_cast<double>(static_cast<float>(v));
}

// Distance in representable values between two numbers of type T (0: identical, 1: neighbours). Signed
// zeros are equal; NaN against NaN is 0, NaN against a number is "far".
template <typename T>
int64_t ulp_distance(T a, T b) {
  double da = to_double(a), db = to_double(b);
  if (std::isnan(da) || std::isnan(db)) return std::isnan(da) && std::isnan(db) ? 0 : INT64_MAX;
  if (da == db) return 0;
  auto ordered = [](T v) -> int64_t {
    if constexpr (sizeof(T) == 2) {
      uint16_t bits = v.bits;
      return (bits & 0x8000u) ? -static_cast<int64_t>(bits & 0x7fffu) : static_cast<int64_t>(bits);
    } else if constexpr (sizeof(T) == 4) {
      uint32_t bits = std::bit_cast<uint32_t>(v);
      return (bits & 0x80000000u) ? -static_cast<int64_t>(bits & 0x7fffffffu) : static_cast<int64_t>(bits);
    } else {
      uint64_t bits = std::bit_cast<uint64_t>(v);
      return (bits >> 63) ? -static_cast<int64_t>(bits & 0x7fffffffffffffffull) : static_cast<int64_t>(bits);
    }
  };
  int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Low-precision results of the fast kernels: within 1 ulp of the reference run on the same inputs (the
// f32 computations differ by a few f32 ulps, which can move one rounding to bf16/f16) and within
// tolerance_for(dtype). f32 results: within tolerance_for(kF32).
template <typename T>
void expect_close_to_reference(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  Tolerance tol = tolerance_for(dtype_of_v<T>);
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i) {
    double g = to_double(got[i]), w = to_double(want[i]);
    bool ok = tol.close(g, w);
    if constexpr (sizeof(T) == 2) ok = ok && ulp_distance(got[i], want[i]) <= 1;
    if (!ok) {
      ++failures;
      ADD_FAILURE() << what << ": element " << i << " got " << g << ", reference " << w;
    }
  }
}

template <typename T>
void expect_bit_identical(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i) {
    bool ok = same_bits(got[i], want[i]) || (std::isnan(to_double(got[i])) && std::isnan(to_double(want[i])));
    if (!ok) {
      ++failures;
      ADD_FAILURE() << what << ": element " << i << " got " << to_double(got[i]) << ", reference "
                    << to_double(want[i]);
    }
  }
}

inline std::string level_name(CpuLevel l) { return std::string(cpu_level_name(l)); }

template <typename T>
std::string type_name() {
  return std::string(dtype_name(dtype_of_v<T>));
}

}  // namespace demi::kernels::test
