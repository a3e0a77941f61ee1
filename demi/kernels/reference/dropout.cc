#include "demi/kernels/reference/dropout.h"

#include <cmath>

#include "demi/core/error.h"
#include "demi/core/half.h"

namespace demi::kernels {

uint32_t dropout_threshold(float keep_prob) {
  DEMI_CHECK(keep_prob >= 0.0f && keep_prob <= 1.0f, "dropout: keep_prob must be in [0, 1], got ", keep_prob);
  // u = (w >> 8) * 2^-24 < p  <=>  (w >> 8) < ceil(p * 2^24), exactly (p * 2^24 is exact in double).
  return static_cast<uint32_t>(std::ceil(static_cast<double>(keep_prob) * 16777216.0));
}

DropoutParams make_dropout_params(float keep_prob, Generator& gen, int64_t n) {
  DEMI_CHECK(n >= 0, "dropout: expected a non-negative element count, got ", n);
  dropout_threshold(keep_prob);  // validates keep_prob
  DropoutParams p;
  p.keep_prob = keep_prob;
  p.seed = gen.seed();
  p.counter = gen.reserve(static_cast<uint64_t>((n + 3) / 4));
  return p;
}

}  // namespace demi::kernels

namespace demi::kernels::ref {
namespace {

template <typename A>
A dropout_scale(float keep_prob) {
  return keep_prob > 0.0f ? A(1) / static_cast<A>(keep_prob) : A(0);
}

}  // namespace

template <typename T>
void dropout_forward(const DropoutParams& p, const T* x, T* y, uint8_t* mask, int64_t n) {
  using A = AccT<T>;
  uint32_t threshold = dropout_threshold(p.keep_prob);
  A scale = dropout_scale<A>(p.keep_prob);
  Generator gen(p.seed);
  for (int64_t i = 0; i < dropout_mask_bytes(n); ++i) mask[i] = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w = gen.block(p.counter + static_cast<uint64_t>(i / 4))[static_cast<size_t>(i % 4)];
    bool keep = (w >> 8) < threshold;
    if (keep) mask[i / 8] = static_cast<uint8_t>(mask[i / 8] | (1u << (i % 8)));
    y[i] = T(keep ? static_cast<A>(x[i]) * scale : A(0));
  }
}

template <typename T>
void dropout_backward(float keep_prob, const T* dy, const uint8_t* mask, T* dx, int64_t n) {
  using A = AccT<T>;
  dropout_threshold(keep_prob);  // validates keep_prob
  A scale = dropout_scale<A>(keep_prob);
  for (int64_t i = 0; i < n; ++i) {
    bool keep = (mask[i / 8] >> (i % 8)) & 1u;
    dx[i] = T(keep ? static_cast<A>(dy[i]) * scale : A(0));
  }
}

template void dropout_forward<float>(const DropoutParams&, const float*, float*, uint8_t*, int64_t);
template void dropout_forward<double>(const DropoutParams&, const double*, double*, uint8_t*, int64_t);
template void dropout_forward<Half>(const DropoutParams&, const Half*, Half*, uint8_t*, int64_t);
template void dropout_forward<BFloat16>(const DropoutParams&, const BFloat16*, BFloat16*, uint8_t*, int64_t);
template void dropout_backward<float>(float, const float*, const uint8_t*, float*, int64_t);
template void dropout_backward<double>(float, const double*, const uint8_t*, double*, int64_t);
template void dropout_backward<Half>(float, const Half*, const uint8_t*, Half*, int64_t);
template void dropout_backward<BFloat16>(float, const BFloat16*, const uint8_t*, BFloat16*, int64_t);

}  // namespace demi::kernels::ref
