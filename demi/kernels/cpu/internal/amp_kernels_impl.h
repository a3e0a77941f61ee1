// AMP kernels written once against the vector traits V; instantiated by amp_kernels.cc (VecScalar) and
// amp_kernels_avx512.cc (VecAvx512). The portable dispatcher cuts the list of buffers into fixed blocks
// (AmpBlock); blocks run in parallel and report per block, so one pass covers every gradient and the
// result does not depend on the thread count.
#pragma once

#include <cstdint>

#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/common_impl.h"

namespace demi::kernels::cpu_internal {

struct AmpBlock {
  float* data;
  int64_t n;
};

struct AmpKernels {
  // Each block: g *= inv_scale (no writes when scale is false); nonfinite[b] = 1 if any product is inf/NaN.
  void (*unscale)(const AmpBlock* blocks, int64_t count, float inv_scale, bool scale, uint8_t* nonfinite);
  // Each block: partial[b] = sum of squares, f32 accumulation.
  void (*sum_squares)(const AmpBlock* blocks, int64_t count, float* partial);
};

const AmpKernels& amp_kernels_scalar();
const AmpKernels& amp_kernels_avx2();
const AmpKernels& amp_kernels_avx512();

template <class V, bool kScale>
bool unscale_block(float* p, int64_t n, typename V::F s) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  F acc0 = V::zero(), acc1 = V::zero();
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    F v0 = V::load(p + i), v1 = V::load(p + i + W);
    if constexpr (kScale) {
      v0 = V::mul(v0, s);
      v1 = V::mul(v1, s);
      V::store(p + i, v0);
      V::store(p + i + W, v1);
    }
    acc0 = V::nonfinite_acc(acc0, v0);
    acc1 = V::nonfinite_acc(acc1, v1);
  }
  for (; i < n; i += W) {
    int64_t k = n - i < W ? n - i : W;
    F v = V::load_n(p + i, k);
    if constexpr (kScale) {
      v = V::mul(v, s);
      V::store_n(p + i, v, k);
    }
    acc0 = V::nonfinite_acc(acc0, v);
  }
  return V::is_finite_acc(V::add(acc0, acc1));
}

// Blocks per parallel chunk: all of them (no fork) when the whole list is small.
template <class V>
int64_t block_grain(const AmpBlock* blocks, int64_t count) {
  int64_t total = 0;
  for (int64_t b = 0; b < count; ++b) total += blocks[b].n;
  return total < 2 * kGrainElems ? (count > 0 ? count : 1) : 1;
}

template <class V>
void unscale_entry(const AmpBlock* blocks, int64_t count, float inv_scale, bool scale, uint8_t* nonfinite) {
  const typename V::F s = V::set1(inv_scale);
  parallel_for(0, count, block_grain<V>(blocks, count), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      bool finite = scale ? unscale_block<V, true>(blocks[b].data, blocks[b].n, s)
                          : unscale_block<V, false>(blocks[b].data, blocks[b].n, s);
      nonfinite[b] = finite ? 0 : 1;
    }
  });
}

template <class V>
void sum_squares_entry(const AmpBlock* blocks, int64_t count, float* partial) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  parallel_for(0, count, block_grain<V>(blocks, count), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* p = blocks[b].data;
      const int64_t n = blocks[b].n;
      F a0 = V::zero(), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();
      int64_t i = 0;
      for (; i + 4 * W <= n; i += 4 * W) {
        F v0 = V::load(p + i), v1 = V::load(p + i + W), v2 = V::load(p + i + 2 * W), v3 = V::load(p + i + 3 * W);
        a0 = V::fmadd(v0, v0, a0);
        a1 = V::fmadd(v1, v1, a1);
        a2 = V::fmadd(v2, v2, a2);
        a3 = V::fmadd(v3, v3, a3);
      }
      for (; i < n; i += W) {
        int64_t k = n - i < W ? n - i : W;
        F v = V::load_n(p + i, k);
        a0 = V::fmadd(v, v, a0);
      }
      partial[b] = V::reduce_add(V::add(V::add(a0, a1), V::add(a2, a3)));
    }
  });
}

template <class V>
AmpKernels make_amp_kernels() {
  return {unscale_entry<V>, sum_squares_entry<V>};
}

}  // namespace demi::kernels::cpu_internal
