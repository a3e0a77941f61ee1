// AMP kernels written once against the vector traits V; instantiated by amp_kernels.cc (VecScalar) and
// per ISA from the registry (cmake/demi_kernel_variants.cmake). The portable dispatcher cuts the list of
// buffers into fixed blocks (AmpBlock); blocks run in parallel and report per block, so one pass covers
// every gradient and the result does not depend on the thread count.
#pragma once

#include <cstdint>
#include <type_traits>

#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/common_impl.h"

namespace demi::kernels::cpu_internal {

// A block of one gradient buffer: n values of dtype (f32, f16 or bf16) at data.
struct AmpBlock {
  void* data;
  int64_t n;
  DType dtype;
};

struct AmpKernels {
  // Each block: f32 g *= inv_scale (no writes when scale is false; f16 and bf16 blocks are never written);
  // nonfinite[b] = 1 if any product g * inv_scale is inf/NaN.
  void (*unscale)(const AmpBlock* blocks, int64_t count, float inv_scale, bool scale, uint8_t* nonfinite);
  // Each block: partial[b] = sum of squares of the values widened to f32, f32 accumulation.
  void (*sum_squares)(const AmpBlock* blocks, int64_t count, float* partial);
};

const AmpKernels& amp_kernels_scalar();
const AmpKernels& amp_kernels_avx2();
const AmpKernels& amp_kernels_avx512();

// kMul: the check is on g * s; kStore: the products are written back (f32 only).
template <class V, class T, bool kMul, bool kStore>
bool unscale_block(T* p, int64_t n, typename V::F s) {
  static_assert(!kStore || std::is_same_v<T, float>, "only f32 gradients are unscaled in place");
  constexpr int W = V::kWidth;
  using F = typename V::F;
  F acc0 = V::zero(), acc1 = V::zero();
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    F v0 = V::load(p + i), v1 = V::load(p + i + W);
    if constexpr (kMul) {
      v0 = V::mul(v0, s);
      v1 = V::mul(v1, s);
    }
    if constexpr (kStore) {
      V::store(p + i, v0);
      V::store(p + i + W, v1);
    }
    acc0 = V::nonfinite_acc(acc0, v0);
    acc1 = V::nonfinite_acc(acc1, v1);
  }
  for (; i < n; i += W) {
    int64_t k = n - i < W ? n - i : W;
    F v = V::load_n(p + i, k);
    if constexpr (kMul) v = V::mul(v, s);
    if constexpr (kStore) V::store_n(p + i, v, k);
    acc0 = V::nonfinite_acc(acc0, v);
  }
  return V::is_finite_acc(V::add(acc0, acc1));
}

template <class V, class T>
bool check_low_block(const AmpBlock& b, bool scale, typename V::F s) {
  T* p = static_cast<T*>(b.data);
  return scale ? unscale_block<V, T, true, false>(p, b.n, s) : unscale_block<V, T, false, false>(p, b.n, s);
}

template <class V>
bool unscale_one(const AmpBlock& b, bool scale, typename V::F s) {
  switch (b.dtype) {
    case DType::kF16: return check_low_block<V, Half>(b, scale, s);
    case DType::kBF16: return check_low_block<V, BFloat16>(b, scale, s);
    default: {
      float* p = static_cast<float*>(b.data);
      return scale ? unscale_block<V, float, true, true>(p, b.n, s) : unscale_block<V, float, false, false>(p, b.n, s);
    }
  }
}

template <class V, class T>
float sum_squares_block(const T* p, int64_t n) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
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
  return V::reduce_add(V::add(V::add(a0, a1), V::add(a2, a3)));
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
      nonfinite[b] = unscale_one<V>(blocks[b], scale, s) ? 0 : 1;
    }
  });
}

template <class V>
void sum_squares_entry(const AmpBlock* blocks, int64_t count, float* partial) {
  parallel_for(0, count, block_grain<V>(blocks, count), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const AmpBlock& blk = blocks[b];
      switch (blk.dtype) {
        case DType::kF16: partial[b] = sum_squares_block<V>(static_cast<const Half*>(blk.data), blk.n); break;
        case DType::kBF16: partial[b] = sum_squares_block<V>(static_cast<const BFloat16*>(blk.data), blk.n); break;
        default: partial[b] = sum_squares_block<V>(static_cast<const float*>(blk.data), blk.n); break;
      }
    }
  });
}

template <class V>
AmpKernels make_amp_kernels() {
  return {unscale_entry<V>, sum_squares_entry<V>};
}

}  // namespace demi::kernels::cpu_internal
