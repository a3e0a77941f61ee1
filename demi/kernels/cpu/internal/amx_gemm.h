// demi's AMX GEMM's entry points inside the kernels that run on the tile unit (gemm_amx.cc; compiled for
// AMX, reached only at the amx level): the whole call, and one product run on the calling thread, for a
// fused kernel that multiplies per item inside its own parallel region (attention_amx.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "demi/kernels/matmul_params.h"

namespace demi::kernels::cpu::cpu_internal_amx {

// c = p's product (../gemm_amx.h's amx_gemm), `split`: the exact f16 hi/lo split.
void amx_gemm_body(const MatmulParams& p, const void* a, const void* b, void* c, bool split);

// Whether amx_gemm_body(p, ..., split)'s calls run K blocks with a's block held in L1 across b's column
// blocks (gemm_amx.cc: blocks()) rather than one pass over the whole K per C block: the same bits either way
// (tests).
bool amx_gemm_k_blocks(const MatmulParams& p, bool split);

// Whether amx_gemm_body(p, ..., split) takes a's rows a panel of K at a time (gemm_amx.cc: Shares), holding
// the split's chains per row block and column block between panels: the same bits as one pass (tests).
bool amx_gemm_k_panels(const MatmulParams& p, bool split);

// Elements between the stored rows of a, b and c (and of the residual, laid out as c): contiguous, or rows of
// wider tensors (attention's heads read in place from the in-projection's output).
struct AmxStrides {
  int64_t a = 0, b = 0, c = 0;
  static AmxStrides contiguous(const MatmulParams& p) {
    return {p.trans_a ? p.m : p.k, p.trans_b ? p.k : p.n, p.n};
  }
};

// The scratch amx_gemm_one takes for p (batch 1) with its operands `strides` apart (whether a's tiles load
// from a itself depends on its stride): its packed a and b (and the split's held sums, a bias in f32).
size_t amx_gemm_one_bytes(const MatmulParams& p, bool split, const AmxStrides& strides);

// p's product (batch 1) wholly on the calling thread, whose tiles are configured (configure_tiles,
// internal/amx_tiles.h): packing into `scratch` (amx_gemm_one_bytes(p, split) bytes, 64-byte aligned),
// the same sums and epilogue as amx_gemm_body; a, b and c's rows `strides` apart.
void amx_gemm_one(const MatmulParams& p, const void* a, const void* b, void* c, bool split, void* scratch,
                  const AmxStrides& strides);

}  // namespace demi::kernels::cpu::cpu_internal_amx
