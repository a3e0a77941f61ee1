// The per-ISA 2x2 / stride-2 pooling kernels behind demi/kernels/cpu/pool.h (the window models A and B
// use), for geometries where every window lies inside x: 2 OH <= H and 2 OW <= W, no padding reached
// (pool.cc sends the others, e.g. "same" padding on odd sizes, to the reference loops). Output (oy, ox)
// reads rows 2 oy, 2 oy + 1 and columns 2 ox, 2 ox + 1; an odd H or W leaves a last row or column that
// no window covers, whose dx pool.cc zeroes.
#pragma once

#include <cstdint>

namespace demi::kernels::cpu_internal {

struct Pool2x2Geometry {
  int64_t planes;  // N * C planes in this call
  int64_t h, w;    // input plane
  int64_t oh, ow;  // output plane: oh = h / 2, ow = w / 2 (floor)
};

struct Pool2x2Kernels {
  // x (planes, h, w) -> y (planes, oh, ow), argmax u8 (nullable); relu: y = maxpool(relu(x)) with
  // kArgmaxNone where the maximum was <= 0.
  void (*max_forward)(const Pool2x2Geometry& g, const void* x, void* y, uint8_t* argmax, bool relu);
  // dy (planes, oh, ow), argmax -> dx (planes, h, w): rows < 2 oh and columns < 2 ow only.
  void (*max_backward)(const Pool2x2Geometry& g, const void* dy, const uint8_t* argmax, void* dx);
  // x -> y = the mean of each 2x2 window.
  void (*avg_forward)(const Pool2x2Geometry& g, const void* x, void* y);
  // dy -> dx = dy / 4 on each window's 4 elements: rows < 2 oh and columns < 2 ow only.
  void (*avg_backward)(const Pool2x2Geometry& g, const void* dy, void* dx);
};

// slot: 0 f32, 1 bf16, 2 f16 (FloatSlot in activation_kernels.h).
const Pool2x2Kernels& pool2x2_kernels_scalar(int slot);  // pool.cc
const Pool2x2Kernels& pool2x2_kernels_avx2(int slot);      // pool_avx2.cc
const Pool2x2Kernels& pool2x2_kernels_avx512(int slot);    // pool_avx512.cc

}  // namespace demi::kernels::cpu_internal
