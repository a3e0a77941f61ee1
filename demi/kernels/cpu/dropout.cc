// Dispatch of the dropout kernels (dropout.h) and their portable variant (one Philox block per four
// elements through demi::philox4x32).
#include "demi/kernels/cpu/dropout.h"

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/half.h"
#include "demi/core/parallel.h"
#include "demi/core/rng.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/dropout_kernels.h"

namespace demi::kernels {
namespace cpu_internal {
namespace {

template <typename T>
void forward_portable(const void* xv, void* yv, uint8_t* mask, int64_t first_block, int64_t end_block, int64_t n,
                      uint64_t seed, uint64_t counter, uint32_t threshold, float scale) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  int64_t begin = first_block * kDropoutBlock;
  int64_t end = end_block * kDropoutBlock < n ? end_block * kDropoutBlock : n;
  const std::array<uint32_t, 2> key = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  std::array<uint32_t, 4> words{};
  uint8_t byte = 0;
  for (int64_t i = begin; i < end; ++i) {
    if (i % 4 == 0) {
      uint64_t c = counter + static_cast<uint64_t>(i / 4);
      words = philox4x32({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0, 0}, key);
    }
    bool keep = (words[static_cast<size_t>(i % 4)] >> 8) < threshold;
    y[i] = T(keep ? static_cast<float>(x[i]) * scale : 0.0f);
    byte = static_cast<uint8_t>(byte | (keep ? 1u << (i % 8) : 0u));
    if (i % 8 == 7 || i + 1 == end) {
      mask[i / 8] = byte;
      byte = 0;
    }
  }
}

template <typename T>
void backward_portable(const void* dyv, const uint8_t* mask, void* dxv, int64_t first_block, int64_t end_block,
                       int64_t n, float scale) {
  const T* dy = static_cast<const T*>(dyv);
  T* dx = static_cast<T*>(dxv);
  int64_t end = end_block * kDropoutBlock < n ? end_block * kDropoutBlock : n;
  for (int64_t i = first_block * kDropoutBlock; i < end; ++i) {
    bool keep = (mask[i / 8] >> (i % 8)) & 1u;
    dx[i] = T(keep ? static_cast<float>(dy[i]) * scale : 0.0f);
  }
}

}  // namespace

const DropoutKernels& dropout_kernels_scalar(int slot) {
  static const DropoutKernels kernels[3] = {{&forward_portable<float>, &backward_portable<float>},
                                            {&forward_portable<BFloat16>, &backward_portable<BFloat16>},
                                            {&forward_portable<Half>, &backward_portable<Half>}};
  return kernels[slot];
}

}  // namespace cpu_internal

namespace {

// Blocks of 64 elements per chunk below which one thread does the whole call (Philox makes dropout
// compute-heavy for a pointwise op, so threads pay early).
constexpr int64_t kGrainBlocks = 128;

int slot_of(const char* op, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::kF32: return 0;
    case DType::kBF16: return 1;
    case DType::kF16: return 2;
    case DType::kF64: return -1;
    default: break;
  }
  DEMI_CHECK(false, op, ": expected float32, bfloat16, float16 or float64 data, got ", dtype_name(dtype), " (", n,
             " elements)");
  return -1;
}

const cpu_internal::DropoutKernels& kernels_for(int slot) {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<DropoutKernels, int> table{DEMI_KERNEL_TABLE_ENTRIES(dropout)};
  return table.get(slot);
}

float dropout_scale(float keep_prob) { return keep_prob > 0.0f ? 1.0f / keep_prob : 0.0f; }

}  // namespace

void dropout_forward(const DropoutParams& p, DType dtype, const void* x, void* y, uint8_t* mask, int64_t n) {
  const char* op = "dropout_forward";
  int slot = slot_of(op, dtype, n);
  DEMI_CHECK(n >= 0, op, ": negative element count ", n);
  uint32_t threshold = dropout_threshold(p.keep_prob);  // validates keep_prob
  if (slot < 0) return ref::dropout_forward(p, static_cast<const double*>(x), static_cast<double*>(y), mask, n);
  auto fn = kernels_for(slot).forward;
  float scale = dropout_scale(p.keep_prob);
  int64_t blocks = (n + cpu_internal::kDropoutBlock - 1) / cpu_internal::kDropoutBlock;
  parallel_for(0, blocks, kGrainBlocks,
               [&](int64_t b, int64_t e) { fn(x, y, mask, b, e, n, p.seed, p.counter, threshold, scale); });
}

void dropout_backward(float keep_prob, DType dtype, const void* dy, const uint8_t* mask, void* dx, int64_t n) {
  const char* op = "dropout_backward";
  int slot = slot_of(op, dtype, n);
  DEMI_CHECK(n >= 0, op, ": negative element count ", n);
  dropout_threshold(keep_prob);  // validates keep_prob
  if (slot < 0)
    return ref::dropout_backward(keep_prob, static_cast<const double*>(dy), mask, static_cast<double*>(dx), n);
  auto fn = kernels_for(slot).backward;
  float scale = dropout_scale(keep_prob);
  int64_t blocks = (n + cpu_internal::kDropoutBlock - 1) / cpu_internal::kDropoutBlock;
  parallel_for(0, blocks, kGrainBlocks, [&](int64_t b, int64_t e) { fn(dy, mask, dx, b, e, n, scale); });
}

}  // namespace demi::kernels
