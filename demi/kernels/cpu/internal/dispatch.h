// The CPU kernels' variant selection: the registry and KernelTable of demi/core/kernel_registry.h (one
// mechanism for core's conversions and every kernel family), named in the kernels' namespace.
#pragma once

#include "demi/core/kernel_registry.h"

namespace demi::kernels::cpu_internal {

using ::demi::KernelTable;
using ::demi::kNumCpuLevels;

}  // namespace demi::kernels::cpu_internal
