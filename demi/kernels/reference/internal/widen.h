// Helpers of the reference kernels: read a whole operand into the accumulation type (float for f32, bf16
// and f16 data, which widen exactly; double for f64) and write results back with one rounding. The
// kernels then run on Acc only, which keeps each of them one obviously right loop nest per Acc.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "demi/core/dtype.h"
#include "demi/core/error.h"
#include "demi/core/half.h"

namespace demi::kernels::ref::internal {

template <typename Acc>
std::vector<Acc> widen(const void* src, DType t, int64_t n) {
  std::vector<Acc> out(static_cast<size_t>(n));
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, Half> ||
                  std::is_same_v<T, BFloat16>) {
      const T* s = static_cast<const T*>(src);
      for (int64_t i = 0; i < n; ++i)
        out[static_cast<size_t>(i)] = static_cast<Acc>(static_cast<double>(s[i]));
    } else {
      DEMI_ASSERT(false, "reference kernel given a non-floating dtype ", dtype_name(t));
    }
  });
  return out;
}

// Each value read as if cast to `round` first (bf16 or f16; kF32: as it is), with the scalar conversions every
// cast is bit-identical to: an f32 operand read rounded (MatmulParams::a_round / b_round,
// Conv2dParams::x_round).
template <typename Acc>
void round_values(std::vector<Acc>& values, DType round) {
  for (Acc& v : values) {
    if (round == DType::kBF16) v = static_cast<Acc>(static_cast<float>(BFloat16(static_cast<float>(v))));
    if (round == DType::kF16) v = static_cast<Acc>(static_cast<float>(Half(static_cast<float>(v))));
  }
}

// dst[i] = round(src[i]) into dtype t; with `accumulate`, dst[i] = round(dst[i] + src[i]) (the sum taken
// in Acc, so the stored value is rounded once).
template <typename Acc>
void narrow(const Acc* src, void* dst, DType t, int64_t n, bool accumulate = false) {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, Half> ||
                  std::is_same_v<T, BFloat16>) {
      T* d = static_cast<T*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        Acc v = src[i];
        if (accumulate) v += static_cast<Acc>(static_cast<double>(d[i]));
        if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
          d[i] = T(static_cast<float>(v));
        } else {
          d[i] = static_cast<T>(v);
        }
      }
    } else {
      DEMI_ASSERT(false, "reference kernel given a non-floating dtype ", dtype_name(t));
    }
  });
}

}  // namespace demi::kernels::ref::internal
