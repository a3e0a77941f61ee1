// The fused attention kernels' bodies (attention_amx.h): per matrix of the batch, on one thread, demi's AMX
// GEMM run whole (internal/amx_gemm.h) around the softmax's avx512 rows (internal/attention_impl.h: the
// functions the registry's avx512 variant runs). Compiled for AMX; reached only at the amx level.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // (GCC 12's AVX-512 intrinsics: see gemm_amx.cc)
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "demi/core/half.h"
#include "demi/kernels/cpu/attention_amx.h"
#include "demi/kernels/cpu/internal/amx_gemm.h"
#include "demi/kernels/cpu/internal/amx_tiles.h"
#include "demi/kernels/cpu/internal/attention_impl.h"
#include "demi/kernels/cpu/internal/vec_avx512.h"
#include "demi/kernels/cpu/internal/workspace.h"

namespace demi::kernels::cpu::cpu_internal_amx {
namespace {

using cpu_internal::bytes64;
using cpu_internal::for_each_part;
using cpu_internal::PartScratch;
using cpu_internal::parts_for;
using cpu_internal::VecAvx512;

// One matrix's product of bf16 operands (batch 1), as ops' bmm asks for it.
MatmulParams product(int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType c) {
  MatmulParams p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.trans_a = ta;
  p.trans_b = tb;
  p.a_dtype = p.b_dtype = DType::kBF16;
  p.c_dtype = c;
  return p;
}

// Where an operand's matrices are: matrix i (= b H + h) at base + b per_b + h per_h, its rows ld apart
// (bf16 elements).
struct Heads {
  int64_t per_b, per_h, ld, offset;  // offset: where the operand starts (packed: q 0, k E, v 2E)
  BFloat16* at(const void* base, int64_t i, int64_t heads) const {
    return static_cast<BFloat16*>(const_cast<void*>(base)) + offset + (i / heads) * per_b + (i % heads) * per_h;
  }
};

// The heads of q, k, v (and of their gradients) and of out (and dout) under p's layout.
struct Layouts {
  Heads q, k, v, out;
  explicit Layouts(const AttentionCoreParams& p) {
    const int64_t h = p.softmax.heads, sq = p.softmax.rows, sk = p.softmax.cols;
    if (!p.packed_heads) {
      q = {h * sq * p.dk, sq * p.dk, p.dk, 0};
      k = {h * sk * p.dk, sk * p.dk, p.dk, 0};
      v = {h * sk * p.dv, sk * p.dv, p.dv, 0};
      out = {h * sq * p.dv, sq * p.dv, p.dv, 0};
      return;
    }
    const int64_t e = h * p.dk, s = sq;  // (Sq = Sk, dk = dv: attention_tiles_supported)
    q = {s * 3 * e, p.dk, 3 * e, 0};
    k = {s * 3 * e, p.dk, 3 * e, e};
    v = {s * 3 * e, p.dk, 3 * e, 2 * e};
    out = {s * e, p.dk, e, 0};
  }
};

// A product of one matrix and where its operands' rows are.
struct Product {
  MatmulParams p;
  AmxStrides strides;
};

// The products of the forward (scores, out) and of the backward (dv, dp, dq, dk), with the strides of p's
// layout (the probabilities, scores, dp and ds: Sk apart).
struct Products {
  Product scores, out, dv, dp, dq, dk;
  Products(const AttentionCoreParams& a, const Layouts& l) {
    const int64_t sq = a.softmax.rows, sk = a.softmax.cols;
    scores = {product(sq, sk, a.dk, false, true, DType::kF32), {l.q.ld, l.k.ld, sk}};  // q kᵀ
    out = {product(sq, a.dv, sk, false, false, DType::kBF16), {sk, l.v.ld, l.out.ld}};   // p v
    dv = {product(sk, a.dv, sq, true, false, DType::kBF16), {sk, l.out.ld, l.v.ld}};     // pᵀ dO
    dp = {product(sq, sk, a.dv, false, true, DType::kF32), {l.out.ld, l.v.ld, sk}};      // dO vᵀ
    dq = {product(sq, a.dk, sk, false, false, DType::kBF16), {sk, l.k.ld, l.q.ld}};      // ds k
    dk = {product(sk, a.dk, sq, true, false, DType::kBF16), {sk, l.q.ld, l.k.ld}};       // dsᵀ q
  }
  size_t gemm_bytes(bool backward) const {
    auto b = [](const Product& x) { return bytes64(amx_gemm_one_bytes(x.p, false, x.strides)); };
    return backward ? std::max({b(dv), b(dp), b(dq), b(dk)}) : std::max(b(scores), b(out));
  }
};

// x's product on the calling thread (tiles configured), its packing in `gemm`.
void multiply(const Product& x, const void* a, const void* b, void* c, char* gemm) {
  amx_gemm_one(x.p, a, b, c, false, gemm, x.strides);
}

// A thread's scratch: the f32 scores (or dp), the bf16 ds (backward), then the GEMM's packing.
struct Scratch {
  size_t f32_bytes, ds_bytes, gemm_bytes;
  Scratch(const AttentionCoreParams& a, const Products& pr, bool backward) {
    const size_t cells = static_cast<size_t>(a.softmax.rows * a.softmax.cols);
    f32_bytes = bytes64(cells * sizeof(float));
    ds_bytes = backward ? bytes64(cells * sizeof(BFloat16)) : 0;
    gemm_bytes = pr.gemm_bytes(backward);
  }
  size_t total() const { return f32_bytes + ds_bytes + gemm_bytes; }
};

}  // namespace

int64_t attention_tiles_scratch_body(const AttentionCoreParams& p, bool backward) {
  const Layouts l(p);
  const Products pr(p, l);
  return static_cast<int64_t>(Scratch(p, pr, backward).total()) * parts_for(p.softmax.batch);
}

void attention_tiles_forward_body(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                                  const float* mask, void* probs, void* out) {
  const AttentionSoftmaxParams& s = p.softmax;
  const Layouts l(p);
  const Products pr(p, l);
  const Scratch sc(p, pr, false);
  const int64_t parts = parts_for(s.batch), sq = s.rows, sk = s.cols;
  const void* kk = p.packed_heads ? q : k;  // (packed: one tensor)
  const void* vv = p.packed_heads ? q : v;
  const int64_t h = s.heads;
  const PartScratch scratch(parts, sc.total());
  for_each_part(parts, s.batch, [&](int64_t part, int64_t i0, int64_t i1) {
    auto* scores = reinterpret_cast<float*>(scratch.part(part));
    char* gemm = scratch.part(part) + sc.f32_bytes;
    cpu_internal::configure_tiles();
    for (int64_t i = i0; i < i1; ++i) {
      multiply(pr.scores, l.q.at(q, i, h), l.k.at(kk, i, h), scores, gemm);
      BFloat16* pi = static_cast<BFloat16*>(probs) + i * sq * sk;
      cpu_internal::attention_matrix_rows<VecAvx512>(scores, mask, s, i, 0, sq, pi);  // (the softmax kernel's rows)
      if (out != nullptr)
        multiply(pr.out, pi, l.v.at(vv, i, h), l.out.at(out, i, h), gemm);
    }
    _tile_release();
  });
}

void attention_tiles_backward_body(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                                   const void* probs, const void* dout, void* dq, void* dk, void* dv) {
  const AttentionSoftmaxParams& s = p.softmax;
  const Layouts l(p);
  const Products pr(p, l);
  const Scratch sc(p, pr, true);
  const int64_t parts = parts_for(s.batch), sq = s.rows, sk = s.cols;
  const void *kk = p.packed_heads ? q : k, *vv = p.packed_heads ? q : v;  // (packed: one tensor each)
  void *dkk = p.packed_heads ? dq : dk, *dvv = p.packed_heads ? dq : dv;
  const int64_t h = s.heads;
  const PartScratch scratch(parts, sc.total());
  for_each_part(parts, s.batch, [&](int64_t part, int64_t i0, int64_t i1) {
    auto* dp = reinterpret_cast<float*>(scratch.part(part));
    auto* ds = reinterpret_cast<BFloat16*>(scratch.part(part) + sc.f32_bytes);
    char* gemm = scratch.part(part) + sc.f32_bytes + sc.ds_bytes;
    cpu_internal::configure_tiles();
    for (int64_t i = i0; i < i1; ++i) {
      const BFloat16 *pi = static_cast<const BFloat16*>(probs) + i * sq * sk, *doi = l.out.at(dout, i, h);
      const BFloat16 *qi = l.q.at(q, i, h), *ki = l.k.at(kk, i, h), *vi = l.v.at(vv, i, h);
      multiply(pr.dv, pi, doi, l.v.at(dvv, i, h), gemm);
      multiply(pr.dp, doi, vi, dp, gemm);
      cpu_internal::attention_matrix_backward_rows<VecAvx512>(pi, dp, s, 0, sq, ds);  // (the softmax kernel's rows)
      multiply(pr.dq, ds, ki, l.q.at(dq, i, h), gemm);
      multiply(pr.dk, ds, qi, l.k.at(dkk, i, h), gemm);
    }
    _tile_release();
  });
}

}  // namespace demi::kernels::cpu::cpu_internal_amx

#pragma GCC diagnostic pop
