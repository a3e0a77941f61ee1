// Half (IEEE 754 binary16) and BFloat16 scalar types: distinct storage types, not integer typedefs.
//
// float -> Half/BFloat16 rounds to nearest, ties to even; subnormals are exact; values whose rounded
// magnitude exceeds the largest finite number become ±inf (Half: |x| >= 65520 -> inf, 65504 is the
// largest finite). NaN stays NaN: sign and the top payload bits are kept and the result is quiet.
// Half/BFloat16 -> float is exact (a signalling NaN comes back quiet). These are the rules of F16C's
// vcvtps2ph / vcvtph2ps (measured: both ignore MXCSR.DAZ/FTZ) and of AVX512-BF16's vcvtneps2bf16, except
// that the latter always flushes f32 denormal inputs to zero; the bulk kernels (convert.h) undo that, so
// every variant is bit-identical to these scalar functions, and convert_test.cc checks it.
#pragma once

#include <bit>
#include <cstdint>

namespace demi {

namespace internal {

constexpr uint16_t float_to_half_bits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN
    if (ax == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65536: inf
  if (ax >= 0x38800000u) {                                              // normal in f16 (>= 2^-14)
    uint32_t odd = (ax >> 13) & 1u;
    ax += 0xc8000fffu + odd;  // rebias the exponent by -112, add the round-to-nearest-even bias
    return static_cast<uint16_t>(sign | (ax >> 13));
  }
  uint32_t e = ax >> 23;
  if (e < 102) return static_cast<uint16_t>(sign);  // below half the smallest subnormal: ±0
  // Subnormal in f16: k * 2^-24 with k = m * 2^(e - 126), rounded to nearest even.
  uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  uint32_t s = 126 - e;  // 14..24
  uint32_t k = m >> s;
  uint32_t rem = m & ((1u << s) - 1u);
  uint32_t half = 1u << (s - 1);
  if (rem > half || (rem == half && (k & 1u))) ++k;  // k == 0x400 is the smallest normal: correct
  return static_cast<uint16_t>(sign | k);
}

constexpr float half_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f) {
    uint32_t nan_quiet = m ? 0x400000u : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | (m << 13) | nan_quiet);
  }
  if (e == 0) {
    if (m == 0) return std::bit_cast<float>(sign);
    // Subnormal: normalise the mantissa.
    int shift = std::countl_zero(m) - 21;  // leading zeros within the 10-bit field + 1
    m = (m << shift) & 0x3ffu;
    uint32_t exp32 = static_cast<uint32_t>(113 - shift);
    return std::bit_cast<float>(sign | (exp32 << 23) | (m << 13));
  }
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

constexpr uint16_t float_to_bfloat16_bits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  uint32_t odd = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7fffu + odd) >> 16);  // overflow carries into inf, as IEEE says
}

constexpr float bfloat16_bits_to_float(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x400000u;
  return std::bit_cast<float>(x);
}

}  // namespace internal

struct Half {
  uint16_t bits = 0;

  constexpr Half() = default;
  constexpr explicit Half(float f) : bits(internal::float_to_half_bits(f)) {}
  constexpr operator float() const { return internal::half_bits_to_float(bits); }
  static constexpr Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

struct BFloat16 {
  uint16_t bits = 0;

  constexpr BFloat16() = default;
  constexpr explicit BFloat16(float f) : bits(internal::float_to_bfloat16_bits(f)) {}
  constexpr operator float() const { return internal::bfloat16_bits_to_float(bits); }
  static constexpr BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

// The extremes the AMP code reasons about (loss scaling, overflow checks).
inline constexpr float kHalfMax = 65504.0f;
inline constexpr float kHalfMinNormal = 6.103515625e-05f;       // 2^-14
inline constexpr float kHalfMinSubnormal = 5.9604644775390625e-08f;  // 2^-24

}  // namespace demi
