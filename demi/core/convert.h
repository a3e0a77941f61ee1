// Bulk dtype conversion. f32 <-> f16 and f32 <-> bf16 have SIMD variants (F16C/AVX2, AVX-512,
// AVX512-BF16) chosen at run time by cpu_level(); every variant is bit-identical to the scalar
// conversions in half.h (round to nearest even, subnormals exact, overflow to inf, NaN kept quiet).
#pragma once

#include <cstdint>

#include "demi/core/cpu.h"
#include "demi/core/dtype.h"
#include "demi/core/half.h"

namespace demi {

// src (n, f32) -> dst (n, f16)
void convert_f32_to_f16(const float* src, Half* dst, int64_t n);
// src (n, f16) -> dst (n, f32)
void convert_f16_to_f32(const Half* src, float* dst, int64_t n);
// src (n, f32) -> dst (n, bf16)
void convert_f32_to_bf16(const float* src, BFloat16* dst, int64_t n);
// src (n, bf16) -> dst (n, f32)
void convert_bf16_to_f32(const BFloat16* src, float* dst, int64_t n);

// src (n, f32) -> dst (n, f32): the values a cast to `to` (bf16 or f16) and back gives, bit for bit (an f32
// operand read as if it had been cast, e.g. AMP's master weights); dst may be src. Serial, a chunk at a time
// on the stack.
void round_f32(const float* src, float* dst, int64_t n, DType to);

// Any dtype to any dtype, n elements (float -> integer truncates toward zero; -> bool is "!= 0").
// Large conversions run in parallel on demi's thread pool. f16 <-> bf16 may convert in place (dst == src).
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);

namespace internal {

// One ISA variant's conversion kernels, for tests and benchmarks that pin a variant.
struct ConvertKernels {
  void (*f32_to_f16)(const float*, Half*, int64_t);
  void (*f16_to_f32)(const Half*, float*, int64_t);
  void (*f32_to_bf16)(const float*, BFloat16*, int64_t);
  void (*bf16_to_f32)(const BFloat16*, float*, int64_t);
};

// The kernels of exactly `level` (the scalar ones for kScalar); the level must be supported.
const ConvertKernels& convert_kernels(CpuLevel level);
// Each variant (core/kernel_registry.h's convert family), defined beside its bodies: convert.cc and
// convert_<isa>.cc. Reach them through convert_kernels(), which checks the CPU has the level.
const ConvertKernels& convert_kernels_scalar();
const ConvertKernels& convert_kernels_avx2();
const ConvertKernels& convert_kernels_avx512();
const ConvertKernels& convert_kernels_avx512bf16();

// Scalar reference kernels, kept forever (oracle and fallback).
void f32_to_f16_scalar(const float* src, Half* dst, int64_t n);
void f16_to_f32_scalar(const Half* src, float* dst, int64_t n);
void f32_to_bf16_scalar(const float* src, BFloat16* dst, int64_t n);
void bf16_to_f32_scalar(const BFloat16* src, float* dst, int64_t n);

}  // namespace internal
}  // namespace demi
