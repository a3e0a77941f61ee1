#include "demi/kernels/reference/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "demi/core/half.h"
#include "demi/kernels/reference/acc.h"

namespace demi::kernels::ref {

template <typename S, typename P>
void attention_softmax_forward(const S* s, const S* mask, const AttentionSoftmaxParams& p, P* probs) {
  const int64_t sk = p.cols;
  std::vector<S> z(static_cast<size_t>(sk));
  for (int64_t n = 0; n < p.batch; ++n)
    for (int64_t i = 0; i < p.rows; ++i) {
      const S* srow = s + (n * p.rows + i) * sk;
      const S* mrow = mask ? mask + (n / p.heads) * p.mask_batch_stride + i * p.mask_row_stride : nullptr;
      P* prow = probs + (n * p.rows + i) * sk;
      S m = -std::numeric_limits<S>::infinity();
      const int64_t visible = p.visible_keys(i);
      for (int64_t j = 0; j < sk; ++j) {
        z[static_cast<size_t>(j)] = j >= visible ? -std::numeric_limits<S>::infinity()
                                                 : static_cast<S>(p.scale) * srow[j] + (mrow ? mrow[j] : S(0));
        if (z[static_cast<size_t>(j)] > m) m = z[static_cast<size_t>(j)];
      }
      if (m == -std::numeric_limits<S>::infinity()) {  // every key masked: attend to nothing
        for (int64_t j = 0; j < sk; ++j) prow[j] = P(S(0));
        continue;
      }
      SumT sum = 0;
      for (int64_t j = 0; j < sk; ++j) sum += std::exp(z[static_cast<size_t>(j)] - m);
      for (int64_t j = 0; j < sk; ++j)
        prow[j] = P(static_cast<S>(std::exp(z[static_cast<size_t>(j)] - m) / sum));
    }
}

template <typename S, typename P>
void attention_softmax_backward(const P* probs, const S* dprobs, const AttentionSoftmaxParams& p, P* ds) {
  const int64_t sk = p.cols;
  for (int64_t r = 0; r < p.batch * p.rows; ++r) {
    const P* pr = probs + r * sk;
    const S* gr = dprobs + r * sk;
    const int64_t visible = p.visible_keys(r % p.rows);  // hidden keys: p = 0, so ds = 0
    SumT dot = 0;
    for (int64_t j = 0; j < visible; ++j) dot += static_cast<S>(pr[j]) * gr[j];
    for (int64_t j = 0; j < sk; ++j)
      ds[r * sk + j] = j >= visible ? P(S(0))
                                    : P(static_cast<S>(p.scale) * static_cast<S>(pr[j]) * (gr[j] - static_cast<S>(dot)));
  }
}

#define DEMI_INSTANTIATE(S, P)                                                                              \
  template void attention_softmax_forward<S, P>(const S*, const S*, const AttentionSoftmaxParams&, P*);     \
  template void attention_softmax_backward<S, P>(const P*, const S*, const AttentionSoftmaxParams&, P*);
DEMI_INSTANTIATE(float, float)
DEMI_INSTANTIATE(float, BFloat16)
DEMI_INSTANTIATE(float, Half)
DEMI_INSTANTIATE(double, double)
#undef DEMI_INSTANTIATE

}  // namespace demi::kernels::ref
