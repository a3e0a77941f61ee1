// Embedding kernels written once against the vector traits V; instantiated by embedding.cc (VecScalar) and
// per ISA from the registry (cmake/demi_kernel_variants.cmake). The portable dispatcher in embedding.cc
// checks the ids and dtypes.
//
// Forward copies rows, converting on the way (an FP32 table gathers straight into bf16/f16 under AMP, so
// the table is never cast whole). Backward zeroes the dense (V, D) f32 gradient and adds each dy row into
// its id's row. Threads own disjoint ranges of table rows and each scans every id, keeping the rows it
// owns: no two threads write one row, and every row sums its contributions in id order, so the result is
// the same whatever the thread count (scanning N ids per thread is cheap next to N * D adds).
#pragma once

#include <cstdint>

#include "demi/core/dtype.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/common_impl.h"

namespace demi::kernels::cpu_internal {

struct EmbeddingKernels {
  // ids (n) int32|int64, table (v, d) -> y (n, d); y_dtype is table_dtype, or bf16/f16 for an f32 table
  void (*forward)(const void* ids, DType id_dtype, int64_t n, const void* table, DType table_dtype, int64_t d,
                  void* y, DType y_dtype);
  // ids (n), dy (n, d) f32|bf16|f16 -> dtable (v, d) f32, overwritten
  void (*backward)(const void* ids, DType id_dtype, int64_t n, const void* dy, DType dy_dtype, int64_t v, int64_t d,
                   float* dtable);
};

const EmbeddingKernels& embedding_kernels_scalar();
const EmbeddingKernels& embedding_kernels_avx2();
const EmbeddingKernels& embedding_kernels_avx512();

template <class V, class Id, class T, class Out>
void embedding_gather(const Id* ids, int64_t n, const T* table, int64_t d, Out* y) {
  constexpr int W = V::kWidth;
  parallel_for(0, n, grain_for<V>(d), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const T* src = table + static_cast<int64_t>(ids[i]) * d;
      Out* dst = y + i * d;
      int64_t j = 0;
      for (; j + W <= d; j += W) V::store(dst + j, V::load(src + j));
      if (j < d) V::store_n(dst + j, V::load_n(src + j, d - j), d - j);
    }
  });
}

template <class V, class Id, class G>
void embedding_scatter(const Id* ids, int64_t n, const G* dy, int64_t v, int64_t d, float* dtable) {
  constexpr int W = V::kWidth;
  // Chunks of rows: at least enough rows that a chunk outweighs its scan of n ids.
  parallel_for(0, v, grain_for<V>(d), [&](int64_t r0, int64_t r1) {
    for (int64_t k = r0 * d; k < r1 * d; ++k) dtable[k] = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = static_cast<int64_t>(ids[i]);
      if (id < r0 || id >= r1) continue;
      float* dst = dtable + id * d;
      const G* src = dy + i * d;
      int64_t j = 0;
      for (; j + W <= d; j += W) V::store(dst + j, V::add(V::load(dst + j), V::load(src + j)));
      if (j < d) V::store_n(dst + j, V::add(V::load_n(dst + j, d - j), V::load_n(src + j, d - j)), d - j);
    }
  });
}

template <class V, class Fn>
void visit_id(DType t, Fn&& fn) {
  if (t == DType::kI32)
    fn(int32_t{});
  else
    fn(int64_t{});
}

template <class V>
void embedding_forward_entry(const void* ids, DType id_dtype, int64_t n, const void* table, DType table_dtype,
                             int64_t d, void* y, DType y_dtype) {
  visit_id<V>(id_dtype, [&](auto id_tag) {
    using Id = decltype(id_tag);
    auto pid = static_cast<const Id*>(ids);
    visit_float<V>(y_dtype, [&](auto out_tag) {
      using Out = decltype(out_tag);
      if (table_dtype == DType::kF32)
        embedding_gather<V>(pid, n, static_cast<const float*>(table), d, static_cast<Out*>(y));
      else
        embedding_gather<V>(pid, n, static_cast<const Out*>(table), d, static_cast<Out*>(y));
    });
  });
}

template <class V>
void embedding_backward_entry(const void* ids, DType id_dtype, int64_t n, const void* dy, DType dy_dtype, int64_t v,
                              int64_t d, float* dtable) {
  visit_id<V>(id_dtype, [&](auto id_tag) {
    using Id = decltype(id_tag);
    visit_float<V>(dy_dtype, [&](auto g_tag) {
      using G = decltype(g_tag);
      embedding_scatter<V>(static_cast<const Id*>(ids), n, static_cast<const G*>(dy), v, d, dtable);
    });
  });
}

template <class V>
EmbeddingKernels make_embedding_kernels() {
  return {embedding_forward_entry<V>, embedding_backward_entry<V>};
}

}  // namespace demi::kernels::cpu_internal
