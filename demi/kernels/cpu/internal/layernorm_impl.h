// Layer-normalisation kernels written once against the vector traits V; instantiated by layernorm.cc
// (VecScalar) and per ISA from the registry (cmake/demi_kernel_variants.cmake). The portable dispatcher in
// layernorm.cc checks arguments and provides scratch memory.
//
// x is (R, D), normalised along D. Rows are independent: forward and the dx part of backward run rows in
// parallel, each row's passes (sum; sum of squared deviations — two-pass; normalise) back to back while the
// row is in L1. dgamma and dbeta are column sums over rows: each block of kRowBlock rows sums into its own
// f32 partial (blocks in parallel), and the partials are added in block order, so the result depends on
// neither the thread count nor the scheduling.
#pragma once

#include <cmath>
#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/common_impl.h"

namespace demi::kernels::cpu_internal {

struct LayerNormKernels {
  // x (r, d) -> y (r, d) in x's dtype; mean, rstd (r) f32; gamma, beta (d) f32 (nullable)
  void (*forward)(const void* x, DType dtype, int64_t r, int64_t d, const float* gamma, const float* beta, float eps,
                  void* y, float* mean, float* rstd);
  // x, dy (r, d) -> dx (r, d); dgamma, dbeta (d) f32 (nullable); ws: 2 * d * ceil(r / kRowBlock) floats
  void (*backward)(const void* x, const void* dy, DType dtype, int64_t r, int64_t d, const float* gamma,
                   const float* mean, const float* rstd, void* dx, float* dgamma, float* dbeta, float* ws);
};

const LayerNormKernels& layernorm_kernels_scalar();
const LayerNormKernels& layernorm_kernels_avx2();
const LayerNormKernels& layernorm_kernels_avx512();

template <class V, class T>
void layer_norm_row(const T* x, int64_t d, const float* gamma, const float* beta, float eps, T* y, float* mean_out,
                    float* rstd_out) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  const float mean = sum_run<V>(x, d) / static_cast<float>(d);
  const F vm = V::set1(mean);
  F sq0 = V::zero(), sq1 = V::zero();
  int64_t j = 0;
  for (; j + 2 * W <= d; j += 2 * W) {
    F d0 = V::sub(V::load(x + j), vm), d1 = V::sub(V::load(x + j + W), vm);
    sq0 = V::fmadd(d0, d0, sq0);
    sq1 = V::fmadd(d1, d1, sq1);
  }
  for (; j < d; j += W) {
    F dv = V::sub(d - j >= W ? V::load(x + j) : V::load_n(x + j, d - j, mean), vm);  // padding: deviation 0
    sq0 = V::fmadd(dv, dv, sq0);
  }
  const float var = V::reduce_add(V::add(sq0, sq1)) / static_cast<float>(d);
  const float rstd = 1.0f / std::sqrt(var + eps);
  const F vr = V::set1(rstd);
  for (j = 0; j < d; j += W) {
    const int64_t left = d - j;
    F xv = left >= W ? V::load(x + j) : V::load_n(x + j, left);
    F v = V::mul(V::sub(xv, vm), vr);
    if (gamma) v = V::mul(v, left >= W ? V::load(gamma + j) : V::load_n(gamma + j, left));
    if (beta) v = V::add(v, left >= W ? V::load(beta + j) : V::load_n(beta + j, left));
    if (left >= W)
      V::store(y + j, v);
    else
      V::store_n(y + j, v, left);
  }
  *mean_out = mean;
  *rstd_out = rstd;
}

template <class V, class T>
void ln_forward_typed(const T* x, int64_t r, int64_t d, const float* gamma, const float* beta, float eps, T* y,
                   float* mean, float* rstd) {
  parallel_for(0, r, grain_for<V>(d), [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) layer_norm_row<V>(x + i * d, d, gamma, beta, eps, y + i * d, mean + i, rstd + i);
  });
}

// One row's dx, and (when pdg is set) its dy * xhat and dy added into the partial column sums pdg, pdb.
template <class V, class T>
void layer_norm_backward_row(const T* x, const T* dy, int64_t d, const float* gamma, float mean, float rstd, T* dx,
                             float* pdg, float* pdb) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  const F vm = V::set1(mean), vr = V::set1(rstd);
  F sg = V::zero(), sgx = V::zero();
  for (int64_t j = 0; j < d; j += W) {
    const int64_t left = d - j;
    F xhat = V::mul(V::sub(left >= W ? V::load(x + j) : V::load_n(x + j, left, mean), vm), vr);  // padding: 0
    F g = left >= W ? V::load(dy + j) : V::load_n(dy + j, left);
    if (pdg) {
      if (left >= W) {
        V::store(pdg + j, V::fmadd(g, xhat, V::load(pdg + j)));
        V::store(pdb + j, V::add(g, V::load(pdb + j)));
      } else {
        V::store_n(pdg + j, V::fmadd(g, xhat, V::load_n(pdg + j, left)), left);
        V::store_n(pdb + j, V::add(g, V::load_n(pdb + j, left)), left);
      }
    }
    if (gamma) g = V::mul(g, left >= W ? V::load(gamma + j) : V::load_n(gamma + j, left));
    sg = V::add(sg, g);
    sgx = V::fmadd(g, xhat, sgx);
  }
  const float inv_d = 1.0f / static_cast<float>(d);
  const F mg = V::set1(V::reduce_add(sg) * inv_d), mgx = V::set1(V::reduce_add(sgx) * inv_d);
  for (int64_t j = 0; j < d; j += W) {
    const int64_t left = d - j;
    F xhat = V::mul(V::sub(left >= W ? V::load(x + j) : V::load_n(x + j, left, mean), vm), vr);
    F g = left >= W ? V::load(dy + j) : V::load_n(dy + j, left);
    if (gamma) g = V::mul(g, left >= W ? V::load(gamma + j) : V::load_n(gamma + j, left));
    F v = V::mul(vr, V::sub(V::sub(g, mg), V::mul(xhat, mgx)));
    if (left >= W)
      V::store(dx + j, v);
    else
      V::store_n(dx + j, v, left);
  }
}

template <class V, class T>
void ln_backward_typed(const T* x, const T* dy, int64_t r, int64_t d, const float* gamma, const float* mean,
                    const float* rstd, T* dx, float* dgamma, float* dbeta, float* ws) {
  const bool sums = dgamma != nullptr || dbeta != nullptr;
  const int64_t blocks = (r + kRowBlock - 1) / kRowBlock;
  parallel_for(0, blocks, grain_for<V>(kRowBlock * d), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* pdg = sums ? ws + b * 2 * d : nullptr;
      float* pdb = sums ? pdg + d : nullptr;
      if (sums)
        for (int64_t j = 0; j < 2 * d; ++j) pdg[j] = 0.0f;
      const int64_t e = (b + 1) * kRowBlock < r ? (b + 1) * kRowBlock : r;
      for (int64_t i = b * kRowBlock; i < e; ++i)
        layer_norm_backward_row<V>(x + i * d, dy + i * d, d, gamma, mean[i], rstd[i], dx + i * d, pdg, pdb);
    }
  });
  if (!sums) return;
  // Partials added in block order (columns in parallel): deterministic whatever the thread count.
  parallel_for(0, d, grain_for<V>(blocks * 2), [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      float sg = 0.0f, sb = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        sg += ws[b * 2 * d + j];
        sb += ws[b * 2 * d + d + j];
      }
      if (dgamma) dgamma[j] = sg;
      if (dbeta) dbeta[j] = sb;
    }
  });
}

template <class V>
void layer_norm_forward_entry(const void* x, DType dtype, int64_t r, int64_t d, const float* gamma, const float* beta,
                              float eps, void* y, float* mean, float* rstd) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    ln_forward_typed<V>(static_cast<const T*>(x), r, d, gamma, beta, eps, static_cast<T*>(y), mean, rstd);
  });
}

template <class V>
void layer_norm_backward_entry(const void* x, const void* dy, DType dtype, int64_t r, int64_t d, const float* gamma,
                               const float* mean, const float* rstd, void* dx, float* dgamma, float* dbeta,
                               float* ws) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    ln_backward_typed<V>(static_cast<const T*>(x), static_cast<const T*>(dy), r, d, gamma, mean, rstd,
                      static_cast<T*>(dx), dgamma, dbeta, ws);
  });
}

template <class V>
LayerNormKernels make_layernorm_kernels() {
  return {layer_norm_forward_entry<V>, layer_norm_backward_entry<V>};
}

}  // namespace demi::kernels::cpu_internal
