// The attention-softmax kernels written once against the vector traits V; instantiated by attention.cc
// (VecScalar) and per ISA from the registry (cmake/demi_kernel_variants.cmake). The portable dispatcher in
// attention.cc checks arguments.
//
// One row of scores at a time (rows in parallel): a pass for the maximum of scale * s + mask, a pass summing
// exp(z - max) in f32 that keeps the exponentials in a stack buffer (rows up to kAttnScratch keys; longer
// rows recompute them), and a pass writing the probabilities in the low dtype. Everything before the last
// store is f32, so no intermediate can overflow fp16.
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/common_impl.h"
#include "demi/kernels/reference/attention.h"

namespace demi::kernels::cpu_internal {

struct AttentionKernels {
  // s (N, Sq, Sk) f32, mask f32 (nullable) -> probs (N, Sq, Sk) in p_dtype (f32|bf16|f16)
  void (*forward)(const float* s, const float* mask, const AttentionSoftmaxParams& p, void* probs, DType p_dtype);
  // probs (N, Sq, Sk) in p_dtype, dprobs f32 -> ds in p_dtype
  void (*backward)(const void* probs, DType p_dtype, const float* dprobs, const AttentionSoftmaxParams& p, void* ds);
};

const AttentionKernels& attention_kernels_scalar();
const AttentionKernels& attention_kernels_avx2();
const AttentionKernels& attention_kernels_avx512();

inline constexpr int64_t kAttnScratch = 4096;

// z = scale * s + mask for lanes [j, j + W) (or the first `left` of them; padded lanes are -inf)
template <class V>
typename V::F attn_logits(const float* s, const float* mask, typename V::F scale, int64_t j, int64_t left) {
  using F = typename V::F;
  if (left >= V::kWidth) {
    F z = V::mul(V::load(s + j), scale);
    return mask ? V::add(z, V::load(mask + j)) : z;
  }
  F z = V::mul(V::load_n(s + j, left, -__builtin_inff()), scale);  // scale > 0: padded lanes stay -inf
  return mask ? V::add(z, V::load_n(mask + j, left)) : z;
}

template <class V, class P>
void attention_row(const float* s, const float* mask, int64_t n, float scale, P* out) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  const F vs = V::set1(scale);
  F mv = V::set1(-__builtin_inff());
  for (int64_t j = 0; j < n; j += W) mv = V::max(attn_logits<V>(s, mask, vs, j, n - j), mv);
  const float m = V::reduce_max(mv);
  if (m == -__builtin_inff()) {  // every key masked: attend to nothing rather than divide 0 by 0
    for (int64_t j = 0; j < n; j += W) {
      if (n - j >= W)
        V::store(out + j, V::zero());
      else
        V::store_n(out + j, V::zero(), n - j);
    }
    return;
  }
  const F vm = V::set1(m);
  alignas(64) float scratch[kAttnScratch];
  const bool keep = n <= kAttnScratch;
  F acc = V::zero();
  for (int64_t j = 0; j < n; j += W) {
    F e = V::exp(V::sub(attn_logits<V>(s, mask, vs, j, n - j), vm));  // padded lanes: exp(-inf) = 0
    acc = V::add(acc, e);
    if (keep) V::store(scratch + j, e);
  }
  const F inv = V::set1(1.0f / V::reduce_add(acc));
  for (int64_t j = 0; j < n; j += W) {
    F e = keep ? V::load(scratch + j) : V::exp(V::sub(attn_logits<V>(s, mask, vs, j, n - j), vm));
    if (n - j >= W)
      V::store(out + j, V::mul(e, inv));
    else
      V::store_n(out + j, V::mul(e, inv), n - j);
  }
}

template <class V, class P>
void attention_backward_row(const P* probs, const float* dp, int64_t n, float scale, P* ds) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  F acc = V::zero();
  for (int64_t j = 0; j < n; j += W) {
    const int64_t left = n - j;
    F pv = left >= W ? V::load(probs + j) : V::load_n(probs + j, left);
    F gv = left >= W ? V::load(dp + j) : V::load_n(dp + j, left);
    acc = V::fmadd(pv, gv, acc);
  }
  const F dot = V::set1(V::reduce_add(acc)), vs = V::set1(scale);
  for (int64_t j = 0; j < n; j += W) {
    const int64_t left = n - j;
    F pv = left >= W ? V::load(probs + j) : V::load_n(probs + j, left);
    F gv = left >= W ? V::load(dp + j) : V::load_n(dp + j, left);
    F v = V::mul(V::mul(vs, pv), V::sub(gv, dot));
    if (left >= W)
      V::store(ds + j, v);
    else
      V::store_n(ds + j, v, left);
  }
}

// out[from, n) = 0 (a causal row's hidden keys)
template <class P>
void zero_tail(P* out, int64_t from, int64_t n) {
  for (int64_t j = from; j < n; ++j) out[j] = P(0.0f);
}

template <class V>
void attention_forward_entry(const float* s, const float* mask, const AttentionSoftmaxParams& p, void* probs,
                             DType p_dtype) {
  visit_float<V>(p_dtype, [&](auto tag) {
    using P = decltype(tag);
    P* out = static_cast<P*>(probs);
    const int64_t rows = p.batch * p.rows, n = p.cols;
    parallel_for(0, rows, grain_for<V>(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / p.rows, i = r % p.rows;
        const float* m = mask ? mask + (b / p.heads) * p.mask_batch_stride + i * p.mask_row_stride : nullptr;
        const int64_t visible = p.visible_keys(i);  // causal: the keys after it are hidden, probability 0
        if (visible > 0) attention_row<V>(s + r * n, m, visible, p.scale, out + r * n);
        zero_tail(out + r * n, visible, n);
      }
    });
  });
}

template <class V>
void attention_backward_entry(const void* probs, DType p_dtype, const float* dprobs, const AttentionSoftmaxParams& p,
                              void* ds) {
  visit_float<V>(p_dtype, [&](auto tag) {
    using P = decltype(tag);
    const P* pp = static_cast<const P*>(probs);
    P* out = static_cast<P*>(ds);
    const int64_t rows = p.batch * p.rows, n = p.cols;
    parallel_for(0, rows, grain_for<V>(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t visible = p.visible_keys(r % p.rows);
        if (visible > 0) attention_backward_row<V>(pp + r * n, dprobs + r * n, visible, p.scale, out + r * n);
        zero_tail(out + r * n, visible, n);
      }
    });
  });
}

template <class V>
AttentionKernels make_attention_kernels() {
  return {attention_forward_entry<V>, attention_backward_entry<V>};
}

}  // namespace demi::kernels::cpu_internal
