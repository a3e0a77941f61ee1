// The kernel-variant registry: every CPU kernel family and the ISA variants it has, declared once, here —
// core's conversions and the kernels module's families alike. A family's table (KernelTable below) is
// built from its entry, `demi info` prints the family x ISA matrix from it, and CMake reads the same lines
// to write the generated variants (cmake/demi_kernel_variants.cmake).
//
//   DEMI_KERNEL_FAMILIES(F): F(family, Kernels type, impl header of its generated variants (- : none), module)
//   DEMI_KERNELS_<family>(X): X(CpuLevel, getter, how) for each variant, lowest level first
//
// how: own — a body of its own (the family's <family>.cc for kScalar, else <family>_<isa>.cc); gen — the
// family's impl header instantiated with that ISA's vector type (VecAvx2, VecAvx512) by a source CMake
// writes into the build tree, `static const T k = make_<family>_kernels<Vec>(); return k;`, so no
// twelve-line file is copied per ISA. A getter returns `const Kernels&` (families with slots take an int).
//
// Adding a tier (AMX, say) is: the CpuLevel (core/cpu.h, with its detection and ISA flags), an X(...) entry
// here in each family that gets a variant, and the new bodies. Adding a family: an F(...) line, its
// DEMI_KERNELS_ line (a family in the list without one does not compile; one not in the list is a CMake
// error), and its portable body. Get a family's variant with DEMI_KERNEL_TABLE_ENTRIES:
//
//   const ActivationKernels& activation_kernels() {
//     static const KernelTable<ActivationKernels> table{DEMI_KERNEL_TABLE_ENTRIES(activation)};
//     return table.get();
//   }
#pragma once

#include <array>
#include <initializer_list>
#include <utility>
#include <vector>

#include "demi/core/cpu.h"

// clang-format off
#define DEMI_KERNEL_FAMILIES(F)                                          \
  F(convert, ConvertKernels, -, core)                                    \
  F(activation, ActivationKernels, activation_impl.h, kernels)           \
  F(amp, AmpKernels, amp_kernels_impl.h, kernels)                        \
  F(attention, AttentionKernels, attention_impl.h, kernels)              \
  F(batchnorm, BatchNormKernels, batchnorm_impl.h, kernels)              \
  F(elementwise, ElementwiseKernels, elementwise_impl.h, kernels)        \
  F(embedding, EmbeddingKernels, embedding_impl.h, kernels)              \
  F(layernorm, LayerNormKernels, layernorm_impl.h, kernels)              \
  F(loss, LossKernels, loss_impl.h, kernels)                             \
  F(reduce, ReduceKernels, reduce_impl.h, kernels)                       \
  F(softmax, SoftmaxKernels, softmax_impl.h, kernels)                    \
  F(gemm, GemmKernels, -, kernels)                                       \
  F(gemm_dot, GemmDotKernels, -, kernels)                                \
  F(gemm_outer, GemmOuterKernels, gemm_outer_impl.h, kernels)            \
  F(direct_conv, DirectConvKernels, -, kernels)                          \
  F(dropout, DropoutKernels, -, kernels)                                 \
  F(pool2x2, Pool2x2Kernels, -, kernels)                                 \
  F(peak, PeakKernels, -, kernels)                                       \
  F(f16_split, F16SplitKernels, -, kernels)                              \
  F(pool_strided, PoolStridedKernels, -, kernels)                        \
  F(optimizer, OptimizerKernels, optimizer_impl.h, kernels)

#define DEMI_KERNELS_convert(X) \
  X(kScalar, convert_kernels_scalar, own) \
  X(kAvx2, convert_kernels_avx2, own) \
  X(kAvx512, convert_kernels_avx512, own) \
  X(kAvx512Bf16, convert_kernels_avx512bf16, own)
#define DEMI_KERNELS_activation(X) \
  X(kScalar, activation_kernels_scalar, own) \
  X(kAvx2, activation_kernels_avx2, gen) \
  X(kAvx512, activation_kernels_avx512, gen)
#define DEMI_KERNELS_amp(X) \
  X(kScalar, amp_kernels_scalar, own) \
  X(kAvx2, amp_kernels_avx2, gen) \
  X(kAvx512, amp_kernels_avx512, gen)
#define DEMI_KERNELS_attention(X) \
  X(kScalar, attention_kernels_scalar, own) \
  X(kAvx2, attention_kernels_avx2, gen) \
  X(kAvx512, attention_kernels_avx512, gen)
#define DEMI_KERNELS_batchnorm(X) \
  X(kScalar, batchnorm_kernels_scalar, own) \
  X(kAvx2, batchnorm_kernels_avx2, gen) \
  X(kAvx512, batchnorm_kernels_avx512, gen)
#define DEMI_KERNELS_elementwise(X) \
  X(kScalar, elementwise_kernels_scalar, own) \
  X(kAvx2, elementwise_kernels_avx2, gen) \
  X(kAvx512, elementwise_kernels_avx512, gen)
#define DEMI_KERNELS_embedding(X) \
  X(kScalar, embedding_kernels_scalar, own) \
  X(kAvx2, embedding_kernels_avx2, gen) \
  X(kAvx512, embedding_kernels_avx512, gen)
#define DEMI_KERNELS_layernorm(X) \
  X(kScalar, layernorm_kernels_scalar, own) \
  X(kAvx2, layernorm_kernels_avx2, gen) \
  X(kAvx512, layernorm_kernels_avx512, gen)
#define DEMI_KERNELS_loss(X) \
  X(kScalar, loss_kernels_scalar, own) \
  X(kAvx2, loss_kernels_avx2, gen) \
  X(kAvx512, loss_kernels_avx512, gen)
#define DEMI_KERNELS_reduce(X) \
  X(kScalar, reduce_kernels_scalar, own) \
  X(kAvx2, reduce_kernels_avx2, gen) \
  X(kAvx512, reduce_kernels_avx512, gen)
#define DEMI_KERNELS_softmax(X) \
  X(kScalar, softmax_kernels_scalar, own) \
  X(kAvx2, softmax_kernels_avx2, gen) \
  X(kAvx512, softmax_kernels_avx512, gen)
#define DEMI_KERNELS_gemm(X) \
  X(kScalar, gemm_kernels_scalar, own) \
  X(kAvx2, gemm_kernels_avx2, own) \
  X(kAvx512, gemm_kernels_avx512, own) \
  X(kAvx512Bf16, gemm_kernels_avx512bf16, own)
#define DEMI_KERNELS_gemm_dot(X) \
  X(kScalar, gemm_dot_kernels_scalar, own) \
  X(kAvx2, gemm_dot_kernels_avx2, own) \
  X(kAvx512, gemm_dot_kernels_avx512, own)
#define DEMI_KERNELS_gemm_outer(X) \
  X(kScalar, gemm_outer_kernels_scalar, own) \
  X(kAvx2, gemm_outer_kernels_avx2, gen) \
  X(kAvx512, gemm_outer_kernels_avx512, gen)
#define DEMI_KERNELS_direct_conv(X) \
  X(kScalar, direct_conv_kernels_scalar, own) \
  X(kAvx512, direct_conv_kernels_avx512, own) \
  X(kAvx512Bf16, direct_conv_kernels_avx512bf16, own) \
  X(kAmx, direct_conv_kernels_amx, own)
#define DEMI_KERNELS_dropout(X) \
  X(kScalar, dropout_kernels_scalar, own) \
  X(kAvx2, dropout_kernels_avx2, own) \
  X(kAvx512, dropout_kernels_avx512, own)
#define DEMI_KERNELS_pool2x2(X) \
  X(kScalar, pool2x2_kernels_scalar, own) \
  X(kAvx2, pool2x2_kernels_avx2, own) \
  X(kAvx512, pool2x2_kernels_avx512, own)
#define DEMI_KERNELS_peak(X) \
  X(kScalar, peak_kernels_scalar, own) \
  X(kAvx2, peak_kernels_avx2, own) \
  X(kAvx512, peak_kernels_avx512, own) \
  X(kAvx512Bf16, peak_kernels_avx512bf16, own) \
  X(kAmx, peak_kernels_amx, own)
#define DEMI_KERNELS_f16_split(X) X(kScalar, f16_split_kernels_scalar, own) X(kAvx512, f16_split_kernels_avx512, own)
#define DEMI_KERNELS_optimizer(X) \
  X(kScalar, optimizer_kernels_scalar, own) \
  X(kAvx2, optimizer_kernels_avx2, gen) \
  X(kAvx512, optimizer_kernels_avx512, gen)
#define DEMI_KERNELS_pool_strided(X) \
  X(kScalar, pool_strided_kernels_scalar, own) \
  X(kAvx512, pool_strided_kernels_avx512, own)
// clang-format on

// {CpuLevel, getter} for each of the family's variants: a KernelTable's initializer.
#define DEMI_KERNEL_TABLE_ENTRY_(level, getter, how) {::demi::CpuLevel::level, getter},
#define DEMI_KERNEL_TABLE_ENTRIES(family) DEMI_KERNELS_##family(DEMI_KERNEL_TABLE_ENTRY_)

namespace demi {

inline constexpr int kNumCpuLevels = static_cast<int>(CpuLevel::kLast) + 1;

// One kernel-selection mechanism (the idea of PyTorch's DispatchStub): a family's table holds the variant
// of each level it has, and get() returns the best one at or below cpu_level().
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

// The registry as data: each family, its module, and per CpuLevel "own", "gen" or nullptr (none).
struct KernelFamilyInfo {
  const char* name;
  const char* module;
  std::array<const char*, kNumCpuLevels> variants{};
};

#define DEMI_KERNEL_HOW_(level, getter, how) f.variants[static_cast<size_t>(::demi::CpuLevel::level)] = #how;
#define DEMI_KERNEL_FAMILY_INFO_(family, type, impl, module) \
  [] {                                                       \
    KernelFamilyInfo f{#family, #module, {}};                \
    DEMI_KERNELS_##family(DEMI_KERNEL_HOW_) return f;        \
  }(),

inline std::vector<KernelFamilyInfo> kernel_families() {
  return {DEMI_KERNEL_FAMILIES(DEMI_KERNEL_FAMILY_INFO_)};
}

}  // namespace demi
