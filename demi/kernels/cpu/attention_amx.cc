// The fused attention kernels' bodies (attention_amx.h): per matrix of the batch, on one thread, demi's AMX
// GEMM run whole (internal/amx_gemm.h) around the softmax's avx512 rows (internal/attention_impl.h: the
// functions the registry's avx512 variant runs). Compiled for AMX; reached only at the amx level.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // (GCC 12's AVX-512 intrinsics: see gemm_amx.cc)
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "demi/core/half.h"
#include "demi/kernels/cpu/attention_amx.h"
#include "demi/kernels/cpu/gemm_amx.h"
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

// Where an operand's matrices are: matrix i (= b H + h) at base + b per_b + h per_h, its rows ld apart
// (elements of 2 bytes: bf16 or f16).
struct Heads {
  int64_t per_b, per_h, ld, offset;  // offset: where the operand starts (packed: q 0, k E, v 2E)
  template <class T>
  T* at(T* base, int64_t i, int64_t heads) const {
    return base + offset + (i / heads) * per_b + (i % heads) * per_h;
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

// The strides of the six products (AttentionProducts, batch 1) under p's layout: q, k, v, out rows as Layouts
// says; the probabilities, scores, dp and ds Sk apart.
struct Strides {
  AmxStrides scores, out, dv, dp, dq, dk;
  Strides(const AttentionCoreParams& a, const Layouts& l) {
    const int64_t sk = a.softmax.cols;
    scores = {l.q.ld, l.k.ld, sk};
    out = {sk, l.v.ld, l.out.ld};
    dv = {sk, l.out.ld, l.v.ld};
    dp = {l.out.ld, l.v.ld, sk};
    dq = {sk, l.k.ld, l.q.ld};
    dk = {sk, l.q.ld, l.k.ld};
  }
};

// The products of one matrix (f16 values split exactly: gemm_amx.h) and where their operands' rows are.
struct Products {
  AttentionProducts p;
  Strides s;
  Products(const AttentionCoreParams& a, const Layouts& l) : p(a, 1), s(a, l) {}
  size_t gemm_bytes(bool backward) const {
    auto b = [](const MatmulParams& x, const AmxStrides& st) {
      return bytes64(amx_gemm_one_bytes(x, amx_gemm_splits(x), st));
    };
    return backward ? std::max({b(p.dv, s.dv), b(p.dp, s.dp), b(p.dq, s.dq), b(p.dk, s.dk)})
                    : std::max(b(p.scores, s.scores), b(p.out, s.out));
  }
};

// x's product on the calling thread (tiles configured), its operands' rows `st` apart, its packing in `gemm`.
void multiply(const MatmulParams& x, const AmxStrides& st, const void* a, const void* b, void* c, char* gemm) {
  amx_gemm_one(x, a, b, c, amx_gemm_splits(x), gemm, st);
}

// A thread's scratch: the f32 scores (or dp), ds (backward, in the operands' dtype), then the GEMM's packing.
struct Scratch {
  size_t f32_bytes, ds_bytes, gemm_bytes;
  Scratch(const AttentionCoreParams& a, const Products& pr, bool backward) {
    const size_t cells = static_cast<size_t>(a.softmax.rows * a.softmax.cols);
    f32_bytes = bytes64(cells * sizeof(float));
    ds_bytes = backward ? bytes64(cells * dtype_size(a.dtype)) : 0;
    gemm_bytes = pr.gemm_bytes(backward);
  }
  size_t total() const { return f32_bytes + ds_bytes + gemm_bytes; }
};

// The bodies for operands of type T (BFloat16 or Half).
template <class T>
void forward_as(const AttentionCoreParams& p, const T* q, const T* k, const T* v, const float* mask, T* probs, T* out) {
  const AttentionSoftmaxParams& s = p.softmax;
  const Layouts l(p);
  const Products pr(p, l);
  const Scratch sc(p, pr, false);
  const int64_t parts = parts_for(s.batch), sq = s.rows, sk = s.cols;
  const T* kk = p.packed_heads ? q : k;  // (packed: one tensor)
  const T* vv = p.packed_heads ? q : v;
  const int64_t h = s.heads;
  const PartScratch scratch(parts, sc.total());
  for_each_part(parts, s.batch, [&](int64_t part, int64_t i0, int64_t i1) {
    auto* scores = reinterpret_cast<float*>(scratch.part(part));
    char* gemm = scratch.part(part) + sc.f32_bytes;
    cpu_internal::configure_tiles();
    for (int64_t i = i0; i < i1; ++i) {
      multiply(pr.p.scores, pr.s.scores, l.q.at(q, i, h), l.k.at(kk, i, h), scores, gemm);
      T* pi = probs + i * sq * sk;
      cpu_internal::attention_matrix_rows<VecAvx512>(scores, mask, s, i, 0, sq, pi);  // (the softmax kernel's rows)
      if (out != nullptr)
        multiply(pr.p.out, pr.s.out, pi, l.v.at(vv, i, h), l.out.at(out, i, h), gemm);
    }
    _tile_release();
  });
}

template <class T>
void backward_as(const AttentionCoreParams& p, const T* q, const T* k, const T* v, const T* probs, const T* dout, T* dq,
                 T* dk, T* dv) {
  const AttentionSoftmaxParams& s = p.softmax;
  const Layouts l(p);
  const Products pr(p, l);
  const Scratch sc(p, pr, true);
  const int64_t parts = parts_for(s.batch), sq = s.rows, sk = s.cols;
  const T *kk = p.packed_heads ? q : k, *vv = p.packed_heads ? q : v;  // (packed: one tensor each)
  T *dkk = p.packed_heads ? dq : dk, *dvv = p.packed_heads ? dq : dv;
  const int64_t h = s.heads;
  const PartScratch scratch(parts, sc.total());
  for_each_part(parts, s.batch, [&](int64_t part, int64_t i0, int64_t i1) {
    auto* dp = reinterpret_cast<float*>(scratch.part(part));
    auto* ds = reinterpret_cast<T*>(scratch.part(part) + sc.f32_bytes);
    char* gemm = scratch.part(part) + sc.f32_bytes + sc.ds_bytes;
    cpu_internal::configure_tiles();
    for (int64_t i = i0; i < i1; ++i) {
      const T *pi = probs + i * sq * sk, *doi = l.out.at(dout, i, h);
      const T *qi = l.q.at(q, i, h), *ki = l.k.at(kk, i, h), *vi = l.v.at(vv, i, h);
      multiply(pr.p.dv, pr.s.dv, pi, doi, l.v.at(dvv, i, h), gemm);
      multiply(pr.p.dp, pr.s.dp, doi, vi, dp, gemm);
      cpu_internal::attention_matrix_backward_rows<VecAvx512>(pi, dp, s, 0, sq, ds);  // (the softmax kernel's rows)
      multiply(pr.p.dq, pr.s.dq, ds, ki, l.q.at(dq, i, h), gemm);
      multiply(pr.p.dk, pr.s.dk, ds, qi, l.k.at(dkk, i, h), gemm);
    }
    _tile_release();
  });
}

}  // namespace

void attention_tiles_forward_body(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                                  const float* mask, void* probs, void* out) {
  auto run = [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    forward_as<T>(p, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), mask,
                  static_cast<T*>(probs), static_cast<T*>(out));
  };
  p.dtype == DType::kF16 ? run(static_cast<Half*>(nullptr)) : run(static_cast<BFloat16*>(nullptr));
}

void attention_tiles_backward_body(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                                   const void* probs, const void* dout, void* dq, void* dk, void* dv) {
  auto run = [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    backward_as<T>(p, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                   static_cast<const T*>(probs), static_cast<const T*>(dout), static_cast<T*>(dq), static_cast<T*>(dk),
                   static_cast<T*>(dv));
  };
  p.dtype == DType::kF16 ? run(static_cast<Half*>(nullptr)) : run(static_cast<BFloat16*>(nullptr));
}

}  // namespace demi::kernels::cpu::cpu_internal_amx

#pragma GCC diagnostic pop
