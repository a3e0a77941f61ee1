// Batch-normalisation kernels written once against the vector traits V; instantiated by batchnorm.cc
// (VecScalar) and per ISA from the registry (cmake/demi_kernel_variants.cmake). The portable dispatcher in
// batchnorm.cc checks arguments, provides scratch memory and updates the running statistics.
//
// x is (N, C, S). With S > 1 (BatchNorm2d) each channel is N runs of S contiguous values: channels run in
// parallel, and one channel's passes (sum; sum of squared deviations — two-pass, so |mean| >> std loses
// nothing; normalise) follow each other while its data is still in L2. With S == 1 (BatchNorm1d, (N, C))
// a channel is a column: statistics accumulate whole rows of channels (blocks of columns in parallel) and
// the normalisation runs over rows in parallel. Statistics accumulate in f32 — within a run of S values
// (then the runs add up in f64), or within blocks of kRowBlock rows (then the blocks add up in f32).
#pragma once

#include <cmath>
#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/common_impl.h"
#include "demi/kernels/cpu/internal/softmax_impl.h"

namespace demi::kernels::cpu_internal {

struct BatchNormKernels {
  // x (n, c, s) -> y; mean, invstd, var (biased) (c) f32 out; gamma, beta (c) f32 (nullable);
  // ws: 2c floats of scratch when s == 1
  void (*train_forward)(const void* x, DType dtype, int64_t n, int64_t c, int64_t s, const float* gamma,
                        const float* beta, float eps, void* y, float* mean, float* invstd, float* var, float* ws);
  // x (n, c, s) -> y = (x - mean[c]) * scale[c] + shift[c]
  void (*apply)(const void* x, DType dtype, int64_t n, int64_t c, int64_t s, const float* mean, const float* scale,
                const float* shift, void* y);
  // x, dy (n, c, s) -> dx; dgamma, dbeta (c) (nullable); ws: 5c floats of scratch when s == 1
  void (*backward)(const void* x, const void* dy, DType dtype, int64_t n, int64_t c, int64_t s, const float* gamma,
                   const float* mean, const float* invstd, bool training, void* dx, float* dgamma, float* dbeta,
                   float* ws);
};

const BatchNormKernels& batchnorm_kernels_scalar();
const BatchNormKernels& batchnorm_kernels_avx2();
const BatchNormKernels& batchnorm_kernels_avx512();

// sum over rows of (x[r, :] - center[:]) * (w[r, :] - wcenter[:]) style column statistics: for rows
// r in [0, n) of a (n, cols) matrix, out[j] = sum_r f(a[r, j], b[r, j], j) for one block of columns.
// kMode 0: sum a; 1: sum (a - m)^2; 2: sum b and sum b * (a - m) (two outputs).
template <class V, int kMode, class T>
void column_stats(const T* a, const T* b, int64_t n, int64_t cols, const float* m, float* out0, float* out1) {
  using F = typename V::F;
  const int64_t blocks = (cols + kSoftmaxColBlock - 1) / kSoftmaxColBlock;
  parallel_for(0, blocks, grain_for<V>(kSoftmaxColBlock * n), [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t c0 = blk * kSoftmaxColBlock;
      const int64_t w = cols - c0 < kSoftmaxColBlock ? cols - c0 : kSoftmaxColBlock;
      const int nv = static_cast<int>((w + V::kWidth - 1) / V::kWidth);
      constexpr int kVecs = static_cast<int>(kSoftmaxColBlock / V::kWidth);
      F acc0[kVecs], acc1[kVecs], blk0[kVecs], blk1[kVecs], mv[kVecs];
      for (int k = 0; k < nv; ++k) {
        acc0[k] = acc1[k] = blk0[k] = blk1[k] = V::zero();
        if constexpr (kMode != 0) mv[k] = load_cols<V>(m + c0, k, w);
      }
      for (int64_t r = 0; r < n; ++r) {
        for (int k = 0; k < nv; ++k) {
          F av = load_cols<V>(a + r * cols + c0, k, w);
          if constexpr (kMode == 0) {
            blk0[k] = V::add(blk0[k], av);
          } else if constexpr (kMode == 1) {
            F d = V::sub(av, mv[k]);
            blk0[k] = V::fmadd(d, d, blk0[k]);
          } else {
            F bv = load_cols<V>(b + r * cols + c0, k, w);
            blk0[k] = V::add(blk0[k], bv);
            blk1[k] = V::fmadd(bv, V::sub(av, mv[k]), blk1[k]);
          }
        }
        if ((r + 1) % kRowBlock == 0 || r + 1 == n)
          for (int k = 0; k < nv; ++k) {
            acc0[k] = V::add(acc0[k], blk0[k]);
            acc1[k] = V::add(acc1[k], blk1[k]);
            blk0[k] = blk1[k] = V::zero();
          }
      }
      for (int k = 0; k < nv; ++k) {
        store_cols<V>(out0 + c0, k, w, acc0[k]);
        if (kMode == 2) store_cols<V>(out1 + c0, k, w, acc1[k]);
      }
    }
  });
}

// One channel's N runs of s values: sum, then sum of squared deviations, then y = (x - mean) * a + shift.
// Each run accumulates in f32; the runs add up in f64.
template <class V, class T>
void train_channel(const T* x, int64_t n, int64_t c, int64_t s, float gamma, float beta, float eps, T* y,
                   float* mean_out, float* invstd_out, float* var_out) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  const int64_t stride = c * s;
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += sum_run<V>(x + i * stride, s);
  const double count = static_cast<double>(n * s);
  const float mean = static_cast<float>(total / count);
  const F vm = V::set1(mean);
  double total_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T* p = x + i * stride;
    F sq0 = V::zero(), sq1 = V::zero();
    int64_t j = 0;
    for (; j + 2 * W <= s; j += 2 * W) {
      F d0 = V::sub(V::load(p + j), vm), d1 = V::sub(V::load(p + j + W), vm);
      sq0 = V::fmadd(d0, d0, sq0);
      sq1 = V::fmadd(d1, d1, sq1);
    }
    for (; j < s; j += W) {
      F d = V::sub(s - j >= W ? V::load(p + j) : V::load_n(p + j, s - j, mean), vm);  // padding: d = 0
      sq0 = V::fmadd(d, d, sq0);
    }
    total_sq += V::reduce_add(V::add(sq0, sq1));
  }
  const float var = static_cast<float>(total_sq / count);
  const float invstd = 1.0f / std::sqrt(var + eps);
  const F va = V::set1(gamma * invstd), vb = V::set1(beta);
  for (int64_t i = 0; i < n; ++i) {
    const T* p = x + i * stride;
    T* q = y + i * stride;
    int64_t j = 0;
    for (; j + W <= s; j += W) V::store(q + j, V::fmadd(V::sub(V::load(p + j), vm), va, vb));
    if (j < s) V::store_n(q + j, V::fmadd(V::sub(V::load_n(p + j, s - j), vm), va, vb), s - j);
  }
  *mean_out = mean;
  *invstd_out = invstd;
  *var_out = var;
}

// y (n, c, s) = (x - mean[ch]) * scale[ch] + shift[ch]
template <class V, class T>
void apply_typed(const T* x, int64_t n, int64_t c, int64_t s, const float* mean, const float* scale,
                 const float* shift, T* y) {
  using F = typename V::F;
  if (s == 1) {  // rows of channels: vectors run along the channels
    parallel_for(0, n, grain_for<V>(c), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int nv = static_cast<int>((c + V::kWidth - 1) / V::kWidth);
        for (int k = 0; k < nv; ++k) {
          F v = V::fmadd(V::sub(load_cols<V>(x + r * c, k, c), load_cols<V>(mean, k, c)), load_cols<V>(scale, k, c),
                         load_cols<V>(shift, k, c));
          store_cols<V>(y + r * c, k, c, v);
        }
      }
    });
    return;
  }
  parallel_for(0, n * c, grain_for<V>(s), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t ch = u % c;
      const F vm = V::set1(mean[ch]), va = V::set1(scale[ch]), vb = V::set1(shift[ch]);
      const T* p = x + u * s;
      T* q = y + u * s;
      int64_t j = 0;
      for (; j + V::kWidth <= s; j += V::kWidth) V::store(q + j, V::fmadd(V::sub(V::load(p + j), vm), va, vb));
      if (j < s) V::store_n(q + j, V::fmadd(V::sub(V::load_n(p + j, s - j), vm), va, vb), s - j);
    }
  });
}

template <class V, class T>
void train_forward_typed(const T* x, int64_t n, int64_t c, int64_t s, const float* gamma, const float* beta, float eps,
                         T* y, float* mean, float* invstd, float* var, float* ws) {
  if (s > 1) {
    parallel_for(0, c, grain_for<V>(3 * n * s), [&](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch)
        train_channel<V>(x + ch * s, n, c, s, gamma ? gamma[ch] : 1.0f, beta ? beta[ch] : 0.0f, eps, y + ch * s,
                         mean + ch, invstd + ch, var + ch);
    });
    return;
  }
  const float count = static_cast<float>(n);
  column_stats<V, 0>(x, x, n, c, nullptr, mean, nullptr);
  for (int64_t ch = 0; ch < c; ++ch) mean[ch] /= count;
  column_stats<V, 1>(x, x, n, c, mean, var, nullptr);
  float* scale = ws;
  float* shift = ws + c;
  for (int64_t ch = 0; ch < c; ++ch) {
    var[ch] /= count;
    invstd[ch] = 1.0f / std::sqrt(var[ch] + eps);
    scale[ch] = (gamma ? gamma[ch] : 1.0f) * invstd[ch];
    shift[ch] = beta ? beta[ch] : 0.0f;
  }
  apply_typed<V>(x, n, c, 1, mean, scale, shift, y);
}

// dx = A * dy + B * (x - mean) + Cc per channel (training), or A * dy (inference), with
// A = gamma * invstd, B = -A * invstd * dgamma / M, Cc = -A * dbeta / M.
template <class V, class T>
void backward_channel(const T* x, const T* dy, int64_t n, int64_t c, int64_t s, float gamma, float mean, float invstd,
                      bool training, T* dx, float* dgamma, float* dbeta) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  const int64_t stride = c * s;
  const F vm = V::set1(mean);
  double total_dy = 0, total_dx = 0;  // runs in f32, added up in f64
  for (int64_t i = 0; i < n; ++i) {
    const T* p = x + i * stride;
    const T* g = dy + i * stride;
    F sdy = V::zero(), sdx = V::zero();
    for (int64_t j = 0; j < s; j += W) {
      int64_t k = s - j < W ? s - j : W;
      F gv = k == W ? V::load(g + j) : V::load_n(g + j, k);
      F xv = k == W ? V::load(p + j) : V::load_n(p + j, k, mean);
      sdy = V::add(sdy, gv);
      sdx = V::fmadd(gv, V::sub(xv, vm), sdx);
    }
    total_dy += V::reduce_add(sdy);
    total_dx += V::reduce_add(sdx);
  }
  const float sum_dy = static_cast<float>(total_dy), sum_dy_xhat = static_cast<float>(total_dx) * invstd;
  if (dgamma) *dgamma = sum_dy_xhat;
  if (dbeta) *dbeta = sum_dy;
  const float count = static_cast<float>(n * s);
  const float a = gamma * invstd;
  const float b = training ? -a * invstd * sum_dy_xhat / count : 0.0f;
  const float cc = training ? -a * sum_dy / count : 0.0f;
  const F va = V::set1(a), vb = V::set1(b), vc = V::set1(cc);
  for (int64_t i = 0; i < n; ++i) {
    const T* p = x + i * stride;
    const T* g = dy + i * stride;
    T* q = dx + i * stride;
    for (int64_t j = 0; j < s; j += W) {
      int64_t k = s - j < W ? s - j : W;
      F gv = k == W ? V::load(g + j) : V::load_n(g + j, k);
      F xv = k == W ? V::load(p + j) : V::load_n(p + j, k);
      F v = V::fmadd(va, gv, V::fmadd(vb, V::sub(xv, vm), vc));
      if (k == W)
        V::store(q + j, v);
      else
        V::store_n(q + j, v, k);
    }
  }
}

template <class V, class T>
void backward_typed(const T* x, const T* dy, int64_t n, int64_t c, int64_t s, const float* gamma, const float* mean,
                    const float* invstd, bool training, T* dx, float* dgamma, float* dbeta, float* ws) {
  if (s > 1) {
    parallel_for(0, c, grain_for<V>(2 * n * s), [&](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch)
        backward_channel<V>(x + ch * s, dy + ch * s, n, c, s, gamma ? gamma[ch] : 1.0f, mean[ch], invstd[ch], training,
                            dx + ch * s, dgamma ? dgamma + ch : nullptr, dbeta ? dbeta + ch : nullptr);
    });
    return;
  }
  float* sum_dy = ws;
  float* sum_dxm = ws + c;  // sum dy * (x - mean)
  float* ca = ws + 2 * c;
  float* cb = ws + 3 * c;
  float* cc = ws + 4 * c;
  column_stats<V, 2>(x, dy, n, c, mean, sum_dy, sum_dxm);
  const float count = static_cast<float>(n);
  for (int64_t ch = 0; ch < c; ++ch) {
    const float sdx = sum_dxm[ch] * invstd[ch];
    if (dgamma) dgamma[ch] = sdx;
    if (dbeta) dbeta[ch] = sum_dy[ch];
    const float a = (gamma ? gamma[ch] : 1.0f) * invstd[ch];
    ca[ch] = a;
    cb[ch] = training ? -a * invstd[ch] * sdx / count : 0.0f;
    cc[ch] = training ? -a * sum_dy[ch] / count : 0.0f;
  }
  using F = typename V::F;
  parallel_for(0, n, grain_for<V>(2 * c), [&](int64_t r0, int64_t r1) {
    const int nv = static_cast<int>((c + V::kWidth - 1) / V::kWidth);
    for (int64_t r = r0; r < r1; ++r)
      for (int k = 0; k < nv; ++k) {
        F gv = load_cols<V>(dy + r * c, k, c), xv = load_cols<V>(x + r * c, k, c);
        F d = V::sub(xv, load_cols<V>(mean, k, c));
        F v = V::fmadd(load_cols<V>(ca, k, c), gv, V::fmadd(load_cols<V>(cb, k, c), d, load_cols<V>(cc, k, c)));
        store_cols<V>(dx + r * c, k, c, v);
      }
  });
}

template <class V>
void train_forward_entry(const void* x, DType dtype, int64_t n, int64_t c, int64_t s, const float* gamma,
                         const float* beta, float eps, void* y, float* mean, float* invstd, float* var, float* ws) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    train_forward_typed<V>(static_cast<const T*>(x), n, c, s, gamma, beta, eps, static_cast<T*>(y), mean, invstd, var,
                           ws);
  });
}

template <class V>
void apply_entry(const void* x, DType dtype, int64_t n, int64_t c, int64_t s, const float* mean, const float* scale,
                 const float* shift, void* y) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    apply_typed<V>(static_cast<const T*>(x), n, c, s, mean, scale, shift, static_cast<T*>(y));
  });
}

template <class V>
void backward_entry(const void* x, const void* dy, DType dtype, int64_t n, int64_t c, int64_t s, const float* gamma,
                    const float* mean, const float* invstd, bool training, void* dx, float* dgamma, float* dbeta,
                    float* ws) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    backward_typed<V>(static_cast<const T*>(x), static_cast<const T*>(dy), n, c, s, gamma, mean, invstd, training,
                      static_cast<T*>(dx), dgamma, dbeta, ws);
  });
}

template <class V>
BatchNormKernels make_batchnorm_kernels() {
  return {train_forward_entry<V>, apply_entry<V>, backward_entry<V>};
}

}  // namespace demi::kernels::cpu_internal
