// The activation kernels, written once against the vector interface of the vec_*.h traits: activation.cc
// instantiates VecScalar, the vector variants are instantiated per ISA from the registry
// (cmake/demi_kernel_variants.cmake). Compute is f32: loads widen bf16/f16 exactly, stores round to
// nearest even.
//
// The transcendental functions for vectors wider than one lane are polynomial, accurate to a few f32
// ulps (activation_test.cc sweeps them densely against the <cmath> functions):
//   exp  — V::exp (Cephes' expf polynomial, about 1 ulp);
//   tanh — Cephes' tanhf: an odd polynomial below |x| = 0.625, 1 - 2 / (e^2|x| + 1) above;
//   Phi  — the standard normal CDF for GELU, Phi(x) = erfc(-x / sqrt 2) / 2, computed without the
//          cancellation of 1 + erf for negative x: erf(z) = z P(z^2) (Cephes' erff) for -0.25 <= z <= 1,
//          erfc(|z|) = e^-z^2 g(|z|) elsewhere, g two degree-8 fits on [0.25, 1) and [1, 2) and Cephes'
//          erfcf form 1/z R(1/z^2) from 2 on; e^-z^2 = e^(-x^2/2) is corrected for the rounding of x^2
//          (an FMA residual).
// Where a derivative needs 1 - sigmoid, it is e^-x sigmoid(x) (no cancellation near 1).
// The one-lane (portable) instantiation calls the <cmath> functions instead (in f64 where an f32
// argument would lose digits: erfc(-x / sqrt 2), e^(-x^2 / 2) and GELU-tanh's u).
//
// Included only by activation.cc and the generated variants; everything here depends on V, so each ISA's
// instantiations have names of their own.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "demi/core/half.h"
#include "demi/kernels/cpu/internal/activation_kernels.h"

namespace demi::kernels::cpu_internal {

template <class V>
struct ActMath {
  using F = typename V::F;

  static constexpr float kInvSqrt2 = 0.707106781186547524f;
  static constexpr float kInvSqrt2Pi = 0.398942280401432678f;
  static constexpr float kSqrt2OverPi = 0.797884560802865356f;
  static constexpr float kGeluCoef = 0.044715f;

  static F c(float v) { return V::set1(v); }

  // c[0] x^n + ... + c[n], Horner with FMA.
  template <int N>
  static F poly(F x, const float (&coef)[N]) {
    F y = c(coef[0]);
    for (int i = 1; i < N; ++i) y = V::fmadd(y, x, c(coef[i]));
    return y;
  }

  static F sigmoid(F x) { return V::div(c(1.0f), V::add(c(1.0f), V::exp(V::neg(x)))); }

  // sigmoid(x) and 1 - sigmoid(x) = e^-x sigmoid(x), the latter without 1 - s's cancellation for large x.
  static void sigmoid_and_complement(F x, F& s, F& one_minus_s) {
    F e = V::exp(V::neg(x));
    s = V::div(c(1.0f), V::add(c(1.0f), e));
    one_minus_s = V::mul(e, s);
  }

  static F tanh(F x) {
    if constexpr (V::kWidth == 1) {
      return std::tanh(x);
    } else {
      static constexpr float kP[] = {-5.70498872745e-3f, 2.06390887954e-2f, -5.37397155531e-2f, 1.33314422036e-1f,
                                     -3.33332819422e-1f};
      F ax = V::abs(x);
      F z = V::mul(x, x);
      F small = V::fmadd(V::mul(poly(z, kP), z), x, x);
      F e = V::exp(V::add(ax, ax));
      F big = V::sub(c(1.0f), V::div(c(2.0f), V::add(e, c(1.0f))));
      big = V::select(V::gt(V::zero(), x), big, V::neg(big));
      return V::select(V::gt(ax, c(0.625f)), small, big);  // NaN: the small branch, which keeps it
    }
  }

  // The standard normal CDF Phi(x) = erfc(-x / sqrt 2) / 2.
  static F phi(F x) {
    if constexpr (V::kWidth == 1) {
      return static_cast<float>(0.5 * std::erfc(-static_cast<double>(x) * 0.7071067811865475244));
    } else {
      static constexpr float kErf[] = {7.853861353153693e-5f,  -8.010193625184903e-4f, 5.188327685732524e-3f,
                                       -2.685381193529856e-2f, 1.128358514861418e-1f,  -3.761262582423300e-1f,
                                       1.128379165726710e+0f};
      // erfc(z) e^(z^2) on [0.25, 1), in powers of z - 0.625, and on [1, 2), in powers of z - 1.5.
      static constexpr float kLow[] = {3.967835568e-03f,  -9.597859345e-03f, 2.080472186e-02f,
                                       -4.484621808e-02f, 9.053537995e-02f,  -1.688316911e-01f,
                                       2.865877450e-01f,  -4.323617816e-01f, 5.568138957e-01f};
      static constexpr float kMid[] = {2.366185363e-04f,  -7.043126388e-04f, 1.883612829e-03f,
                                       -5.137920380e-03f, 1.337751653e-02f,  -3.293146566e-02f,
                                       7.615103573e-02f,  -1.636229008e-01f, 3.215854168e-01f};
      // erfc(z) e^(z^2) z on [2, inf), in powers of 1 / z^2.
      static constexpr float kTail[] = {-1.047766399936249e+1f, 1.297719955372516e+1f,  -7.495518717768503e+0f,
                                        2.921019019210786e+0f,  -1.015265279202700e+0f, 4.218463358204948e-1f,
                                        -2.820767439740514e-1f, 5.641895067754075e-1f};
      F z = V::mul(x, c(kInvSqrt2));
      // 1/2 + erf(z)/2 loses bits to cancellation for negative z (6x at z = -1): from z = -0.25 down,
      // and from z = 1 up, Phi comes from erfc(|z|) instead.
      auto use_erfc = V::mask_or(V::gt(c(-0.25f), z), V::gt(z, c(1.0f)));  // false for NaN: erf keeps it
      F result = V::fmadd(c(0.5f), V::mul(z, poly(V::mul(z, z), kErf)), c(0.5f));
      if (V::any(use_erfc)) {
        F a = V::min(V::abs(z), c(10.0f));  // erfc(10) = 2e-45: beyond, the result is 0 (or 1) anyway
        F low = poly(V::sub(a, c(0.625f)), kLow);
        F mid = poly(V::sub(a, c(1.5f)), kMid);
        F q = V::div(c(1.0f), a);
        F tail = V::mul(q, poly(V::mul(q, q), kTail));
        F g = V::select(V::gt(a, c(2.0f)), V::select(V::gt(c(1.0f), a), mid, low), tail);
        F half_erfc = V::mul(c(0.5f), V::mul(exp_minus_half_square(x), g));
        F pos = V::sub(c(1.0f), half_erfc);
        result = V::select(use_erfc, result, V::select(V::gt(z, V::zero()), half_erfc, pos));
      }
      return result;
    }
  }

  // e^(-x^2 / 2), with x^2 / 2 taken exactly (its rounding residual from an FMA, applied to first order):
  // rounding x^2 alone would cost |x^2 / 2| * 2^-24 relative, 50 ulps at x = 10.
  static F exp_minus_half_square(F x) {
    F a = V::min(V::abs(x), c(14.5f));  // e^-105 is 0 in f32; and inf^2 - inf^2 would be NaN
    F sq = V::mul(a, a);
    F residual = V::mul(c(0.5f), V::fmadd(a, a, V::neg(sq)));  // (a^2 - sq) / 2, exactly
    F e = V::exp(V::mul(c(-0.5f), sq));
    return V::fmadd(V::neg(e), residual, e);
  }

  // The standard normal density phi(x) = e^(-x^2 / 2) / sqrt(2 pi).
  static F pdf(F x) {
    if constexpr (V::kWidth == 1)
      return static_cast<float>(0.3989422804014326779 * std::exp(-0.5 * static_cast<double>(x) * x));
    else
      return V::mul(c(kInvSqrt2Pi), exp_minus_half_square(x));
  }

  // 2u for GELU's tanh form, u = sqrt(2/pi) (x + 0.044715 x^3).
  static F gelu_tanh_2u(F x) {
    if constexpr (V::kWidth == 1) {
      double xd = x;
      return static_cast<float>(2 * 0.7978845608028654 * xd * (1 + 0.044715 * xd * xd));
    } else {
      F x2 = V::mul(x, x);
      return V::mul(V::mul(c(2.0f * kSqrt2OverPi), x), V::fmadd(c(kGeluCoef), x2, c(1.0f)));
    }
  }

  template <Activation A>
  static F forward(F x) {
    if constexpr (A == Activation::kReLU) {
      return V::max(V::zero(), x);  // 0 > x ? 0 : x: NaN and -0 pass through, as the reference
    } else if constexpr (A == Activation::kSigmoid) {
      return sigmoid(x);
    } else if constexpr (A == Activation::kTanh) {
      return tanh(x);
    } else if constexpr (A == Activation::kGelu) {
      return V::mul(x, phi(x));
    } else if constexpr (A == Activation::kGeluTanh) {
      // x (1 + tanh u) / 2 = x sigmoid(2u): the same function, without 1 + tanh's cancellation.
      return V::mul(x, sigmoid(gelu_tanh_2u(x)));
    } else {
      return V::mul(x, sigmoid(x));
    }
  }

  // dy * activation'(.) with s the saved tensor (activation_saved(A)).
  template <Activation A>
  static F backward(F s, F dy) {
    if constexpr (A == Activation::kReLU) {
      return V::select(V::gt(s, V::zero()), V::zero(), dy);
    } else if constexpr (A == Activation::kSigmoid) {
      return V::mul(dy, V::mul(s, V::sub(c(1.0f), s)));
    } else if constexpr (A == Activation::kTanh) {
      return V::mul(dy, V::sub(c(1.0f), V::mul(s, s)));
    } else if constexpr (A == Activation::kGelu) {
      return V::mul(dy, V::fmadd(s, pdf(s), phi(s)));
    } else if constexpr (A == Activation::kGeluTanh) {
      // d/dx [x sg(2u)] = sg + 2 x sg (1 - sg) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
      F sg, one_minus;
      sigmoid_and_complement(gelu_tanh_2u(s), sg, one_minus);
      F du = V::mul(c(kSqrt2OverPi), V::fmadd(c(3.0f * kGeluCoef), V::mul(s, s), c(1.0f)));
      F t = V::mul(V::mul(V::add(s, s), V::mul(sg, one_minus)), du);
      return V::mul(dy, V::add(sg, t));
    } else {
      F sg, one_minus;
      sigmoid_and_complement(s, sg, one_minus);
      return V::mul(dy, V::mul(sg, V::fmadd(s, one_minus, c(1.0f))));
    }
  }
};

template <class V, Activation A, typename T>
void activation_forward_kernel(const void* xv, void* yv, int64_t n) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  int64_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) V::store(y + i, ActMath<V>::template forward<A>(V::load(x + i)));
  if (i < n) V::store_n(y + i, ActMath<V>::template forward<A>(V::load_n(x + i, n - i)), n - i);
}

template <class V, Activation A, typename T>
void activation_backward_kernel(const void* sv, const void* dyv, void* dxv, int64_t n) {
  const T* s = static_cast<const T*>(sv);
  const T* dy = static_cast<const T*>(dyv);
  T* dx = static_cast<T*>(dxv);
  int64_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth)
    V::store(dx + i, ActMath<V>::template backward<A>(V::load(s + i), V::load(dy + i)));
  if (i < n) {
    int64_t r = n - i;
    V::store_n(dx + i, ActMath<V>::template backward<A>(V::load_n(s + i, r), V::load_n(dy + i, r)), r);
  }
}

// ReLU's mask kept as bits: groups of G elements (G / 8 whole bytes of bits, G a multiple of the vector
// width), lane i of vector v at bit v * kWidth + i of the group's little-endian word.
template <class V>
inline constexpr int kMaskGroup = V::kWidth >= 8 ? V::kWidth : 8;

template <class V, typename T>
void relu_mask_kernel(const void* yv, uint8_t* bits, int64_t n) {
  if constexpr (sizeof(T) == 2 && requires(const void* y, uint8_t* b) { V::positive_bits16(y, b, n, 0); }) {
    return V::positive_bits16(yv, bits, n, std::is_same_v<T, BFloat16> ? 0x7F80 : 0x7C00);  // (+inf's bits)
  }
  constexpr int G = kMaskGroup<V>;
  const T* y = static_cast<const T*>(yv);
  for (int64_t i = 0; i < n; i += G) {
    const int64_t r = n - i < G ? n - i : G;
    uint32_t word = 0;
    for (int v = 0; v * V::kWidth < r; ++v) {
      const int64_t m = r - v * V::kWidth < V::kWidth ? r - v * V::kWidth : V::kWidth;
      const typename V::F x = m == V::kWidth ? V::load(y + i + v * V::kWidth) : V::load_n(y + i + v * V::kWidth, m);
      word |= V::mask_bits(V::gt(x, V::zero())) << (v * V::kWidth);  // (a lane past n loads 0: its bit is 0)
    }
    const uint8_t out[4] = {static_cast<uint8_t>(word), static_cast<uint8_t>(word >> 8),
                            static_cast<uint8_t>(word >> 16), static_cast<uint8_t>(word >> 24)};
    std::memcpy(bits + i / 8, out, static_cast<size_t>((r + 7) / 8));
  }
}

template <class V, typename T>
void relu_backward_mask_kernel(const uint8_t* bits, const void* dyv, void* dxv, int64_t n) {
  // (16-bit values kept or zeroed as stored where the vector type can: no widening and rounding back)
  if constexpr (sizeof(T) == 2 && requires(void* d) { V::keep_by_bits16(bits, dyv, d, n); }) {
    return V::keep_by_bits16(bits, dyv, dxv, n);
  }
  constexpr int G = kMaskGroup<V>;
  const T* dy = static_cast<const T*>(dyv);
  T* dx = static_cast<T*>(dxv);
  for (int64_t i = 0; i < n; i += G) {
    const int64_t r = n - i < G ? n - i : G;
    uint8_t in[4] = {0, 0, 0, 0};
    std::memcpy(in, bits + i / 8, static_cast<size_t>((r + 7) / 8));
    const uint32_t word = uint32_t{in[0]} | uint32_t{in[1]} << 8 | uint32_t{in[2]} << 16 | uint32_t{in[3]} << 24;
    for (int v = 0; v * V::kWidth < r; ++v) {
      const int64_t m = r - v * V::kWidth < V::kWidth ? r - v * V::kWidth : V::kWidth;
      const typename V::M keep = V::mask_from_bits(word >> (v * V::kWidth));
      T* out = dx + i + v * V::kWidth;
      if (m == V::kWidth)
        V::store(out, V::select(keep, V::zero(), V::load(dy + i + v * V::kWidth)));
      else
        V::store_n(out, V::select(keep, V::zero(), V::load_n(dy + i + v * V::kWidth, m)), m);
    }
  }
}

template <class V, Activation A>
void fill_activation(ActivationKernels& k) {
  constexpr int a = static_cast<int>(A);
  k.forward[a][0] = &activation_forward_kernel<V, A, float>;
  k.forward[a][1] = &activation_forward_kernel<V, A, BFloat16>;
  k.forward[a][2] = &activation_forward_kernel<V, A, Half>;
  k.backward[a][0] = &activation_backward_kernel<V, A, float>;
  k.backward[a][1] = &activation_backward_kernel<V, A, BFloat16>;
  k.backward[a][2] = &activation_backward_kernel<V, A, Half>;
}

template <class V>
ActivationKernels make_activation_kernels() {
  static_assert(kNumActivations == 6, "a new activation needs its kernels here");
  ActivationKernels k{};
  fill_activation<V, Activation::kReLU>(k);
  fill_activation<V, Activation::kSigmoid>(k);
  fill_activation<V, Activation::kTanh>(k);
  fill_activation<V, Activation::kGelu>(k);
  fill_activation<V, Activation::kGeluTanh>(k);
  fill_activation<V, Activation::kSiLU>(k);
  k.relu_mask[0] = &relu_mask_kernel<V, float>;
  k.relu_mask[1] = &relu_mask_kernel<V, BFloat16>;
  k.relu_mask[2] = &relu_mask_kernel<V, Half>;
  k.relu_backward_mask[0] = &relu_backward_mask_kernel<V, float>;
  k.relu_backward_mask[1] = &relu_backward_mask_kernel<V, BFloat16>;
  k.relu_backward_mask[2] = &relu_backward_mask_kernel<V, Half>;
  return k;
}

}  // namespace demi::kernels::cpu_internal
