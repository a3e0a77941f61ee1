// Dispatch of the activation kernels (activation.h) and their portable variant: activation_impl.h with
// one-lane vectors and the <cmath> functions.
#include "demi/kernels/cpu/activation.h"

#include <algorithm>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/activation_impl.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"

namespace demi::kernels {
namespace cpu_internal {

const ActivationKernels& activation_kernels_scalar() {
  static const ActivationKernels kernels = make_activation_kernels<VecScalar>();
  return kernels;
}

}  // namespace cpu_internal

namespace {

// Elements per chunk below which one thread does the whole tensor (the transcendental ones cost about
// as much per element as the memory traffic, so they pay for threads a little earlier than ReLU).
constexpr int64_t kGrain = 1 << 14;

const cpu_internal::ActivationKernels& kernels_for_level() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<ActivationKernels> table{DEMI_KERNEL_TABLE_ENTRIES(activation)};
  return table.get();
}

// The table column of a storage dtype, or -1 for f64 (the reference) / a demi::Error for the rest.
int slot_of(const char* op, Activation a, DType dtype) {
  switch (dtype) {
    case DType::kF32: return 0;
    case DType::kBF16: return 1;
    case DType::kF16: return 2;
    case DType::kF64: return -1;
    default: break;
  }
  DEMI_CHECK(false, op, " (", activation_name(a), "): expected float32, bfloat16, float16 or float64 data, got ",
             dtype_name(dtype));
  return -1;
}

}  // namespace

void activation_forward(Activation a, DType dtype, const void* x, void* y, int64_t n) {
  int slot = slot_of("activation_forward", a, dtype);
  DEMI_CHECK(n >= 0, "activation_forward (", activation_name(a), "): negative element count ", n);
  if (slot < 0) return ref::activation_forward(a, dtype, x, y, n);
  auto fn = kernels_for_level().forward[static_cast<int>(a)][slot];
  size_t es = dtype_size(dtype);
  const char* xb = static_cast<const char*>(x);
  char* yb = static_cast<char*>(y);
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { fn(xb + b * es, yb + b * es, e - b); });
}

void activation_backward(Activation a, DType dtype, const void* saved, const void* dy, void* dx, int64_t n) {
  int slot = slot_of("activation_backward", a, dtype);
  DEMI_CHECK(n >= 0, "activation_backward (", activation_name(a), "): negative element count ", n);
  if (slot < 0) return ref::activation_backward(a, dtype, saved, dy, dx, n);
  auto fn = kernels_for_level().backward[static_cast<int>(a)][slot];
  size_t es = dtype_size(dtype);
  const char* sb = static_cast<const char*>(saved);
  const char* dyb = static_cast<const char*>(dy);
  char* dxb = static_cast<char*>(dx);
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { fn(sb + b * es, dyb + b * es, dxb + b * es, e - b); });
}

// The mask's kernels run on whole bytes of bits per thread: 8 elements per byte.
void relu_mask(DType dtype, const void* y, uint8_t* bits, int64_t n) {
  const int slot = slot_of("relu_mask", Activation::kReLU, dtype);
  DEMI_CHECK(n >= 0, "relu_mask: negative element count ", n);
  if (slot < 0) return ref::relu_mask(dtype, y, bits, n);
  auto fn = kernels_for_level().relu_mask[slot];
  const size_t es = dtype_size(dtype);
  const char* yb = static_cast<const char*>(y);
  parallel_for(0, ref::relu_mask_bytes(n), kGrain / 8, [&](int64_t b, int64_t e) {
    fn(yb + 8 * b * es, bits + b, std::min(n, 8 * e) - 8 * b);
  });
}

void relu_backward_mask(DType dtype, const uint8_t* bits, const void* dy, void* dx, int64_t n) {
  const int slot = slot_of("relu_backward_mask", Activation::kReLU, dtype);
  DEMI_CHECK(n >= 0, "relu_backward_mask: negative element count ", n);
  if (slot < 0) return ref::relu_backward_mask(dtype, bits, dy, dx, n);
  auto fn = kernels_for_level().relu_backward_mask[slot];
  const size_t es = dtype_size(dtype);
  const char* dyb = static_cast<const char*>(dy);
  char* dxb = static_cast<char*>(dx);
  parallel_for(0, ref::relu_mask_bytes(n), kGrain / 8, [&](int64_t b, int64_t e) {
    fn(bits + b, dyb + 8 * b * es, dxb + 8 * b * es, std::min(n, 8 * e) - 8 * b);
  });
}

}  // namespace demi::kernels
