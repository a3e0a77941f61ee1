#include "demi/kernels/reference/loss.h"

#include <cmath>
#include <vector>

#include "demi/core/error.h"

namespace demi::kernels {

std::string_view reduction_name(Reduction r) {
  switch (r) {
    case Reduction::kNone: return "none";
    case Reduction::kMean: return "mean";
    case Reduction::kSum: return "sum";
  }
  return "?";
}

namespace ref {
namespace {

template <typename T>
AccT<T> row_lse(const T* x, int64_t c) {
  using A = AccT<T>;
  A m = -INFINITY;
  for (int64_t j = 0; j < c; ++j)
    if (static_cast<A>(x[j]) > m) m = static_cast<A>(x[j]);
  SumT s = 0;
  for (int64_t j = 0; j < c; ++j) s += std::exp(static_cast<A>(x[j]) - m);
  return m + std::log(static_cast<A>(s));
}

template <typename A>
void reduce_rows(const std::vector<A>& rows, Reduction r, A* loss) {
  if (r == Reduction::kNone) {
    for (size_t i = 0; i < rows.size(); ++i) loss[i] = rows[i];
    return;
  }
  SumT s = 0;
  for (A v : rows) s += v;
  loss[0] = static_cast<A>(r == Reduction::kMean ? s / static_cast<SumT>(rows.size()) : s);
}

// The factor each row's gradient is scaled by.
template <typename A>
A row_grad(const A* dloss, Reduction r, int64_t i, int64_t n) {
  if (r == Reduction::kNone) return dloss[i];
  return r == Reduction::kMean ? dloss[0] / static_cast<A>(n) : dloss[0];
}

template <typename L>
void check_label(L label, int64_t row, int64_t c) {
  DEMI_CHECK(label >= 0 && static_cast<int64_t>(label) < c, "softmax_cross_entropy: label ", label, " of row ", row,
             " is out of range for ", c, " classes (expected 0 <= label < ", c, ")");
}

}  // namespace

template <typename T, typename L>
void softmax_cross_entropy_sparse_forward(const T* logits, const L* labels, CrossEntropyParams p, AccT<T>* loss,
                                          AccT<T>* lse) {
  using A = AccT<T>;
  std::vector<A> rows(static_cast<size_t>(p.n));
  for (int64_t i = 0; i < p.n; ++i) {
    check_label(labels[i], i, p.c);
    A l = row_lse(logits + i * p.c, p.c);
    if (lse) lse[i] = l;
    rows[static_cast<size_t>(i)] = l - static_cast<A>(logits[i * p.c + static_cast<int64_t>(labels[i])]);
  }
  reduce_rows(rows, p.reduction, loss);
}

template <typename T, typename L>
void softmax_cross_entropy_sparse_backward(const T* logits, const L* labels, const AccT<T>* lse,
                                           const AccT<T>* dloss, CrossEntropyParams p, T* dlogits) {
  using A = AccT<T>;
  for (int64_t i = 0; i < p.n; ++i) {
    check_label(labels[i], i, p.c);
    const T* x = logits + i * p.c;
    A l = lse ? lse[i] : row_lse(x, p.c);
    A g = row_grad(dloss, p.reduction, i, p.n);
    for (int64_t j = 0; j < p.c; ++j) {
      A onehot = j == static_cast<int64_t>(labels[i]) ? A(1) : A(0);
      dlogits[i * p.c + j] = T((std::exp(static_cast<A>(x[j]) - l) - onehot) * g);
    }
  }
}

template <typename T, typename P>
void softmax_cross_entropy_dense_forward(const T* logits, const P* probs, CrossEntropyParams p, AccT<T>* loss,
                                         AccT<T>* lse) {
  using A = AccT<T>;
  std::vector<A> rows(static_cast<size_t>(p.n));
  for (int64_t i = 0; i < p.n; ++i) {
    A l = row_lse(logits + i * p.c, p.c);
    if (lse) lse[i] = l;
    SumT sp = 0, spx = 0;
    for (int64_t j = 0; j < p.c; ++j) {
      A pj = static_cast<A>(probs[i * p.c + j]);
      sp += pj;
      spx += pj * static_cast<A>(logits[i * p.c + j]);
    }
    rows[static_cast<size_t>(i)] = l * static_cast<A>(sp) - static_cast<A>(spx);
  }
  reduce_rows(rows, p.reduction, loss);
}

template <typename T, typename P>
void softmax_cross_entropy_dense_backward(const T* logits, const P* probs, const AccT<T>* lse, const AccT<T>* dloss,
                                          CrossEntropyParams p, T* dlogits) {
  using A = AccT<T>;
  for (int64_t i = 0; i < p.n; ++i) {
    const T* x = logits + i * p.c;
    A l = lse ? lse[i] : row_lse(x, p.c);
    A g = row_grad(dloss, p.reduction, i, p.n);
    SumT sum_p = 0;
    for (int64_t j = 0; j < p.c; ++j) sum_p += static_cast<A>(probs[i * p.c + j]);
    A sp = static_cast<A>(sum_p);
    for (int64_t j = 0; j < p.c; ++j) {
      A pj = static_cast<A>(probs[i * p.c + j]);
      dlogits[i * p.c + j] = T((std::exp(static_cast<A>(x[j]) - l) * sp - pj) * g);
    }
  }
}

template <typename T>
void mse_forward(const T* x, const T* target, int64_t n, Reduction r, AccT<T>* loss) {
  using A = AccT<T>;
  std::vector<A> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    A d = static_cast<A>(x[i]) - static_cast<A>(target[i]);
    rows[static_cast<size_t>(i)] = d * d;
  }
  reduce_rows(rows, r, loss);
}

template <typename T>
void mse_backward(const T* x, const T* target, int64_t n, Reduction r, const AccT<T>* dloss, T* dx, T* dtarget) {
  using A = AccT<T>;
  for (int64_t i = 0; i < n; ++i) {
    A d = static_cast<A>(x[i]) - static_cast<A>(target[i]);
    A g = A(2) * d * row_grad(dloss, r, i, n);
    dx[i] = T(g);
    if (dtarget) dtarget[i] = T(-g);
  }
}

#define DEMI_INSTANTIATE_T(T)                                                                                  \
  template void mse_forward<T>(const T*, const T*, int64_t, Reduction, AccT<T>*);                              \
  template void mse_backward<T>(const T*, const T*, int64_t, Reduction, const AccT<T>*, T*, T*);
#define DEMI_INSTANTIATE_TL(T, L)                                                                              \
  template void softmax_cross_entropy_sparse_forward<T, L>(const T*, const L*, CrossEntropyParams, AccT<T>*,   \
                                                           AccT<T>*);                                          \
  template void softmax_cross_entropy_sparse_backward<T, L>(const T*, const L*, const AccT<T>*, const AccT<T>*, \
                                                            CrossEntropyParams, T*);
#define DEMI_INSTANTIATE_TP(T, P)                                                                              \
  template void softmax_cross_entropy_dense_forward<T, P>(const T*, const P*, CrossEntropyParams, AccT<T>*,    \
                                                          AccT<T>*);                                           \
  template void softmax_cross_entropy_dense_backward<T, P>(const T*, const P*, const AccT<T>*, const AccT<T>*, \
                                                           CrossEntropyParams, T*);
#define DEMI_INSTANTIATE(T)     \
  DEMI_INSTANTIATE_T(T)         \
  DEMI_INSTANTIATE_TL(T, int32_t) \
  DEMI_INSTANTIATE_TL(T, int64_t) \
  DEMI_INSTANTIATE_TP(T, T)
DEMI_INSTANTIATE(float)
DEMI_INSTANTIATE(double)
DEMI_INSTANTIATE(Half)
DEMI_INSTANTIATE(BFloat16)
DEMI_INSTANTIATE_TP(Half, float)
DEMI_INSTANTIATE_TP(BFloat16, float)
#undef DEMI_INSTANTIATE
#undef DEMI_INSTANTIATE_TP
#undef DEMI_INSTANTIATE_TL
#undef DEMI_INSTANTIATE_T

}  // namespace ref
}  // namespace demi::kernels
