// demi's AMX GEMM's entry points inside the kernels that run on the tile unit (gemm_amx.cc; compiled for
// AMX, reached only at the amx level): the whole call, and one product run on the calling thread, for a
// fused kernel that multiplies per item inside its own parallel region (attention_amx.cc).
#pragma once

#include <cstddef>

#include "demi/kernels/matmul_params.h"

namespace demi::kernels::cpu::cpu_internal_amx {

// c = p's product (../gemm_amx.h's amx_gemm), `split`: the exact f16 hi/lo split.
void amx_gemm_body(const MatmulParams& p, const void* a, const void* b, void* c, bool split);

// The scratch amx_gemm_one takes for p (batch 1): its packed a and b (and the split's held sums, a bias
// in f32).
size_t amx_gemm_one_bytes(const MatmulParams& p, bool split);

// p's product (batch 1) wholly on the calling thread, whose tiles are configured (configure_tiles,
// internal/amx_tiles.h): packing into `scratch` (amx_gemm_one_bytes(p, split) bytes, 64-byte aligned),
// the same sums and epilogue as amx_gemm_body.
void amx_gemm_one(const MatmulParams& p, const void* a, const void* b, void* c, bool split, void* scratch);

}  // namespace demi::kernels::cpu::cpu_internal_amx
