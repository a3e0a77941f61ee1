// Dropout forward and backward, reference twins (scalar, obviously right; the oracle for the fast
// kernels in demi/kernels/cpu/dropout.h and the f64 path).
//
// Element i is kept when its random word w = philox(seed, counter + i / 4)[i % 4] (demi::Generator's
// block) satisfies u32_to_unit_float(w) < keep_prob, i.e. (w >> 8) < ceil(keep_prob * 2^24): the mask
// depends only on (seed, counter, i), never on the thread count or the ISA. Kept elements are scaled by
// 1 / keep_prob (computed once in f32, or f64 for f64 data), dropped ones become 0.
//
// The mask is one bit per element: bit i % 8 of byte i / 8 is 1 where element i was kept
// (dropout_mask_bytes(n) bytes; the unused high bits of the last byte are 0).
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/rng.h"
#include "demi/kernels/reference/acc.h"

namespace demi::kernels {

struct DropoutParams {
  float keep_prob = 1.0f;  // in [0, 1]; 0 drops everything (y = 0), 1 keeps everything (y = x)
  uint64_t seed = 0;       // Philox key
  uint64_t counter = 0;    // first Philox counter; element i uses counter + i / 4
};

inline int64_t dropout_mask_bytes(int64_t n) { return (n + 7) / 8; }

// Reserves the counters that n elements use ((n + 3) / 4) from `gen` and returns the parameters.
DropoutParams make_dropout_params(float keep_prob, Generator& gen, int64_t n);

// Element i is kept iff (w >> 8) < dropout_threshold(keep_prob); 2^24 keeps every element.
uint32_t dropout_threshold(float keep_prob);

}  // namespace demi::kernels

namespace demi::kernels::ref {

// x (n) -> y (n), mask (dropout_mask_bytes(n)) u8 bits; T = float|double|Half|BFloat16
template <typename T>
void dropout_forward(const DropoutParams& p, const T* x, T* y, uint8_t* mask, int64_t n);

// dy (n), mask -> dx (n) = dy * mask / keep_prob
template <typename T>
void dropout_backward(float keep_prob, const T* dy, const uint8_t* mask, T* dx, int64_t n);

}  // namespace demi::kernels::ref
