// Softmax and log-softmax kernels written once against the vector traits V; instantiated by softmax.cc
// (VecScalar) and per ISA from the registry (cmake/demi_kernel_variants.cmake). The portable dispatcher in
// softmax.cc checks arguments.
//
// Rows (inner == 1): a max pass, a pass summing exp(x - max) in f32 (softmax into f32 keeps those
// exponentials in y, into bf16/f16 in a stack buffer for rows up to kScratch, so each is computed once),
// and a pass writing the result. Columns (inner > 1): a block of up to kColBlock columns keeps its maxima
// and sums in vectors while walking the axis, so every load is contiguous.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "demi/core/dtype.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/common_impl.h"
#include "demi/kernels/reference/reduce.h"

namespace demi::kernels::cpu_internal {

struct SoftmaxKernels {
  // x (outer, axis, inner) -> y (same); x f32|bf16|f16, y x's dtype or f32
  void (*forward)(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype, bool log);
  // y, dy (outer, axis, inner) in y_dtype -> dx (same) in dx_dtype
  void (*backward)(const void* y, const void* dy, DType y_dtype, AxisView v, void* dx, DType dx_dtype, bool log);
};

const SoftmaxKernels& softmax_kernels_scalar();
const SoftmaxKernels& softmax_kernels_avx2();
const SoftmaxKernels& softmax_kernels_avx512();

inline constexpr int64_t kSoftmaxScratch = 4096;
inline constexpr int64_t kSoftmaxColBlock = 128;

template <class V, class T, class Out, bool kLog>
void softmax_row(const T* x, Out* y, int64_t n) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  const float m = max_run<V>(x, n);
  const F vm = V::set1(m);
  constexpr bool kKeepInY = !kLog && std::is_same_v<Out, float>;
  alignas(64) float scratch[kKeepInY || kLog ? 1 : kSoftmaxScratch];
  const bool keep_in_scratch = !kKeepInY && !kLog && n <= kSoftmaxScratch;
  F acc = V::zero();
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    F e = V::exp(V::sub(V::load(x + i), vm));
    acc = V::add(acc, e);
    if constexpr (kKeepInY) V::store(reinterpret_cast<float*>(y) + i, e);
    if (keep_in_scratch) V::store(scratch + i, e);
  }
  if (i < n) {
    F e = V::exp(V::sub(V::load_n(x + i, n - i, -__builtin_inff()), vm));  // padded lanes: exp(-inf) = 0
    acc = V::add(acc, e);
    if constexpr (kKeepInY) V::store_n(reinterpret_cast<float*>(y) + i, e, n - i);
    if (keep_in_scratch) V::store_n(scratch + i, e, n - i);
  }
  const float s = V::reduce_add(acc);
  if constexpr (kLog) {
    const F log_s = V::set1(std::log(s));
    for (i = 0; i + W <= n; i += W) V::store(y + i, V::sub(V::sub(V::load(x + i), vm), log_s));
    if (i < n) V::store_n(y + i, V::sub(V::sub(V::load_n(x + i, n - i), vm), log_s), n - i);
  } else {
    const F inv = V::set1(1.0f / s);
    for (i = 0; i + W <= n; i += W) {
      F e;
      if constexpr (kKeepInY)
        e = V::load(reinterpret_cast<const float*>(y) + i);
      else
        e = keep_in_scratch ? V::load(scratch + i) : V::exp(V::sub(V::load(x + i), vm));
      V::store(y + i, V::mul(e, inv));
    }
    if (i < n) {
      F e;
      if constexpr (kKeepInY)
        e = V::load_n(reinterpret_cast<const float*>(y) + i, n - i);
      else
        e = keep_in_scratch ? V::load_n(scratch + i, n - i) : V::exp(V::sub(V::load_n(x + i, n - i), vm));
      V::store_n(y + i, V::mul(e, inv), n - i);
    }
  }
}

// Loads lanes [k * W, k * W + W) of a column block of width w (masked past w).
template <class V, class T>
typename V::F load_cols(const T* p, int k, int64_t w, float fill = 0.0f) {
  int64_t left = w - static_cast<int64_t>(k) * V::kWidth;
  return left >= V::kWidth ? V::load(p + k * V::kWidth) : V::load_n(p + k * V::kWidth, left, fill);
}

template <class V, class T>
void store_cols(T* p, int k, int64_t w, typename V::F v) {
  int64_t left = w - static_cast<int64_t>(k) * V::kWidth;
  if (left >= V::kWidth)
    V::store(p + k * V::kWidth, v);
  else
    V::store_n(p + k * V::kWidth, v, left);
}

template <class V, class T, class Out, bool kLog>
void softmax_cols(const T* x, Out* y, int64_t axis, int64_t inner, int64_t w) {
  using F = typename V::F;
  constexpr int kMaxVecs = static_cast<int>(kSoftmaxColBlock / V::kWidth);
  const int nv = static_cast<int>((w + V::kWidth - 1) / V::kWidth);
  F m[kMaxVecs], s[kMaxVecs];
  for (int k = 0; k < nv; ++k) {
    m[k] = V::set1(-__builtin_inff());
    s[k] = V::zero();
  }
  for (int64_t a = 0; a < axis; ++a)
    for (int k = 0; k < nv; ++k) m[k] = V::max(load_cols<V>(x + a * inner, k, w), m[k]);
  for (int64_t a = 0; a < axis; ++a)
    for (int k = 0; k < nv; ++k) s[k] = V::add(s[k], V::exp(V::sub(load_cols<V>(x + a * inner, k, w), m[k])));
  for (int k = 0; k < nv; ++k) s[k] = kLog ? V::log(s[k]) : V::div(V::set1(1.0f), s[k]);
  for (int64_t a = 0; a < axis; ++a)
    for (int k = 0; k < nv; ++k) {
      F d = V::sub(load_cols<V>(x + a * inner, k, w), m[k]);
      store_cols<V>(y + a * inner, k, w, kLog ? V::sub(d, s[k]) : V::mul(V::exp(d), s[k]));
    }
}

template <class V, class T, class Out, bool kLog>
void forward_typed(const T* x, AxisView v, Out* y) {
  if (v.inner == 1) {
    parallel_for(0, v.outer, grain_for<V>(v.axis), [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) softmax_row<V, T, Out, kLog>(x + o * v.axis, y + o * v.axis, v.axis);
    });
    return;
  }
  const int64_t blocks = (v.inner + kSoftmaxColBlock - 1) / kSoftmaxColBlock;
  parallel_for(0, v.outer * blocks, grain_for<V>(kSoftmaxColBlock * v.axis), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      int64_t o = u / blocks, c0 = (u % blocks) * kSoftmaxColBlock;
      int64_t w = v.inner - c0 < kSoftmaxColBlock ? v.inner - c0 : kSoftmaxColBlock;
      int64_t off = o * v.axis * v.inner + c0;
      softmax_cols<V, T, Out, kLog>(x + off, y + off, v.axis, v.inner, w);
    }
  });
}

// softmax: dx = y * (dy - sum(dy * y)); log-softmax: dx = dy - exp(y) * sum(dy)
template <class V, class T, class Out, bool kLog>
void backward_row(const Out* y, const Out* dy, T* dx, int64_t n) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  F acc = V::zero();
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    F g = V::load(dy + i);
    acc = V::add(acc, kLog ? g : V::mul(g, V::load(y + i)));
  }
  if (i < n) {
    F g = V::load_n(dy + i, n - i);
    acc = V::add(acc, kLog ? g : V::mul(g, V::load_n(y + i, n - i)));
  }
  const F dot = V::set1(V::reduce_add(acc));
  for (i = 0; i + W <= n; i += W) {
    F yv = V::load(y + i), g = V::load(dy + i);
    V::store(dx + i, kLog ? V::sub(g, V::mul(V::exp(yv), dot)) : V::mul(yv, V::sub(g, dot)));
  }
  if (i < n) {
    F yv = V::load_n(y + i, n - i), g = V::load_n(dy + i, n - i);
    V::store_n(dx + i, kLog ? V::sub(g, V::mul(V::exp(yv), dot)) : V::mul(yv, V::sub(g, dot)), n - i);
  }
}

template <class V, class T, class Out, bool kLog>
void backward_cols(const Out* y, const Out* dy, T* dx, int64_t axis, int64_t inner, int64_t w) {
  using F = typename V::F;
  constexpr int kMaxVecs = static_cast<int>(kSoftmaxColBlock / V::kWidth);
  const int nv = static_cast<int>((w + V::kWidth - 1) / V::kWidth);
  F dot[kMaxVecs];
  for (int k = 0; k < nv; ++k) dot[k] = V::zero();
  for (int64_t a = 0; a < axis; ++a)
    for (int k = 0; k < nv; ++k) {
      F g = load_cols<V>(dy + a * inner, k, w);
      dot[k] = V::add(dot[k], kLog ? g : V::mul(g, load_cols<V>(y + a * inner, k, w)));
    }
  for (int64_t a = 0; a < axis; ++a)
    for (int k = 0; k < nv; ++k) {
      F yv = load_cols<V>(y + a * inner, k, w), g = load_cols<V>(dy + a * inner, k, w);
      store_cols<V>(dx + a * inner, k, w, kLog ? V::sub(g, V::mul(V::exp(yv), dot[k])) : V::mul(yv, V::sub(g, dot[k])));
    }
}

template <class V, class T, class Out, bool kLog>
void backward_typed(const Out* y, const Out* dy, AxisView v, T* dx) {
  if (v.inner == 1) {
    parallel_for(0, v.outer, grain_for<V>(v.axis), [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o)
        backward_row<V, T, Out, kLog>(y + o * v.axis, dy + o * v.axis, dx + o * v.axis, v.axis);
    });
    return;
  }
  const int64_t blocks = (v.inner + kSoftmaxColBlock - 1) / kSoftmaxColBlock;
  parallel_for(0, v.outer * blocks, grain_for<V>(kSoftmaxColBlock * v.axis), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      int64_t o = u / blocks, c0 = (u % blocks) * kSoftmaxColBlock;
      int64_t w = v.inner - c0 < kSoftmaxColBlock ? v.inner - c0 : kSoftmaxColBlock;
      int64_t off = o * v.axis * v.inner + c0;
      backward_cols<V, T, Out, kLog>(y + off, dy + off, dx + off, v.axis, v.inner, w);
    }
  });
}

template <class V>
void softmax_forward_entry(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype, bool log) {
  visit_float<V>(x_dtype, [&](auto tag) {
    using T = decltype(tag);
    auto px = static_cast<const T*>(x);
    if (y_dtype == x_dtype) {
      auto py = static_cast<T*>(y);
      log ? forward_typed<V, T, T, true>(px, v, py) : forward_typed<V, T, T, false>(px, v, py);
    } else {
      auto py = static_cast<float*>(y);
      log ? forward_typed<V, T, float, true>(px, v, py) : forward_typed<V, T, float, false>(px, v, py);
    }
  });
}

template <class V>
void softmax_backward_entry(const void* y, const void* dy, DType y_dtype, AxisView v, void* dx, DType dx_dtype,
                            bool log) {
  visit_float<V>(dx_dtype, [&](auto tag) {
    using T = decltype(tag);
    auto pdx = static_cast<T*>(dx);
    if (y_dtype == dx_dtype) {
      auto py = static_cast<const T*>(y);
      auto pdy = static_cast<const T*>(dy);
      log ? backward_typed<V, T, T, true>(py, pdy, v, pdx) : backward_typed<V, T, T, false>(py, pdy, v, pdx);
    } else {
      auto py = static_cast<const float*>(y);
      auto pdy = static_cast<const float*>(dy);
      log ? backward_typed<V, T, float, true>(py, pdy, v, pdx) : backward_typed<V, T, float, false>(py, pdy, v, pdx);
    }
  });
}

template <class V>
SoftmaxKernels make_softmax_kernels() {
  return {softmax_forward_entry<V>, softmax_backward_entry<V>};
}

}  // namespace demi::kernels::cpu_internal
