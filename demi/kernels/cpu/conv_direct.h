// Direct convolution for few input channels (a network's first layers: model A's 3 -> 32 k3, K = 27; model
// B's 1 -> 32 k3p1, K = 9), with the fused ReLU -> MaxPool2d and the weight gradient, on f32 FMAs (bf16 on
// vdpbf16ps where the CPU has AVX512-BF16, or on the tile unit where it has AMX: whichever measures fastest).
//
// Why not a GEMM: with K = C*KH*KW this small, an im2col GEMM (or oneDNN's jit kernel) does a few dozen
// multiply-adds per output and then stores it; the layer is bound by moving its full-size output, which the
// fused op then re-reads to pool and, in backward, re-writes as a mostly-zero gradient. Here
//   forward           one output row of up to 32 columns x 12 output channels stays in 24 zmm accumulators
//                     over all K taps, read straight from a zero-padded f32 copy of the image (bf16 and f16
//                     converted while padding: products exact, f32 sums; bf16 x and w on AVX512-BF16: taps in
//                     pairs by vdpbf16ps); the fused op pools each image's output while it is hot in L2
//                     (cpu/pool.h) and never writes it out.
//   backward-weights  dW[oc, k] = sum_n sum_p dz[n, oc, p] * col[n, k, p]: dense dot products of dz rows and the
//                     image's columns in 4 x 6 register tiles, each (oc, k) summing its positions in one fixed
//                     order (16 lanes, then the lanes); the fused op rebuilds each image's dz from the pool's
//                     winners (max_pool2d_backward of dy and argmax) while it is hot, so it and the separate call
//                     give the same bits. (Lists of the nonzero dz, three in four being zero after ReLU -> 2x2
//                     MaxPool, came first and were slower than the dense tiles.)
// On the tile unit (AMX) the weight gradient of bf16 values takes the tiles' products; of f16 values (image
// and dz f16), each split into bf16 hi + lo and each product taken as four tile products, exactly
// (conv_direct_amx.cc), where that measures faster than the f32 FMAs.
// Threads take images (each its own partial sums for the weight gradient, added in thread order).
//
// Serves: groups 1, stride 1, dilation 1, any padding, K <= kDirectMaxK, f32|bf16|f16 tensors. The
// kernels' variants per CPU level are in demi/core/kernel_registry.h (`demi info` prints them); the oracles
// are ../reference/conv.h and ../reference/pool.h. Whether a geometry runs here or on oneDNN is measured
// per geometry on the machine it runs on (kernels/onednn/conv.cc: direct_chosen).
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/kernels/conv_params.h"
#include "demi/kernels/pool_params.h"

namespace demi::kernels::cpu {

inline constexpr int64_t kDirectMaxK = 64;  // C * KH * KW

// Whether these kernels take p's geometry and dtypes (p.y_dtype is not looked at: every output dtype works).
bool direct_conv_supported(const Conv2dParams& p);
// How a bf16 layer of p's geometry runs its products, as measured fastest here (now if not yet; every way's
// products exact): the forward's taps (x and w bf16) and, with a bf16 p.y_dtype (dz), the weight gradient's:
// "f32" (FMAs on widened values), "bf16 pairs" (vdpbf16ps, AVX512-BF16) or "tiles" (the tile unit, AMX).
const char* direct_conv_forward_products(const Conv2dParams& p);
const char* direct_conv_dots_products(const Conv2dParams& p);

// Tests: while in scope, the bf16 layers take their products `way` ("f32", "bf16 pairs" or "tiles"; nullptr:
// as measured) wherever the CPU level has that way's kernels (else as measured), instead of the measured
// choice.
class ScopedDirectConvProducts {
 public:
  explicit ScopedDirectConvProducts(const char* way);
  ~ScopedDirectConvProducts();
  ScopedDirectConvProducts(const ScopedDirectConvProducts&) = delete;
  ScopedDirectConvProducts& operator=(const ScopedDirectConvProducts&) = delete;

 private:
  int saved_;
};

// x (N, C, H, W), w (OC, C, KH, KW), bias (OC) or nullptr -> y (N, OC, OH, OW) y_dtype = act(conv(x, w) + bias)
void direct_conv2d_forward(const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y);

// y = max_pool2d(relu(conv(x, w) + bias)) in y_dtype (f32|bf16|f16, rounded once) with argmax (nullable)
// as cpu::relu_max_pool2d_forward writes it; pool: windows that neither overlap nor reach padding.
void direct_conv2d_relu_max_pool2d_forward(const Conv2dParams& p, const Pool2dParams& pool, const void* x,
                                           const void* w, const void* bias, DType y_dtype, void* y, uint8_t* argmax);

// x, dy (N, OC, OH, OW) in p.y_dtype -> dw (OC, C, KH, KW) p.w_dtype and, unless db is nullptr, db (OC)
// p.bias_dtype (both += with p.accumulate).
void direct_conv2d_backward_weights(const Conv2dParams& p, const void* x, const void* dy, void* dw, void* db);

// The same with dz = the gradient of relu -> max_pool2d: dy (N, OC, PH, PW) NCHW in dy_dtype and the forward's
// argmax; dw in dw_dtype, db (nullable) in db_dtype, overwritten. Bit for bit direct_conv2d_backward_weights
// of max_pool2d_backward(dy, argmax).
void direct_conv2d_relu_max_pool2d_backward_weights(const Conv2dParams& p, const Pool2dParams& pool, const void* x,
                                                    DType dy_dtype, const void* dy, const uint8_t* argmax, void* dw,
                                                    DType dw_dtype, void* db, DType db_dtype);

}  // namespace demi::kernels::cpu
