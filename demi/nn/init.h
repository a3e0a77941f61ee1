// Parameter initializers, in MindSpore's vocabulary (mindspore.common.initializer), drawn from demi's
// counter-based generator so a seed gives the same weights whatever the thread count.
#pragma once

#include <cstdint>

#include "demi/core/rng.h"
#include "demi/core/tensor.h"

namespace demi::nn {

struct Initializer {
  enum class Kind { kZero, kOne, kConstant, kNormal, kTruncatedNormal, kUniform, kHeUniform, kHeNormal, kXavierUniform };
  Kind kind = Kind::kZero;
  double a = 0;      // HeUniform/HeNormal: negative slope; Uniform: scale (U(-a, a)); Constant: value
  double sigma = 0;  // Normal / TruncatedNormal
  double mean = 0;

  static Initializer Zero() { return {Kind::kZero}; }
  static Initializer One() { return {Kind::kOne}; }
  static Initializer Constant(double v) { return {Kind::kConstant, v}; }
  static Initializer Normal(double sigma = 0.01, double mean = 0) { return {Kind::kNormal, 0, sigma, mean}; }
  // Normal(mean, sigma) redrawn outside [mean - 2 sigma, mean + 2 sigma].
  static Initializer TruncatedNormal(double sigma = 0.01) { return {Kind::kTruncatedNormal, 0, sigma, 0}; }
  static Initializer Uniform(double scale = 0.07) { return {Kind::kUniform, scale}; }
  // U(-b, b), b = sqrt(6 / ((1 + a^2) fan_in)); MindSpore's (and PyTorch's) layer default uses a = sqrt(5).
  static Initializer HeUniform(double negative_slope = 0) { return {Kind::kHeUniform, negative_slope}; }
  static Initializer HeNormal(double negative_slope = 0) { return {Kind::kHeNormal, negative_slope}; }
  static Initializer XavierUniform(double gain = 1) { return {Kind::kXavierUniform, gain}; }
};

// fan_in and fan_out of a weight shape: (out, in) for Dense, (out, in/groups, kh, kw) for Conv2d.
int64_t fan_in(const Shape& shape);
int64_t fan_out(const Shape& shape);

// A new f32 tensor of `shape` filled by `init` from `gen`.
Tensor initialize(const Shape& shape, const Initializer& init, Generator& gen);

}  // namespace demi::nn
