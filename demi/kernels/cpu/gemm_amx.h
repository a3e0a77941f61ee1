// demi's AMX GEMM: MatmulParams' products of bf16 values, and of f16 values exactly, on the tile unit
// (TDPBF16PS: a 16 x 32 bf16 tile times a 32 x 16 one into 16 x 16 f32 sums, about fifteen times the f32
// FMA rate of one core on the Xeons that have it).
//
//   - bf16 values (bf16 operands, f32 ones read as bf16, f16 ones under bf16_products) are packed as
//     they are; f16 values (f16 operands, f32 ones read as f16) are split exactly into bf16 hi + lo
//     (f16_split.h) and each step of 32 k multiplies four tile products, ah bh, al bh, al bl and ah bl,
//     into one chain per C tile, every term exact in f32 and summed in f32 — the values of the f32
//     product of the f16 values, up to the order of the sum (a bf16 operand beside an f16 one is split
//     too, its lo 0). No option changes the numbers.
//   - a is packed as rows of K' bf16 (K' = K, or [hi | lo] split, each part padded to 32 with zeros), b as
//     column tiles of 16 in VNNI-2 pairs, both converted, rounded, split and transposed in vector
//     registers while packing (a call's workspace: the packed operands, the bytes its measured choice weighs
//     against its time). The threads share the smaller operand, packed first, and each packs its own part
//     of the larger one a chunk at a time, just before its tiles read it (the split's rows of a with a long
//     K a panel of K at a time, a and b: two panels of b packed, the next while this one is multiplied);
//     a batch of many small products goes a whole product per thread instead.
//   - a C block of 32 x 32 is 2 x 2 tiles (bf16 values: held in the tiles over the whole K, the next
//     steps' tiles prefetched, or over K blocks of 256 with a's block in L1; split values: over the whole K,
//     or a panel's); the block's store applies MatmulParams' epilogue in AVX-512
//     (accumulate or residual, bias, ReLU, one rounding into c's dtype; an f32 C with none of them is
//     stored from the tiles).
//   - the tile configuration is loaded once per thread per call and released at its end.
// The tile unit treats bf16 input subnormals (below 2^-126) as zero and flushes f32 subnormal sums: f16
// values and their hi/lo parts are never that small. Not a_row_sums, not f64, not f32 values unrounded.
#pragma once

#include <string>

#include "demi/kernels/matmul_params.h"

namespace demi::kernels::cpu {

// Whether amx_gemm takes p here: the CPU level is amx (core/cpu.h) and p is a product of bf16 or f16
// values (a_product_dtype and b_product_dtype), no a_row_sums, c f32|bf16|f16. Any CPU may ask.
bool amx_gemm_supported(const MatmulParams& p);
// Whether p runs as the exact f16 split (four products per step) rather than on bf16 values as they are.
bool amx_gemm_splits(const MatmulParams& p);
// c = p's product (its whole contract, ../matmul_params.h) on the tile unit; amx_gemm_supported(p) holds.
void amx_gemm(const MatmulParams& p, const void* a, const void* b, void* c);
// "demi-amx:bf16" or "demi-amx:f16-split", for diagnostics.
std::string amx_gemm_implementation(const MatmulParams& p);

}  // namespace demi::kernels::cpu
