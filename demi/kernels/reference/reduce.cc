#include "demi/kernels/reference/reduce.h"

#include <cmath>

#include "demi/core/error.h"

namespace demi::kernels::ref {

template <typename T, typename Out>
void reduce_sum(const T* x, AxisView v, Out* y) {
  using A = AccT<T>;
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t i = 0; i < v.inner; ++i) {
      SumT acc = 0;
      for (int64_t a = 0; a < v.axis; ++a) acc += static_cast<A>(x[(o * v.axis + a) * v.inner + i]);
      y[o * v.inner + i] = Out(static_cast<A>(acc));
    }
}

template <typename T, typename Out>
void reduce_mean(const T* x, AxisView v, Out* y) {
  using A = AccT<T>;
  DEMI_CHECK(v.axis > 0, "reduce_mean: the reduced axis is empty");
  A scale = A(1) / static_cast<A>(v.axis);
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t i = 0; i < v.inner; ++i) {
      SumT acc = 0;
      for (int64_t a = 0; a < v.axis; ++a) acc += static_cast<A>(x[(o * v.axis + a) * v.inner + i]);
      y[o * v.inner + i] = Out(static_cast<A>(acc) * scale);
    }
}

template <typename T, typename Out>
void reduce_max(const T* x, AxisView v, Out* y, int64_t* argmax) {
  using A = AccT<T>;
  DEMI_CHECK(v.axis > 0, "reduce_max: the reduced axis is empty");
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t i = 0; i < v.inner; ++i) {
      int64_t best = 0;
      A m = static_cast<A>(x[o * v.axis * v.inner + i]);
      for (int64_t a = 1; a < v.axis && !std::isnan(m); ++a) {
        A val = static_cast<A>(x[(o * v.axis + a) * v.inner + i]);
        if (val > m || std::isnan(val)) {
          m = val;
          best = a;
        }
      }
      if (y) y[o * v.inner + i] = Out(m);
      if (argmax) argmax[o * v.inner + i] = best;
    }
}

#define DEMI_INSTANTIATE(T, Out)                                          \
  template void reduce_sum<T, Out>(const T*, AxisView, Out*);             \
  template void reduce_mean<T, Out>(const T*, AxisView, Out*);            \
  template void reduce_max<T, Out>(const T*, AxisView, Out*, int64_t*);
DEMI_INSTANTIATE(float, float)
DEMI_INSTANTIATE(double, double)
DEMI_INSTANTIATE(Half, Half)
DEMI_INSTANTIATE(BFloat16, BFloat16)
DEMI_INSTANTIATE(Half, float)
DEMI_INSTANTIATE(BFloat16, float)
#undef DEMI_INSTANTIATE

}  // namespace demi::kernels::ref
