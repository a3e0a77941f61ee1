// Tolerances for comparing a result computed in one dtype against a reference, named per dtype.
// Tests use these and never write magic numbers at call sites: |got - want| <= atol + rtol * |want|.
//
// f32: rounding of long f32 sums (accumulation order differs between fast and reference kernels).
// bf16: 8 significant bits, so one rounding is 2^-9 relative; kernels that round inputs and outputs to
//       bf16 but accumulate in f32 stay within a few ulps.
// f16: 11 significant bits (2^-12 relative per rounding); same reasoning.
#pragma once

#include <cmath>

#include "demi/core/dtype.h"

namespace demi {

struct Tolerance {
  double rtol;
  double atol;
  bool close(double got, double want) const {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want)) return got == want;
    return std::abs(got - want) <= atol + rtol * std::abs(want);
  }
};

// For a kernel whose inputs and output are in `t` and that accumulates in f32 (or f64 for f64).
inline Tolerance tolerance_for(DType t) {
  switch (t) {
    case DType::kF64: return {1e-12, 1e-12};
    case DType::kF32: return {1e-5, 1e-5};
    case DType::kBF16: return {2e-2, 2e-2};
    case DType::kF16: return {4e-3, 4e-3};
    default: return {0, 0};
  }
}

// For a kernel whose every output is a sum of `terms` products bounded by `magnitude` (max|a|·max|b|),
// accumulated in f32 (f64 for f64) in an order that differs between the fast kernel (blocked, split
// across threads) and the reference, then rounded once to `t` — matrix products and convolutions,
// compared with a reference computed on the same (already rounded) inputs. The relative part is t's
// rounding of the output; the absolute part is the accumulation's: its rounding error grows like
// sqrt(terms)·magnitude (random-walk partial sums), which a per-element rtol misses when terms cancel.
inline Tolerance tolerance_for_sum(DType t, int64_t terms, double magnitude) {
  const Tolerance acc = tolerance_for(t == DType::kF64 ? DType::kF64 : DType::kF32);
  return {tolerance_for(t).rtol, acc.atol * std::sqrt(static_cast<double>(terms)) * magnitude};
}

// For a gradient checked against f64 central finite differences (step kFiniteDiffStep).
inline constexpr double kFiniteDiffStep = 1e-6;
inline constexpr Tolerance kFiniteDiffTolerance = {1e-5, 1e-6};

}  // namespace demi
