// The ISA loops behind ../peak.h: each runs `iters` rounds of independent accumulator chains and returns
// the FLOPs it did (the result is folded into `sink` so the loop is not removed).
#pragma once

#include <cstdint>

namespace demi::kernels::cpu_internal {

double fma_loop_avx2(int64_t iters, float* sink);
double fma_loop_avx512(int64_t iters, float* sink);
double bf16_loop_avx512bf16(int64_t iters, float* sink);

// A level's loops (null: the level has no such instruction to measure).
struct PeakKernels {
  double (*fma_loop)(int64_t iters, float* sink) = nullptr;
  double (*bf16_loop)(int64_t iters, float* sink) = nullptr;
  double (*amx_loop)(int64_t iters, float* sink) = nullptr;   // TDPBF16PS
  double (*fp16_loop)(int64_t iters, float* sink) = nullptr;  // AVX512-FP16 vfmaddph
};
const PeakKernels& peak_kernels_scalar();      // peak.cc: none
const PeakKernels& peak_kernels_avx2();        // peak_avx2.cc
const PeakKernels& peak_kernels_avx512();      // peak_avx512.cc
const PeakKernels& peak_kernels_avx512bf16();  // peak_avx512bf16.cc: AVX-512's FMA loop and vdpbf16ps
const PeakKernels& peak_kernels_amx();         // peak_amx.cc: those, TDPBF16PS and vfmaddph

}  // namespace demi::kernels::cpu_internal
