// 2-D convolution through oneDNN: forward (bias and ReLU fused), backward-data and backward-weights (bias
// gradient fused), with stride, explicit asymmetric padding, dilation and groups. Geometry, dtypes and
// semantics are Conv2dParams' (../conv_params.h, which also resolves MindSpore's pad_mode); the oracles
// are in ../reference/conv.h.
//
// Tensors are plain NCHW at the interface. Inside, oneDNN's blocked layouts are much faster than its
// gemm-based NCHW path on most shapes even counting the reorders in and out (measured, see conv.cc), so
// ConvLayout::kAuto reorders within the call except where NCHW measured faster. f32 and mixed inputs run
// in f32; f16 is converted to f32 in tracked workspace (oneDNN 2.6 has no f16 kernels here) and back;
// bf16 x bf16 runs oneDNN's bf16 kernels (AMX or AVX512-BF16, f32 accumulation) or its f32 kernels on
// operands widened within the call, whichever measured faster for that call's shape on this machine
// (ConvBf16Policy below); f64 runs the reference. Every call runs its batch in chunks of images sized so
// that the reorders' and conversions' copies stay within a few MiB of workspace whatever the batch
// (conv.cc: kChunkBytes). Primitives and their reorders are created once per geometry, dtypes and flags,
// and cached.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "demi/kernels/conv_params.h"
#include "demi/kernels/pool_params.h"

namespace demi::kernels::onednn {

// x (N, C, H, W) x_dtype, w (OC, C/groups, KH, KW) w_dtype, bias (OC) bias_dtype or nullptr
//   -> y (N, OC, OH, OW) y_dtype = act(conv(x, w) + bias)           (p.accumulate is ignored)
void conv2d_forward(const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y);

// dy (N, OC, OH, OW) y_dtype, w (OC, C/groups, KH, KW) w_dtype -> dx (N, C, H, W) x_dtype
// (dx += ... with p.accumulate)
void conv2d_backward_data(const Conv2dParams& p, const void* dy, const void* w, void* dx);

// x (N, C, H, W) x_dtype, dy (N, OC, OH, OW) y_dtype -> dw (OC, C/groups, KH, KW) w_dtype and, unless db is
// nullptr, db (OC) bias_dtype = sums of dy over N, OH, OW (both += with p.accumulate). f32 dw from bf16 x
// and dy is AMP's master gradient, written without an extra pass when nothing is accumulated.
void conv2d_backward_weights(const Conv2dParams& p, const void* x, const void* dy, void* dw, void* db);

// ---- Conv2d -> ReLU -> MaxPool2d, fused ----
// The convolution writes its output in its own layout (nChw16c for f32, NHWC for bf16 on AMX) into
// workspace, a chunk of images at a time, and the pooling reads it there (cpu/pool.h, strided kernels): the output is never
// reordered to NCHW, nor, for f16 storage, converted — on models A and B those reorders cost as much as the
// convolutions. Backward writes the pooling's gradient straight into the layout the weight-gradient (and
// data-gradient) primitives read. The values are exactly those of conv2d_forward then
// relu_max_pool2d_forward (and their backward), since max and ReLU commute with rounding.
//
// p: the convolution with y_dtype its output's dtype (f32 or bf16: the compute dtype; p.relu false), x and
// w f32|bf16|f16 as in conv2d_forward. pool: its geometry over (N, OC, OH, OW), windows that neither
// overlap nor reach padding (strided_pool_supported). y (N, OC, PH, PW) NCHW in y_dtype (f32|bf16|f16),
// argmax (nullable) one byte per y element as relu_max_pool2d_forward writes it.
void conv2d_relu_max_pool2d_forward(const Conv2dParams& p, const Pool2dParams& pool, const void* x, const void* w,
                                    const void* bias, DType y_dtype, void* y, uint8_t* argmax);

// dy (N, OC, PH, PW) NCHW in dy_dtype and the forward's argmax -> dw (dw_dtype), db (db_dtype; nullable) and
// dx (dx_dtype, p.x_dtype unless given; nullable: the data needs none), overwritten. x and w as the forward
// read them; p.y_dtype the convolution output's dtype as its gradient has it: where it is bf16 and dy is not,
// dy is rounded to bf16 as it is unpooled (fused_dense_gradient_dtype). (An f16 layer whose products are
// rounded to bf16: bf16 x and w, p.y_dtype bf16, f16 dy and an f16 dx.) dw null: dx alone (x not read),
// the same values as the whole call's; so a caller can compute dw first (dx null), then dx into x's bytes.
void conv2d_relu_max_pool2d_backward(const Conv2dParams& p, const Pool2dParams& pool, const void* x, const void* w,
                                     DType dy_dtype, const void* dy, const uint8_t* argmax, void* dx, void* dw,
                                     DType dw_dtype, void* db, DType db_dtype,
                                     std::optional<DType> dx_dtype = std::nullopt);

// For benchmarks and diagnostics: oneDNN's implementation for a call ("brgconv:avx512_core_amx_bf16",
// "gemm:jit", ...), or "reference" for f64, for bf16 x bf16 as the policy or the measured choice for the
// geometry has it (measured now on scratch operands if not yet). Creates (and caches) the primitive.
enum class ConvDirection { kForward, kBackwardData, kBackwardWeights };

// How bf16 x bf16 calls compute: kAuto (default) measures both at a shape's first call and keeps the
// faster (in memory and in "conv-v1-<cpu>.txt" in the kernel choice folder, see
// ../internal/choice_cache.h, so every process on the machine makes the same choice); kBf16 always uses
// oneDNN's bf16 kernels; kWidenF32 always its f32 kernels on widened operands (exact products, f32 sums:
// the two differ in summation order only). DEMI_CONV_BF16=auto|bf16|f32 sets it at start-up.
enum class ConvBf16Policy { kAuto, kBf16, kWidenF32 };
void set_conv_bf16_policy(ConvBf16Policy policy);
ConvBf16Policy conv_bf16_policy();
// The choice file in use ("" = memory only); set_conv_cache_dir uses another folder from now on ("" = the
// default) and forgets the choices in memory (tests).
std::string conv_cache_path();
void set_conv_cache_dir(const std::string& dir);
// How a bf16 x bf16 convolution of p's geometry computes on this machine: "onednn-bf16 (<impl>)" or
// "onednn-f32 (<impl>)", measured now on zeroed scratch operands if the geometry has not run yet (for
// `demi info` and benchmarks). p's dtypes are ignored.
std::string conv2d_bf16_kernel(const Conv2dParams& p);
std::string conv2d_implementation(const Conv2dParams& p, ConvDirection dir, bool with_bias);

// ---- demi's direct convolution for few input channels (../cpu/conv_direct.h) ----
// The geometries it takes (a network's first layers: groups 1, stride 1, dilation 1, C*KH*KW <= 64) run
// there or on oneDNN, whichever measured faster at the geometry's first call, per direction (forward, weight
// gradient; on that call's own operands; oneDNN, which takes a chunk of activations in workspace, has to be
// 10% faster), kept per geometry and input dtype in memory and in
// "conv-direct-v5-<cpu>.txt" (../internal/choice_cache.h). The separate calls and the fused Conv2d -> ReLU ->
// MaxPool2d follow the same choices (the fused layer stays bit for bit the separate calls); the data gradient
// is oneDNN's. DEMI_CONV_DIRECT=auto|on|off sets the policy at start-up (on: every geometry it takes).
enum class ConvDirectPolicy { kAuto, kOn, kOff };
void set_conv_direct_policy(ConvDirectPolicy policy);
ConvDirectPolicy conv_direct_policy();
std::string conv_direct_cache_path();
void set_conv_direct_cache_dir(const std::string& dir);
// "demi-direct" or "onednn" for p's geometry and x_dtype in direction dir as a conv layer runs it ("onednn (not
// a direct geometry)" where the direct kernels do not take it), measured now on zeroed scratch operands if not
// yet (both directions' speeds do not depend on the values). For `demi info` and benchmarks.
std::string conv2d_direct_kernel(const Conv2dParams& p, ConvDirection dir);

// ---- demi's indirect convolution (../cpu/conv.h): forward, stride-1 data gradient, weight gradient ----
// The forward (plain, and fused with ReLU -> MaxPool2d) of a geometry the direct kernels do not take (or
// lost) runs as demi's indirect product (cpu::conv2d_indirect_supported: groups 1, the packed weights and a
// padded image within bounds) or on oneDNN, whichever measured faster at the geometry's first forward, on
// that call's operands (oneDNN, which holds a chunk of activations in workspace, has to be 10% faster);
// kept per geometry and input dtype in memory and in "conv-gemm-v5-<cpu>.txt". The data gradient of a
// stride-1 geometry (cpu::conv2d_backward_data_indirect_supported) is chosen the same way, per dy's dtype,
// and the weight gradient (cpu::conv2d_backward_weights_indirect_supported) per x's and dy's dtypes, after
// the direct kernels' choice. The fused layer follows these choices and computes what the separate calls
// compute: demi's convolution a chunk of images at a time into the compute dtype, pooled from it; demi's
// gradients from the pool's gradient in the compute dtype (demi's data gradient alone: the fused
// primitive then makes the weight gradient only).
// DEMI_CONV_GEMM=auto|on|off sets the policy at start-up.
enum class ConvGemmPolicy { kAuto, kOn, kOff };
void set_conv_gemm_policy(ConvGemmPolicy policy);
ConvGemmPolicy conv_gemm_policy();
std::string conv_gemm_cache_path();
void set_conv_gemm_cache_dir(const std::string& dir);
// The forward's kernel for p's geometry and x_dtype as a conv layer runs it: "demi-direct", "demi-gemm",
// "demi-gemm (tiles)" (on the tile unit: cpu::conv2d_forward_on_tiles), "onednn" or "onednn (not an indirect
// geometry)", measured now on zeroed scratch operands if not yet. For `demi info` and benchmarks.
std::string conv2d_forward_kernel(const Conv2dParams& p);

// How a measured choice between demi's kernel and oneDNN's is decided (the direct and the indirect
// choices): each best time priced by the workspace it holds beyond the other's, as a share of the call's
// footprint (kernels/internal/choice_cache.h's priced_seconds: 1% of time for 1% of memory), oneDNN's with
// a 10% margin besides (it holds workspace by design, demi's kernels little); demi's where it is no dearer.
bool demi_kernel_preferred(double demi_seconds, double onednn_seconds, int64_t demi_workspace,
                           int64_t onednn_workspace, int64_t footprint);

}  // namespace demi::kernels::onednn
