// Overflow attribution: which op first produced an Inf or NaN in a step.
//
// MindSpore, PyTorch, Apex and Keras name at most the first non-finite parameter *gradient*, which says
// nothing about where the overflow began. demi re-runs an overflowing step (same batch, same parameters,
// same loss scale, same random numbers; running statistics and generators restored afterwards) with an
// observer that checks every op's outputs, forward then backward, in the order they run, and reports the
// first op whose outputs hold a non-finite value: its layer, its direction, its dtype and the values it
// saw. Steps that do not overflow cost nothing: only overflowing steps are re-run (TrainStep does it when
// attribution is on, the default).
#pragma once

#include <cstdint>
#include <string>

#include "demi/core/dtype.h"
#include "demi/ops/observer.h"

namespace demi::amp {

struct OverflowSource {
  bool found = false;
  std::string layer;       // the layer's path ("" for the root network, "(outside any layer)" for none)
  std::string layer_type;  // "Dense" (filled by TrainStep from the network)
  ops::Op op = ops::Op::kCast;
  bool backward = false;
  DType dtype = DType::kF32;  // the op's compute dtype (backward: the incoming gradients')
  DType output_dtype = DType::kF32;  // the dtype of its first non-finite output
  int64_t numel = 0;          // values in its outputs
  int64_t inf = 0;            // of which +-Inf
  int64_t nan = 0;            // of which NaN
  double max_abs_finite = 0;  // the largest finite |value| among its outputs
  double max_abs_input = 0;   // the largest finite |value| among its inputs
  bool input_nonfinite = false;  // an input was already non-finite (it came from outside the observed ops)
  // A forward op computing in float16 read a finite input past float16's range (65504), which reads as Inf:
  // the data batch, which the first layer reads rounded with no Cast op (ops' x_round), or a value cast in.
  bool input_past_f16_range = false;

  // "forward Dense in layer 'fc2' (Dense), float16: 37 of 8192 values Inf, 0 NaN; largest finite
  // |output| 6.5e+04, largest finite |input| 812" ("float32 -> float16" when the output dtype differs)
  std::string describe() const;
  // What adaptive AMP promotes: the layer path ("fc2"), "" for the root.
  const std::string& promotion_key() const { return layer; }
};

// Sees op events and keeps the first one whose outputs are not all finite.
class OverflowFinder : public ops::OpObserver {
 public:
  void on_op(const ops::OpEvent& event) override;
  const OverflowSource& source() const { return source_; }
  bool found() const { return source_.found; }

 private:
  OverflowSource source_;
};

}  // namespace demi::amp
