#include "demi/kernels/reference/softmax.h"

#include <cmath>

namespace demi::kernels::ref {
namespace {

template <typename T, typename Out, bool kLog>
void forward(const T* x, AxisView v, Out* y) {
  using A = AccT<T>;
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t i = 0; i < v.inner; ++i) {
      auto at = [&](int64_t a) { return (o * v.axis + a) * v.inner + i; };
      A m = -INFINITY;
      for (int64_t a = 0; a < v.axis; ++a) {
        A val = static_cast<A>(x[at(a)]);
        if (val > m) m = val;
      }
      SumT sum = 0;
      for (int64_t a = 0; a < v.axis; ++a) sum += std::exp(static_cast<A>(x[at(a)]) - m);
      A s = static_cast<A>(sum), log_s = std::log(s);
      for (int64_t a = 0; a < v.axis; ++a) {
        A shifted = static_cast<A>(x[at(a)]) - m;
        y[at(a)] = Out(kLog ? shifted - log_s : std::exp(shifted) / s);
      }
    }
}

template <typename T, typename Out, bool kLog>
void backward(const Out* y, const Out* dy, AxisView v, T* dx) {
  using A = AccT<T>;
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t i = 0; i < v.inner; ++i) {
      auto at = [&](int64_t a) { return (o * v.axis + a) * v.inner + i; };
      SumT sum = 0;  // softmax: sum(dy * y); log-softmax: sum(dy)
      for (int64_t a = 0; a < v.axis; ++a)
        sum += kLog ? static_cast<A>(dy[at(a)]) : static_cast<A>(dy[at(a)]) * static_cast<A>(y[at(a)]);
      A dot = static_cast<A>(sum);
      for (int64_t a = 0; a < v.axis; ++a) {
        A yv = static_cast<A>(y[at(a)]), g = static_cast<A>(dy[at(a)]);
        dx[at(a)] = T(kLog ? g - std::exp(yv) * dot : yv * (g - dot));
      }
    }
}

}  // namespace

template <typename T, typename Out>
void softmax_forward(const T* x, AxisView v, Out* y) {
  forward<T, Out, false>(x, v, y);
}
template <typename T, typename Out>
void log_softmax_forward(const T* x, AxisView v, Out* y) {
  forward<T, Out, true>(x, v, y);
}
template <typename T, typename Out>
void softmax_backward(const Out* y, const Out* dy, AxisView v, T* dx) {
  backward<T, Out, false>(y, dy, v, dx);
}
template <typename T, typename Out>
void log_softmax_backward(const Out* y, const Out* dy, AxisView v, T* dx) {
  backward<T, Out, true>(y, dy, v, dx);
}

#define DEMI_INSTANTIATE(T, Out)                                                     \
  template void softmax_forward<T, Out>(const T*, AxisView, Out*);                   \
  template void log_softmax_forward<T, Out>(const T*, AxisView, Out*);               \
  template void softmax_backward<T, Out>(const Out*, const Out*, AxisView, T*);      \
  template void log_softmax_backward<T, Out>(const Out*, const Out*, AxisView, T*);
DEMI_INSTANTIATE(float, float)
DEMI_INSTANTIATE(double, double)
DEMI_INSTANTIATE(Half, Half)
DEMI_INSTANTIATE(BFloat16, BFloat16)
DEMI_INSTANTIATE(Half, float)
DEMI_INSTANTIATE(BFloat16, float)
#undef DEMI_INSTANTIATE

}  // namespace demi::kernels::ref
