#include "demi/kernels/cpu/internal/checks.h"

#include "demi/core/error.h"

namespace demi::kernels::cpu_internal {

bool is_fast_float(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

void check_float_entry(std::string_view op, std::string_view what, DType dtype, bool want_f64) {
  if (want_f64) {
    DEMI_CHECK(dtype == DType::kF64, op, ": the double* overload takes float64 data, got ", dtype_name(dtype));
  } else {
    DEMI_CHECK(is_fast_float(dtype), op, ": expected ", what, " of dtype float32, bfloat16 or float16 (float64 ",
               "takes the double* overload), got ", dtype_name(dtype));
  }
}

}  // namespace demi::kernels::cpu_internal
