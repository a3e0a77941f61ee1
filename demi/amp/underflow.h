// Gradient underflow, measured: float16 holds values down to 2^-24, and below 2^-14 only as subnormals
// with fewer significant bits; a gradient scaled too little lands there, loses precision, and the
// smallest of it becomes exactly zero — training slows down without any overflow to warn about.
//
// UnderflowWatch observes a step's backward ops and counts, among the nonzero values of every gradient
// written in float16, those in the subnormal range. A healthy loss scale keeps that share near zero; the
// Model samples one step in every 100 and warns once when the share reaches 1% (or when a gradient
// written in float16 is entirely zero while its inputs were not). bfloat16 has FP32's range: not counted.
#pragma once

#include <cstdint>
#include <string>

#include "demi/ops/observer.h"

namespace demi::amp {

class UnderflowWatch : public ops::OpObserver {
 public:
  void on_op(const ops::OpEvent& event) override;
  int64_t nonzero() const { return nonzero_; }
  int64_t subnormal() const { return subnormal_; }
  double subnormal_share() const { return nonzero_ > 0 ? static_cast<double>(subnormal_) / static_cast<double>(nonzero_) : 0; }
  // The op whose float16 gradients had the largest subnormal share (for the warning).
  const std::string& worst() const { return worst_; }
  double worst_share() const { return worst_share_; }

 private:
  int64_t nonzero_ = 0, subnormal_ = 0;
  std::string worst_;
  double worst_share_ = 0;
};

}  // namespace demi::amp
