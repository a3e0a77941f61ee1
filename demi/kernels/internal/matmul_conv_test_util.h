// Test helpers for the matrix-product and convolution kernels: random (never all-zero) operands in any
// floating dtype together with the exactly widened values, and an element-wise comparison that reports
// the worst offenders. Header-only, used by *_test.cc files only.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/dtype.h"
#include "demi/core/half.h"
#include "demi/kernels/matmul_params.h"
#include "demi/kernels/reference/matmul.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels::testing {

// n values in dtype `t`, uniform in [-1, 1) before rounding; f32 holds them widened (exactly, for f32,
// bf16 and f16), f64 too. Bytes are 64-byte aligned through the vector's over-allocation.
struct Operand {
  DType dtype = DType::kF32;
  int64_t n = 0;
  std::vector<double> bytes;  // storage (doubles keep every dtype aligned)
  std::vector<float> f32;
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
};

inline Operand random_operand(DType t, int64_t n, uint64_t seed) {
  Operand o;
  o.dtype = t;
  o.n = n;
  o.bytes.assign(static_cast<size_t>((n * static_cast<int64_t>(dtype_size(t)) + 7) / 8 + 1), 0.0);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  convert(v.data(), DType::kF64, o.data(), t, n);
  o.f32.resize(static_cast<size_t>(n));
  convert(o.data(), t, o.f32.data(), DType::kF32, n);
  return o;
}

// n values k / 256 with k uniform in [-255, 255]: exact in f32, bf16 and f16 alike, so one f32
// reference serves every dtype, and products of two are exact in f32.
inline Operand dyadic_operand(DType t, int64_t n, uint64_t seed) {
  Operand o;
  o.dtype = t;
  o.n = n;
  o.bytes.assign(static_cast<size_t>((n * static_cast<int64_t>(dtype_size(t)) + 7) / 8 + 1), 0.0);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(-255, 255);
  o.f32.resize(static_cast<size_t>(n));
  for (float& x : o.f32) x = static_cast<float>(dist(rng)) / 256.0f;
  convert(o.f32.data(), DType::kF32, o.data(), t, n);
  return o;
}

// The same values in another dtype (rounded).
inline Operand cast_operand(const Operand& src, DType t) {
  Operand o;
  o.dtype = t;
  o.n = src.n;
  o.bytes.assign(static_cast<size_t>((src.n * static_cast<int64_t>(dtype_size(t)) + 7) / 8 + 1), 0.0);
  convert(src.data(), src.dtype, o.data(), t, src.n);
  o.f32.resize(static_cast<size_t>(src.n));
  convert(o.data(), t, o.f32.data(), DType::kF32, src.n);
  return o;
}

// o's values in f64, or (to_bf16) their bf16 roundings: an exact product's reference and the error of
// products taken in bf16.
inline std::vector<double> values_f64(const Operand& o, bool to_bf16) {
  std::vector<double> v(o.f32.begin(), o.f32.end());
  if (to_bf16)
    for (double& e : v) e = static_cast<double>(static_cast<float>(BFloat16(static_cast<float>(e))));
  return v;
}

inline std::vector<double> widen(const void* p, DType t, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  convert(p, t, out.data(), DType::kF64, n);
  return out;
}

// Every |got[i] - want[i]| <= tol; on failure names the count and the worst few elements.
inline ::testing::AssertionResult all_close(const void* got, DType got_dtype, const std::vector<double>& want,
                                            const Tolerance& tol) {
  const int64_t n = static_cast<int64_t>(want.size());
  std::vector<double> g = widen(got, got_dtype, n);
  int64_t bad = 0;
  std::vector<std::pair<double, int64_t>> worst;
  double max_abs = 0;
  for (int64_t i = 0; i < n; ++i) {
    double err = std::abs(g[i] - want[i]);
    if (!(err == err)) err = INFINITY;
    max_abs = std::max(max_abs, err);
    if (!tol.close(g[i], want[i])) {
      ++bad;
      worst.emplace_back(err, i);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::sort(worst.rbegin(), worst.rend());
  std::ostringstream os;
  os << bad << " of " << n << " elements differ (rtol " << tol.rtol << ", atol " << tol.atol << ", max |err| "
     << max_abs << "):";
  for (size_t j = 0; j < std::min<size_t>(5, worst.size()); ++j) {
    int64_t i = worst[j].second;
    os << " [" << i << "] got " << g[i] << " want " << want[i] << ";";
  }
  return ::testing::AssertionFailure() << os.str();
}

// Element-wise dot product, in f64.
inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The dtype mixes the matrix-product kernels are checked over: same-dtype products, AMP's
// low-precision-in / f32-out products, and mixed operands.
struct MatmulDtypes {
  DType a, b, c;
};
inline const std::vector<MatmulDtypes> kMatmulDtypes = {
    {DType::kF32, DType::kF32, DType::kF32},   {DType::kBF16, DType::kBF16, DType::kBF16},
    {DType::kBF16, DType::kBF16, DType::kF32}, {DType::kF16, DType::kF16, DType::kF16},
    {DType::kF16, DType::kF16, DType::kF32},   {DType::kF32, DType::kBF16, DType::kF32},
    {DType::kBF16, DType::kF32, DType::kBF16}, {DType::kF16, DType::kBF16, DType::kF16}};

// Runs `product` (a matmul kernel with MatmulParams' contract) on operands in p's dtypes — random, or
// dyadic with `exact` — and compares with ref::matmul in f32 on the same (rounded) values. Random operands
// are compared within tolerance_for_sum; dyadic ones exactly (every f32 partial sum is exact, so any
// summation order gives the same f32 value, rounded once into c's dtype).
template <typename Product>
// with_residual: a residual (c's dtype) added in the store (MatmulParams::residual), which p must not set.
void check_product(Product&& product, MatmulParams p, bool with_bias, uint64_t seed, bool exact = false,
                   bool with_residual = false) {
  auto make = [&](DType t, int64_t n, uint64_t s) { return exact ? dyadic_operand(t, n, s) : random_operand(t, n, s); };
  Operand a = make(p.a_dtype, p.batch * p.m * p.k, seed);
  Operand b = make(p.b_dtype, p.batch * p.k * p.n, seed + 1);
  Operand bias = make(p.bias_dtype, p.n, seed + 2);
  Operand c = make(p.c_dtype, p.batch * p.m * p.n, seed + 3);  // what accumulate adds to
  Operand residual = make(p.c_dtype, with_residual ? p.batch * p.m * p.n : 0, seed + 4);
  std::vector<float> want = c.f32;
  MatmulParams r = p;
  r.a_dtype = r.b_dtype = r.c_dtype = r.bias_dtype = DType::kF32;
  r.bias = with_bias ? bias.f32.data() : nullptr;
  r.residual = with_residual ? residual.f32.data() : nullptr;
  ref::matmul(r, a.f32.data(), b.f32.data(), want.data());
  p.bias = with_bias ? bias.data() : nullptr;
  p.residual = with_residual ? residual.data() : nullptr;
  product(p, a.data(), b.data(), c.data());
  std::vector<double> expect = widen(want.data(), DType::kF32, c.n);
  if (exact && p.c_dtype != DType::kF32) {
    std::vector<char> rounded(static_cast<size_t>(c.n) * dtype_size(p.c_dtype));
    convert(want.data(), DType::kF32, rounded.data(), p.c_dtype, c.n);
    expect = widen(rounded.data(), p.c_dtype, c.n);
  }
  const Tolerance tol = exact ? Tolerance{0, 0} : tolerance_for_sum(p.c_dtype, p.k, 1.0);
  EXPECT_TRUE(all_close(c.data(), p.c_dtype, expect, tol));
}

// An f32 b read rounded (p.b_round, bf16|f16; p.b_dtype f32): `product`'s result is bit for bit its result on
// b cast to b_round first, with one of b's values overflowing f16 to inf.
template <typename Product>
void check_rounded_b_is_cast_b(Product&& product, const MatmulParams& p) {
  const DType t = p.b_round;
  Operand a = random_operand(p.a_dtype, p.batch * p.m * p.k, 1);
  Operand b = random_operand(DType::kF32, p.batch * p.k * p.n, 2);
  static_cast<float*>(b.data())[5] = 70000.0f;  // inf in f16
  std::vector<char> b_low(static_cast<size_t>(b.n) * dtype_size(t));
  convert(b.data(), DType::kF32, b_low.data(), t, b.n);
  std::vector<char> got(static_cast<size_t>(p.batch * p.m * p.n) * dtype_size(p.c_dtype)), want(got.size());
  product(p, a.data(), b.data(), got.data());
  MatmulParams cast = p;
  cast.b_dtype = t;
  cast.b_round = DType::kF32;
  product(cast, a.data(), b_low.data(), want.data());
  EXPECT_EQ(got, want);
}

}  // namespace demi::kernels::testing
