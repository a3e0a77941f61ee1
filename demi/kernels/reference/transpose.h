// Axis permutation (transpose) and strided block copies (split / concatenate), reference twins. Data moves
// as opaque elements of elem_size bytes (1, 2, 4 or 8): no dtype conversion, so one kernel serves every
// dtype. Kept forever as the oracle for demi/kernels/cpu/transpose.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace demi::kernels::ref {

// x (d_0, ..., d_{r-1}) -> y (d_perm[0], ..., d_perm[r-1]): y's axis j is x's axis perm[j], so
// y[i_0, ..., i_{r-1}] = x[k] with k's coordinate on axis perm[j] equal to i_j. perm is a permutation of 0..r-1.
void permute(const void* x, size_t elem_size, std::span<const int64_t> shape, std::span<const int> perm, void* y);

// `rows` runs of `run` elements: dst + r * dst_stride <- src + r * src_stride (strides in elements).
void copy_strided(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows, int64_t run,
                  size_t elem_size);

}  // namespace demi::kernels::ref
