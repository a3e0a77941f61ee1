// Exhaustive tests of half.h: every Half and BFloat16 bit pattern through float and back, and float ->
// Half/BFloat16 against an independent reference on every edge and on 10^7 random floats per type.
//
// The reference shares no code or bit tricks with half.h: it lists every finite value of the format as
// an exact double (decoded with ldexp), finds the two neighbours of the input by binary search, and picks
// the nearer one, the one with the even bit pattern on a tie, and inf beyond the largest finite value
// (rounding as if the exponent range were unbounded, as IEEE 754 says). Only NaN is spelled in bits,
// because its rule is about bits (sign and top payload kept, quiet bit set).
#include "demi/core/half.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "demi/core/parallel.h"

namespace demi {
namespace {

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t u) { return std::bit_cast<float>(u); }

// A 16-bit binary floating-point format: 1 sign bit, exp_bits of exponent, man_bits of mantissa.
struct Format {
  int exp_bits;
  int man_bits;
  const char* name;

  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  uint16_t inf_bits() const { return static_cast<uint16_t>(((1u << exp_bits) - 1u) << man_bits); }
  uint16_t quiet_bit() const { return static_cast<uint16_t>(1u << (man_bits - 1)); }
  // The value of a finite pattern, exactly: m * 2^(1 - bias - man_bits) when subnormal,
  // (2^man_bits + m) * 2^(e - bias - man_bits) when normal.
  double decode(uint16_t b) const {
    int e = (b >> man_bits) & ((1 << exp_bits) - 1);
    int m = b & ((1 << man_bits) - 1);
    double mag = e == 0 ? std::ldexp(m, 1 - bias() - man_bits)
                        : std::ldexp((1 << man_bits) + m, e - bias() - man_bits);
    return (b & 0x8000u) ? -mag : mag;
  }
};

constexpr Format kHalfFormat{5, 10, "f16"};
constexpr Format kBFloat16Format{8, 7, "bf16"};

// Round-to-nearest-even reference for float -> format.
class Reference {
 public:
  explicit Reference(const Format& fmt) : fmt_(fmt) {
    // Non-negative patterns sort like their values; the pattern after the largest finite one is +inf,
    // whose magnitude for rounding purposes is 2^(emax + 1) and whose pattern is even, as it must be.
    for (uint32_t b = 0; b < fmt.inf_bits(); ++b) values_.push_back(fmt.decode(static_cast<uint16_t>(b)));
    values_.push_back(std::ldexp(1.0, (1 << fmt.exp_bits) - 1 - fmt.bias()));
  }

  uint16_t round(float x) const {
    uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    if (std::isnan(x)) {
      uint32_t payload = (bits_of(x) & 0x7fffffu) >> (23 - fmt_.man_bits);
      return static_cast<uint16_t>(sign | fmt_.inf_bits() | fmt_.quiet_bit() | payload);
    }
    double a = std::fabs(static_cast<double>(x));
    if (a >= values_.back()) return static_cast<uint16_t>(sign | fmt_.inf_bits());
    // values_[i] <= a < values_[i + 1]
    size_t i = static_cast<size_t>(std::upper_bound(values_.begin(), values_.end(), a) - values_.begin()) - 1;
    double mid = (values_[i] + values_[i + 1]) / 2;  // exact: one more bit than the format has
    size_t pick = a < mid ? i : a > mid ? i + 1 : (i % 2 == 0 ? i : i + 1);
    return static_cast<uint16_t>(sign | pick);
  }

 private:
  Format fmt_;
  std::vector<double> values_;
};

const Reference& half_reference() {
  static const Reference r(kHalfFormat);
  return r;
}
const Reference& bfloat16_reference() {
  static const Reference r(kBFloat16Format);
  return r;
}

uint16_t to_half(float x) { return Half(x).bits; }
uint16_t to_bfloat16(float x) { return BFloat16(x).bits; }

// Deterministic random 32-bit patterns: splitmix64 of the index, so any split across threads agrees.
uint32_t random_bits(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 16);
}

// Checks convert(input(i)) == reference for i in [0, n), in parallel; reports the first few misses.
template <typename Input, typename Convert>
void expect_matches_reference(const Reference& ref, int64_t n, Input input, Convert convert) {
  std::atomic<int64_t> misses{0};
  std::atomic<uint32_t> first_miss{0};
  parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float x = input(i);
      if (convert(x) != ref.round(x) && misses.fetch_add(1) == 0) first_miss = bits_of(x);
    }
  });
  float x = float_of(first_miss.load());
  EXPECT_EQ(misses.load(), 0) << "first miss: float bits 0x" << std::hex << first_miss.load() << " -> 0x"
                              << convert(x) << ", reference 0x" << ref.round(x);
}

// Floats around every tie and boundary of a format: for each finite non-negative pattern, its value and
// the midpoint to the next one, each with its float neighbours 1 and 2 ulps either side, in both signs;
// plus, for each pattern's top 16 bits of a float, the low halves that decide a bf16 rounding.
std::vector<float> edge_floats(const Format& fmt) {
  std::vector<float> out;
  auto add_around = [&](float f) {
    float below = f, above = f;
    out.push_back(f);
    for (int k = 0; k < 2; ++k) {
      below = std::nextafter(below, 0.0f);
      above = std::nextafter(above, std::numeric_limits<float>::infinity());
      out.push_back(below);
      out.push_back(above);
    }
  };
  for (uint32_t b = 0; b < fmt.inf_bits(); ++b) {
    double v = fmt.decode(static_cast<uint16_t>(b));
    double next = b + 1 < fmt.inf_bits() ? fmt.decode(static_cast<uint16_t>(b + 1))
                                         : std::ldexp(1.0, (1 << fmt.exp_bits) - 1 - fmt.bias());
    add_around(static_cast<float>(v));
    double mid = (v + next) / 2;
    if (mid <= FLT_MAX) add_around(static_cast<float>(mid));
  }
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      out.push_back(float_of((hi << 16) | lo));
  }
  size_t n = out.size();
  for (size_t i = 0; i < n; ++i) out.push_back(-out[i]);
  return out;
}

// ----- Half -> float -> Half, all 65,536 patterns -----

TEST(Half, EveryPatternToFloatAndBack) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    auto h = static_cast<uint16_t>(b);
    float f = Half::from_bits(h);
    bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    if (!nan) {
      double want = (h & 0x7fffu) == 0x7c00u ? ((h & 0x8000u) ? -INFINITY : INFINITY)
                                             : kHalfFormat.decode(h);
      ASSERT_EQ(bits_of(f), bits_of(static_cast<float>(want))) << "f16 0x" << std::hex << b;
      ASSERT_EQ(to_half(f), h) << "f16 0x" << std::hex << b;
    } else {
      // Sign and payload kept (payload in the top mantissa bits), quiet bit set.
      uint32_t want = ((h & 0x8000u) << 16) | 0x7f800000u | 0x400000u | ((h & 0x3ffu) << 13);
      ASSERT_EQ(bits_of(f), want) << "f16 0x" << std::hex << b;
      ASSERT_EQ(to_half(f), h | 0x200u) << "f16 0x" << std::hex << b;
    }
  }
}

TEST(BFloat16, EveryPatternToFloatAndBack) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    auto h = static_cast<uint16_t>(b);
    float f = BFloat16::from_bits(h);
    bool nan = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
    if (!nan) {
      double want = (h & 0x7fffu) == 0x7f80u ? ((h & 0x8000u) ? -INFINITY : INFINITY)
                                             : kBFloat16Format.decode(h);
      ASSERT_EQ(bits_of(f), bits_of(static_cast<float>(want))) << "bf16 0x" << std::hex << b;
      ASSERT_EQ(to_bfloat16(f), h) << "bf16 0x" << std::hex << b;
    } else {
      ASSERT_EQ(bits_of(f), (b << 16) | 0x400000u) << "bf16 0x" << std::hex << b;
      ASSERT_EQ(to_bfloat16(f), h | 0x40u) << "bf16 0x" << std::hex << b;
    }
  }
}

// ----- float -> Half: named edges, with the expected patterns worked out by hand -----

struct Case {
  uint32_t in;   // float bits
  uint16_t out;  // expected pattern
  const char* what;
};

void expect_cases(const std::vector<Case>& cases, uint16_t (*convert)(float), const Reference& ref) {
  for (const Case& c : cases) {
    EXPECT_EQ(convert(float_of(c.in)), c.out) << c.what << " (float bits 0x" << std::hex << c.in << ")";
    EXPECT_EQ(ref.round(float_of(c.in)), c.out) << "reference: " << c.what;
  }
}

TEST(Half, FromFloatEdges) {
  std::vector<Case> cases = {
      {bits_of(1.0f), 0x3c00, "1"},
      {bits_of(1.0f + 0x1p-11f), 0x3c00, "tie at 1 + half ulp: to even (down)"},
      {bits_of(1.0f + 3 * 0x1p-11f), 0x3c02, "tie at 1 + 3 half ulps: to even (up)"},
      {bits_of(1.0f + 0x1p-11f + 0x1p-23f), 0x3c01, "just above the tie"},
      {bits_of(1.0f + 0x1p-11f - 0x1p-23f), 0x3c00, "just below the tie"},
      {bits_of(1024.5f), 0x6400, "tie at 1024.5: to even (down)"},
      {bits_of(1025.5f), 0x6402, "tie at 1025.5: to even (up)"},
      {bits_of(-1025.5f), 0xe402, "negative tie"},
      {bits_of(0x1p-14f + 0x1p-25f), 0x0400, "tie above the smallest normal: to even"},
      {bits_of(0x1p-14f - 0x1p-25f), 0x0400, "tie between largest subnormal and smallest normal: up"},
      {bits_of(0x1p-14f), 0x0400, "smallest normal 2^-14"},
      {bits_of(1023 * 0x1p-24f), 0x03ff, "largest subnormal"},
      {bits_of(0x1p-24f), 0x0001, "smallest subnormal 2^-24"},
      {bits_of(0x1p-25f), 0x0000, "half the smallest subnormal: tie to even zero"},
      {bits_of(0x1p-25f) + 1, 0x0001, "just above half the smallest subnormal"},
      {bits_of(0x1p-25f) - 1, 0x0000, "just below half the smallest subnormal"},
      {bits_of(3 * 0x1p-25f), 0x0002, "1.5 smallest subnormals: tie to even (up)"},
      {bits_of(5 * 0x1p-25f), 0x0002, "2.5 smallest subnormals: tie to even (down)"},
      {bits_of(-0x1p-24f), 0x8001, "negative smallest subnormal"},
      {bits_of(0x1p-26f), 0x0000, "a quarter of the smallest subnormal"},
      {0x00000001u, 0x0000, "smallest f32 denormal"},
      {0x807fffffu, 0x8000, "negative f32 denormal keeps its sign"},
      {bits_of(65504.0f), 0x7bff, "largest finite 65504"},
      {bits_of(65519.99f), 0x7bff, "65519.99 rounds down to 65504"},
      {bits_of(65520.0f) - 1, 0x7bff, "largest float below 65520"},
      {bits_of(65520.0f), 0x7c00, "65520: tie between 65504 (odd) and 2^16 (even): inf"},
      {bits_of(-65520.0f), 0xfc00, "-65520 -> -inf"},
      {bits_of(65536.0f), 0x7c00, "2^16 -> inf"},
      {bits_of(FLT_MAX), 0x7c00, "FLT_MAX -> inf"},
      {bits_of(INFINITY), 0x7c00, "inf"},
      {bits_of(-INFINITY), 0xfc00, "-inf"},
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x7fc00000u, 0x7e00, "quiet NaN"},
      {0xffc00000u, 0xfe00, "negative quiet NaN"},
      {0x7f800001u, 0x7e00, "signalling NaN whose payload is all dropped: quiet, not inf"},
      {0xff800001u, 0xfe00, "negative signalling NaN"},
      {0x7f802000u, 0x7e01, "signalling NaN: top payload bit kept"},
      {0x7fa00000u, 0x7f00, "signalling NaN with a high payload"},
      {0xffffffffu, 0xffff, "all-ones NaN"},
  };
  expect_cases(cases, to_half, half_reference());
}

TEST(BFloat16, FromFloatEdges) {
  std::vector<Case> cases = {
      {bits_of(1.0f), 0x3f80, "1"},
      {0x3f808000u, 0x3f80, "tie at 1 + half ulp: to even (down)"},
      {0x3f818000u, 0x3f82, "tie at 1 + 3 half ulps: to even (up)"},
      {0x3f808001u, 0x3f81, "just above the tie"},
      {0x3f807fffu, 0x3f80, "just below the tie"},
      {0xc3018000u, 0xc302, "negative tie"},
      {0x00000001u, 0x0000, "smallest f32 denormal"},
      {0x00008000u, 0x0000, "half the smallest bf16 subnormal: tie to even zero"},
      {0x00008001u, 0x0001, "just above half the smallest subnormal"},
      {0x00018000u, 0x0002, "1.5 smallest subnormals: tie to even (up)"},
      {0x007f7fffu, 0x007f, "just below the tie under the smallest normal"},
      {0x007f8000u, 0x0080, "tie between largest subnormal (odd) and smallest normal"},
      {0x007fffffu, 0x0080, "largest f32 denormal rounds up to the smallest normal"},
      {0x807fffffu, 0x8080, "negative largest f32 denormal"},
      {0x00800000u, 0x0080, "smallest normal"},
      {0x7f7f0000u, 0x7f7f, "largest finite"},
      {0x7f7e8000u, 0x7f7e, "tie below the largest finite: to even (down)"},
      {0x7f7f7fffu, 0x7f7f, "just below the overflow tie"},
      {0x7f7f8000u, 0x7f80, "overflow tie: to even, which is inf"},
      {bits_of(FLT_MAX), 0x7f80, "FLT_MAX -> inf"},
      {bits_of(-FLT_MAX), 0xff80, "-FLT_MAX -> -inf"},
      {bits_of(INFINITY), 0x7f80, "inf"},
      {bits_of(-INFINITY), 0xff80, "-inf"},
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x7fc00000u, 0x7fc0, "quiet NaN"},
      {0xffc00000u, 0xffc0, "negative quiet NaN"},
      {0x7f800001u, 0x7fc0, "signalling NaN whose payload is all dropped: quiet, not inf"},
      {0xff800001u, 0xffc0, "negative signalling NaN"},
      {0x7f810000u, 0x7fc1, "signalling NaN: top payload bit kept"},
      {0x7fa00000u, 0x7fe0, "signalling NaN with a high payload"},
      {0x7fffffffu, 0x7fff, "NaN with a full payload: no carry out of it"},
      {0xffffffffu, 0xffff, "all-ones NaN"},
  };
  expect_cases(cases, to_bfloat16, bfloat16_reference());
}

// The conversions are constexpr, so tables of constants can be built at compile time.
static_assert(Half(1.0f).bits == 0x3c00);
static_assert(Half(65520.0f).bits == 0x7c00);
static_assert(Half(0x1p-25f).bits == 0x0000);
static_assert(static_cast<float>(Half::from_bits(0x0001)) == 0x1p-24f);
static_assert(BFloat16(1.0f).bits == 0x3f80);
static_assert(static_cast<float>(BFloat16::from_bits(0xc000)) == -2.0f);
static_assert(kHalfMax == 65504.0f && kHalfMinNormal == 0x1p-14f && kHalfMinSubnormal == 0x1p-24f);

// ----- float -> Half/BFloat16 against the reference: systematic edges, then random bit patterns -----

TEST(Half, FromFloatEveryTieAndBoundary) {
  std::vector<float> edges = edge_floats(kHalfFormat);
  expect_matches_reference(half_reference(), static_cast<int64_t>(edges.size()),
                           [&](int64_t i) { return edges[static_cast<size_t>(i)]; }, to_half);
}

TEST(BFloat16, FromFloatEveryTieAndBoundary) {
  std::vector<float> edges = edge_floats(kBFloat16Format);
  expect_matches_reference(bfloat16_reference(), static_cast<int64_t>(edges.size()),
                           [&](int64_t i) { return edges[static_cast<size_t>(i)]; }, to_bfloat16);
}

constexpr int64_t kRandomCount = 10'000'000;

TEST(Half, FromFloatRandomBitPatterns) {
  expect_matches_reference(half_reference(), kRandomCount,
                           [](int64_t i) { return float_of(random_bits(1, static_cast<uint64_t>(i))); },
                           to_half);
  // Uniform bits land in f16's range only one time in six; these stay within it (exponents 2^-26..2^16).
  expect_matches_reference(half_reference(), kRandomCount / 4, [](int64_t i) {
    uint32_t r = random_bits(2, static_cast<uint64_t>(i));
    uint32_t exp = 101 + (r >> 24) % 43;
    return float_of((r & 0x807fffffu) | (exp << 23));
  }, to_half);
}

TEST(BFloat16, FromFloatRandomBitPatterns) {
  expect_matches_reference(bfloat16_reference(), kRandomCount,
                           [](int64_t i) { return float_of(random_bits(3, static_cast<uint64_t>(i))); },
                           to_bfloat16);
}

}  // namespace
}  // namespace demi
