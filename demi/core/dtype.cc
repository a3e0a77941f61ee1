#include "demi/core/dtype.h"

#include <array>
#include <string>

#include "demi/core/error.h"

namespace demi {
namespace {

struct DTypeInfo {
  std::string_view name;
  size_t size;
  bool floating;
};

constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {"float32", 4, true},
    {"float16", 2, true},
    {"bfloat16", 2, true},
    {"float64", 8, true},
    {"int32", 4, false},
    {"int64", 8, false},
    {"uint8", 1, false},
    {"bool", 1, false},
}};

constexpr DType F32 = DType::kF32, F16 = DType::kF16, B16 = DType::kBF16, F64 = DType::kF64,
                I32 = DType::kI32, I64 = DType::kI64, U8 = DType::kU8, BOL = DType::kBool;

// kPromote[a][b]: rows and columns in enum order f32 f16 bf16 f64 i32 i64 u8 bool.
// Floating beats integer; among floats the wider wins and f16 with bf16 meets at f32 (neither holds
// the other); among integers the wider signed type wins.
constexpr DType kPromote[kNumDTypes][kNumDTypes] = {
    /* f32  */ {F32, F32, F32, F64, F32, F32, F32, F32},
    /* f16  */ {F32, F16, F32, F64, F16, F16, F16, F16},
    /* bf16 */ {F32, F32, B16, F64, B16, B16, B16, B16},
    /* f64  */ {F64, F64, F64, F64, F64, F64, F64, F64},
    /* i32  */ {F32, F16, B16, F64, I32, I64, I32, I32},
    /* i64  */ {F32, F16, B16, F64, I64, I64, I64, I64},
    /* u8   */ {F32, F16, B16, F64, I32, I64, U8, U8},
    /* bool */ {F32, F16, B16, F64, I32, I64, U8, BOL},
};

size_t index(DType t) {
  auto i = static_cast<size_t>(t);
  DEMI_ASSERT(i < kNumDTypes, "bad dtype value ", i);
  return i;
}

}  // namespace

size_t dtype_size(DType t) { return kInfo[index(t)].size; }
std::string_view dtype_name(DType t) { return kInfo[index(t)].name; }
bool is_floating(DType t) { return kInfo[index(t)].floating; }
bool is_low_precision(DType t) { return t == DType::kF16 || t == DType::kBF16; }
DType promote_types(DType a, DType b) { return kPromote[index(a)][index(b)]; }

DType parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType type;
  };
  static constexpr Alias kAliases[] = {
      {"float32", F32}, {"f32", F32},  {"fp32", F32},  {"float", F32},     {"float16", F16},
      {"f16", F16},     {"fp16", F16}, {"half", F16},  {"bfloat16", B16},  {"bf16", B16},
      {"float64", F64}, {"f64", F64},  {"double", F64}, {"int32", I32},   {"i32", I32},
      {"int64", I64},   {"i64", I64},  {"uint8", U8},  {"u8", U8},         {"bool", BOL},
  };
  for (const auto& a : kAliases)
    if (a.name == name) return a.type;
  DEMI_CHECK(false, "unknown dtype '", name,
             "'; expected one of float32 (f32, fp32), float16 (f16, fp16, half), bfloat16 (bf16), "
             "float64, int32, int64, uint8, bool");
  return F32;
}

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

}  // namespace demi
