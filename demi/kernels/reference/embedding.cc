#include "demi/kernels/reference/embedding.h"

#include <type_traits>

#include "demi/core/half.h"

namespace demi::kernels::ref {

template <typename Id, typename T, typename Out>
void embedding_forward(const Id* ids, int64_t n, const T* table, int64_t dim, Out* y) {
  using Mid = std::conditional_t<std::is_same_v<T, double> || std::is_same_v<Out, double>, double, float>;
  for (int64_t i = 0; i < n; ++i) {
    const T* row = table + static_cast<int64_t>(ids[i]) * dim;
    for (int64_t j = 0; j < dim; ++j) y[i * dim + j] = Out(static_cast<Mid>(row[j]));
  }
}

template <typename Id, typename G, typename A>
void embedding_backward(const Id* ids, int64_t n, const G* dy, int64_t vocab, int64_t dim, A* dtable) {
  for (int64_t k = 0; k < vocab * dim; ++k) dtable[k] = A(0);
  for (int64_t i = 0; i < n; ++i) {
    A* row = dtable + static_cast<int64_t>(ids[i]) * dim;
    for (int64_t j = 0; j < dim; ++j) row[j] += static_cast<A>(dy[i * dim + j]);
  }
}

#define DEMI_INSTANTIATE_FWD(Id, T, Out) \
  template void embedding_forward<Id, T, Out>(const Id*, int64_t, const T*, int64_t, Out*);
#define DEMI_INSTANTIATE_TO(Id, T)  \
  DEMI_INSTANTIATE_FWD(Id, T, float)    \
  DEMI_INSTANTIATE_FWD(Id, T, BFloat16) \
  DEMI_INSTANTIATE_FWD(Id, T, Half)
#define DEMI_INSTANTIATE_ID(Id)                                          \
  DEMI_INSTANTIATE_TO(Id, float)                                         \
  DEMI_INSTANTIATE_TO(Id, BFloat16)                                      \
  DEMI_INSTANTIATE_TO(Id, Half)                                          \
  DEMI_INSTANTIATE_FWD(Id, double, double)                               \
  template void embedding_backward<Id, float, float>(const Id*, int64_t, const float*, int64_t, int64_t, float*); \
  template void embedding_backward<Id, BFloat16, float>(const Id*, int64_t, const BFloat16*, int64_t, int64_t,   \
                                                        float*);                                                \
  template void embedding_backward<Id, Half, float>(const Id*, int64_t, const Half*, int64_t, int64_t, float*);   \
  template void embedding_backward<Id, double, double>(const Id*, int64_t, const double*, int64_t, int64_t, double*);
DEMI_INSTANTIATE_ID(int32_t)
DEMI_INSTANTIATE_ID(int64_t)
#undef DEMI_INSTANTIATE_ID
#undef DEMI_INSTANTIATE_TO
#undef DEMI_INSTANTIATE_FWD

}  // namespace demi::kernels::ref
