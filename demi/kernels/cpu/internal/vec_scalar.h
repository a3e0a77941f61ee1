// The portable "vector" of one f32 lane that the kernel templates in *_impl.h are instantiated with for
// the fallback path (dispatch levels below AVX-512). Same interface as VecAvx512 (vec_avx512.h); the
// templates are written once against it, so every level runs the same algorithm, only wider.
//
// Only portable translation units (compiled without ISA flags) include this header.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "demi/core/half.h"

namespace demi::kernels::cpu_internal {

struct VecScalar {
  static constexpr int kWidth = 1;
  using F = float;
  using M = bool;
  using I = int32_t;

  static F zero() { return 0.0f; }
  static F set1(float v) { return v; }

  static F load(const float* p) { return *p; }
  static F load(const Half* p) { return static_cast<float>(*p); }
  static F load(const BFloat16* p) { return static_cast<float>(*p); }
  // The first n (< kWidth) lanes from p, the others `fill`. With one lane, n is always 0.
  template <typename T>
  static F load_n(const T* p, int64_t n, float fill = 0.0f) {
    return n > 0 ? load(p) : fill;
  }

  static void store(float* p, F v) { *p = v; }
  static void store(Half* p, F v) { *p = Half(v); }
  static void store(BFloat16* p, F v) { *p = BFloat16(v); }
  template <typename T>
  static void store_n(T* p, F v, int64_t n) {
    if (n > 0) store(p, v);
  }

  // One element's conversions (for per-row scalars such as the label's logit).
  static float to_float(float v) { return v; }
  static float to_float(Half v) { return static_cast<float>(v); }
  static float to_float(BFloat16 v) { return static_cast<float>(v); }

  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F fmadd(F a, F b, F c) { return a * b + c; }  // fused where the ISA has FMA (not here)
  // max/min ignoring a NaN in `a` (the accumulator is `b`): the kernels detect NaN separately.
  static F max(F a, F b) { return a > b ? a : b; }
  static F min(F a, F b) { return a < b ? a : b; }
  static F neg(F a) { return -a; }
  static F abs(F a) { return std::fabs(a); }
  static F sqrt(F a) { return std::sqrt(a); }
  static F exp(F a) { return std::exp(a); }
  static F log(F a) { return std::log(a); }

  static float reduce_add(F a) { return a; }
  static float reduce_max(F a) { return a; }

  // a * 0 + acc: stays finite exactly while every a seen is finite (inf * 0 and NaN give NaN).
  static F nonfinite_acc(F acc, F a) { return acc + a * 0.0f; }
  static bool is_finite_acc(F acc) { return acc == acc; }

  // Masks and index vectors (argmax).
  static M gt(F a, F b) { return a > b; }  // ordered: false when either is NaN
  static M is_nan(F a) { return a != a; }
  static bool any(M m) { return m; }
  static M mask_or(M a, M b) { return a || b; }
  static M mask_andnot(M a, M b) { return !a && b; }  // ~a & b
  static F select(M m, F a, F b) { return m ? b : a; }
  // A mask as kWidth bits (lane i: bit i) and back (ReLU's mask kept as bits).
  static uint32_t mask_bits(M m) { return m ? 1u : 0u; }
  static M mask_from_bits(uint32_t bits) { return (bits & 1u) != 0; }
  static I iota() { return 0; }
  static I seti(int32_t v) { return v; }
  static I addi(I a, I b) { return a + b; }
  static I selecti(M m, I a, I b) { return m ? b : a; }
  static void storei(int32_t* p, I v) { *p = v; }
};

}  // namespace demi::kernels::cpu_internal
