#include "demi/kernels/reference/activation.h"

#include <cmath>
#include <numbers>
#include <type_traits>

#include "demi/core/error.h"
#include "demi/core/half.h"

namespace demi::kernels {

ActivationSaved activation_saved(Activation a) {
  switch (a) {
    case Activation::kReLU:
    case Activation::kSigmoid:
    case Activation::kTanh: return ActivationSaved::kOutput;
    case Activation::kGelu:
    case Activation::kGeluTanh:
    case Activation::kSiLU: return ActivationSaved::kInput;
  }
  return ActivationSaved::kInput;
}

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::kReLU: return "relu";
    case Activation::kSigmoid: return "sigmoid";
    case Activation::kTanh: return "tanh";
    case Activation::kGelu: return "gelu";
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kSiLU: return "silu";
  }
  return "?";
}

}  // namespace demi::kernels

namespace demi::kernels::ref {
namespace {

template <typename A>
struct Consts {
  static constexpr A kSqrt2OverPi = static_cast<A>(0.797884560802865355879892119868763737);  // sqrt(2/pi)
  static constexpr A kInvSqrt2 = static_cast<A>(std::numbers::sqrt2 / 2);
  static constexpr A kInvSqrt2Pi = static_cast<A>(0.398942280401432677939946059934381868);  // 1/sqrt(2 pi)
  static constexpr A kGeluCoef = static_cast<A>(0.044715);
};

template <typename A>
A sigmoid(A x) {
  return A(1) / (A(1) + std::exp(-x));
}

template <typename A>
A forward_one(Activation a, A x) {
  using C = Consts<A>;
  switch (a) {
    case Activation::kReLU: return x < 0 ? A(0) : x;
    case Activation::kSigmoid: return sigmoid(x);
    case Activation::kTanh: return std::tanh(x);
    // 1 + erf(z) = erfc(-z), without the cancellation of 1 + erf(z) for negative z.
    case Activation::kGelu: return A(0.5) * x * std::erfc(-x * C::kInvSqrt2);
    case Activation::kGeluTanh: {
      // (1 + tanh u) / 2 = sigmoid(2u): the same function, without 1 + tanh u rounding to 0 below x = -5.
      A u = C::kSqrt2OverPi * (x + C::kGeluCoef * x * x * x);
      return x * sigmoid(A(2) * u);
    }
    case Activation::kSiLU: return x * sigmoid(x);
  }
  return x;
}

// d activation / dx at the saved value (x or y, see activation_saved()).
template <typename A>
A derivative_one(Activation a, A s) {
  using C = Consts<A>;
  switch (a) {
    case Activation::kReLU: return s > 0 ? A(1) : A(0);
    case Activation::kSigmoid: return s * (A(1) - s);
    case Activation::kTanh: return A(1) - s * s;
    case Activation::kGelu: {
      A cdf = A(0.5) * std::erfc(-s * C::kInvSqrt2);
      A pdf = C::kInvSqrt2Pi * std::exp(A(-0.5) * s * s);
      return cdf + s * pdf;
    }
    case Activation::kGeluTanh: {
      // d/dx [x sg(2u)] = sg + 2 x sg (1 - sg) u'  (sg = (1 + tanh u) / 2, 1 - tanh^2 u = 4 sg (1 - sg))
      A u = C::kSqrt2OverPi * (s + C::kGeluCoef * s * s * s);
      A du = C::kSqrt2OverPi * (A(1) + A(3) * C::kGeluCoef * s * s);
      A sg = sigmoid(A(2) * u);
      return sg + A(2) * s * sg * (A(1) - sg) * du;
    }
    case Activation::kSiLU: {
      A sg = sigmoid(s);
      return sg * (A(1) + s * (A(1) - sg));
    }
  }
  return A(0);
}

}  // namespace

template <typename T>
void activation_forward(Activation a, const T* x, T* y, int64_t n) {
  using A = AccT<T>;
  for (int64_t i = 0; i < n; ++i) y[i] = T(forward_one<A>(a, static_cast<A>(x[i])));
}

template <typename T>
void activation_backward(Activation a, const T* saved, const T* dy, T* dx, int64_t n) {
  using A = AccT<T>;
  for (int64_t i = 0; i < n; ++i) dx[i] = T(static_cast<A>(dy[i]) * derivative_one<A>(a, static_cast<A>(saved[i])));
}

namespace {

void check_dtype(const char* op, Activation a, DType dtype) {
  DEMI_CHECK(dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kBF16 || dtype == DType::kF16, op, " (",
             activation_name(a), "): expected float32, float64, bfloat16 or float16 data, got ", dtype_name(dtype));
}

}  // namespace

void activation_forward(Activation a, DType dtype, const void* x, void* y, int64_t n) {
  check_dtype("activation_forward", a, dtype);
  visit_dtype(dtype, [&](auto v) {
    using T = decltype(v);
    if constexpr (!std::is_integral_v<T>) activation_forward<T>(a, static_cast<const T*>(x), static_cast<T*>(y), n);
  });
}

void activation_backward(Activation a, DType dtype, const void* saved, const void* dy, void* dx, int64_t n) {
  check_dtype("activation_backward", a, dtype);
  visit_dtype(dtype, [&](auto v) {
    using T = decltype(v);
    if constexpr (!std::is_integral_v<T>)
      activation_backward<T>(a, static_cast<const T*>(saved), static_cast<const T*>(dy), static_cast<T*>(dx), n);
  });
}

int64_t relu_mask_bytes(int64_t n) { return (n + 7) / 8; }

void relu_mask(DType dtype, const void* y, uint8_t* bits, int64_t n) {
  check_dtype("relu_mask", Activation::kReLU, dtype);
  visit_dtype(dtype, [&](auto v) {
    using T = decltype(v);
    if constexpr (!std::is_integral_v<T>) {
      const T* p = static_cast<const T*>(y);
      for (int64_t b = 0; b < relu_mask_bytes(n); ++b) bits[b] = 0;
      for (int64_t i = 0; i < n; ++i)
        if (static_cast<AccT<T>>(p[i]) > 0) bits[i / 8] = static_cast<uint8_t>(bits[i / 8] | (1u << (i % 8)));
    }
  });
}

void relu_backward_mask(DType dtype, const uint8_t* bits, const void* dy, void* dx, int64_t n) {
  check_dtype("relu_backward_mask", Activation::kReLU, dtype);
  visit_dtype(dtype, [&](auto v) {
    using T = decltype(v);
    if constexpr (!std::is_integral_v<T>) {
      const T* g = static_cast<const T*>(dy);
      T* out = static_cast<T*>(dx);
      for (int64_t i = 0; i < n; ++i) out[i] = (bits[i / 8] >> (i % 8)) & 1u ? g[i] : T(0);
    }
  });
}

template void activation_forward<float>(Activation, const float*, float*, int64_t);
template void activation_forward<double>(Activation, const double*, double*, int64_t);
template void activation_forward<Half>(Activation, const Half*, Half*, int64_t);
template void activation_forward<BFloat16>(Activation, const BFloat16*, BFloat16*, int64_t);
template void activation_backward<float>(Activation, const float*, const float*, float*, int64_t);
template void activation_backward<double>(Activation, const double*, const double*, double*, int64_t);
template void activation_backward<Half>(Activation, const Half*, const Half*, Half*, int64_t);
template void activation_backward<BFloat16>(Activation, const BFloat16*, const BFloat16*, BFloat16*, int64_t);

}  // namespace demi::kernels::ref
