// Elementwise kernels written once against the vector traits V; instantiated by elementwise.cc
// (VecScalar, the portable fallback) and per ISA from the registry (cmake/demi_kernel_variants.cmake). The
// portable dispatcher in elementwise.cc checks arguments and builds the broadcast plan; the bodies here
// only compute.
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/common_impl.h"
#include "demi/kernels/reference/elementwise.h"

namespace demi::kernels::cpu_internal {

// A broadcast binary op after coalescing: the output is contiguous with dims[0..rank), and input k's
// element for output multi-index i is at sum_d i[d] * stride_k[d] (0 where k is broadcast). The innermost
// strides are 0 or 1. rank >= 1; dims never hold a 1 unless the whole output has one element.
struct BroadcastPlan {
  int rank = 1;
  int64_t dims[Shape::kMaxRank] = {1};
  int64_t a_stride[Shape::kMaxRank] = {1};
  int64_t b_stride[Shape::kMaxRank] = {1};
};

struct ElementwiseKernels {
  void (*binary)(BinaryOp op, DType dtype, const BroadcastPlan& plan, const void* a, const void* b, void* out);
  void (*unary)(UnaryOp op, DType dtype, const void* x, void* y, int64_t n);
  void (*affine)(DType dtype, const void* x, float alpha, float beta, void* y, int64_t n);
  void (*axpy)(DType dtype, int64_t n, float alpha, const void* x, void* y);
};

const ElementwiseKernels& elementwise_kernels_scalar();
const ElementwiseKernels& elementwise_kernels_avx2();
const ElementwiseKernels& elementwise_kernels_avx512();

template <class V, BinaryOp kOp>
typename V::F apply_binary(typename V::F a, typename V::F b) {
  if constexpr (kOp == BinaryOp::kAdd) return V::add(a, b);
  if constexpr (kOp == BinaryOp::kSub) return V::sub(a, b);
  if constexpr (kOp == BinaryOp::kMul) return V::mul(a, b);
  if constexpr (kOp == BinaryOp::kDiv) return V::div(a, b);
}

// a, b (n) or one element broadcast -> out (n). kMode 0: both runs; 1: b is one element; 2: a is.
template <class V, class T, BinaryOp kOp, int kMode>
void binary_run(const T* a, const T* b, T* out, int64_t n) {
  constexpr int W = V::kWidth;
  typename V::F sa = V::zero(), sb = V::zero();
  if constexpr (kMode == 1) sb = V::set1(V::to_float(b[0]));
  if constexpr (kMode == 2) sa = V::set1(V::to_float(a[0]));
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    typename V::F va = kMode == 2 ? sa : V::load(a + i);
    typename V::F vb = kMode == 1 ? sb : V::load(b + i);
    V::store(out + i, apply_binary<V, kOp>(va, vb));
  }
  if (i < n) {
    typename V::F va = kMode == 2 ? sa : V::load_n(a + i, n - i, 1.0f);
    typename V::F vb = kMode == 1 ? sb : V::load_n(b + i, n - i, 1.0f);
    V::store_n(out + i, apply_binary<V, kOp>(va, vb), n - i);
  }
}

template <class V, class T, BinaryOp kOp, int kMode>
void binary_plan_typed(const BroadcastPlan& plan, const T* a, const T* b, T* out) {
  const int outer_rank = plan.rank - 1;
  const int64_t len = plan.dims[outer_rank];
  int64_t rows = 1;
  for (int d = 0; d < outer_rank; ++d) rows *= plan.dims[d];
  if (len >= 2 * kGrainElems) {
    // Long rows (a same-shape op is one row): chunks of rows run in parallel.
    const int64_t chunks = (len + kGrainElems - 1) / kGrainElems;
    parallel_for(0, rows * chunks, 1, [&](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t r = u / chunks, c0 = (u % chunks) * kGrainElems;
        const int64_t n = len - c0 < kGrainElems ? len - c0 : kGrainElems;
        int64_t rem = r, a_off = 0, b_off = 0;
        for (int d = outer_rank - 1; d >= 0; --d) {
          a_off += (rem % plan.dims[d]) * plan.a_stride[d];
          b_off += (rem % plan.dims[d]) * plan.b_stride[d];
          rem /= plan.dims[d];
        }
        binary_run<V, T, kOp, kMode>(a + a_off + (kMode == 2 ? 0 : c0), b + b_off + (kMode == 1 ? 0 : c0),
                                     out + r * len + c0, n);
      }
    });
    return;
  }
  parallel_for(0, rows, grain_for<V>(len), [&](int64_t r0, int64_t r1) {
    int64_t idx[Shape::kMaxRank] = {};
    int64_t rem = r0, a_off = 0, b_off = 0;
    for (int d = outer_rank - 1; d >= 0; --d) {
      idx[d] = rem % plan.dims[d];
      rem /= plan.dims[d];
      a_off += idx[d] * plan.a_stride[d];
      b_off += idx[d] * plan.b_stride[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      binary_run<V, T, kOp, kMode>(a + a_off, b + b_off, out + r * len, len);
      for (int d = outer_rank - 1; d >= 0; --d) {  // odometer step
        a_off += plan.a_stride[d];
        b_off += plan.b_stride[d];
        if (++idx[d] < plan.dims[d]) break;
        a_off -= idx[d] * plan.a_stride[d];
        b_off -= idx[d] * plan.b_stride[d];
        idx[d] = 0;
      }
    }
  });
}

template <class V, class T, BinaryOp kOp>
void binary_op_typed(const BroadcastPlan& plan, const T* a, const T* b, T* out) {
  const int inner = plan.rank - 1;
  if (plan.a_stride[inner] == plan.b_stride[inner])
    binary_plan_typed<V, T, kOp, 0>(plan, a, b, out);
  else if (plan.b_stride[inner] == 0)
    binary_plan_typed<V, T, kOp, 1>(plan, a, b, out);
  else
    binary_plan_typed<V, T, kOp, 2>(plan, a, b, out);
}

template <class V>
void binary_entry(BinaryOp op, DType dtype, const BroadcastPlan& plan, const void* a, const void* b, void* out) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto pa = static_cast<const T*>(a);
    auto pb = static_cast<const T*>(b);
    auto po = static_cast<T*>(out);
    switch (op) {
      case BinaryOp::kAdd: binary_op_typed<V, T, BinaryOp::kAdd>(plan, pa, pb, po); break;
      case BinaryOp::kSub: binary_op_typed<V, T, BinaryOp::kSub>(plan, pa, pb, po); break;
      case BinaryOp::kMul: binary_op_typed<V, T, BinaryOp::kMul>(plan, pa, pb, po); break;
      case BinaryOp::kDiv: binary_op_typed<V, T, BinaryOp::kDiv>(plan, pa, pb, po); break;
    }
  });
}

template <class V, UnaryOp kOp>
typename V::F apply_unary(typename V::F x) {
  if constexpr (kOp == UnaryOp::kNeg) return V::neg(x);
  if constexpr (kOp == UnaryOp::kAbs) return V::abs(x);
  if constexpr (kOp == UnaryOp::kSquare) return V::mul(x, x);
  if constexpr (kOp == UnaryOp::kSqrt) return V::sqrt(x);
  if constexpr (kOp == UnaryOp::kExp) return V::exp(x);
  if constexpr (kOp == UnaryOp::kLog) return V::log(x);
  if constexpr (kOp == UnaryOp::kReciprocal) return V::div(V::set1(1.0f), x);
}

// Applies f (a V::F -> V::F functor) to x (n) -> y (n), in parallel chunks; y may be x.
template <class V, class T, class Fn>
void map_unary(const T* x, T* y, int64_t n, Fn f) {
  constexpr int W = V::kWidth;
  parallel_for(0, n, kGrainElems, [&](int64_t b, int64_t e) {
    int64_t i = b;
    for (; i + W <= e; i += W) V::store(y + i, f(V::load(x + i)));
    if (i < e) V::store_n(y + i, f(V::load_n(x + i, e - i, 1.0f)), e - i);
  });
}

template <class V>
void unary_entry(UnaryOp op, DType dtype, const void* x, void* y, int64_t n) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto px = static_cast<const T*>(x);
    auto py = static_cast<T*>(y);
    using F = typename V::F;
    switch (op) {
#define DEMI_UNARY_CASE(k) \
  case k: map_unary<V>(px, py, n, [](F v) { return apply_unary<V, k>(v); }); break;
      DEMI_UNARY_CASE(UnaryOp::kNeg)
      DEMI_UNARY_CASE(UnaryOp::kAbs)
      DEMI_UNARY_CASE(UnaryOp::kSquare)
      DEMI_UNARY_CASE(UnaryOp::kSqrt)
      DEMI_UNARY_CASE(UnaryOp::kExp)
      DEMI_UNARY_CASE(UnaryOp::kLog)
      DEMI_UNARY_CASE(UnaryOp::kReciprocal)
#undef DEMI_UNARY_CASE
    }
  });
}

// y = alpha * x + beta, rounded twice in f32 as the reference does (no FMA contraction).
template <class V>
void affine_entry(DType dtype, const void* x, float alpha, float beta, void* y, int64_t n) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    using F = typename V::F;
    F va = V::set1(alpha), vb = V::set1(beta);
    map_unary<V>(static_cast<const T*>(x), static_cast<T*>(y), n, [=](F v) { return V::add(V::mul(va, v), vb); });
  });
}

// y += alpha * x
template <class V>
void axpy_entry(DType dtype, int64_t n, float alpha, const void* x, void* y) {
  visit_float<V>(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = V::kWidth;
    auto px = static_cast<const T*>(x);
    auto py = static_cast<T*>(y);
    typename V::F va = V::set1(alpha);
    parallel_for(0, n, kGrainElems, [&](int64_t b, int64_t e) {
      int64_t i = b;
      for (; i + W <= e; i += W) V::store(py + i, V::add(V::load(py + i), V::mul(va, V::load(px + i))));
      if (i < e)
        V::store_n(py + i, V::add(V::load_n(py + i, e - i), V::mul(va, V::load_n(px + i, e - i))), e - i);
    });
  });
}

template <class V>
ElementwiseKernels make_elementwise_kernels() {
  return {binary_entry<V>, unary_entry<V>, affine_entry<V>, axpy_entry<V>};
}

}  // namespace demi::kernels::cpu_internal
