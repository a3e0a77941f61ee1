// The optimizers' element-wise updates written once against the vector traits V; instantiated by
// optimizer.cc (VecScalar, the portable fallback and the reference twin) and per ISA from the registry
// (cmake/demi_kernel_variants.cmake). Each element goes through the same FP32 operations in the same order
// at every width (a multiply and an add apart, never fused into an FMA: GCC would contract them in the
// FMA-capable variants unless told not to, below), so every variant gives the scalar one's bits.
#pragma once

#include <cstdint>

#include "demi/kernels/cpu/optimizer.h"

// (fp-contract is a per-function optimization setting in GCC: these functions and their instantiations keep
// it off. Clang contracts only within one expression, never across the intrinsics' calls.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace demi::kernels::cpu_internal {

struct OptimizerKernels {
  void (*momentum)(const MomentumStep& s, float* v, float* p, const float* g, int64_t n);
  void (*momentum_mixed)(const MomentumStep& s, const MixedOperands& x, float* p, int64_t n);
  void (*sgd)(const SgdStep& s, float* p, const float* g, int64_t n);
  void (*adam)(const AdamStep& s, float* m, float* v, float* p, const float* g, int64_t n);
};

const OptimizerKernels& optimizer_kernels_scalar();
const OptimizerKernels& optimizer_kernels_avx2();
const OptimizerKernels& optimizer_kernels_avx512();

// Each update is one step of W elements (kFull) or of the k < W left at the end, loaded and stored masked
// (f32 values, or f16 and bf16 ones widened as loaded and rounded to nearest even as stored).
template <class V, bool kFull, class T>
typename V::F load_k(const T* p, int64_t k) {
  if constexpr (kFull) {
    return V::load(p);
  } else {
    return V::load_n(p, k);
  }
}

template <class V, bool kFull, class T>
void store_k(T* p, typename V::F x, int64_t k) {
  if constexpr (kFull) {
    V::store(p, x);
  } else {
    V::store_n(p, x, k);
  }
}

// v = m v + g + wd p; p -= lr v. Nesterov: gi = g + wd p; v = m v + gi; p -= lr (gi + m v). The gradient
// g of G (f32, f16, bf16) is multiplied by `scale` first where kScaled; the state v is of S (f32, bf16).
template <class V, bool kNesterov, bool kScaled, bool kFull, class G, class S>
inline void momentum_step(typename V::F m, typename V::F l, typename V::F wd, typename V::F scale, S* v, float* p,
                          const G* g, int64_t k) {
  using F = typename V::F;
  F gi = load_k<V, kFull>(g, k);
  if constexpr (kScaled) gi = V::mul(gi, scale);
  const F pi = load_k<V, kFull>(p, k), vi = load_k<V, kFull>(v, k);
  if constexpr (kNesterov) {
    const F gw = V::add(gi, V::mul(wd, pi));
    const F vn = V::add(V::mul(m, vi), gw);
    store_k<V, kFull>(v, vn, k);
    store_k<V, kFull>(p, V::sub(pi, V::mul(l, V::add(gw, V::mul(m, vn)))), k);
  } else {
    const F vn = V::add(V::add(V::mul(m, vi), gi), V::mul(wd, pi));
    store_k<V, kFull>(v, vn, k);
    store_k<V, kFull>(p, V::sub(pi, V::mul(l, vn)), k);
  }
}

template <class V, bool kNesterov, bool kScaled, class G, class S>
void momentum_run(const MomentumStep& s, float g_scale, S* v, float* p, const G* g, int64_t n) {
  constexpr int W = V::kWidth;
  const typename V::F m = V::set1(s.momentum), l = V::set1(s.lr), wd = V::set1(s.weight_decay),
                      scale = V::set1(g_scale);
  int64_t i = 0;
  for (; i + W <= n; i += W) momentum_step<V, kNesterov, kScaled, true>(m, l, wd, scale, v + i, p + i, g + i, W);
  if (i < n) momentum_step<V, kNesterov, kScaled, false>(m, l, wd, scale, v + i, p + i, g + i, n - i);
}

template <class V>
void momentum_update(const MomentumStep& s, float* v, float* p, const float* g, int64_t n) {
  s.nesterov ? momentum_run<V, true, false>(s, 1, v, p, g, n) : momentum_run<V, false, false>(s, 1, v, p, g, n);
}

// momentum_update on a gradient and state of other dtypes (MixedOperands), W elements at a time through
// registers: the same FP32 operations as widening both into FP32 buffers, multiplying the gradient (where
// the scale is not 1), momentum_update and rounding the state back.
template <class V, class G, class S>
void momentum_mixed_typed(const MomentumStep& s, const MixedOperands& x, float* p, int64_t n) {
  const G* g = static_cast<const G*>(x.g);
  S* v = static_cast<S*>(x.v);
  const float c = x.g_scale;
  if (s.nesterov)
    c != 1.0f ? momentum_run<V, true, true>(s, c, v, p, g, n) : momentum_run<V, true, false>(s, c, v, p, g, n);
  else
    c != 1.0f ? momentum_run<V, false, true>(s, c, v, p, g, n) : momentum_run<V, false, false>(s, c, v, p, g, n);
}

template <class V>
void momentum_mixed(const MomentumStep& s, const MixedOperands& x, float* p, int64_t n) {
  const auto with_state = [&](auto g_tag) {
    using G = decltype(g_tag);
    x.v_dtype == DType::kBF16 ? momentum_mixed_typed<V, G, BFloat16>(s, x, p, n)
                              : momentum_mixed_typed<V, G, float>(s, x, p, n);
  };
  if (x.g_dtype == DType::kF16)
    with_state(Half{});
  else if (x.g_dtype == DType::kBF16)
    with_state(BFloat16{});
  else
    with_state(float{});
}

// p -= lr (g + wd p)
template <class V, bool kFull>
inline void sgd_step(typename V::F l, typename V::F wd, float* p, const float* g, int64_t k) {
  const typename V::F pi = load_k<V, kFull>(p, k);
  store_k<V, kFull>(p, V::sub(pi, V::mul(l, V::add(load_k<V, kFull>(g, k), V::mul(wd, pi)))), k);
}

template <class V>
void sgd_update(const SgdStep& s, float* p, const float* g, int64_t n) {
  constexpr int W = V::kWidth;
  const typename V::F l = V::set1(s.lr), wd = V::set1(s.weight_decay);
  int64_t i = 0;
  for (; i + W <= n; i += W) sgd_step<V, true>(l, wd, p + i, g + i, W);
  if (i < n) sgd_step<V, false>(l, wd, p + i, g + i, n - i);
}

// gi = g + l2 p; m = b1 m + (1 - b1) gi; v = b2 v + (1 - b2) gi gi; p = p decay - step m / (sqrt(v) / bc2 + eps)
template <class V>
struct AdamVectors {
  typename V::F b1, b2, c1, c2, step, bc2, eps, decay, l2;
  explicit AdamVectors(const AdamStep& s)
      : b1(V::set1(s.beta1)), b2(V::set1(s.beta2)), c1(V::set1(1 - s.beta1)), c2(V::set1(1 - s.beta2)),
        step(V::set1(s.step)), bc2(V::set1(s.bias_correction2_sqrt)), eps(V::set1(s.eps)), decay(V::set1(s.decay)),
        l2(V::set1(s.l2)) {}
};

template <class V, bool kFull>
inline void adam_step(const AdamVectors<V>& c, float* m, float* v, float* p, const float* g, int64_t k) {
  using F = typename V::F;
  const F pi = load_k<V, kFull>(p, k);
  const F gi = V::add(load_k<V, kFull>(g, k), V::mul(c.l2, pi));
  const F mi = V::add(V::mul(c.b1, load_k<V, kFull>(m, k)), V::mul(c.c1, gi));
  const F vi = V::add(V::mul(c.b2, load_k<V, kFull>(v, k)), V::mul(V::mul(c.c2, gi), gi));
  store_k<V, kFull>(m, mi, k);
  store_k<V, kFull>(v, vi, k);
  const F denom = V::add(V::div(V::sqrt(vi), c.bc2), c.eps);
  store_k<V, kFull>(p, V::sub(V::mul(pi, c.decay), V::div(V::mul(c.step, mi), denom)), k);
}

template <class V>
void adam_update(const AdamStep& s, float* m, float* v, float* p, const float* g, int64_t n) {
  constexpr int W = V::kWidth;
  const AdamVectors<V> c(s);
  int64_t i = 0;
  for (; i + W <= n; i += W) adam_step<V, true>(c, m + i, v + i, p + i, g + i, W);
  if (i < n) adam_step<V, false>(c, m + i, v + i, p + i, g + i, n - i);
}

template <class V>
OptimizerKernels make_optimizer_kernels() {
  return {momentum_update<V>, momentum_mixed<V>, sgd_update<V>, adam_update<V>};
}

}  // namespace demi::kernels::cpu_internal

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
