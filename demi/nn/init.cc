#include "demi/nn/init.h"

#include <cmath>

namespace demi::nn {

int64_t fan_in(const Shape& shape) {
  DEMI_CHECK(shape.rank() >= 1, "fan_in of a scalar shape");
  if (shape.rank() == 1) return shape[0];
  int64_t receptive = 1;
  for (int i = 2; i < shape.rank(); ++i) receptive *= shape[i];
  return shape[1] * receptive;
}

int64_t fan_out(const Shape& shape) {
  DEMI_CHECK(shape.rank() >= 1, "fan_out of a scalar shape");
  if (shape.rank() == 1) return shape[0];
  int64_t receptive = 1;
  for (int i = 2; i < shape.rank(); ++i) receptive *= shape[i];
  return shape[0] * receptive;
}

Tensor initialize(const Shape& shape, const Initializer& init, Generator& gen) {
  using K = Initializer::Kind;
  switch (init.kind) {
    case K::kZero: return zeros(shape);
    case K::kOne: return ones(shape);
    case K::kConstant: return full(shape, init.a);
    case K::kNormal: return normal(shape, init.mean, init.sigma, gen);
    case K::kUniform: return uniform(shape, -init.a, init.a, gen);
    case K::kTruncatedNormal: {
      Tensor t = normal(shape, 0.0, 1.0, gen);
      float* p = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        while (std::abs(p[i]) > 2.0f) p[i] = gen.next_normal();
        p[i] = static_cast<float>(init.mean + init.sigma * p[i]);
      }
      return t;
    }
    case K::kHeUniform: {
      double gain = std::sqrt(2.0 / (1.0 + init.a * init.a));
      double bound = gain * std::sqrt(3.0 / static_cast<double>(fan_in(shape)));
      return uniform(shape, -bound, bound, gen);
    }
    case K::kHeNormal: {
      double gain = std::sqrt(2.0 / (1.0 + init.a * init.a));
      return normal(shape, 0.0, gain / std::sqrt(static_cast<double>(fan_in(shape))), gen);
    }
    case K::kXavierUniform: {
      double bound = init.a * std::sqrt(6.0 / static_cast<double>(fan_in(shape) + fan_out(shape)));
      return uniform(shape, -bound, bound, gen);
    }
  }
  return zeros(shape);
}

}  // namespace demi::nn
