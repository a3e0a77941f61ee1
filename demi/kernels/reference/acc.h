// The arithmetic type of the reference kernels: f32 for f32, bf16 and f16 data (what the fast kernels
// compute in, so the two agree within tolerance_for(dtype)), f64 for f64 data (finite-difference gradient
// checks need the extra digits). Sums (reductions, softmax, losses, batch statistics) are accumulated in
// SumT = f64 whatever T is: the oracle should be the most exact side of a comparison, and a sequential
// f32 sum of 10^5 terms is not (the fast kernels accumulate in f32 but in many lanes and blocks).
#pragma once

#include <type_traits>

#include "demi/core/half.h"

namespace demi::kernels::ref {

template <typename T>
using AccT = std::conditional_t<std::is_same_v<T, double>, double, float>;

using SumT = double;

// Rounds an accumulator value to storage type T (round to nearest even for Half and BFloat16).
template <typename T>
T from_acc(AccT<T> v) {
  return T(v);
}

}  // namespace demi::kernels::ref
