// Tests of the bulk conversion kernels (convert.h): every ISA variant the machine supports is compared
// bit for bit with the scalar kernels (themselves checked against an independent reference in
// half_test.cc) on every f16/bf16 pattern, on 10^7 random f32 patterns plus the rounding edges, at odd
// lengths and unaligned addresses, and with MXCSR's DAZ/FTZ set. Then the generic convert() between
// every pair of dtypes.
#include "demi/core/convert.h"

#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "demi/core/error.h"

namespace demi {
namespace {

using internal::ConvertKernels;
using internal::convert_kernels;

float float_of(uint32_t u) { return std::bit_cast<float>(u); }

uint32_t random_bits(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 16);
}

// Every f32 that matters to f16 or bf16 rounding — each of the 65,536 top halves (all exponents, both
// signs, inf and NaN payloads, denormals) with the low halves that sit on or next to a tie for either
// format — followed by 10^7 random bit patterns.
const std::vector<float>& f32_inputs() {
  static const std::vector<float> inputs = [] {
    std::vector<float> v;
    const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000,
                             0x3000, 0x4000, 0x7fff, 0x8000, 0x8001, 0xffff};
    for (uint32_t hi = 0; hi < 0x10000u; ++hi)
      for (uint32_t lo : lows) v.push_back(float_of((hi << 16) | lo));
    for (uint64_t i = 0; i < 10'000'000; ++i) v.push_back(float_of(random_bits(7, i)));
    return v;
  }();
  return inputs;
}

// All 65,536 patterns of T, `copies` times over (long enough for the longest odd length).
template <typename T>
std::vector<T> all_patterns(int copies = 1) {
  std::vector<T> v(0x10000 * static_cast<size_t>(copies));
  for (size_t i = 0; i < v.size(); ++i) v[i] = T::from_bits(static_cast<uint16_t>(i));
  return v;
}

template <typename T>
T* align64(T* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<T*>((a + 63) & ~uintptr_t{63});
}

// Runs kernel(src, dst, n) and expects dst to be bit-identical to want, with both arrays 64-byte aligned
// and then one element off (unaligned for every vector width), and with guard bytes either side of the
// output left untouched.
template <typename Src, typename Dst>
void expect_kernel_matches(void (*kernel)(const Src*, Dst*, int64_t), const Src* src, const Dst* want,
                           int64_t n) {
  constexpr int kGuard = 64;
  for (int offset : {0, 1}) {
    std::vector<Src> in(static_cast<size_t>(n) + 64);
    Src* in_start = align64(in.data()) + offset;
    if (n > 0) std::memcpy(in_start, src, static_cast<size_t>(n) * sizeof(Src));
    std::vector<unsigned char> out((static_cast<size_t>(n) + 2 * kGuard + 64) * sizeof(Dst), 0xa5);
    Dst* dst = reinterpret_cast<Dst*>(align64(out.data()) + kGuard * sizeof(Dst)) + offset;
    kernel(in_start, dst, n);
    int64_t first_miss = -1;
    for (int64_t i = 0; i < n && first_miss < 0; ++i)
      if (std::memcmp(dst + i, want + i, sizeof(Dst)) != 0) first_miss = i;
    if (first_miss >= 0) {
      uint32_t in_bits = 0, got = 0, expected = 0;
      std::memcpy(&in_bits, src + first_miss, sizeof(Src));
      std::memcpy(&got, dst + first_miss, sizeof(Dst));
      std::memcpy(&expected, want + first_miss, sizeof(Dst));
      ADD_FAILURE() << "n=" << n << " offset=" << offset << ": element " << first_miss << " input 0x"
                    << std::hex << in_bits << " gave 0x" << got << ", scalar 0x" << expected;
    }
    auto untouched = [&](const unsigned char* p, size_t bytes) {
      for (size_t i = 0; i < bytes; ++i)
        if (p[i] != 0xa5) return false;
      return true;
    };
    auto* base = reinterpret_cast<unsigned char*>(dst);
    EXPECT_TRUE(untouched(out.data(), static_cast<size_t>(base - out.data())))
        << "wrote before the output, n=" << n << " offset=" << offset;
    size_t end = static_cast<size_t>(n) * sizeof(Dst);
    EXPECT_TRUE(untouched(base + end, out.size() - static_cast<size_t>(base - out.data()) - end))
        << "wrote past the output, n=" << n << " offset=" << offset;
  }
}

// Every level: the kernel on the whole input at once, then on slices of odd lengths starting at odd
// places, each against the scalar kernel's output.
template <typename Src, typename Dst>
void check_direction(void (*ConvertKernels::*member)(const Src*, Dst*, int64_t),
                     const std::vector<Src>& src) {
  const ConvertKernels& scalar = convert_kernels(CpuLevel::kScalar);
  std::vector<Dst> want(src.size());
  (scalar.*member)(src.data(), want.data(), static_cast<int64_t>(src.size()));
  for (CpuLevel level : supported_cpu_levels()) {
    SCOPED_TRACE(cpu_level_name(level));
    auto kernel = convert_kernels(level).*member;
    expect_kernel_matches(kernel, src.data(), want.data(), static_cast<int64_t>(src.size()));
    for (int64_t n : {0, 1, 15, 17, 31, 33, 1000003}) {
      size_t start = static_cast<size_t>(n * 7 + 3) % (src.size() - static_cast<size_t>(n));
      expect_kernel_matches(kernel, src.data() + start, want.data() + start, n);
    }
  }
}

TEST(ConvertKernels, F16ToF32EveryPattern) {
  check_direction(&ConvertKernels::f16_to_f32, all_patterns<Half>(17));
}

TEST(ConvertKernels, BF16ToF32EveryPattern) {
  check_direction(&ConvertKernels::bf16_to_f32, all_patterns<BFloat16>(17));
}

TEST(ConvertKernels, F32ToF16EdgesAndRandom) { check_direction(&ConvertKernels::f32_to_f16, f32_inputs()); }

TEST(ConvertKernels, F32ToBF16EdgesAndRandom) { check_direction(&ConvertKernels::f32_to_bf16, f32_inputs()); }

// Someone may set DAZ/FTZ for speed elsewhere in a training run; the conversions must not change. (F16C
// ignores both; vcvtneps2bf16 ignores MXCSR and flushes denormals always, which its kernel undoes.)
// round_f32 gives the values a cast to bf16 or f16 and back gives, bit for bit (edges, subnormals, values
// past f16's range, NaN, random), in place too; any other dtype is an error naming it.
TEST(Convert, RoundF32IsTheCastThereAndBack) {
  const std::vector<float> x = f32_inputs();
  const int64_t n = static_cast<int64_t>(x.size());
  for (DType to : {DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> low(x.size());
    std::vector<float> want(x.size()), got(x.size()), in_place = x;
    convert(x.data(), DType::kF32, low.data(), to, n);
    convert(low.data(), to, want.data(), DType::kF32, n);
    round_f32(x.data(), got.data(), n, to);
    round_f32(in_place.data(), in_place.data(), n, to);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), x.size() * sizeof(float)), 0) << dtype_name(to);
    EXPECT_EQ(std::memcmp(in_place.data(), want.data(), x.size() * sizeof(float)), 0) << dtype_name(to);
  }
  float v = 1.0f;
  EXPECT_THROW(round_f32(&v, &v, 1, DType::kF64), Error);
}

TEST(ConvertKernels, IgnoreDenormalsAreZeroAndFlushToZero) {
  const std::vector<float>& f32 = f32_inputs();
  std::vector<float> inputs(f32.begin(), f32.begin() + 13 * 0x10000);  // the edges only
  std::vector<Half> halves = all_patterns<Half>();
  std::vector<BFloat16> bfloats = all_patterns<BFloat16>();
  const ConvertKernels& scalar = convert_kernels(CpuLevel::kScalar);
  std::vector<Half> want_f16(inputs.size());
  std::vector<BFloat16> want_bf16(inputs.size());
  std::vector<float> want_from_f16(0x10000), want_from_bf16(0x10000);
  scalar.f32_to_f16(inputs.data(), want_f16.data(), static_cast<int64_t>(inputs.size()));
  scalar.f32_to_bf16(inputs.data(), want_bf16.data(), static_cast<int64_t>(inputs.size()));
  scalar.f16_to_f32(halves.data(), want_from_f16.data(), 0x10000);
  scalar.bf16_to_f32(bfloats.data(), want_from_bf16.data(), 0x10000);

  unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
  for (CpuLevel level : supported_cpu_levels()) {
    SCOPED_TRACE(cpu_level_name(level));
    const ConvertKernels& k = convert_kernels(level);
    auto n = static_cast<int64_t>(inputs.size());
    expect_kernel_matches(k.f32_to_f16, inputs.data(), want_f16.data(), n);
    expect_kernel_matches(k.f32_to_bf16, inputs.data(), want_bf16.data(), n);
    expect_kernel_matches(k.f16_to_f32, halves.data(), want_from_f16.data(), 0x10000);
    expect_kernel_matches(k.bf16_to_f32, bfloats.data(), want_from_bf16.data(), 0x10000);
  }
  _mm_setcsr(saved);
}

TEST(ConvertKernels, UnsupportedLevelIsAnError) {
  if (max_cpu_level() == CpuLevel::kLast) GTEST_SKIP() << "every level is supported here";
  EXPECT_THROW(convert_kernels(CpuLevel::kLast), Error);
}

// The public entry points dispatch on cpu_level() and split large inputs across threads.
TEST(Convert, PublicEntryPointsFollowTheLevel) {
  // The edges and a slice of the random patterns: long enough to be split across threads.
  std::vector<float> f32(f32_inputs().begin(), f32_inputs().begin() + 2'000'003);
  auto n = static_cast<int64_t>(f32.size());
  const ConvertKernels& scalar = convert_kernels(CpuLevel::kScalar);
  std::vector<Half> want_f16(f32.size()), got_f16(f32.size());
  std::vector<BFloat16> want_bf16(f32.size()), got_bf16(f32.size());
  std::vector<float> want_back(f32.size()), got_back(f32.size());
  scalar.f32_to_f16(f32.data(), want_f16.data(), n);
  scalar.f32_to_bf16(f32.data(), want_bf16.data(), n);
  for (CpuLevel level : supported_cpu_levels()) {
    SCOPED_TRACE(cpu_level_name(level));
    ScopedCpuLevel scoped(level);
    convert(f32.data(), DType::kF32, got_f16.data(), DType::kF16, n);
    EXPECT_EQ(std::memcmp(got_f16.data(), want_f16.data(), f32.size() * 2), 0);
    convert(f32.data(), DType::kF32, got_bf16.data(), DType::kBF16, n);
    EXPECT_EQ(std::memcmp(got_bf16.data(), want_bf16.data(), f32.size() * 2), 0);
    scalar.f16_to_f32(want_f16.data(), want_back.data(), n);
    convert_f16_to_f32(want_f16.data(), got_back.data(), n);
    EXPECT_EQ(std::memcmp(got_back.data(), want_back.data(), f32.size() * 4), 0);
    scalar.bf16_to_f32(want_bf16.data(), want_back.data(), n);
    convert_bf16_to_f32(want_bf16.data(), got_back.data(), n);
    EXPECT_EQ(std::memcmp(got_back.data(), want_back.data(), f32.size() * 4), 0);
  }
}

// ----- generic convert() -----

// std::vector<bool> has no data(), so bool elements live in bytes here.
template <typename T>
using Stored = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;

// Converts src (of dtype From, by default its element type) to To through convert().
template <typename To, typename From = void, typename Elem>
std::vector<Stored<To>> converted(const std::vector<Elem>& src) {
  using F = std::conditional_t<std::is_void_v<From>, Elem, From>;
  std::vector<Stored<To>> out(src.size());
  convert(src.data(), dtype_of_v<F>, out.data(), dtype_of_v<To>, static_cast<int64_t>(src.size()));
  return out;
}

// Small whole numbers are exact in every dtype, so every pair must carry them unchanged (bool: != 0).
TEST(Convert, EveryDTypePairOnWholeNumbers) {
  const double values[] = {0, 1, 5, 100, 1, 0, 37};
  for (int s = 0; s < kNumDTypes; ++s) {
    for (int d = 0; d < kNumDTypes; ++d) {
      auto src_dtype = static_cast<DType>(s);
      auto dst_dtype = static_cast<DType>(d);
      SCOPED_TRACE(std::string(dtype_name(src_dtype)) + " -> " + std::string(dtype_name(dst_dtype)));
      visit_dtype(src_dtype, [&](auto src_tag) {
        visit_dtype(dst_dtype, [&](auto dst_tag) {
          using S = decltype(src_tag);
          using D = decltype(dst_tag);
          std::vector<Stored<S>> src;
          for (double v : values) {
            if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) {
              src.push_back(S(static_cast<float>(v)));
            } else {
              src.push_back(static_cast<Stored<S>>(static_cast<S>(v)));
            }
          }
          std::vector<Stored<D>> dst = converted<D, S>(src);
          for (size_t i = 0; i < src.size(); ++i) {
            double want = std::is_same_v<S, bool> || std::is_same_v<D, bool> ? (values[i] != 0) : values[i];
            double got;
            if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) {
              got = static_cast<float>(dst[i]);
            } else {
              got = static_cast<double>(dst[i]);
            }
            EXPECT_EQ(got, want) << "element " << i;
          }
        });
      });
    }
  }
}

TEST(Convert, FloatToIntegerTruncatesTowardZeroAndSaturates) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> src = {2.7f, -2.7f, 0.5f, -0.5f, -0.0f, 1e10f, -1e10f, inf, -inf, nan, 300.0f, 255.9f};
  EXPECT_EQ(converted<int32_t>(src),
            (std::vector<int32_t>{2, -2, 0, 0, 0, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, 0, 300, 255}));
  EXPECT_EQ(converted<int64_t>(src), (std::vector<int64_t>{2, -2, 0, 0, 0, 10'000'000'000, -10'000'000'000,
                                                           INT64_MAX, INT64_MIN, 0, 300, 255}));
  EXPECT_EQ(converted<uint8_t>(src), (std::vector<uint8_t>{2, 0, 0, 0, 0, 255, 0, 255, 0, 0, 255, 255}));
  std::vector<double> big = {9.3e18, -9.3e18, 2147483647.9, -2147483648.9, 2147483648.0};
  EXPECT_EQ(converted<int64_t>(big), (std::vector<int64_t>{INT64_MAX, INT64_MIN, 2147483647, -2147483648,
                                                           2147483648}));
  EXPECT_EQ(converted<int32_t>(big), (std::vector<int32_t>{INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN,
                                                           INT32_MAX}));
  std::vector<Half> halves = {Half(-3.75f), Half(65504.0f)};
  EXPECT_EQ(converted<int32_t>(halves), (std::vector<int32_t>{-3, 65504}));
}

TEST(Convert, ToBoolIsNonZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> src = {0.0f, -0.0f, 0.5f, -3.0f, nan, 1e-45f};
  EXPECT_EQ(converted<bool>(src), (std::vector<uint8_t>{0, 0, 1, 1, 1, 1}));
  std::vector<int64_t> ints = {0, -1, 256};
  EXPECT_EQ((converted<int32_t, bool>(converted<bool>(ints))), (std::vector<int32_t>{0, 1, 1}));
}

// f64 and integers reach f16/bf16 with one rounding: a value just above a tie must not be rounded to a
// float on the tie first and then to even.
TEST(Convert, WideTypesToHalfRoundOnce) {
  std::vector<double> above_tie = {1.0 + 0x1p-11 + 0x1p-40, -(1.0 + 0x1p-11 + 0x1p-40), 1.0 + 0x1p-11};
  EXPECT_EQ(converted<Half>(above_tie)[0].bits, 0x3c01);
  EXPECT_EQ(converted<Half>(above_tie)[1].bits, 0xbc01);
  EXPECT_EQ(converted<Half>(above_tie)[2].bits, 0x3c00);  // an exact tie still goes to even
  std::vector<double> bf_above_tie = {1.0 + 0x1p-8 + 0x1p-30};
  EXPECT_EQ(converted<BFloat16>(bf_above_tie)[0].bits, 0x3f81);
  // 2^24 + 2^16 + 1: f32 would round it onto the bf16 tie 2^24 + 2^16, which goes to even (2^24).
  std::vector<int32_t> i32 = {(1 << 24) + (1 << 16) + 1};
  EXPECT_EQ(converted<BFloat16>(i32)[0].bits, 0x4b81);
  std::vector<int64_t> i64 = {(int64_t{1} << 40) + (int64_t{1} << 32) + 1, 70000};
  EXPECT_EQ(converted<BFloat16>(i64)[0].bits, 0x5381);
  EXPECT_EQ(converted<Half>(i64)[1].bits, 0x7c00);  // past 65520: inf
  std::vector<double> specials = {std::numeric_limits<double>::infinity(), -1e300, 1e-300, -1e-300, 0x1p-25,
                                  0x1p-25 + 0x1p-60, std::numeric_limits<double>::quiet_NaN()};
  std::vector<Half> h = converted<Half>(specials);
  EXPECT_EQ(h[0].bits, 0x7c00);
  EXPECT_EQ(h[1].bits, 0xfc00);
  EXPECT_EQ(h[2].bits, 0x0000);
  EXPECT_EQ(h[3].bits, 0x8000);
  EXPECT_EQ(h[4].bits, 0x0000);  // exact tie at half the smallest subnormal: even (zero)
  EXPECT_EQ(h[5].bits, 0x0001);  // just above it
  EXPECT_EQ(h[6].bits, 0x7e00);
  std::vector<BFloat16> b = converted<BFloat16>(specials);
  EXPECT_EQ(b[1].bits, 0xff80);  // beyond f32's range: inf, not FLT_MAX's rounding
  EXPECT_EQ(b[2].bits, 0x0000);
  EXPECT_EQ(b[3].bits, 0x8000);
  EXPECT_EQ(b[6].bits & 0x7fc0, 0x7fc0);
}

TEST(Convert, HalfAndBFloat16ToEachOther) {
  std::vector<Half> h = {Half(1.0f + 0x1p-10f), Half(65504.0f), Half::from_bits(0x0001)};
  std::vector<BFloat16> b = converted<BFloat16>(h);
  EXPECT_EQ(b[0].bits, 0x3f80);  // 1 + 2^-10 is below bf16's half ulp (2^-8)
  EXPECT_EQ(b[1].bits, 0x4780);  // 65504 rounds up to 65536 in bf16
  EXPECT_EQ(static_cast<float>(b[2]), 0x1p-24f);
  std::vector<Half> back = converted<Half>(b);
  EXPECT_EQ(back[1].bits, 0x7c00);
}

// f16 <-> bf16 (an f16 convolution's operands under F16Products::kBf16) run the level's kernels through an
// f32 chunk: every one of the 65536 patterns each way, at every level, is the scalar conversion's value
// (exact widening, one rounding), over several chunks and a tail, also in place.
TEST(Convert, HalfAndBFloat16EveryPatternAtEveryLevel) {
  std::vector<Half> h(65536 + 77);
  std::vector<BFloat16> b(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    h[i] = Half::from_bits(static_cast<uint16_t>(i));
    b[i] = BFloat16::from_bits(static_cast<uint16_t>(i * 40503u));  // another order of the patterns
  }
  std::vector<BFloat16> want_b(h.size());
  std::vector<Half> want_h(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    want_b[i] = BFloat16(static_cast<float>(h[i]));
    want_h[i] = Half(static_cast<float>(b[i]));
  }
  auto same_bits = [](const auto& got, const auto& want) {
    for (size_t i = 0; i < want.size(); ++i)
      if (got[i].bits != want[i].bits)
        return testing::AssertionFailure() << "element " << i << ": " << got[i].bits << " != " << want[i].bits;
    return testing::AssertionSuccess();
  };
  for (CpuLevel level : supported_cpu_levels()) {
    SCOPED_TRACE(cpu_level_name(level));
    ScopedCpuLevel scoped(level);
    EXPECT_TRUE(same_bits(converted<BFloat16>(h), want_b));
    EXPECT_TRUE(same_bits(converted<Half>(b), want_h));
    std::vector<Half> in_place = h;  // dst == src
    convert(in_place.data(), DType::kF16, in_place.data(), DType::kBF16, static_cast<int64_t>(h.size()));
    EXPECT_EQ(std::memcmp(in_place.data(), want_b.data(), h.size() * 2), 0) << "in place";
  }
}

TEST(Convert, LargeGenericConversionRunsInParallelChunks) {
  std::vector<double> src(300'001);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<double>(i) - 150'000.5;
  std::vector<int32_t> dst = converted<int32_t>(src);
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(dst[i], static_cast<int32_t>(std::trunc(src[i]))) << i;
}

}  // namespace
}  // namespace demi
