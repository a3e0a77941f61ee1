// DType: the element type of a tensor, a run-time property (never a compile-time typedef).
// Promotion is a table (dtype.cc), written as data: f16 with bf16 gives f32; nothing is lowered silently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>

#include "demi/core/half.h"

namespace demi {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI32, kI64, kU8, kBool, kLast = kBool };
inline constexpr int kNumDTypes = static_cast<int>(DType::kLast) + 1;  // derived: a new dtype goes before kLast

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "float32", "float16", "bfloat16", ...
bool is_floating(DType t);
bool is_low_precision(DType t);  // f16 or bf16
// The dtype of a binary op's result: the smallest type that represents both inputs exactly.
DType promote_types(DType a, DType b);
// Parses "float32"/"f32"/"fp32", "float16"/"f16"/"fp16"/"half", "bfloat16"/"bf16", ...; throws on others.
DType parse_dtype(std::string_view name);

std::ostream& operator<<(std::ostream& os, DType t);

// The C++ type that stores one element of a dtype, and back.
template <typename T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::kF32; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::kF16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::kBF16; };
template <> struct dtype_of<double> { static constexpr DType value = DType::kF64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::kU8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::kBool; };
template <typename T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

// Calls f(T{}) with T the C++ type of dtype t: DEMI_DISPATCH-style switch without macros.
template <typename F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kF32: return f(float{});
    case DType::kF16: return f(Half{});
    case DType::kBF16: return f(BFloat16{});
    case DType::kF64: return f(double{});
    case DType::kI32: return f(int32_t{});
    case DType::kI64: return f(int64_t{});
    case DType::kU8: return f(uint8_t{});
    case DType::kBool: return f(bool{});
  }
  return f(float{});  // unreachable: every enumerator is handled above
}

}  // namespace demi
