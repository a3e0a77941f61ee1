// Scaled dot-product attention's core fused per (sequence, head) on the tile unit: for each of the N
// matrices of a batch, on one thread, the scores q kᵀ (f32) in that thread's buffer — never a (N, Sq, Sk)
// f32 tensor in memory —, the softmax of kernels::attention_softmax_forward on them (its avx512 rows: the
// same function, the same bits from the same scores) into probs, and out = probs v; backward the same per
// matrix: dv = pᵀ dO, dp = dO vᵀ (f32, the thread's buffer), ds (the softmax backward's rows, the thread's
// buffer), dq = ds k, dk = dsᵀ q. Each product is demi's AMX GEMM run whole on the thread
// (internal/amx_gemm.h), so a product's sums are those amx_gemm gives for it.
//
// The alternative is the unfused form (ops/transformer_ops.cc): batched products around the softmax
// kernels, the scores and their gradient (N, Sq, Sk) f32 in memory between them; which one runs is a
// measured choice per shape (kernels/attention.h).
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/kernels/matmul_params.h"
#include "demi/kernels/reference/attention.h"

namespace demi::kernels::cpu {

// q (N, Sq, dk), k (N, Sk, dk), v (N, Sk, dv), every one in `dtype` (bf16, or f16: its products exact, four
// bf16 tile products each, gemm_amx.h), as are probs, out and the gradients; `softmax` as for
// attention_softmax_forward (N = softmax.batch, Sq = rows, Sk = cols, the mask f32 in its layout).
struct AttentionCoreParams {
  AttentionSoftmaxParams softmax;
  int64_t dk = 0, dv = 0;
  DType dtype = DType::kBF16;
  // The heads read and written in place (self-attention: Sq = Sk = S, dk = dv = d, N = B H): q is one
  // (B, S, 3 H d) tensor, each token's [q | k | v] of H heads of d (nn::MultiheadAttention's in-projection
  // output; k and v are not passed), out is (B, S, H d), the heads merged, and dq the gradient of that one
  // (B, S, 3 H d) tensor (dk, dv not passed). No permutation of the heads before or after. Otherwise every
  // operand is (N, S, d), contiguous.
  bool packed_heads = false;
};

// The core's six products for N matrices (batch = N: the batched products; 1: one matrix, the fused
// kernels), as ops' bmm asks for them, operands in p.dtype: forward scores = q kᵀ (into f32) and out = p v;
// backward dv = pᵀ dO, dp = dO vᵀ (into f32), dq = ds k, dk = dsᵀ q.
struct AttentionProducts {
  MatmulParams scores, out, dv, dp, dq, dk;
  AttentionProducts(const AttentionCoreParams& p, int64_t batch) {
    const int64_t sq = p.softmax.rows, sk = p.softmax.cols;
    auto product = [&](int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType c) {
      MatmulParams mp;
      mp.batch = batch;
      mp.m = m;
      mp.n = n;
      mp.k = k;
      mp.trans_a = ta;
      mp.trans_b = tb;
      mp.a_dtype = mp.b_dtype = p.dtype;
      mp.c_dtype = c;
      return mp;
    };
    scores = product(sq, sk, p.dk, false, true, DType::kF32);
    out = product(sq, p.dv, sk, false, false, p.dtype);
    dv = product(sk, p.dv, sq, true, false, p.dtype);
    dp = product(sq, sk, p.dv, false, true, DType::kF32);
    dq = product(sq, p.dk, sk, false, false, p.dtype);
    dk = product(sk, p.dk, sq, true, false, p.dtype);
  }
};

// Whether the fused kernels take p here: the amx level, bf16 or f16, positive sizes, one matrix's scores small enough for
// a core's L2 (Sq Sk f32 <= 256 KiB), and for packed_heads Sq = Sk and dk = dv. Any CPU may ask.
bool attention_tiles_supported(const AttentionCoreParams& p);

// probs (N, Sq, Sk) = softmax(scale q kᵀ + mask), out (N, Sq, dv) = probs v, both in p.dtype (out null:
// probs alone). mask f32 or null.
void attention_tiles_forward(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                             const float* mask, void* probs, void* out);

// From probs (the forward's) and dout (N, Sq, dv): dq, dk, dv (p.dtype, shaped as q, k, v).
void attention_tiles_backward(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                              const void* probs, const void* dout, void* dq, void* dk, void* dv);

}  // namespace demi::kernels::cpu
