// Loss kernels written once against the vector traits V; instantiated by loss.cc (VecScalar) and per ISA
// from the registry (cmake/demi_kernel_variants.cmake). The portable dispatcher in loss.cc validates labels
// and shapes, and reduces the per-row losses written here (mean / sum) with the reduction kernels.
//
// Cross-entropy runs per row (rows in parallel): forward is a max pass and one pass that sums exp(x - max)
// (and, for dense labels, sum(p) and sum(p * x)) in f32; backward is one pass over the row given the
// forward's per-row log-sum-exp (two more when it is not given).
#pragma once

#include <cmath>
#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/common_impl.h"
#include "demi/kernels/reference/loss.h"

namespace demi::kernels::cpu_internal {

struct LossKernels {
  // logits (n, c), labels (n) i32|i64 -> rows (n) f32 per-row losses, lse (n) f32 (nullable)
  void (*ce_sparse_forward)(const void* logits, DType dtype, const void* labels, DType label_dtype, int64_t n,
                            int64_t c, float* rows, float* lse);
  // dense: probs (n, c) in prob_dtype (the logits' or f32)
  void (*ce_dense_forward)(const void* logits, DType dtype, const void* probs, DType prob_dtype, int64_t n, int64_t c,
                           float* rows, float* lse);
  // -> dlogits (n, c) in dtype; row i's gradient is scaled by g[i] (g_stride 1) or g[0] (g_stride 0) times g_scale
  void (*ce_sparse_backward)(const void* logits, DType dtype, const void* labels, DType label_dtype, int64_t n,
                             int64_t c, const float* lse, const float* g, int64_t g_stride, float g_scale,
                             void* dlogits);
  void (*ce_dense_backward)(const void* logits, DType dtype, const void* probs, DType prob_dtype, int64_t n, int64_t c,
                            const float* lse, const float* g, int64_t g_stride, float g_scale, void* dlogits);
  // x, t (n) -> rows (n) f32 = (x - t)^2
  void (*mse_rows)(const void* x, const void* t, DType dtype, int64_t n, float* rows);
  // x, t (n) -> sum (x - t)^2: f32 within fixed blocks, f64 across them
  double (*mse_sum)(const void* x, const void* t, DType dtype, int64_t n);
  // -> dx (n) = 2 (x - t) * g, dt = -dx (nullable); g as in ce backward
  void (*mse_backward)(const void* x, const void* t, DType dtype, int64_t n, const float* g, int64_t g_stride,
                       float g_scale, void* dx, void* dt);
};

const LossKernels& loss_kernels_scalar();
const LossKernels& loss_kernels_avx2();
const LossKernels& loss_kernels_avx512();

// log(sum(exp(x))) of a row, with the maximum subtracted.
template <class V, class T>
float row_lse(const T* x, int64_t c) {
  constexpr int W = V::kWidth;
  const float m = max_run<V>(x, c);
  const typename V::F vm = V::set1(m);
  typename V::F acc = V::zero();
  int64_t j = 0;
  for (; j + W <= c; j += W) acc = V::add(acc, V::exp(V::sub(V::load(x + j), vm)));
  if (j < c) acc = V::add(acc, V::exp(V::sub(V::load_n(x + j, c - j, -__builtin_inff()), vm)));
  return m + std::log(V::reduce_add(acc));
}

template <class V, class T, class L>
void ce_sparse_forward_typed(const T* x, const L* labels, int64_t n, int64_t c, float* rows, float* lse) {
  parallel_for(0, n, grain_for<V>(c), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      float l = row_lse<V>(x + i * c, c);
      if (lse) lse[i] = l;
      rows[i] = l - V::to_float(x[i * c + static_cast<int64_t>(labels[i])]);
    }
  });
}

template <class V, class T, class P>
void ce_dense_forward_typed(const T* x, const P* probs, int64_t n, int64_t c, float* rows, float* lse) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  parallel_for(0, n, grain_for<V>(2 * c), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const T* xr = x + i * c;
      const P* pr = probs + i * c;
      const float m = max_run<V>(xr, c);
      const F vm = V::set1(m);
      F s = V::zero(), sp = V::zero(), spx = V::zero();
      int64_t j = 0;
      for (; j + W <= c; j += W) {
        F xv = V::load(xr + j), pv = V::load(pr + j);
        s = V::add(s, V::exp(V::sub(xv, vm)));
        sp = V::add(sp, pv);
        spx = V::add(spx, V::mul(pv, xv));
      }
      if (j < c) {
        F xv = V::load_n(xr + j, c - j, -__builtin_inff()), pv = V::load_n(pr + j, c - j);
        s = V::add(s, V::exp(V::sub(xv, vm)));
        sp = V::add(sp, pv);
        spx = V::add(spx, V::mul(pv, V::load_n(xr + j, c - j)));
      }
      float l = m + std::log(V::reduce_add(s));
      if (lse) lse[i] = l;
      rows[i] = l * V::reduce_add(sp) - V::reduce_add(spx);
    }
  });
}

// dlogits = (exp(x - lse) * sp - p) * g for one row, p given by a functor of the column vector index.
template <class V, class T, class LoadP>
void ce_backward_row(const T* x, int64_t c, float l, float sp, float g, T* dx, LoadP load_p) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  const F vl = V::set1(l), vsp = V::set1(sp), vg = V::set1(g);
  int64_t j = 0;
  for (; j + W <= c; j += W)
    V::store(dx + j, V::mul(V::sub(V::mul(V::exp(V::sub(V::load(x + j), vl)), vsp), load_p(j, W)), vg));
  if (j < c)
    V::store_n(dx + j, V::mul(V::sub(V::mul(V::exp(V::sub(V::load_n(x + j, c - j), vl)), vsp), load_p(j, c - j)), vg),
               c - j);
}

template <class V, class T, class L>
void ce_sparse_backward_typed(const T* x, const L* labels, int64_t n, int64_t c, const float* lse, const float* g,
                              int64_t g_stride, float g_scale, T* dx) {
  parallel_for(0, n, grain_for<V>(c), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const T* xr = x + i * c;
      float l = lse ? lse[i] : row_lse<V>(xr, c);
      float gi = g[i * g_stride] * g_scale;
      // exp(x - lse) * 1 - 0 everywhere, then the label's entry gets its -1.
      ce_backward_row<V>(xr, c, l, 1.0f, gi, dx + i * c, [](int64_t, int64_t) { return V::zero(); });
      int64_t k = static_cast<int64_t>(labels[i]);
      float p = std::exp(V::to_float(xr[k]) - l);
      V::store_n(dx + i * c + k, V::set1((p - 1.0f) * gi), 1);
    }
  });
}

template <class V, class T, class P>
void ce_dense_backward_typed(const T* x, const P* probs, int64_t n, int64_t c, const float* lse, const float* g,
                             int64_t g_stride, float g_scale, T* dx) {
  constexpr int W = V::kWidth;
  parallel_for(0, n, grain_for<V>(2 * c), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const T* xr = x + i * c;
      const P* pr = probs + i * c;
      float l = lse ? lse[i] : row_lse<V>(xr, c);
      typename V::F acc = V::zero();
      int64_t j = 0;
      for (; j + W <= c; j += W) acc = V::add(acc, V::load(pr + j));
      if (j < c) acc = V::add(acc, V::load_n(pr + j, c - j));
      ce_backward_row<V>(xr, c, l, V::reduce_add(acc), g[i * g_stride] * g_scale, dx + i * c,
                         [pr](int64_t col, int64_t count) {
                           return count >= V::kWidth ? V::load(pr + col) : V::load_n(pr + col, count);
                         });
    }
  });
}

template <class V, class T>
void mse_rows_typed(const T* x, const T* t, int64_t n, float* rows) {
  constexpr int W = V::kWidth;
  parallel_for(0, n, kGrainElems, [&](int64_t b, int64_t e) {
    int64_t i = b;
    for (; i + W <= e; i += W) {
      typename V::F d = V::sub(V::load(x + i), V::load(t + i));
      V::store(rows + i, V::mul(d, d));
    }
    if (i < e) {
      typename V::F d = V::sub(V::load_n(x + i, e - i), V::load_n(t + i, e - i));
      V::store_n(rows + i, V::mul(d, d), e - i);
    }
  });
}

template <class V, class T>
double mse_sum_typed(const T* x, const T* t, int64_t n) {
  constexpr int W = V::kWidth;
  constexpr int64_t kMaxBlocks = 4096;
  int64_t block = int64_t{1} << 14;
  while ((n + block - 1) / block > kMaxBlocks) block *= 2;
  const int64_t blocks = (n + block - 1) / block;
  float partial[kMaxBlocks];
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t i = b * block, e = i + block < n ? i + block : n;
      typename V::F acc0 = V::zero(), acc1 = V::zero();
      for (; i + 2 * W <= e; i += 2 * W) {
        typename V::F d0 = V::sub(V::load(x + i), V::load(t + i));
        typename V::F d1 = V::sub(V::load(x + i + W), V::load(t + i + W));
        acc0 = V::fmadd(d0, d0, acc0);
        acc1 = V::fmadd(d1, d1, acc1);
      }
      for (; i < e; i += W) {
        int64_t k = e - i < W ? e - i : W;
        typename V::F d = V::sub(V::load_n(x + i, k), V::load_n(t + i, k));
        acc0 = V::fmadd(d, d, acc0);
      }
      partial[b] = V::reduce_add(V::add(acc0, acc1));
    }
  });
  double s = 0;
  for (int64_t b = 0; b < blocks; ++b) s += partial[b];
  return s;
}

template <class V, class T>
void mse_backward_typed(const T* x, const T* t, int64_t n, const float* g, int64_t g_stride, float g_scale, T* dx,
                        T* dt) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  const F two = V::set1(2.0f), gs = V::set1(g_scale);
  parallel_for(0, n, kGrainElems, [&](int64_t b, int64_t e) {
    int64_t i = b;
    for (; i < e; i += W) {
      int64_t k = e - i < W ? e - i : W;
      F d = k == W ? V::sub(V::load(x + i), V::load(t + i)) : V::sub(V::load_n(x + i, k), V::load_n(t + i, k));
      F gv = g_stride ? (k == W ? V::load(g + i) : V::load_n(g + i, k)) : V::set1(g[0]);
      F v = V::mul(V::mul(two, d), V::mul(gv, gs));
      if (k == W) {
        V::store(dx + i, v);
        if (dt) V::store(dt + i, V::neg(v));
      } else {
        V::store_n(dx + i, v, k);
        if (dt) V::store_n(dt + i, V::neg(v), k);
      }
    }
  });
}

// Calls fn(L{}) with the C++ type of an integer label dtype.
template <class V, class Fn>
void visit_label(DType t, Fn&& fn) {
  if (t == DType::kI32)
    fn(int32_t{});
  else
    fn(int64_t{});
}

template <class V>
void ce_sparse_forward_entry(const void* logits, DType dtype, const void* labels, DType label_dtype, int64_t n,
                             int64_t c, float* rows, float* lse) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    visit_label<V>(label_dtype, [&](auto ltag) {
      using L = decltype(ltag);
      ce_sparse_forward_typed<V>(static_cast<const T*>(logits), static_cast<const L*>(labels), n, c, rows, lse);
    });
  });
}

template <class V>
void ce_dense_forward_entry(const void* logits, DType dtype, const void* probs, DType prob_dtype, int64_t n, int64_t c,
                            float* rows, float* lse) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (prob_dtype == dtype)
      ce_dense_forward_typed<V>(static_cast<const T*>(logits), static_cast<const T*>(probs), n, c, rows, lse);
    else
      ce_dense_forward_typed<V>(static_cast<const T*>(logits), static_cast<const float*>(probs), n, c, rows, lse);
  });
}

template <class V>
void ce_sparse_backward_entry(const void* logits, DType dtype, const void* labels, DType label_dtype, int64_t n,
                              int64_t c, const float* lse, const float* g, int64_t g_stride, float g_scale,
                              void* dlogits) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    visit_label<V>(label_dtype, [&](auto ltag) {
      using L = decltype(ltag);
      ce_sparse_backward_typed<V>(static_cast<const T*>(logits), static_cast<const L*>(labels), n, c, lse, g, g_stride,
                                  g_scale, static_cast<T*>(dlogits));
    });
  });
}

template <class V>
void ce_dense_backward_entry(const void* logits, DType dtype, const void* probs, DType prob_dtype, int64_t n, int64_t c,
                             const float* lse, const float* g, int64_t g_stride, float g_scale, void* dlogits) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto x = static_cast<const T*>(logits);
    auto dx = static_cast<T*>(dlogits);
    if (prob_dtype == dtype)
      ce_dense_backward_typed<V>(x, static_cast<const T*>(probs), n, c, lse, g, g_stride, g_scale, dx);
    else
      ce_dense_backward_typed<V>(x, static_cast<const float*>(probs), n, c, lse, g, g_stride, g_scale, dx);
  });
}

template <class V>
void mse_rows_entry(const void* x, const void* t, DType dtype, int64_t n, float* rows) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    mse_rows_typed<V>(static_cast<const T*>(x), static_cast<const T*>(t), n, rows);
  });
}

template <class V>
double mse_sum_entry(const void* x, const void* t, DType dtype, int64_t n) {
  double s = 0;
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    s = mse_sum_typed<V>(static_cast<const T*>(x), static_cast<const T*>(t), n);
  });
  return s;
}

template <class V>
void mse_backward_entry(const void* x, const void* t, DType dtype, int64_t n, const float* g, int64_t g_stride,
                        float g_scale, void* dx, void* dt) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    mse_backward_typed<V>(static_cast<const T*>(x), static_cast<const T*>(t), n, g, g_stride, g_scale,
                          static_cast<T*>(dx), static_cast<T*>(dt));
  });
}

template <class V>
LossKernels make_loss_kernels() {
  return {ce_sparse_forward_entry<V>, ce_dense_forward_entry<V>, ce_sparse_backward_entry<V>,
          ce_dense_backward_entry<V>, mse_rows_entry<V>,         mse_sum_entry<V>,
          mse_backward_entry<V>};
}

}  // namespace demi::kernels::cpu_internal
