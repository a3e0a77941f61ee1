// The one entry point for matrix products (MatmulParams' contract, matmul_params.h): it runs demi's own
// GEMM (cpu/gemm.h) or oneDNN's matmul (onednn/matmul.h), whichever measured faster for that product on
// this machine. Not a table written on one machine: at the first use of a shape (sizes, transposes,
// dtypes, epilogue, CPU level, thread count) each candidate runs a few times on the call's own operands
// and the fastest is kept for the process (for f16 operands oneDNN must be 10% faster: it widens whole
// operands into f32 workspace, demi converts panel by panel):
//   - "onednn"     oneDNN's matmul (f16 widened to f32 there: oneDNN has no f16 kernels);
//   - "demi-f32"   demi's GEMM on its f32 FMA micro-kernel, low-precision operands converted in packing;
//   - "demi-bf16"  demi's GEMM on vdpbf16ps pairs (bf16 x bf16, where the CPU has AVX512-BF16);
//   - "onednn-f32" oneDNN's f32 matmul on bf16 operands widened in chunks (bf16 x bf16; like the f16
//                  path, it must be 10% faster to be chosen);
//   - "demi-dot"   demi's dot-product kernel for few output columns (cpu/gemm_dot.h: a . b^T with N <= 32,
//                  a classifier's last Dense forward), a converted b in one copy the threads share;
//   - "demi-dot-per-thread"  the same with a copy of the converted b per thread (where it fits a core's
//                  L2: faster on two threads, twice the copies — weighed by the workspace pricing below);
//   - "demi-amx"   demi's AMX GEMM (cpu/gemm_amx.h: bf16 values, and f16 ones exactly, on the tile unit).
// Each candidate's time is priced by the workspace it holds beyond the lightest one's
// (internal::priced_seconds: 1% of time for 1% of the call's footprint).
// f64 always runs the reference kernel.
//
// Choices are also kept on disk, so that another process on the same machine makes the same ones (a run
// resumed from a checkpoint computes bit for bit what the uninterrupted run did): one line per product in
// $DEMI_CACHE_DIR (else $XDG_CACHE_HOME/demi, else ~/.cache/demi, else /tmp/demi-UID), file
// "matmul-v<tuning version>-<cpu>.txt" keyed by the CPU's model name, family and model; a process tunes
// under an exclusive lock on it and the first choice written wins.
// Where no cache folder can be written, choices live in memory only.
//
// DEMI_MATMUL=auto|demi|onednn (or set_matmul_policy) forces a backend: "demi" takes the fastest of demi's
// kernels by the same measurement, "onednn" always oneDNN.
#pragma once

#include <string>

#include "demi/core/context.h"
#include "demi/kernels/matmul_params.h"

namespace demi::kernels {

// a (batch, M, K) | a^T, b (batch, K, N) | b^T, bias (N) -> c (batch, M, N).
void matmul(const MatmulParams& p, const void* a, const void* b, void* c);

// Whether matmul(p, a, b, ...) runs oneDNN (tuning the product now if needed): for callers that have a
// oneDNN-only alternative for the same product (the Dense weight gradient's inner-product primitive).
bool matmul_picks_onednn(const MatmulParams& p, const void* a, const void* b);

enum class MatmulPolicy { kAuto, kDemi, kOnednn };
void set_matmul_policy(MatmulPolicy policy);
MatmulPolicy matmul_policy();

// How products of f16 values are computed (an explicit choice, never made silently): kExact multiplies the
// f16 values themselves (demi's GEMM converts them to f32 in packing; the f32 FMA rate on a CPU without fp16
// arithmetic); kBf16 rounds them to bf16 (8 significant bits instead of 11) and runs the bf16 pair kernel
// (or demi's f32 kernel or demi-dot on the rounded values, where those measure faster: short K, few output
// columns), about twice as fast where vdpbf16ps exists, with other numbers (MatmulParams::bf16_products);
// oneDNN, which multiplies f16 values exactly, is never chosen for them. It applies to every matmul() of
// f16|bf16 operands with at least one f16 value (Dense, MatMul, BatchMatMul and their gradients, attention's
// products); the convolution layers round their f16 operands (x, w, dy) to bf16 before their kernels, which
// then run as bf16 convolutions (oneDNN's among the candidates: its operands are bf16 there) writing f16
// outputs (y, dx) rounded once. kBf16 needs AVX512-BF16 (else a demi::Error).
// (demi::F16Products, core/context.h: the AMP option in force on the calling thread.)
// Whether a product of operands in dtypes a and b multiplies its f16 values as bf16 under the setting:
// kBf16, both f16|bf16, at least one f16. (The convolution layers follow the same rule: ops/conv_pool.cc.)
bool f16_products_in_bf16(DType a, DType b);

// The kernel a product runs (tuning it now if it has not run yet; a and b are then read from scratch
// operands): "onednn (brg:avx512_core)", "demi-f32 (demi:avx512_bf16:f32)", "reference".
std::string matmul_kernel(const MatmulParams& p);

// The cache file in use, or "" when choices are kept in memory only.
std::string matmul_cache_path();
// Uses another cache folder from now on ("" = the default) and forgets the in-memory choices (tests).
void set_matmul_cache_dir(const std::string& dir);
// Forgets the in-memory choices (tests; the file is left as it is).
void clear_matmul_choices();

}  // namespace demi::kernels
