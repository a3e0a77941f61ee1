#include "demi/kernels/cpu/embedding.h"

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/checks.h"
#include "demi/kernels/cpu/internal/embedding_impl.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"

namespace demi::kernels {
namespace cpu_internal {

const EmbeddingKernels& embedding_kernels_scalar() {
  static const EmbeddingKernels k = make_embedding_kernels<VecScalar>();
  return k;
}

}  // namespace cpu_internal

namespace {

const cpu_internal::EmbeddingKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<EmbeddingKernels> table{DEMI_KERNEL_TABLE_ENTRIES(embedding)};
  return table.get();
}

using cpu_internal::is_fast_float;

template <typename Id>
void check_ids_typed(const Id* ids, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i)
    DEMI_CHECK(ids[i] >= 0 && static_cast<int64_t>(ids[i]) < vocab, "Embedding: id ", static_cast<int64_t>(ids[i]),
               " at position ", i, " is outside the vocabulary [0, ", vocab, ")");
}

void check_ids(const void* ids, DType id_dtype, int64_t n, int64_t vocab) {
  DEMI_CHECK(id_dtype == DType::kI32 || id_dtype == DType::kI64, "Embedding: ids must be int32 or int64, got ",
             dtype_name(id_dtype));
  if (id_dtype == DType::kI32)
    check_ids_typed(static_cast<const int32_t*>(ids), n, vocab);
  else
    check_ids_typed(static_cast<const int64_t*>(ids), n, vocab);
}

}  // namespace

void embedding_forward(const void* ids, DType id_dtype, int64_t n, const void* table, DType table_dtype, int64_t vocab,
                       int64_t dim, void* y, DType y_dtype) {
  DEMI_CHECK(vocab >= 1 && dim >= 1 && n >= 0, "Embedding: expected a table (V, D) with V, D >= 1 and N >= 0 ids, got (",
             vocab, ", ", dim, ") and N = ", n);
  check_ids(ids, id_dtype, n, vocab);
  if (table_dtype == DType::kF64) {
    DEMI_CHECK(y_dtype == DType::kF64, "Embedding: a float64 table gathers into float64, got ", dtype_name(y_dtype));
    if (id_dtype == DType::kI32)
      ref::embedding_forward(static_cast<const int32_t*>(ids), n, static_cast<const double*>(table), dim,
                             static_cast<double*>(y));
    else
      ref::embedding_forward(static_cast<const int64_t*>(ids), n, static_cast<const double*>(table), dim,
                             static_cast<double*>(y));
    return;
  }
  const bool narrowing_ok = table_dtype == DType::kF32 && is_fast_float(y_dtype);
  DEMI_CHECK(is_fast_float(table_dtype) && (y_dtype == table_dtype || narrowing_ok),
             "Embedding: gathers a float32 table into float32, bfloat16 or float16, or a table into its own dtype; ",
             "got ",
             dtype_name(table_dtype), " -> ", dtype_name(y_dtype));
  kernels().forward(ids, id_dtype, n, table, table_dtype, dim, y, y_dtype);
}

void embedding_backward(const void* ids, DType id_dtype, int64_t n, const void* dy, DType dy_dtype, int64_t vocab,
                        int64_t dim, void* dtable, DType dtable_dtype) {
  DEMI_CHECK(vocab >= 1 && dim >= 1 && n >= 0, "Embedding backward: expected a table (V, D) with V, D >= 1, got (",
             vocab, ", ", dim, ")");
  check_ids(ids, id_dtype, n, vocab);
  if (dy_dtype == DType::kF64) {
    DEMI_CHECK(dtable_dtype == DType::kF64, "Embedding backward: float64 dy gives a float64 table gradient, got ",
               dtype_name(dtable_dtype));
    if (id_dtype == DType::kI32)
      ref::embedding_backward(static_cast<const int32_t*>(ids), n, static_cast<const double*>(dy), vocab, dim,
                              static_cast<double*>(dtable));
    else
      ref::embedding_backward(static_cast<const int64_t*>(ids), n, static_cast<const double*>(dy), vocab, dim,
                              static_cast<double*>(dtable));
    return;
  }
  DEMI_CHECK(is_fast_float(dy_dtype) && dtable_dtype == DType::kF32,
             "Embedding backward: expected dy float32, bfloat16 or float16 and a float32 table gradient, got dy ",
             dtype_name(dy_dtype), " -> ", dtype_name(dtable_dtype));
  kernels().backward(ids, id_dtype, n, dy, dy_dtype, vocab, dim, static_cast<float*>(dtable));
}

}  // namespace demi::kernels
