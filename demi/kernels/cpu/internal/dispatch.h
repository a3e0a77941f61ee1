// One kernel-selection mechanism for the CPU kernels (the idea of PyTorch's DispatchStub): a kernel family
// lists the variants it has, one per CpuLevel, and get() returns the best one at or below cpu_level().
// Adding an AVX2, AVX-512 or AVX512-BF16 variant of a family is one more entry where the family's table is
// defined (its portable .cc file) and one ISA file; no caller changes. The number of levels is derived from
// the enum (kNumCpuLevels), never typed by hand.
//
//   const GemmKernels& gemm_kernels() {
//     static const KernelTable<GemmKernels> table{{CpuLevel::kScalar, gemm_kernels_scalar},
//                                                 {CpuLevel::kAvx512, gemm_kernels_avx512}};
//     return table.get();
//   }
#pragma once

#include <array>
#include <initializer_list>
#include <utility>

#include "demi/core/cpu.h"

namespace demi::kernels::cpu_internal {

inline constexpr int kNumCpuLevels = static_cast<int>(CpuLevel::kLast) + 1;

// Kernels: the family's table type; Args: what its getters take (a dtype slot, say), usually nothing.
template <typename Kernels, typename... Args>
class KernelTable {
 public:
  using Getter = const Kernels& (*)(Args...);

  // Every entry's level once; a kScalar entry is required (the fallback every machine runs).
  KernelTable(std::initializer_list<std::pair<CpuLevel, Getter>> entries) {
    for (const auto& [level, getter] : entries) getters_[static_cast<size_t>(level)] = getter;
  }

  // The variant for `level`: the entry at that level or the nearest one below it.
  const Kernels& at(CpuLevel level, Args... args) const {
    for (int l = static_cast<int>(level); l >= 0; --l)
      if (getters_[static_cast<size_t>(l)]) return getters_[static_cast<size_t>(l)](args...);
    return getters_[0](args...);  // unreachable with a kScalar entry
  }
  const Kernels& get(Args... args) const { return at(cpu_level(), args...); }

 private:
  std::array<Getter, kNumCpuLevels> getters_{};
};

}  // namespace demi::kernels::cpu_internal
