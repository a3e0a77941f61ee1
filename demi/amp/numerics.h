// The numerics report: "which layer overflows, which gradients underflow?" — the question MindSpore and
// PyTorch users ask when FP16 training diverges or stalls, answered for one batch.
//
// It runs one forward and backward in FP32 (the true values, whatever the network's AMP level) and
// reports, per parameter, the fraction of gradient values that FP16 would flush to zero (|g * scale| below
// its smallest subnormal, 2^-24) or overflow (above 65504) at a given loss scale, and, per layer, the
// largest activation magnitude against FP16's 65504 (the largest output of the layer's own ops, or of its
// sub-layers', with fused layers run one by one so that each reports its own output). Parameters and their gradients are left as they were.
#pragma once

#include <string>
#include <vector>

#include "demi/nn/cell.h"

namespace demi::amp {

struct GradientNumerics {
  std::string name;             // parameter path
  int64_t numel = 0;
  double max_abs = 0;           // largest |g| (true, unscaled)
  double zero_fraction = 0;     // exactly zero already in FP32
  double underflow_fraction = 0;  // nonzero values FP16 would flush to zero at the scale
  double overflow_fraction = 0;   // values beyond 65504 at the scale
};

struct ActivationNumerics {
  std::string path;  // layer path ("features.0"), the root is ""
  std::string type;  // "Conv2d"
  double max_abs = 0;
  bool exceeds_fp16 = false;  // max_abs > 65504
};

struct NumericsReport {
  double loss_scale = 1;
  float loss = 0;
  std::vector<GradientNumerics> gradients;
  std::vector<ActivationNumerics> activations;
  std::string to_string() const;  // a readable table
};

NumericsReport analyze_numerics(nn::Cell& net, nn::LossCell& loss_fn, const Tensor& data, const Tensor& label,
                                double loss_scale);

}  // namespace demi::amp
