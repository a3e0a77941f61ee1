// Axis permutation (transpose) and strided block copies (split / concatenate), fast. Elements are opaque
// blocks of elem_size bytes (1, 2, 4 or 8), so every dtype shares one kernel and nothing is converted.
// The permutation first merges axes that stay neighbours in the same order and drops size-1 axes; when
// the innermost axis stays innermost (attention's head split (B, S, H, Dh) -> (B, H, S, Dh), whose runs are
// Dh elements long) each run is one memcpy, otherwise elements move one by one. Output positions are split
// across threads. Oracle: demi/kernels/reference/transpose.h, which states the contract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "demi/kernels/reference/transpose.h"

namespace demi::kernels {

// x (d_0, ..., d_{r-1}) -> y (d_perm[0], ..., d_perm[r-1]); perm a permutation of 0..r-1 (else demi::Error)
void permute(const void* x, size_t elem_size, std::span<const int64_t> shape, std::span<const int> perm, void* y);

// `rows` runs of `run` elements: dst + r * dst_stride <- src + r * src_stride (strides in elements)
void copy_strided(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows, int64_t run,
                  size_t elem_size);

}  // namespace demi::kernels
