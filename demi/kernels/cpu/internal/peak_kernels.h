// The ISA loops behind ../peak.h: each runs `iters` rounds of independent accumulator chains and returns
// the FLOPs it did (the result is folded into `sink` so the loop is not removed).
#pragma once

#include <cstdint>

namespace demi::kernels::cpu_internal {

double fma_loop_avx2(int64_t iters, float* sink);
double fma_loop_avx512(int64_t iters, float* sink);
double bf16_loop_avx512bf16(int64_t iters, float* sink);

}  // namespace demi::kernels::cpu_internal
