// Pointwise activations (ReLU, Sigmoid, Tanh, GELU exact and tanh-approximated, SiLU) forward and
// backward, reference twins: one scalar loop each with the <cmath> functions, obviously right; kept
// forever as the oracle for the fast kernels in demi/kernels/cpu/activation.h and as the f64 path.
//
// Formulas (backward uses what is cheapest to keep, see activation_saved()):
//   relu(x)      = x < 0 ? 0 : x  (NaN and -0 pass through)       drelu   = dy * (y > 0)          [from y]
//   sigmoid(x)   = 1 / (1 + e^-x)                                  dsigm   = dy * y * (1 - y)      [from y]
//   tanh(x)                                                        dtanh   = dy * (1 - y^2)        [from y]
//   gelu(x)      = x * Phi(x) = x/2 * erfc(-x / sqrt 2)            dgelu   = dy * (Phi(x) + x * phi(x))  [from x]
//   gelu_tanh(x) = x/2 * (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)  (evaluated in
//                  the sigmoid form: 1 + tanh u rounds to 0 below x = -5 where x sigmoid(2u) does not)
//                  dgelu_tanh = dy * (s + 2 x s (1 - s) u'), s = sigmoid(2u), u' = sqrt(2/pi)(1 + 3 * 0.044715 x^2)
//   silu(x)      = x * sigmoid(x)                                  dsilu   = dy * s * (1 + x (1 - s)) [from x]
// Arithmetic is in AccT<T> (f32 for f32/bf16/f16, f64 for f64), rounded once on store.
#pragma once

#include <cstdint>
#include <string_view>

#include "demi/core/dtype.h"
#include "demi/kernels/reference/acc.h"

namespace demi::kernels {

enum class Activation : uint8_t { kReLU, kSigmoid, kTanh, kGelu, kGeluTanh, kSiLU, kLast = kSiLU };
// Derived from the enum: the kernel tables are sized by it, and the static_asserts where kernels and tests
// are listed fail to compile until a new activation has both.
inline constexpr int kNumActivations = static_cast<int>(Activation::kLast) + 1;

// What the backward of an activation reads besides dy: its input x or its output y.
enum class ActivationSaved : uint8_t { kInput, kOutput };
ActivationSaved activation_saved(Activation a);
std::string_view activation_name(Activation a);  // "relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu"

}  // namespace demi::kernels

namespace demi::kernels::ref {

// x (n) -> y (n); T = float|double|Half|BFloat16; y may alias x
template <typename T>
void activation_forward(Activation a, const T* x, T* y, int64_t n);

// saved (n) = x or y as activation_saved(a) says, dy (n) -> dx (n); dx may alias dy
template <typename T>
void activation_backward(Activation a, const T* saved, const T* dy, T* dx, int64_t n);

// The same, for data of run-time dtype (f32, f64, bf16, f16).
void activation_forward(Activation a, DType dtype, const void* x, void* y, int64_t n);
void activation_backward(Activation a, DType dtype, const void* saved, const void* dy, void* dx, int64_t n);

// ReLU's mask kept as bits, one per element (relu_mask_bytes(n) = (n + 7) / 8 bytes): bit i % 8 of
// bits[i / 8] is y[i] > 0 (0 for NaN and -0; the last byte's unused bits 0). Its backward keeps dy where
// the bit is set: dx[i] = bit ? dy[i] : +0 (so a non-finite dy where the unit is off gives 0, as the fast
// kernels' ReLU backward from y does). dx may alias dy. f32|f64|bf16|f16.
int64_t relu_mask_bytes(int64_t n);
void relu_mask(DType dtype, const void* y, uint8_t* bits, int64_t n);
void relu_backward_mask(DType dtype, const uint8_t* bits, const void* dy, void* dx, int64_t n);

}  // namespace demi::kernels::ref
