// The per-ISA tables of activation kernels behind demi/kernels/cpu/activation.h. Each variant fills one
// table (activation.cc the portable one; the others are instantiated per ISA from the registry,
// cmake/demi_kernel_variants.cmake); the dispatcher picks a table from demi::cpu_level() once per call and
// splits the work over demi's thread pool.
#pragma once

#include <cstdint>

#include "demi/kernels/reference/activation.h"

namespace demi::kernels::cpu_internal {

// Storage dtypes the fast kernels take, in table order.
enum class FloatSlot : int { kF32 = 0, kBF16 = 1, kF16 = 2, kLast = kF16 };
inline constexpr int kNumFloatSlots = static_cast<int>(FloatSlot::kLast) + 1;

struct ActivationKernels {
  // x (n) -> y (n); y may alias x
  using Forward = void (*)(const void* x, void* y, int64_t n);
  // saved (n), dy (n) -> dx (n); dx may alias dy
  using Backward = void (*)(const void* saved, const void* dy, void* dx, int64_t n);
  Forward forward[kNumActivations][kNumFloatSlots];
  Backward backward[kNumActivations][kNumFloatSlots];
  // ReLU's mask as bits (../activation.h: relu_mask, relu_backward_mask), over n elements that start at a
  // whole byte of `bits`.
  using Mask = void (*)(const void* y, uint8_t* bits, int64_t n);
  using MaskBackward = void (*)(const uint8_t* bits, const void* dy, void* dx, int64_t n);
  Mask relu_mask[kNumFloatSlots];
  MaskBackward relu_backward_mask[kNumFloatSlots];
};

const ActivationKernels& activation_kernels_scalar();
const ActivationKernels& activation_kernels_avx2();
const ActivationKernels& activation_kernels_avx512();

}  // namespace demi::kernels::cpu_internal
