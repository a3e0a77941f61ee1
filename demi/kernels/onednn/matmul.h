// Matrix products through oneDNN's matmul primitive: the general (batched, transposed, mixed-dtype,
// accumulating, bias + ReLU fused) product that Dense (dense.h), batched attention products and the ops
// layer build on. The semantics, shapes and dtypes are MatmulParams' (../matmul_params.h); the oracle is
// ref::matmul (../reference/matmul.h).
//
// How each dtype runs here: bf16 x bf16 in oneDNN's bf16 kernels (AMX or AVX512-BF16, f32 accumulation),
// writing f32 or bf16 directly; f32 and mixed operands in f32; f16 x f16 (oneDNN 2.6 has no f16 kernels)
// either as one bf16 product over 4K of the operands split exactly into bf16 pairs (../cpu/f16_split.h:
// the f32 product of the f16 values, up to summation order) where oneDNN runs bf16 on AMX and the product
// has >= 1024 rows, K <= 512 and a plain a (where that measured faster), else widened to f32 in tracked
// workspace and computed in f32 — a plain a (or a weight gradient's K) a chunk of rows at a time, so the
// workspace stays bounded; an f16 output is converted back from f32.
// f64 runs the reference kernel (gradient checks). Primitives are created once per shape, dtypes and flags
// and cached (primitive_cache.h).
#pragma once

#include <string>

#include "demi/kernels/matmul_params.h"

namespace demi::kernels::onednn {

// a (batch, M, K) | a^T (batch, K, M), b (batch, K, N) | b^T (batch, N, K), bias (N) -> c (batch, M, N);
// f32|bf16|f16 (or all f64) in any combination, c = act(op(a) op(b) + bias [+ c]).
void matmul(const MatmulParams& p, const void* a, const void* b, void* c);
// The same with bf16 operands widened to f32 as f16 ones are (in chunks where the layout allows: a plain
// a by rows, a weight gradient by K) and oneDNN's f32 product: exact products and f32 sums like the bf16
// kernels, faster where vdpbf16ps issues at half the FMA rate (Intel Xeons without AMX).
void matmul_widened(const MatmulParams& p, const void* a, const void* b, void* c);

// How f16 x f16 products run: kAuto as above, or forced (tests, benchmarks). Process-wide.
enum class F16Matmul { kAuto, kSplitBf16, kConvertF32 };
void set_f16_matmul(F16Matmul mode);
F16Matmul f16_matmul();
// f16 operands are prepared max(min_rows, target_elements / row length) rows at a time (default 256 and
// 2^20, which bounds the workspace); tests set small values to cover many chunks on small products.
void set_f16_matmul_chunking(int64_t min_rows, int64_t target_elements);
// Whether a product with these parameters takes the split-bf16 path under the current mode.
bool f16_matmul_splits(const MatmulParams& p);

// For benchmarks and diagnostics: oneDNN's implementation for a product ("brg:avx512_core_amx_bf16", ...),
// or "reference" for f64. Creates (and caches) the primitive if needed.
std::string matmul_implementation(const MatmulParams& p);

}  // namespace demi::kernels::onednn
