// The pieces of demi's packing GEMM (../gemm.h) that differ per ISA: the register-blocked micro-kernels
// with their fused store (the epilogue) and the packing routines that convert on the way in. The blocking,
// threading and epilogue bookkeeping are portable and live in ../gemm.cc.
//
// Layouts (MR x NR is the micro-kernel's register tile):
//   f32 path:  a micro-panel is read in place through strides: a(r, k) = a[r * rs + k * cs] (a plain f32 a,
//              a transposed f32 a, or a block converted to f32 rows or columns); b is packed as panels of
//              NR columns, [k][NR] f32, zero beyond the last column.
//   bf16 path: (vdpbf16ps, AVX512-BF16 only) a(r, k..k+1) is the 32-bit pair at a + r * rs + (k / 2) * cs
//              (elements of 16 bits; an odd last k is read alone, its partner taken as +0); b is packed
//              as [k / 2][NR][2] bf16 ("VNNI-2"), zero beyond the last column and for the odd last k.
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/half.h"

namespace demi::kernels::cpu_internal {

// Where one micro-kernel call's tile goes and what its store does, in this order:
//   v = acc (+ c if load_c) (+ bias) (max(v, 0) if relu), rounded once into c's dtype.
// With `src` set, load_c reads the tile's previous values from src (c's layout, ldc and dtype) instead of c:
// a residual added in the store (MatmulParams::residual).
// A transposed tile (the driver computed c^T = op(b)^T op(a)^T, packing the smaller operand) stores its
// element (r, j) at c[j * ldc + r]. The bias runs along the tile's columns (bias[j]) or, with bias_rows,
// down its rows (bias[r]): a swapped product's column bias, or a convolution's per-channel one.
struct GemmTile {
  void* c = nullptr;       // the tile's (0, 0)
  int64_t ldc = 0;         // c's row stride, in elements
  DType c_dtype = DType::kF32;
  int m = 0, n = 0;        // valid rows (1..MR) and columns (1..NR); the rest of the tile is dropped
  bool load_c = false;     // accumulate onto c (beta = 1, or a later K block)
  const void* src = nullptr;  // with load_c: where the values added are read (the tile's (0, 0)); null: c
  const float* bias = nullptr;  // the tile's bias values (n of them, or m with bias_rows), or nullptr
  bool bias_rows = false;
  bool relu = false;
  bool transposed = false;
};

// Where a tile's load_c reads: src, or c itself.
inline const void* load_source(const GemmTile& t) { return t.src != nullptr ? t.src : t.c; }

struct GemmKernels {
  const char* name = nullptr;  // "avx512", ... (for diagnostics)
  int mr = 0, nr = 0;

  // tile = a(0:MR, 0:kc) . b(0:kc, 0:NR) with a read through (rs, cs); rows >= t.m are not read.
  void (*f32)(int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b, const GemmTile& t) = nullptr;
  // The epilogue alone, for a swapped product: the t.m x t.n matrix whose element (r, j) is src[j * sld + r]
  // (f32 sums of tiles stored as they are, c^T) stored as the micro-kernels store a tile (t.transposed
  // false; t.m and t.n any size), transposed in registers 16 x 16 at a time. nullptr where a variant has
  // none: its tiles store themselves transposed.
  void (*store_f32_transposed)(const float* src, int64_t sld, const GemmTile& t) = nullptr;
  // The same product with a read indirectly (a convolution's image, never copied into a column matrix):
  // a(r, k) = base[roff[r] + koff[k]]; roff holds t.m offsets. nullptr where a variant has none.
  void (*f32_indirect)(int64_t kc, const float* base, const int64_t* roff, const int64_t* koff, const float* b,
                       const GemmTile& t) = nullptr;
  // The same read indirectly in bf16 pairs, for the vdpbf16ps kernel: a(r, 2kp .. 2kp+1) is the 32-bit pair
  // at base + roff[r] + koff[kp] (offsets in bf16 elements), b packed as VNNI-2 panels of `pairs` pairs.
  // nullptr where a variant has none.
  void (*bf16_indirect)(int64_t pairs, const BFloat16* base, const int64_t* roff, const int64_t* koff,
                        const BFloat16* b, const GemmTile& t) = nullptr;
  // Narrow forms of the two indirect kernels, for products of at most nr / 2 columns: a narrow_mr x nr / 2
  // tile (narrow_mr = 2 mr: the same accumulators), b read from the first nr / 2 columns of the usual
  // panels. The tile is f32 sums only (t.c f32, + c with load_c; no bias or ReLU). nullptr where none.
  int narrow_mr = 0;
  void (*f32_indirect_narrow)(int64_t kc, const float* base, const int64_t* roff, const int64_t* koff, const float* b,
                              const GemmTile& t) = nullptr;
  void (*bf16_indirect_narrow)(int64_t pairs, const BFloat16* base, const int64_t* roff, const int64_t* koff,
                               const BFloat16* b, const GemmTile& t) = nullptr;
  // The bf16 pair product (nullptr where the CPU has no AVX512-BF16).
  void (*bf16)(int64_t kc, const BFloat16* a, int64_t rs, int64_t cs, const BFloat16* b, const GemmTile& t) = nullptr;

  // b(k0 : k0+kc, j0 : j0+nc) of an operand stored (K, N) with row stride ld, or stored (N, K) when trans,
  // in dtype t (f32|bf16|f16) -> ceil(nc / NR) f32 panels [kc][NR], `stride` elements apart, zero beyond
  // nc. A plain b is read a row at a time across all the panels (sequential reads), a transposed one
  // 16 columns x 16 k at a time.
  void (*pack_b_f32)(const void* b, DType t, bool trans, int64_t ld, int64_t k0, int64_t kc, int64_t j0, int64_t nc,
                     float* dst, int64_t stride) = nullptr;
  // pack_b_f32 of an f32 b whose values are read rounded to f16 (MatmulParams::b_round), the rounding done
  // in registers as it packs; nullptr where a variant has none (the caller rounds the packed panel).
  void (*pack_b_f32_as_f16)(const float* b, bool trans, int64_t ld, int64_t k0, int64_t kc, int64_t j0, int64_t nc,
                            float* dst, int64_t stride) = nullptr;
  // The same into VNNI-2 bf16 panels [ceil(kc / 2)][NR][2] (bf16 b only).
  void (*pack_b_bf16)(const BFloat16* b, bool trans, int64_t ld, int64_t k0, int64_t kc, int64_t j0, int64_t nc,
                      BFloat16* dst, int64_t stride) = nullptr;
  // rows x cols of src (dtype t, row stride sld) -> f32 dst (row stride dld): the conversion that packs
  // a low-precision a (either orientation) for the f32 path.
  void (*to_f32)(const void* src, DType t, int64_t sld, int64_t rows, int64_t cols, float* dst, int64_t dld) = nullptr;
  // A transposed bf16 a, stored (K, M) with row stride ld: the block k0 : k0+kc, i0 : i0+mc -> pairs
  // [ceil(kc / 2)][mc][2] (the odd last k's partner +0), read by the bf16 kernel with rs = 2, cs = 2 * mc.
  void (*pack_a_pairs)(const BFloat16* a, int64_t ld, int64_t k0, int64_t kc, int64_t i0, int64_t mc,
                       BFloat16* dst) = nullptr;
  // n f16 values (t f16), or f32 values read as f16 (t f32), rounded to bf16 in one pass: the packing of
  // MatmulParams::bf16_products for the pair kernel. Set in every variant that sets bf16.
  void (*f16_to_bf16)(const void* src, DType t, BFloat16* dst, int64_t n) = nullptr;
};

const GemmKernels& gemm_kernels_scalar();
const GemmKernels& gemm_kernels_avx2();
const GemmKernels& gemm_kernels_avx512();
const GemmKernels& gemm_kernels_avx512bf16();
// The variant for the CPU level in force (cpu_level()): the one demi's GEMM runs.
const GemmKernels& gemm_kernels();

}  // namespace demi::kernels::cpu_internal
