#include "demi/kernels/reference/matmul.h"

#include <algorithm>
#include <vector>

#include "demi/core/error.h"
#include "demi/core/half.h"
#include "demi/kernels/reference/internal/widen.h"

namespace demi::kernels::ref {
namespace {

template <typename Acc>
void matmul_impl(const MatmulParams& p, const void* a, const void* b, void* c) {
  const int64_t M = p.m, N = p.n, K = p.k;
  std::vector<Acc> A = internal::widen<Acc>(a, p.a_dtype, p.batch * M * K);
  std::vector<Acc> B = internal::widen<Acc>(b, p.b_dtype, p.batch * K * N);
  internal::round_values(A, p.a_round);  // a and b read as if cast to a_round, b_round
  internal::round_values(B, p.b_round);
  if (p.a_row_sums)  // op(a)'s rows summed k ascending, in f32 (batch 1: check_matmul_params)
    for (int64_t i = 0; i < M; ++i) {
      float sum = 0;
      for (int64_t kk = 0; kk < K; ++kk) sum += static_cast<float>(p.trans_a ? A[kk * M + i] : A[i * K + kk]);
      p.a_row_sums[i] = sum;
    }
  // bf16_products: the f16 values multiplied as bf16 (f16 -> f32 is exact, then one rounding).
  const auto as_bf16 = [](std::vector<Acc>& values) {
    for (Acc& v : values) v = static_cast<Acc>(static_cast<float>(BFloat16(static_cast<float>(v))));
  };
  if (p.bf16_products && a_value_dtype(p) == DType::kF16) as_bf16(A);
  if (p.bf16_products && b_value_dtype(p) == DType::kF16) as_bf16(B);
  std::vector<Acc> bias =
      p.bias ? internal::widen<Acc>(p.bias, p.bias_dtype, N) : std::vector<Acc>(N, Acc(0));
  std::vector<Acc> old = p.accumulate || p.residual
                             ? internal::widen<Acc>(p.residual ? p.residual : c, p.c_dtype, p.batch * M * N)
                             : std::vector<Acc>();
  std::vector<Acc> C(static_cast<size_t>(p.batch * M * N));
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    const Acc* Ab = A.data() + bi * M * K;
    const Acc* Bb = B.data() + bi * K * N;
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        Acc sum = 0;
        for (int64_t kk = 0; kk < K; ++kk) {
          Acc av = p.trans_a ? Ab[kk * M + i] : Ab[i * K + kk];
          Acc bv = p.trans_b ? Bb[j * K + kk] : Bb[kk * N + j];
          sum += av * bv;
        }
        int64_t idx = (bi * M + i) * N + j;
        sum += bias[static_cast<size_t>(j)];
        if (!old.empty()) sum += old[static_cast<size_t>(idx)];  // c (accumulate) or the residual
        if (p.relu) sum = std::max(sum, Acc(0));
        C[static_cast<size_t>(idx)] = sum;
      }
    }
  }
  internal::narrow<Acc>(C.data(), c, p.c_dtype, p.batch * M * N);
}

template <typename Acc>
void bias_grad_impl(const void* dy, DType dy_dtype, int64_t rows, int64_t cols, void* db, DType db_dtype,
                    bool accumulate) {
  std::vector<Acc> D = internal::widen<Acc>(dy, dy_dtype, rows * cols);
  std::vector<Acc> sums(static_cast<size_t>(cols), Acc(0));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) sums[static_cast<size_t>(j)] += D[static_cast<size_t>(i * cols + j)];
  internal::narrow<Acc>(sums.data(), db, db_dtype, cols, accumulate);
}

}  // namespace

void matmul(const MatmulParams& p, const void* a, const void* b, void* c) {
  check_matmul_params(p, "matmul (reference)");
  if (p.c_dtype == DType::kF64) {
    matmul_impl<double>(p, a, b, c);
  } else {
    matmul_impl<float>(p, a, b, c);
  }
}

void bias_grad(const void* dy, DType dy_dtype, int64_t rows, int64_t cols, void* db, DType db_dtype,
               bool accumulate) {
  DEMI_CHECK(rows >= 1 && cols >= 1, "bias_grad (reference): sizes must be positive, got dy(", rows, ", ",
             cols, ")");
  DEMI_CHECK((dy_dtype == DType::kF64) == (db_dtype == DType::kF64),
             "bias_grad (reference): float64 cannot be mixed with other dtypes, got dy ",
             dtype_name(dy_dtype), ", db ", dtype_name(db_dtype));
  if (dy_dtype == DType::kF64) {
    bias_grad_impl<double>(dy, dy_dtype, rows, cols, db, db_dtype, accumulate);
  } else {
    bias_grad_impl<float>(dy, dy_dtype, rows, cols, db, db_dtype, accumulate);
  }
}

}  // namespace demi::kernels::ref
