// The per-ISA dropout kernels behind demi/kernels/cpu/dropout.h. Work is split in blocks of 64 elements
// (16 Philox counters, 8 mask bytes), so that every thread starts on a whole mask byte.
#pragma once

#include <cstdint>

namespace demi::kernels::cpu_internal {

inline constexpr int64_t kDropoutBlock = 64;

struct DropoutKernels {
  // Elements [64 first_block, min(64 end_block, n)) of x -> y and their mask bits; element i uses Philox
  // counter `counter + i / 4`, word i % 4, keyed by `seed`.
  void (*forward)(const void* x, void* y, uint8_t* mask, int64_t first_block, int64_t end_block, int64_t n,
                  uint64_t seed, uint64_t counter, uint32_t threshold, float scale);
  // Elements [64 first_block, min(64 end_block, n)): dx = mask ? dy * scale : 0.
  void (*backward)(const void* dy, const uint8_t* mask, void* dx, int64_t first_block, int64_t end_block, int64_t n,
                   float scale);
};

// slot: 0 f32, 1 bf16, 2 f16.
const DropoutKernels& dropout_kernels_scalar(int slot);
const DropoutKernels& dropout_kernels_avx2(int slot);
const DropoutKernels& dropout_kernels_avx512(int slot);

}  // namespace demi::kernels::cpu_internal
