#include "demi/kernels/matmul_params.h"

#include "demi/core/error.h"

namespace demi::kernels {

std::string describe(const MatmulParams& p) {
  auto shape = [&](int64_t rows, int64_t cols) {
    return p.batch == 1 && rows >= 0 ? str_cat("(", rows, ", ", cols, ")")
                                     : str_cat("(", p.batch, ", ", rows, ", ", cols, ")");
  };
  std::string s = str_cat("a", p.trans_a ? "^T" : "", p.trans_a ? shape(p.k, p.m) : shape(p.m, p.k), " ",
                          dtype_name(p.a_dtype),
                          p.a_round != DType::kF32 ? str_cat(" read as ", dtype_name(p.a_round)) : "", " x b",
                          p.trans_b ? "^T" : "",
                          p.trans_b ? shape(p.n, p.k) : shape(p.k, p.n), " ", dtype_name(p.b_dtype),
                          p.b_round != DType::kF32 ? str_cat(" read as ", dtype_name(p.b_round)) : "", " -> c",
                          shape(p.m, p.n), " ", dtype_name(p.c_dtype));
  if (p.bias) s += str_cat(", bias(", p.n, ") ", dtype_name(p.bias_dtype));
  if (p.relu) s += ", relu";
  if (p.accumulate) s += ", accumulate";
  if (p.residual) s += str_cat(", + residual", shape(p.m, p.n), " ", dtype_name(p.c_dtype));
  if (p.a_row_sums) s += str_cat(", row sums of a (", p.m, ")");
  if (p.bf16_products) s += ", float16 values multiplied as bfloat16";
  return s;
}

void check_matmul_params(const MatmulParams& p, const char* op) {
  DEMI_CHECK(p.batch >= 1 && p.m >= 1 && p.n >= 1 && p.k >= 1, op,
             ": every size must be positive, got batch=", p.batch, " M=", p.m, " N=", p.n, " K=", p.k, " in ",
             describe(p));
  auto floating = [](DType t) {
    return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF64;
  };
  DEMI_CHECK(floating(p.a_dtype) && floating(p.b_dtype) && floating(p.c_dtype) &&
                 (!p.bias || floating(p.bias_dtype)),
             op, ": expected floating dtypes (float32, bfloat16, float16, float64), got ", describe(p));
  bool any_f64 = p.a_dtype == DType::kF64 || p.b_dtype == DType::kF64 || p.c_dtype == DType::kF64 ||
                 (p.bias && p.bias_dtype == DType::kF64);
  bool all_f64 = p.a_dtype == DType::kF64 && p.b_dtype == DType::kF64 && p.c_dtype == DType::kF64 &&
                 (!p.bias || p.bias_dtype == DType::kF64);
  DEMI_CHECK(!any_f64 || all_f64, op, ": float64 cannot be mixed with other dtypes, got ", describe(p));
  DEMI_CHECK(p.b_round == DType::kF32 || ((p.b_round == DType::kBF16 || p.b_round == DType::kF16) &&
                                          p.b_dtype == DType::kF32),
             op, ": b can be read rounded to bfloat16 or float16 only from float32, got ", describe(p));
  DEMI_CHECK(p.a_round == DType::kF32 || ((p.a_round == DType::kBF16 || p.a_round == DType::kF16) &&
                                          p.a_dtype == DType::kF32),
             op, ": a can be read rounded to bfloat16 or float16 only from float32, got ", describe(p));
  DEMI_CHECK(!p.residual || !p.accumulate, op,
             ": a product adds a residual or accumulates into c, not both (a residual that is c is accumulate), got ",
             describe(p));
  DEMI_CHECK(!p.a_row_sums || (p.batch == 1 && !p.bf16_products && p.c_dtype != DType::kF64), op,
             ": the row sums of a are taken of one float32|bfloat16|float16 product whose a is multiplied as read, got ",
             describe(p));
  DEMI_CHECK(!p.bf16_products || (is_low_precision(a_value_dtype(p)) && is_low_precision(b_value_dtype(p))), op,
             ": float16 values are multiplied as bfloat16 only in a product of float16|bfloat16 operands, got ",
             describe(p));
}

}  // namespace demi::kernels
