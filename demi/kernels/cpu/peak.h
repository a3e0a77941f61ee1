// The machine's arithmetic ceilings, measured rather than assumed: dependency-free register loops of
// vfmadd231ps (f32 FMA) and vdpbf16ps (bf16 pair dot products) on every thread of demi's pool, for about
// `seconds` each. Benchmarks report kernels as a share of these, measured in the same run (clocks differ
// between machines and periods). Returns 0 where the CPU lacks the instruction (bf16 without AVX512-BF16).
#pragma once

namespace demi::kernels::cpu {

// f32 GFLOP/s (2 per lane per FMA) at the widest vectors cpu_level() allows, or 0 at a level without an
// FMA loop (the levels: demi/core/kernel_registry.h; `demi info` prints them).
double fma_peak_gflops(double seconds = 0.2);
// bf16 GFLOP/s of vdpbf16ps (4 per lane per instruction), or 0.
double bf16_peak_gflops(double seconds = 0.2);
// bf16 GFLOP/s of the AMX tile unit's TDPBF16PS (2 x 16 x 16 x 32 per instruction), or 0 below the amx level.
double amx_peak_gflops(double seconds = 0.2);
// fp16 GFLOP/s of AVX512-FP16's vfmaddph (2 per lane, 32 lanes), or 0 where the CPU lacks it (measured at
// the amx level only).
double fp16_peak_gflops(double seconds = 0.2);

}  // namespace demi::kernels::cpu
