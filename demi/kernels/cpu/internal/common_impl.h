// Pieces shared by the ISA-generic kernel templates (*_impl.h): the dtype switch and the row helpers
// every family uses. Everything is a template on the vector traits V (vec_scalar.h and the vec_<isa>.h), so
// each ISA's instantiations get distinct symbols; nothing here may be a plain inline function or use a
// standard-library template that portable code also instantiates (an out-of-line copy compiled with
// AVX-512 could be picked by the linker for portable callers).
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/half.h"

namespace demi::kernels::cpu_internal {

// Elements per parallel chunk for memory-bound loops: large enough that a chunk outlasts the fork.
inline constexpr int64_t kGrainElems = 1 << 15;

// Calls fn(T{}) with T the storage type of a floating dtype the fast kernels run (f32, bf16, f16).
template <class V, class Fn>
void visit_float(DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32: fn(float{}); return;
    case DType::kBF16: fn(BFloat16{}); return;
    case DType::kF16: fn(Half{}); return;
    default: return;  // the portable dispatcher has checked the dtype
  }
}

// At least 1: the number of units per parallel chunk when each unit covers `work` elements.
template <class V>
int64_t grain_for(int64_t work) {
  return work >= kGrainElems ? 1 : (work <= 0 ? kGrainElems : kGrainElems / work);
}

// Sum of n elements of p (f32 accumulation in 4 x V::kWidth lanes) added into acc.
template <class V, class T>
void accumulate_run(typename V::F acc[4], const T* p, int64_t n) {
  constexpr int W = V::kWidth;
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    acc[0] = V::add(acc[0], V::load(p + i));
    acc[1] = V::add(acc[1], V::load(p + i + W));
    acc[2] = V::add(acc[2], V::load(p + i + 2 * W));
    acc[3] = V::add(acc[3], V::load(p + i + 3 * W));
  }
  for (; i + W <= n; i += W) acc[0] = V::add(acc[0], V::load(p + i));
  if (i < n) acc[1] = V::add(acc[1], V::load_n(p + i, n - i));
}

template <class V>
float reduce_acc(const typename V::F acc[4]) {
  return V::reduce_add(V::add(V::add(acc[0], acc[1]), V::add(acc[2], acc[3])));
}

// Sum of n elements of p in f32 (fresh accumulators: callers add runs up in f64).
template <class V, class T>
float sum_run(const T* p, int64_t n) {
  typename V::F acc[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
  accumulate_run<V>(acc, p, n);
  return reduce_acc<V>(acc);
}

// Rows (or reduced indices) per f32 block in column accumulations: each block's sum starts from zero and
// is added to the running total, so the rounding error grows with kRowBlock + rows / kRowBlock, not rows.
inline constexpr int64_t kRowBlock = 64;

// The maximum of n >= 1 elements (a NaN is ignored here; callers that need it see it in a later sum).
template <class V, class T>
float max_run(const T* p, int64_t n) {
  constexpr int W = V::kWidth;
  typename V::F m = V::set1(-__builtin_inff());
  int64_t i = 0;
  for (; i + W <= n; i += W) m = V::max(V::load(p + i), m);
  if (i < n) m = V::max(V::load_n(p + i, n - i, -__builtin_inff()), m);
  return V::reduce_max(m);
}

}  // namespace demi::kernels::cpu_internal
