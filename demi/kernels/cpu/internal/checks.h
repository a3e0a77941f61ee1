// The dtype contract of the fast CPU kernels' entry points, shared by their portable dispatchers (never
// included by an *_avx512.cc file): f32, bf16 or f16 through the void* overloads, float64 only through the
// double* ones, which run the reference twins.
#pragma once

#include <string_view>

#include "demi/core/dtype.h"

namespace demi::kernels::cpu_internal {

// f32, bf16 or f16: the storage dtypes the fast kernels read and write.
bool is_fast_float(DType t);

// A demi::Error naming op and the tensor (`what`, e.g. "x", "logits") unless dtype is a fast float, or,
// with want_f64 (a double* overload), unless it is float64.
void check_float_entry(std::string_view op, std::string_view what, DType dtype, bool want_f64);

}  // namespace demi::kernels::cpu_internal
