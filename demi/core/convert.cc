// Bulk dtype conversion: the scalar reference kernels, the per-level kernel table (the SIMD variants
// live in convert_avx2.cc, convert_avx512.cc and convert_avx512bf16.cc, each compiled for its ISA only),
// and the generic any-to-any convert().
#include "demi/core/convert.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <type_traits>

#include "demi/core/error.h"
#include "demi/core/kernel_registry.h"
#include "demi/core/parallel.h"

namespace demi {
namespace internal {

void f32_to_f16_scalar(const float* src, Half* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Half(src[i]);
}
void f16_to_f32_scalar(const Half* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
void f32_to_bf16_scalar(const float* src, BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16(src[i]);
}
void bf16_to_f32_scalar(const BFloat16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

const ConvertKernels& convert_kernels_scalar() {
  static const ConvertKernels k{f32_to_f16_scalar, f16_to_f32_scalar, f32_to_bf16_scalar, bf16_to_f32_scalar};
  return k;
}

const ConvertKernels& convert_kernels(CpuLevel level) {
  static const KernelTable<ConvertKernels> table{DEMI_KERNEL_TABLE_ENTRIES(convert)};
  DEMI_CHECK(static_cast<int>(level) >= 0 && static_cast<int>(level) <= static_cast<int>(max_cpu_level()),
             "CPU level ", cpu_level_name(level), " is not supported on this machine (best: ",
             cpu_level_name(max_cpu_level()), ")");
  return table.at(level);
}

}  // namespace internal

namespace {

constexpr int64_t kConvertGrain = 1 << 16;

template <typename T>
constexpr bool kIsHalfType = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// v rounded to a float with the sticky bit in the last place (round to odd): inexact results get an odd
// mantissa, so a second rounding to f16/bf16 (which keep far fewer bits) is the single correct rounding
// of v. Rounding through a plain float would round twice and can miss a tie by a hair. long double holds
// every f64, i32 and i64 value exactly (x86-64: 64-bit mantissa).
float round_to_odd_float(long double v) {
  float f = static_cast<float>(v);
  if (static_cast<long double>(f) == v || std::isnan(f)) return f;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  if ((std::bit_cast<uint32_t>(f) & 1u) == 0) f = std::nextafter(f, v > f ? kInf : -kInf);
  return f;
}

// Float -> integer truncates toward zero and saturates at the integer's range; NaN gives 0. A plain cast
// of NaN or of an out-of-range value is undefined behaviour in C++.
template <typename Dst>
Dst float_to_int(double v) {
  constexpr double kLo = static_cast<double>(std::numeric_limits<Dst>::min());   // exact: 0 or -2^k
  constexpr double kHi = 2.0 * static_cast<double>(std::numeric_limits<Dst>::max() / 2 + 1);  // max + 1
  if (std::isnan(v)) return 0;
  if (v <= kLo) return std::numeric_limits<Dst>::min();
  if (v >= kHi) return std::numeric_limits<Dst>::max();
  return static_cast<Dst>(v);
}

template <typename Src, typename Dst>
void convert_loop(const Src* src, Dst* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<Dst, bool>) {
      dst[i] = static_cast<double>(src[i]) != 0.0;
    } else if constexpr (kIsHalfType<Dst>) {
      if constexpr (std::is_same_v<Src, float> || kIsHalfType<Src>) {
        dst[i] = Dst(static_cast<float>(src[i]));  // exact to float, then one rounding
      } else {
        dst[i] = Dst(round_to_odd_float(static_cast<long double>(src[i])));
      }
    } else if constexpr (std::is_integral_v<Dst> && !std::is_integral_v<Src>) {
      dst[i] = float_to_int<Dst>(static_cast<double>(src[i]));
    } else if constexpr (kIsHalfType<Src>) {
      dst[i] = static_cast<Dst>(static_cast<float>(src[i]));
    } else {
      dst[i] = static_cast<Dst>(src[i]);
    }
  }
}

}  // namespace

namespace {

// Splits a bulk conversion across threads at multiples of 64 elements, so that every chunk starts on a
// 64-byte boundary of both arrays when the arrays do (demi's allocator aligns tensors to 64 bytes).
template <typename Src, typename Dst>
void run_chunked(void (*kernel)(const Src*, Dst*, int64_t), const Src* src, Dst* dst, int64_t n) {
  constexpr int64_t kBlock = 64;
  parallel_for(0, (n + kBlock - 1) / kBlock, kConvertGrain / kBlock, [&](int64_t b, int64_t e) {
    int64_t begin = b * kBlock;
    int64_t end = e * kBlock < n ? e * kBlock : n;
    kernel(src + begin, dst + begin, end - begin);
  });
}

}  // namespace

void convert_f32_to_f16(const float* src, Half* dst, int64_t n) {
  run_chunked(internal::convert_kernels(cpu_level()).f32_to_f16, src, dst, n);
}
void convert_f16_to_f32(const Half* src, float* dst, int64_t n) {
  run_chunked(internal::convert_kernels(cpu_level()).f16_to_f32, src, dst, n);
}
void convert_f32_to_bf16(const float* src, BFloat16* dst, int64_t n) {
  run_chunked(internal::convert_kernels(cpu_level()).f32_to_bf16, src, dst, n);
}
void convert_bf16_to_f32(const BFloat16* src, float* dst, int64_t n) {
  run_chunked(internal::convert_kernels(cpu_level()).bf16_to_f32, src, dst, n);
}

namespace {

// Between the two low dtypes through an L1-sized f32 chunk on the stack (exact widening, then one
// rounding: the scalar conversion's value), the level's kernels called directly, chunks split across
// threads.
template <typename Src, typename Dst>
void convert_through_f32(void (*widen)(const Src*, float*, int64_t), void (*narrow)(const float*, Dst*, int64_t),
                         const Src* src, Dst* dst, int64_t n) {
  constexpr int64_t kChunk = 1024;
  parallel_for(0, (n + kChunk - 1) / kChunk, kConvertGrain / kChunk, [&](int64_t c0, int64_t c1) {
    alignas(64) float wide[kChunk];
    for (int64_t i = c0 * kChunk; i < std::min(n, c1 * kChunk); i += kChunk) {
      const int64_t c = std::min(kChunk, n - i);
      widen(src + i, wide, c);
      narrow(wide, dst + i, c);
    }
  });
}

}  // namespace

void round_f32(const float* src, float* dst, int64_t n, DType to) {
  DEMI_CHECK(to == DType::kBF16 || to == DType::kF16, "round_f32: rounds to bfloat16 or float16, got ",
             dtype_name(to));
  // Through an L1-sized chunk of the low dtype, the variant's kernels called directly (a GEMM rounds a
  // packed panel of a few hundred values at a time: the bulk conversions' splitting cost more than the
  // rounding there), chunks split across threads for a large array.
  constexpr int64_t kChunk = 1024;
  const internal::ConvertKernels& k = internal::convert_kernels(cpu_level());
  parallel_for(0, (n + kChunk - 1) / kChunk, kConvertGrain / kChunk, [&](int64_t c0, int64_t c1) {
    alignas(64) uint16_t low[kChunk];
    for (int64_t i = c0 * kChunk; i < std::min(n, c1 * kChunk); i += kChunk) {
      const int64_t c = std::min(kChunk, n - i);
      if (to == DType::kBF16) {
        k.f32_to_bf16(src + i, reinterpret_cast<BFloat16*>(low), c);
        k.bf16_to_f32(reinterpret_cast<const BFloat16*>(low), dst + i, c);
      } else {
        k.f32_to_f16(src + i, reinterpret_cast<Half*>(low), c);
        k.f16_to_f32(reinterpret_cast<const Half*>(low), dst + i, c);
      }
    }
  });
}

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  if (n <= 0) return;
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(src_dtype));
    return;
  }
  if (src_dtype == DType::kF32 && dst_dtype == DType::kF16)
    return convert_f32_to_f16(static_cast<const float*>(src), static_cast<Half*>(dst), n);
  if (src_dtype == DType::kF16 && dst_dtype == DType::kF32)
    return convert_f16_to_f32(static_cast<const Half*>(src), static_cast<float*>(dst), n);
  if (src_dtype == DType::kF32 && dst_dtype == DType::kBF16)
    return convert_f32_to_bf16(static_cast<const float*>(src), static_cast<BFloat16*>(dst), n);
  if (src_dtype == DType::kBF16 && dst_dtype == DType::kF32)
    return convert_bf16_to_f32(static_cast<const BFloat16*>(src), static_cast<float*>(dst), n);
  const internal::ConvertKernels& k = internal::convert_kernels(cpu_level());
  if (src_dtype == DType::kF16 && dst_dtype == DType::kBF16)
    return convert_through_f32(k.f16_to_f32, k.f32_to_bf16, static_cast<const Half*>(src),
                               static_cast<BFloat16*>(dst), n);
  if (src_dtype == DType::kBF16 && dst_dtype == DType::kF16)
    return convert_through_f32(k.bf16_to_f32, k.f32_to_f16, static_cast<const BFloat16*>(src),
                               static_cast<Half*>(dst), n);
  visit_dtype(src_dtype, [&](auto s) {
    visit_dtype(dst_dtype, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      const S* sp = static_cast<const S*>(src);
      D* dp = static_cast<D*>(dst);
      parallel_for(0, n, kConvertGrain, [&](int64_t b, int64_t e) { convert_loop(sp + b, dp + b, e - b); });
    });
  });
}

}  // namespace demi
