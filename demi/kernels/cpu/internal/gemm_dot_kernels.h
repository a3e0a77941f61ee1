// The per-ISA piece of the few-column dot-product GEMM (../gemm_dot.h): one tile of MR (1 or 2) rows x NC
// (1..kDotTileN) columns, f32 b, dot products over K in 16-lane vectors; a f32, or f16|bf16 widened as it is
// loaded (exact: every f16 and bf16 value is an f32).
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/half.h"

namespace demi::kernels::cpu_internal {

inline constexpr int kDotTileN = 12;  // columns per tile (2 rows x 12 = 24 accumulators)

struct GemmDotKernels {
  const char* name = nullptr;
  // out[r * nc + j] = sum_k a[r * lda + k] * b[j * ldb + k] for r < mr (1|2), j < nc (1..kDotTileN): each sum in
  // the kernel's fixed order (16 lanes over k, then the lanes). With `lanes` (not null), each output's 16 lane
  // sums (at lanes + (r * nc + j) * 16, lane l taking k = l, l + 16, ...) start from there unless `first`,
  // and are left there where out is null instead of being added up: a long K taken in chunks (multiples of 16
  // but the last) gives the bits of one pass.
  void (*tile)(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, int mr, int nc, float* lanes,
               bool first, float* out) = nullptr;
  // The same with a stored as a_dtype (f16|bf16), widened in registers: no f32 copy of a's rows. Null where
  // the variant has none (the caller converts a's rows first).
  void (*tile_low_a)(const void* a, DType a_dtype, int64_t lda, const float* b, int64_t ldb, int64_t k, int mr,
                     int nc, float* lanes, bool first, float* out) = nullptr;
};

// A variant's table from its tile template, Tiles::of(a, lda, b, ldb, k, mr, nc, lanes, first, out) for a of float, Half and
// BFloat16: `tile` takes an f32 a, `tile_low_a` the others. Instantiated in the variant's own file (with its
// ISA flags) on a type of that file's anonymous namespace, so no other file shares the instantiations.
template <class Tiles>
GemmDotKernels dot_kernels_of(const char* name) {
  GemmDotKernels t;
  t.name = name;
  t.tile = [](const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, int mr, int nc, float* lanes,
              bool first, float* out) { Tiles::of(a, lda, b, ldb, k, mr, nc, lanes, first, out); };
  t.tile_low_a = [](const void* a, DType a_dtype, int64_t lda, const float* b, int64_t ldb, int64_t k, int mr, int nc,
                    float* lanes, bool first, float* out) {
    if (a_dtype == DType::kF16)
      Tiles::of(static_cast<const Half*>(a), lda, b, ldb, k, mr, nc, lanes, first, out);
    else
      Tiles::of(static_cast<const BFloat16*>(a), lda, b, ldb, k, mr, nc, lanes, first, out);
  };
  return t;
}

const GemmDotKernels& gemm_dot_kernels_scalar();
const GemmDotKernels& gemm_dot_kernels_avx2();
const GemmDotKernels& gemm_dot_kernels_avx512();

}  // namespace demi::kernels::cpu_internal
