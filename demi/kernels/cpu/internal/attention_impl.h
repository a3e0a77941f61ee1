// The attention-softmax kernels written once against the vector traits V; instantiated by attention.cc
// (VecScalar) and per ISA from the registry (cmake/demi_kernel_variants.cmake). The portable dispatcher in
// attention.cc checks arguments.
//
// One row of scores at a time (rows in parallel): a pass for the maximum of scale * s + mask, a pass summing
// exp(z - max) in f32 that keeps the exponentials in a stack buffer (rows up to kAttnScratch keys; longer
// rows recompute them), and a pass writing the probabilities in the low dtype. Everything before the last
// store is f32, so no intermediate can overflow fp16.
#pragma once

#include <algorithm>
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

// lanes [j, j + W) of a row at p (or the first `left` of them, the others 0)
template <class V, class T>
typename V::F load_lanes(const T* p, int64_t left) {
  return left >= V::kWidth ? V::load(p) : V::load_n(p, left);
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
    F pv = load_lanes<V>(probs + j, left), gv = load_lanes<V>(dp + j, left);
    acc = V::fmadd(pv, gv, acc);
  }
  const F dot = V::set1(V::reduce_add(acc)), vs = V::set1(scale);
  for (int64_t j = 0; j < n; j += W) {
    const int64_t left = n - j;
    F pv = load_lanes<V>(probs + j, left), gv = load_lanes<V>(dp + j, left);
    F v = V::mul(V::mul(vs, pv), V::sub(gv, dot));
    if (left >= W)
      V::store(ds + j, v);
    else
      V::store_n(ds + j, v, left);
  }
}

// kRows rows of n visible keys at once (row r's scores at s + r ld, its mask m[r] or null, its
// probabilities at out + r ld): each row exactly attention_row's operations in its order, the rows'
// interleaved so that their chains (a row's maximum, its sum, the reductions between the passes) overlap
// instead of each row waiting on its own (128-key rows: three short loops and two reductions each, which
// one row at a time left mostly latency). Rows up to kRowsKeys keys; where a row is wholly masked, each
// row goes through attention_row.
inline constexpr int kRows = 4;
inline constexpr int64_t kRowsKeys = 1024;
template <class V, class P>
void attention_rows(const float* s, int64_t ld, const float* const (&m)[kRows], int64_t n, float scale, P* out) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  const F vs = V::set1(scale);
  F mv[kRows];
  #pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) mv[r] = V::set1(-__builtin_inff());
  for (int64_t j = 0; j < n; j += W)
    #pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) mv[r] = V::max(attn_logits<V>(s + r * ld, m[r], vs, j, n - j), mv[r]);
  F vm[kRows];
  #pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
    const float mx = V::reduce_max(mv[r]);
    if (mx == -__builtin_inff()) {  // (a row that attends to nothing: each row its own way)
      for (int q = 0; q < kRows; ++q) attention_row<V>(s + q * ld, m[q], n, scale, out + q * ld);
      return;
    }
    vm[r] = V::set1(mx);
  }
  alignas(64) float scratch[kRows][kRowsKeys];
  F acc[kRows];
  #pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) acc[r] = V::zero();
  for (int64_t j = 0; j < n; j += W)
    #pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      F e = V::exp(V::sub(attn_logits<V>(s + r * ld, m[r], vs, j, n - j), vm[r]));  // padded lanes: 0
      acc[r] = V::add(acc[r], e);
      V::store(scratch[r] + j, e);
    }
  F inv[kRows];
  #pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) inv[r] = V::set1(1.0f / V::reduce_add(acc[r]));
  for (int64_t j = 0; j < n; j += W)
    #pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const F e = V::load(scratch[r] + j);
      if (n - j >= W)
        V::store(out + r * ld + j, V::mul(e, inv[r]));
      else
        V::store_n(out + r * ld + j, V::mul(e, inv[r]), n - j);
    }
}

// kRows rows of attention_backward_row at once (row r at probs, dp, ds + r ld), interleaved as attention_rows.
template <class V, class P>
void attention_backward_rows(const P* probs, const float* dp, int64_t ld, int64_t n, float scale, P* ds) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  F acc[kRows];
  #pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) acc[r] = V::zero();
  for (int64_t j = 0; j < n; j += W) {
    const int64_t left = n - j;
    #pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      F pv = load_lanes<V>(probs + r * ld + j, left), gv = load_lanes<V>(dp + r * ld + j, left);
      acc[r] = V::fmadd(pv, gv, acc[r]);
    }
  }
  F dot[kRows];
  #pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) dot[r] = V::set1(V::reduce_add(acc[r]));
  const F vs = V::set1(scale);
  for (int64_t j = 0; j < n; j += W) {
    const int64_t left = n - j;
    #pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      F pv = load_lanes<V>(probs + r * ld + j, left), gv = load_lanes<V>(dp + r * ld + j, left);
      F v = V::mul(V::mul(vs, pv), V::sub(gv, dot[r]));
      if (left >= W)
        V::store(ds + r * ld + j, v);
      else
        V::store_n(ds + r * ld + j, v, left);
    }
  }
}

// out[from, n) = 0 (a causal row's hidden keys)
template <class P>
void zero_tail(P* out, int64_t from, int64_t n) {
  for (int64_t j = from; j < n; ++j) out[j] = P(0.0f);
}

// Rows [i0, i1) of matrix b's probabilities (its scores at s, row i at s + i cols; out likewise): each row as
// attention_row computes it, kRows at a time where every key is visible (not causal) and the rows are short
// enough (attention_rows), then zeros past a causal row's visible keys.
template <class V, class P>
void attention_matrix_rows(const float* s, const float* mask, const AttentionSoftmaxParams& p, int64_t b, int64_t i0,
                           int64_t i1, P* out) {
  const int64_t n = p.cols;
  auto mask_row = [&](int64_t i) {
    return mask ? mask + (b / p.heads) * p.mask_batch_stride + i * p.mask_row_stride : nullptr;
  };
  int64_t i = i0;
  if (!p.causal && n <= kRowsKeys)
    for (; i + kRows <= i1; i += kRows) {
      const float* m[kRows];
      for (int r = 0; r < kRows; ++r) m[r] = mask_row(i + r);
      attention_rows<V>(s + i * n, n, m, n, p.scale, out + i * n);
    }
  for (; i < i1; ++i) {
    const int64_t visible = p.visible_keys(i);  // causal: the keys after it are hidden, probability 0
    if (visible > 0) attention_row<V>(s + i * n, mask_row(i), visible, p.scale, out + i * n);
    zero_tail(out + i * n, visible, n);
  }
}

// Rows [i0, i1) of a matrix's ds (probs, dp, ds at row i + i cols): attention_backward_row's, kRows at a
// time where every key is visible.
template <class V, class P>
void attention_matrix_backward_rows(const P* probs, const float* dp, const AttentionSoftmaxParams& p, int64_t i0,
                                    int64_t i1, P* ds) {
  const int64_t n = p.cols;
  int64_t i = i0;
  if (!p.causal)
    for (; i + kRows <= i1; i += kRows) attention_backward_rows<V>(probs + i * n, dp + i * n, n, n, p.scale, ds + i * n);
  for (; i < i1; ++i) {
    const int64_t visible = p.visible_keys(i);
    if (visible > 0) attention_backward_row<V>(probs + i * n, dp + i * n, visible, p.scale, ds + i * n);
    zero_tail(ds + i * n, visible, n);
  }
}

template <class V>
void attention_forward_entry(const float* s, const float* mask, const AttentionSoftmaxParams& p, void* probs,
                             DType p_dtype) {
  visit_float<V>(p_dtype, [&](auto tag) {
    using P = decltype(tag);
    P* out = static_cast<P*>(probs);
    const int64_t rows = p.batch * p.rows, n = p.cols;
    parallel_for(0, rows, grain_for<V>(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1;) {  // (a matrix's rows in the range at a time)
        const int64_t b = r / p.rows, i = r % p.rows, count = std::min(r1 - r, p.rows - i);
        attention_matrix_rows<V>(s + (r - i) * n, mask, p, b, i, i + count, out + (r - i) * n);
        r += count;
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
      for (int64_t r = r0; r < r1;) {  // (a matrix's rows in the range at a time)
        const int64_t i = r % p.rows, count = std::min(r1 - r, p.rows - i);
        attention_matrix_backward_rows<V>(pp + (r - i) * n, dprobs + (r - i) * n, p, i, i + count, out + (r - i) * n);
        r += count;
      }
    });
  });
}

template <class V>
AttentionKernels make_attention_kernels() {
  return {attention_forward_entry<V>, attention_backward_entry<V>};
}

}  // namespace demi::kernels::cpu_internal
