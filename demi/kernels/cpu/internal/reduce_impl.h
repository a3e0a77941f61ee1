// Reduction kernels written once against the vector traits V; instantiated by reduce.cc (VecScalar)
// and per ISA from the registry (cmake/demi_kernel_variants.cmake). The portable dispatcher in reduce.cc
// checks arguments and builds the SumPlan; the bodies here only compute.
//
// One engine sums over any set of dimensions (reduce_sum/mean over an axis, sum_to_shape for broadcast
// backward): after coalescing, either the innermost dimension is reduced (each output is a sum of
// contiguous runs, each run accumulated in 4 vectors of f32, the runs added in f64) or it is kept (a block
// of outputs accumulates whole vectors, one reduced index after another, in f32 blocks of kRowBlock). When
// a few outputs each sum a lot (a sum over everything), the runs are cut into fixed blocks summed in
// parallel and the block sums are added in f64; block sizes depend only on the shape, so results do not
// depend on the thread count.
#pragma once

#include <cstdint>
#include <type_traits>

#include "demi/core/dtype.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/common_impl.h"
#include "demi/kernels/reference/reduce.h"

namespace demi::kernels::cpu_internal {

inline constexpr int kMaxPlanRank = 8;
// Outputs per block where the innermost dim is kept (columns): accumulators for them stay in L1.
inline constexpr int64_t kColBlock = 256;

// x viewed as coalesced dims (outermost first; strides in elements; no dim of size 1); the output holds
// the kept dims, contiguous, in order. rank 0: a single element.
struct SumPlan {
  int rank = 0;
  int64_t size[kMaxPlanRank] = {};
  int64_t stride[kMaxPlanRank] = {};
  bool reduced[kMaxPlanRank] = {};
};

struct ReduceKernels {
  // x (plan) -> y (kept dims) = scale * sum; x f32|bf16|f16, y x's dtype or f32
  void (*sum)(const SumPlan& plan, const void* x, DType x_dtype, void* y, DType y_dtype, float scale);
  // x (outer, axis, inner) -> y (outer, inner) max (nullable), argmax (nullable); y x's dtype or f32
  void (*max)(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype, int64_t* argmax);
};

const ReduceKernels& reduce_kernels_scalar();
const ReduceKernels& reduce_kernels_avx2();
const ReduceKernels& reduce_kernels_avx512();

// Splits a flat index over n dims (sizes, strides) into an element offset.
template <class V>
int64_t flat_offset(int64_t flat, const int64_t* sizes, const int64_t* strides, int n) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; --d) {
    off += (flat % sizes[d]) * strides[d];
    flat /= sizes[d];
  }
  return off;
}

template <class V, class Out>
void store_one(Out* y, float v) {
  V::store_n(y, V::set1(v), 1);
}

// Innermost dim reduced: y[j] = scale * sum over the other reduced dims of contiguous runs of len.
template <class V, class T, class Out>
void sum_inner_reduced(const T* x, Out* y, float scale, int64_t out_n, const int64_t* ks, const int64_t* kst, int nk,
                       const int64_t* rs, const int64_t* rst, int nr_outer, int64_t len) {
  int64_t combos = 1;
  for (int d = 0; d < nr_outer; ++d) combos *= rs[d];
  constexpr int64_t kMaxUnits = 4096;
  if (out_n <= 16 && out_n * combos <= kMaxUnits / 16 && len * combos >= (int64_t{1} << 17)) {
    // Few outputs, much to sum each: fixed blocks in parallel, block sums added in f64. At most 16 blocks
    // per run keep the units within kMaxUnits.
    int64_t block = int64_t{1} << 14;
    auto units_for = [&](int64_t blk) { return out_n * combos * ((len + blk - 1) / blk); };
    while (units_for(block) > kMaxUnits) block *= 2;
    const int64_t per_run = (len + block - 1) / block;
    const int64_t units = units_for(block);
    float partial[kMaxUnits];
    parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        int64_t j = u / (combos * per_run), rest = u % (combos * per_run);
        int64_t c = rest / per_run, b = rest % per_run;
        int64_t start = b * block, n = len - start < block ? len - start : block;
        const T* p = x + flat_offset<V>(j, ks, kst, nk) + flat_offset<V>(c, rs, rst, nr_outer) + start;
        typename V::F acc[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
        accumulate_run<V>(acc, p, n);
        partial[u] = reduce_acc<V>(acc);
      }
    });
    for (int64_t j = 0; j < out_n; ++j) {
      double s = 0;
      for (int64_t u = j * combos * per_run; u < (j + 1) * combos * per_run; ++u) s += partial[u];
      store_one<V>(y + j, static_cast<float>(s) * scale);
    }
    return;
  }
  parallel_for(0, out_n, grain_for<V>(len * combos), [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const T* base = x + flat_offset<V>(j, ks, kst, nk);
      if (combos == 1) {
        store_one<V>(y + j, sum_run<V>(base, len) * scale);
        continue;
      }
      double total = 0;  // runs in f32, added up in f64
      for (int64_t c = 0; c < combos; ++c) total += sum_run<V>(base + flat_offset<V>(c, rs, rst, nr_outer), len);
      store_one<V>(y + j, static_cast<float>(total) * scale);
    }
  });
}

// Innermost dim kept (len outputs per row, contiguous in x and y): each block of up to kCols outputs
// accumulates one reduced index after another, in index order.
template <class V, class T, class Out>
void sum_inner_kept(const T* x, Out* y, float scale, int64_t out_n, const int64_t* ks, const int64_t* kst, int nk_outer,
                    const int64_t* rs, const int64_t* rst, int nr, int64_t len) {
  constexpr int W = V::kWidth;
  constexpr int64_t kCols = kColBlock;
  int64_t combos = 1;
  for (int d = 0; d < nr; ++d) combos *= rs[d];
  const int64_t rows = out_n / len;
  const int64_t blocks = (len + kCols - 1) / kCols;
  parallel_for(0, rows * blocks, grain_for<V>(kCols * combos), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      int64_t row = u / blocks, c0 = (u % blocks) * kCols;
      int64_t w = len - c0 < kCols ? len - c0 : kCols;
      int full = static_cast<int>(w / W);
      int64_t tail = w % W;
      const T* base = x + flat_offset<V>(row, ks, kst, nk_outer) + c0;
      typename V::F acc[kColBlock / V::kWidth + 1], blk[kColBlock / V::kWidth + 1];
      for (int v = 0; v <= full; ++v) acc[v] = blk[v] = V::zero();
      for (int64_t c = 0; c < combos; ++c) {
        const T* p = base + flat_offset<V>(c, rs, rst, nr);
        for (int v = 0; v < full; ++v) blk[v] = V::add(blk[v], V::load(p + v * W));
        if (tail) blk[full] = V::add(blk[full], V::load_n(p + full * W, tail));
        if ((c + 1) % kRowBlock == 0 || c + 1 == combos)
          for (int v = 0; v <= full; ++v) {
            acc[v] = V::add(acc[v], blk[v]);
            blk[v] = V::zero();
          }
      }
      Out* q = y + row * len + c0;
      typename V::F s = V::set1(scale);
      for (int v = 0; v < full; ++v) V::store(q + v * W, V::mul(acc[v], s));
      if (tail) V::store_n(q + full * W, V::mul(acc[full], s), tail);
    }
  });
}

template <class V, class T, class Out>
void sum_typed(const SumPlan& plan, const T* x, Out* y, float scale) {
  int64_t ks[kMaxPlanRank], kst[kMaxPlanRank], rs[kMaxPlanRank], rst[kMaxPlanRank];
  int nk = 0, nr = 0;
  int64_t out_n = 1;
  for (int d = 0; d < plan.rank; ++d) {
    if (plan.reduced[d]) {
      rs[nr] = plan.size[d];
      rst[nr++] = plan.stride[d];
    } else {
      ks[nk] = plan.size[d];
      kst[nk++] = plan.stride[d];
      out_n *= plan.size[d];
    }
  }
  if (plan.rank == 0) {
    store_one<V>(y, V::to_float(x[0]) * scale);
  } else if (plan.reduced[plan.rank - 1]) {
    sum_inner_reduced<V>(x, y, scale, out_n, ks, kst, nk, rs, rst, nr - 1, rs[nr - 1]);
  } else {
    sum_inner_kept<V>(x, y, scale, out_n, ks, kst, nk - 1, rs, rst, nr, ks[nk - 1]);
  }
}

template <class V>
void sum_entry(const SumPlan& plan, const void* x, DType x_dtype, void* y, DType y_dtype, float scale) {
  visit_float<V>(x_dtype, [&](auto tag) {
    using T = decltype(tag);
    if (y_dtype == x_dtype)
      sum_typed<V>(plan, static_cast<const T*>(x), static_cast<T*>(y), scale);
    else
      sum_typed<V>(plan, static_cast<const T*>(x), static_cast<float*>(y), scale);
  });
}

// Whether (m2, i2) beats (m1, i1) as the maximum: NaN beats numbers (the first NaN wins), then the larger
// value, then the smaller index.
template <class V>
bool max_better(float m1, int32_t i1, float m2, int32_t i2) {
  bool n1 = m1 != m1, n2 = m2 != m2;
  if (n1 || n2) return n2 && (!n1 || i2 < i1);
  return m2 > m1 || (m2 == m1 && i2 < i1);
}

// One lane's update rule, in index order: take x when it is larger, or the first NaN.
template <class V>
typename V::M max_update(typename V::F m, typename V::F x) {
  return V::mask_or(V::gt(x, m), V::mask_andnot(V::is_nan(m), V::is_nan(x)));
}

template <class V, class T, class Out>
void store_max(const T* x, int64_t base, int64_t stride, int32_t best, Out* y, int64_t* argmax, int64_t k) {
  if (argmax) argmax[k] = best;
  if (y) {
    if constexpr (std::is_same_v<T, Out>)
      y[k] = x[base + best * stride];
    else
      y[k] = V::to_float(x[base + best * stride]);
  }
}

template <class V, class T, class Out>
void max_typed(const T* x, AxisView v, Out* y, int64_t* argmax) {
  constexpr int W = V::kWidth;
  using F = typename V::F;
  using I = typename V::I;
  const float kNegInf = -__builtin_inff();
  if (v.inner == 1) {
    parallel_for(0, v.outer, grain_for<V>(v.axis), [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        const T* p = x + o * v.axis;
        F m = V::set1(kNegInf);
        I idx = V::iota(), best = V::iota();
        const I step = V::seti(W);
        int64_t a = 0;
        for (; a + W <= v.axis; a += W) {
          F val = V::load(p + a);
          typename V::M up = max_update<V>(m, val);
          m = V::select(up, m, val);
          best = V::selecti(up, best, idx);
          idx = V::addi(idx, step);
        }
        if (a < v.axis) {
          F val = V::load_n(p + a, v.axis - a, kNegInf);
          typename V::M up = max_update<V>(m, val);
          m = V::select(up, m, val);
          best = V::selecti(up, best, idx);
        }
        alignas(64) float ms[V::kWidth];
        alignas(64) int32_t is[V::kWidth];
        V::store(ms, m);
        V::storei(is, best);
        float bm = ms[0];
        int32_t bi = is[0];
        for (int l = 1; l < W; ++l)
          if (max_better<V>(bm, bi, ms[l], is[l])) {
            bm = ms[l];
            bi = is[l];
          }
        if (bi >= v.axis) bi = 0;  // every lane is a padded -inf: the row is all -inf
        store_max<V>(x, o * v.axis, 1, bi, y, argmax, o);
      }
    });
    return;
  }
  // Columns: a block of up to kCols outputs compares one axis index after another.
  constexpr int64_t kCols = kColBlock;
  const int64_t blocks = (v.inner + kCols - 1) / kCols;
  parallel_for(0, v.outer * blocks, grain_for<V>(kCols * v.axis), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      int64_t o = u / blocks, c0 = (u % blocks) * kCols;
      int64_t w = v.inner - c0 < kCols ? v.inner - c0 : kCols;
      int nv = static_cast<int>((w + W - 1) / W);
      F m[kColBlock / V::kWidth];
      I best[kColBlock / V::kWidth];
      for (int k = 0; k < nv; ++k) {
        m[k] = V::set1(kNegInf);
        best[k] = V::seti(0);
      }
      const T* base = x + o * v.axis * v.inner + c0;
      for (int64_t a = 0; a < v.axis; ++a) {
        const T* p = base + a * v.inner;
        I ia = V::seti(static_cast<int32_t>(a));
        for (int k = 0; k < nv; ++k) {
          int64_t left = w - k * W;
          F val = left >= W ? V::load(p + k * W) : V::load_n(p + k * W, left, kNegInf);
          typename V::M up = max_update<V>(m[k], val);
          m[k] = V::select(up, m[k], val);
          best[k] = V::selecti(up, best[k], ia);
        }
      }
      for (int k = 0; k < nv; ++k) {
        alignas(64) int32_t is[V::kWidth];
        V::storei(is, best[k]);
        for (int l = 0; l < W && k * W + l < w; ++l) {
          int64_t col = c0 + k * W + l;
          store_max<V>(x, o * v.axis * v.inner + col, v.inner, is[l], y, argmax, o * v.inner + col);
        }
      }
    }
  });
}

template <class V>
void max_entry(const void* x, DType x_dtype, AxisView v, void* y, DType y_dtype, int64_t* argmax) {
  visit_float<V>(x_dtype, [&](auto tag) {
    using T = decltype(tag);
    if (y_dtype == x_dtype || y == nullptr)
      max_typed<V>(static_cast<const T*>(x), v, static_cast<T*>(y), argmax);
    else
      max_typed<V>(static_cast<const T*>(x), v, static_cast<float*>(y), argmax);
  });
}

template <class V>
ReduceKernels make_reduce_kernels() {
  return {sum_entry<V>, max_entry<V>};
}

}  // namespace demi::kernels::cpu_internal
