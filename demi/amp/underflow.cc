#include "demi/amp/underflow.h"

#include <cmath>

#include "demi/core/error.h"
#include "demi/core/half.h"
#include "demi/core/tensor.h"

namespace demi::amp {

void UnderflowWatch::on_op(const ops::OpEvent& e) {
  if (!e.backward) return;
  int64_t nz = 0, sub = 0;
  for (const Tensor& g : e.outputs) {
    if (!g.defined() || g.dtype() != DType::kF16) continue;
    const uint16_t* p = static_cast<const uint16_t*>(g.raw_data());
    for (int64_t i = 0; i < g.numel(); ++i) {
      const uint16_t bits = p[i] & 0x7fff;
      if (bits == 0) continue;
      ++nz;
      sub += (bits & 0x7c00) == 0;  // exponent field 0: subnormal
    }
  }
  nonzero_ += nz;
  subnormal_ += sub;
  if (nz >= 64) {
    const double share = static_cast<double>(sub) / static_cast<double>(nz);
    if (share > worst_share_) {
      worst_share_ = share;
      worst_ = str_cat("backward of ", ops::op_name(e.op), e.layer && *e.layer ? str_cat(" in layer '", e.layer, "'") : "");
    }
  }
}

}  // namespace demi::amp
