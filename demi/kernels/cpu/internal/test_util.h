// Helpers for the fast-vs-reference kernel tests (demi_kernels_test): typed buffers filled with random,
// never-all-zero values, comparison with the per-dtype tolerances of tolerance.h, iteration over every
// CPU level the machine supports, and f64 central finite differences.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iomanip>
#include <random>
#include <string>
#include <vector>

#include "demi/core/cpu.h"
#include "demi/core/dtype.h"
#include "demi/core/error.h"
#include "demi/core/half.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels::testing {

inline const std::vector<DType> kFastDtypes = {DType::kF32, DType::kBF16, DType::kF16};

// Uniform values in [lo, hi] from a fixed seed; |x| < 1e-3 is nudged away from zero.
inline std::vector<float> random_floats(int64_t n, uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    x = dist(rng);
    if (std::abs(x) < 1e-3f) x = 1e-3f + x * x;
  }
  return v;
}

// n elements of a dtype, stored as bytes; set/get go through float (or double for f64).
class Buffer {
 public:
  Buffer() = default;
  Buffer(DType t, int64_t n) : dtype_(t), n_(n), bytes_(static_cast<size_t>(n) * dtype_size(t) + 64) {}
  Buffer(DType t, const std::vector<float>& v) : Buffer(t, static_cast<int64_t>(v.size())) {
    for (int64_t i = 0; i < n_; ++i) set(i, v[static_cast<size_t>(i)]);
  }
  DType dtype() const { return dtype_; }
  int64_t size() const { return n_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(bytes_.data());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes_.data());
  }
  void set(int64_t i, double v) {
    switch (dtype_) {
      case DType::kF32: as<float>()[i] = static_cast<float>(v); break;
      case DType::kF64: as<double>()[i] = v; break;
      case DType::kF16: as<Half>()[i] = Half(static_cast<float>(v)); break;
      case DType::kBF16: as<BFloat16>()[i] = BFloat16(static_cast<float>(v)); break;
      case DType::kI32: as<int32_t>()[i] = static_cast<int32_t>(v); break;
      case DType::kI64: as<int64_t>()[i] = static_cast<int64_t>(v); break;
      default: FAIL() << "Buffer: unsupported dtype";
    }
  }
  double get(int64_t i) const {
    switch (dtype_) {
      case DType::kF32: return as<float>()[i];
      case DType::kF64: return as<double>()[i];
      case DType::kF16: return static_cast<float>(as<Half>()[i]);
      case DType::kBF16: return static_cast<float>(as<BFloat16>()[i]);
      case DType::kI32: return as<int32_t>()[i];
      case DType::kI64: return static_cast<double>(as<int64_t>()[i]);
      default: return NAN;
    }
  }
  std::vector<double> values() const {
    std::vector<double> v(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) v[static_cast<size_t>(i)] = get(i);
    return v;
  }

 private:
  DType dtype_ = DType::kF32;
  int64_t n_ = 0;
  std::vector<unsigned char> bytes_;
};

// Calls fn(T{}) with the storage type of a floating dtype.
template <typename Fn>
void visit_floating(DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32: fn(float{}); break;
    case DType::kF64: fn(double{}); break;
    case DType::kF16: fn(Half{}); break;
    case DType::kBF16: fn(BFloat16{}); break;
    default: FAIL() << "visit_floating: not a floating dtype";
  }
}

// Calls fn(T{}) with the storage type of a dtype the fast kernels run (f32, bf16, f16).
template <typename Fn>
void visit_fast(DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32: fn(float{}); break;
    case DType::kF16: fn(Half{}); break;
    case DType::kBF16: fn(BFloat16{}); break;
    default: FAIL() << "visit_fast: not float32, bfloat16 or float16";
  }
}

inline ::testing::AssertionResult all_close(const std::vector<double>& got, const std::vector<double>& want,
                                            Tolerance tol, const std::string& what = "") {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << want.size();
  int bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i)
    if (!tol.close(got[i], want[i])) {
      if (bad++ == 0)
        first = str_cat("element ", i, ": got ", std::setprecision(9), got[i], ", want ", want[i]);
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size() << " elements differ; first "
                                       << first << " (rtol " << tol.rtol << ", atol " << tol.atol << ")";
}

inline ::testing::AssertionResult all_close(const Buffer& got, const Buffer& want, Tolerance tol,
                                            const std::string& what = "") {
  return all_close(got.values(), want.values(), tol, what);
}

// Runs fn once for every CPU level this machine supports, with that level set.
template <typename Fn>
void for_each_level(Fn&& fn) {
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    SCOPED_TRACE(str_cat("cpu level ", cpu_level_name(level)));
    fn(level);
  }
}

// d f / d x_i by central differences with step kFiniteDiffStep (relative to max(1, |x_i|)).
inline std::vector<double> numeric_grad(const std::function<double()>& f, std::vector<double>& x) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    double h = kFiniteDiffStep * std::max(1.0, std::abs(saved));
    x[i] = saved + h;
    double fp = f();
    x[i] = saved - h;
    double fm = f();
    x[i] = saved;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

inline std::string dtype_trace(DType t) { return str_cat("dtype ", dtype_name(t)); }

}  // namespace demi::kernels::testing
