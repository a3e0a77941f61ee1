// The optimizers' element-wise updates (demi/optim), on FP32 parameters, gradients and state: memory-bound
// loops (a Momentum update moves ~18 bytes per parameter) run at the CPU's widest vectors, bit for bit the
// portable variant's (cpu_internal::optimizer_kernels_scalar, the reference twin) at every level. One call
// updates n contiguous elements on the calling thread: the optimizer splits a parameter across threads and
// cache-sized chunks itself.
#pragma once

#include <cstdint>

#include "demi/kernels/optimizer_params.h"

namespace demi::kernels {

void momentum_update(const MomentumStep& s, float* v, float* p, const float* g, int64_t n);
// The same update on a gradient and state of other dtypes (MixedOperands), in one pass: the bits of
// widening them, momentum_update and rounding the state back.
void momentum_update_mixed(const MomentumStep& s, const MixedOperands& x, float* p, int64_t n);
void sgd_update(const SgdStep& s, float* p, const float* g, int64_t n);
void adam_update(const AdamStep& s, float* m, float* v, float* p, const float* g, int64_t n);

}  // namespace demi::kernels
