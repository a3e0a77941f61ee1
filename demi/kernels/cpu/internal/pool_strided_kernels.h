// The AVX-512 bodies behind pool.h's strided (fused Conv2d -> ReLU -> MaxPool2d) kernels, for layouts
// whose channels are contiguous in blocks of a multiple of 16 (NHWC, nChw16c): rows [r0, r1) of the
// output, r = n OH + oy. Defined in pool_strided_avx512.cc.
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/kernels/cpu/pool.h"

namespace demi::kernels::cpu_internal {

void relu_max_pool_strided_rows_avx512(const Pool2dParams& p, DType x_dtype, const void* x,
                                       const StridedLayout4& xl, DType y_dtype, void* y, uint8_t* argmax,
                                       int64_t r0, int64_t r1);

// tiles: the windows cover dx exactly (no gaps, tails or padding), so every position is written (0 where
// not selected); otherwise only selected positions are, into a zeroed dx.
void max_pool_backward_strided_rows_avx512(const Pool2dParams& p, DType dy_dtype, const void* dy,
                                           const uint8_t* argmax, DType dx_dtype, void* dx,
                                           const StridedLayout4& dxl, bool tiles, int64_t r0, int64_t r1);

// A level's bodies for channel-contiguous layouts (null: none; the portable loops in pool_strided.cc run).
struct PoolStridedKernels {
  decltype(&relu_max_pool_strided_rows_avx512) relu_max_pool_rows = nullptr;
  decltype(&max_pool_backward_strided_rows_avx512) max_pool_backward_rows = nullptr;
};
const PoolStridedKernels& pool_strided_kernels_scalar();  // pool_strided.cc: none
const PoolStridedKernels& pool_strided_kernels_avx512();  // pool_strided_avx512.cc

}  // namespace demi::kernels::cpu_internal
