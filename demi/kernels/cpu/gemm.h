// demi's own matrix product: a packing GEMM in the GotoBLAS/BLIS structure (NC / KC / MC cache blocks,
// packed panels of b, register-blocked micro-kernels), with MatmulParams' whole contract
// (../matmul_params.h): batches, transposes, any mix of f32|bf16|f16 operands and output, bias, ReLU and
// accumulation fused into the micro-kernel's store.
//
// What it is for: low-precision storage at full speed. Packing converts on the way in, so
//   - f16 (and mixed) operands run the f32 FMA micro-kernel, reading half the bytes, with no widened copy
//     of either operand (oneDNN 2.6 has no f16 kernels: widening whole operands was the old path);
//   - bf16 x bf16 runs a vdpbf16ps micro-kernel where the CPU has AVX512-BF16 (the f32 one elsewhere);
//   - accumulation is f32 always, the output rounded once; transposed operands are handled by the
//     packing and the micro-kernel's strides, never by copies;
//   - an f32 b read as bf16|f16 (MatmulParams::b_round: AMP's master weights) is rounded in packing, so
//     no low-precision copy of it exists outside the packed panels.
// A bf16|f16 output is rounded once: K up to 1024 runs as one block (the tile goes straight to c), a
// longer K is staged in an f32 workspace (M x N). An f32 output takes K in blocks of KC.
//
// The micro-kernels and their register tiles differ per CPU level (the variants:
// demi/core/kernel_registry.h; `demi info` prints them). Threads: demi's pool (parallel_for); a product's
// row blocks (sharing one packed b panel) go to the threads, or its column panels when it has too few rows.
// f64 is not handled here (ref::matmul is the f64 kernel).
#pragma once

#include <cstdint>
#include <string>

#include "demi/kernels/matmul_params.h"

namespace demi::kernels::cpu {

// Which micro-kernel a bf16 x bf16 product runs: vdpbf16ps pairs where the CPU has them (kBf16Dot), or
// the f32 FMA kernel on operands widened in packing (kF32: exact products, no denormal flushing; faster
// on CPUs whose vdpbf16ps issues at half the FMA rate). Other dtypes always run the f32 kernel.
enum class GemmPath { kBf16Dot, kF32 };

// a (batch, M, K) | a^T, b (batch, K, N) | b^T, bias (N) -> c (batch, M, N), f32|bf16|f16 in any mix.
void gemm(const MatmulParams& p, const void* a, const void* b, void* c, GemmPath path = GemmPath::kBf16Dot);

// The same with an f32 bias (M values) added to every column instead (p.bias unset): a convolution's
// per-output-channel bias, fused into the store like the column bias.
void gemm_row_bias(const MatmulParams& p, const void* a, const void* b, void* c, const float* row_bias,
                   GemmPath path = GemmPath::kBf16Dot);

// "demi:avx512_bf16:bf16" (the variant and the micro-kernel's input type) for diagnostics and `demi info`.
std::string gemm_implementation(const MatmulParams& p, GemmPath path = GemmPath::kBf16Dot);
// Whether this CPU level has the bf16 pair kernel.
bool gemm_has_bf16_dot();

// Cache blocking (elements): rows of a per block, the K block and columns of b per packed panel. Tests
// set small values to cover many blocks on small products; benchmarks tune them. DEMI_GEMM_BLOCKING=
// "MC,KC,NC" sets them at start-up. Each is rounded up to what the micro-kernel needs.
struct GemmBlocking {
  int64_t mc = 144;
  int64_t kc = 768;
  int64_t nc = 2048;
};
GemmBlocking gemm_blocking();
void set_gemm_blocking(const GemmBlocking& b);

}  // namespace demi::kernels::cpu
