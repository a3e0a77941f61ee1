// What demi's AMX GEMM (gemm_amx.h) takes, decided in portable code: any CPU may ask; only the amx level
// runs the tile body (gemm_amx.cc, compiled for AMX).
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/cpu/gemm_amx.h"
#include "demi/kernels/cpu/internal/amx_gemm.h"

namespace demi::kernels::cpu {

bool amx_gemm_supported(const MatmulParams& p) {
  if (cpu_level() < CpuLevel::kAmx) return false;
  const DType av = a_product_dtype(p), bv = b_product_dtype(p);
  const bool outputs = p.c_dtype == DType::kF32 || is_low_precision(p.c_dtype);
  const bool bias = p.bias == nullptr || p.bias_dtype == DType::kF32 || is_low_precision(p.bias_dtype);
  return is_low_precision(av) && is_low_precision(bv) && outputs && bias && p.a_row_sums == nullptr && p.m > 0 && p.n > 0 && p.k > 0;
}

bool amx_gemm_splits(const MatmulParams& p) {
  return a_product_dtype(p) == DType::kF16 || b_product_dtype(p) == DType::kF16;
}

void amx_gemm(const MatmulParams& p, const void* a, const void* b, void* c) {
  DEMI_ASSERT(amx_gemm_supported(p), "amx_gemm: ", describe(p), " is not an AMX product here");
  cpu_internal_amx::amx_gemm_body(p, a, b, c, amx_gemm_splits(p));
}

std::string amx_gemm_implementation(const MatmulParams& p) {
  return amx_gemm_splits(p) ? "demi-amx:f16-split" : "demi-amx:bf16";
}

}  // namespace demi::kernels::cpu
