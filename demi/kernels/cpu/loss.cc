#include "demi/kernels/cpu/loss.h"

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/checks.h"
#include "demi/kernels/cpu/internal/loss_impl.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"
#include "demi/kernels/cpu/internal/workspace.h"
#include "demi/kernels/cpu/reduce.h"

namespace demi::kernels {
namespace cpu_internal {

const LossKernels& loss_kernels_scalar() {
  static const LossKernels k = make_loss_kernels<VecScalar>();
  return k;
}

}  // namespace cpu_internal

namespace {

using cpu_internal::Workspace;

const cpu_internal::LossKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<LossKernels> table{DEMI_KERNEL_TABLE_ENTRIES(loss)};
  return table.get();
}

using cpu_internal::is_fast_float;

void check_logits(std::string_view op, DType dtype, CrossEntropyParams p) {
  cpu_internal::check_float_entry(op, "logits", dtype, false);
  DEMI_CHECK(p.n >= 0 && p.c >= 1, op, ": expected logits of shape (n, c) with c >= 1, got (", p.n, ", ", p.c, ")");
}

template <typename L>
void check_labels_typed(const L* labels, int64_t n, int64_t c) {
  for (int64_t i = 0; i < n; ++i)
    DEMI_CHECK(labels[i] >= 0 && static_cast<int64_t>(labels[i]) < c, "softmax_cross_entropy: label ", labels[i],
               " of row ", i, " is out of range for ", c, " classes (expected 0 <= label < ", c, ")");
}

void check_labels(const void* labels, DType label_dtype, int64_t n, int64_t c) {
  DEMI_CHECK(label_dtype == DType::kI32 || label_dtype == DType::kI64,
             "softmax_cross_entropy: sparse labels must be int32 or int64, got ", dtype_name(label_dtype));
  if (label_dtype == DType::kI32)
    check_labels_typed(static_cast<const int32_t*>(labels), n, c);
  else
    check_labels_typed(static_cast<const int64_t*>(labels), n, c);
}

void check_probs(DType dtype, DType prob_dtype) {
  DEMI_CHECK(prob_dtype == dtype || prob_dtype == DType::kF32,
             "softmax_cross_entropy: dense labels must have the logits' dtype (", dtype_name(dtype),
             ") or float32, got ", dtype_name(prob_dtype));
}

// Writes the per-row losses with `fill(rows)`, then reduces them into loss.
template <typename Fill>
void reduce_rows(int64_t n, Reduction r, float* loss, Fill fill) {
  if (r == Reduction::kNone) return fill(loss);
  if (n == 0) {
    loss[0] = r == Reduction::kMean ? NAN : 0.0f;  // the mean of nothing, as PyTorch
    return;
  }
  Workspace rows(static_cast<size_t>(n) * sizeof(float));
  fill(rows.f32());
  AxisView all{1, n, 1};
  if (r == Reduction::kMean)
    reduce_mean(rows.f32(), DType::kF32, all, loss, DType::kF32);
  else
    reduce_sum(rows.f32(), DType::kF32, all, loss, DType::kF32);
}

// The per-row gradient factor: dloss[i] (none), dloss[0] (sum), dloss[0] / count (mean).
struct RowGrad {
  const float* g;
  int64_t stride;
  float mean_value;
};
RowGrad row_grad(const float* dloss, Reduction r, int64_t count) {
  if (r == Reduction::kNone) return {dloss, 1, 0.0f};
  return {dloss, 0, r == Reduction::kMean ? dloss[0] / static_cast<float>(count) : dloss[0]};
}

void check_f64(std::string_view op, DType dtype) { cpu_internal::check_float_entry(op, "", dtype, true); }

}  // namespace

void softmax_cross_entropy_sparse_forward(const void* logits, DType dtype, const void* labels, DType label_dtype,
                                          CrossEntropyParams p, float* loss, float* lse) {
  check_logits("softmax_cross_entropy", dtype, p);
  check_labels(labels, label_dtype, p.n, p.c);
  reduce_rows(p.n, p.reduction, loss, [&](float* rows) {
    kernels().ce_sparse_forward(logits, dtype, labels, label_dtype, p.n, p.c, rows, lse);
  });
}

void softmax_cross_entropy_sparse_backward(const void* logits, DType dtype, const void* labels, DType label_dtype,
                                           const float* lse, const float* dloss, CrossEntropyParams p,
                                           void* dlogits) {
  check_logits("softmax_cross_entropy_backward", dtype, p);
  check_labels(labels, label_dtype, p.n, p.c);
  if (p.n == 0) return;
  RowGrad g = row_grad(dloss, p.reduction, p.n);
  kernels().ce_sparse_backward(logits, dtype, labels, label_dtype, p.n, p.c, lse, g.stride ? g.g : &g.mean_value,
                               g.stride, 1.0f, dlogits);
}

void softmax_cross_entropy_dense_forward(const void* logits, DType dtype, const void* probs, DType prob_dtype,
                                         CrossEntropyParams p, float* loss, float* lse) {
  check_logits("softmax_cross_entropy", dtype, p);
  check_probs(dtype, prob_dtype);
  reduce_rows(p.n, p.reduction, loss, [&](float* rows) {
    kernels().ce_dense_forward(logits, dtype, probs, prob_dtype, p.n, p.c, rows, lse);
  });
}

void softmax_cross_entropy_dense_backward(const void* logits, DType dtype, const void* probs, DType prob_dtype,
                                          const float* lse, const float* dloss, CrossEntropyParams p,
                                          void* dlogits) {
  check_logits("softmax_cross_entropy_backward", dtype, p);
  check_probs(dtype, prob_dtype);
  if (p.n == 0) return;
  RowGrad g = row_grad(dloss, p.reduction, p.n);
  kernels().ce_dense_backward(logits, dtype, probs, prob_dtype, p.n, p.c, lse, g.stride ? g.g : &g.mean_value,
                              g.stride, 1.0f, dlogits);
}

void mse_forward(const void* x, const void* target, DType dtype, int64_t n, Reduction r, float* loss) {
  DEMI_CHECK(is_fast_float(dtype), "mse_loss: expected float32, bfloat16 or float16 (float64 takes the double* ",
             "overload), got ", dtype_name(dtype));
  DEMI_CHECK(n >= 0, "mse_loss: negative size ", n);
  if (r == Reduction::kNone) return kernels().mse_rows(x, target, dtype, n, loss);
  if (n == 0) {
    loss[0] = r == Reduction::kMean ? NAN : 0.0f;
    return;
  }
  double s = kernels().mse_sum(x, target, dtype, n);
  loss[0] = static_cast<float>(r == Reduction::kMean ? s / static_cast<double>(n) : s);
}

void mse_backward(const void* x, const void* target, DType dtype, int64_t n, Reduction r, const float* dloss, void* dx,
                  void* dtarget) {
  DEMI_CHECK(is_fast_float(dtype), "mse_loss_backward: expected float32, bfloat16 or float16 (float64 takes the ",
             "double* overload), got ", dtype_name(dtype));
  if (n <= 0) return;
  RowGrad g = row_grad(dloss, r, n);
  kernels().mse_backward(x, target, dtype, n, g.stride ? g.g : &g.mean_value, g.stride, 1.0f, dx, dtarget);
}

// f64: the reference kernels.

void softmax_cross_entropy_sparse_forward(const void* logits, DType dtype, const void* labels, DType label_dtype,
                                          CrossEntropyParams p, double* loss, double* lse) {
  check_f64("softmax_cross_entropy", dtype);
  check_labels(labels, label_dtype, p.n, p.c);
  auto x = static_cast<const double*>(logits);
  if (label_dtype == DType::kI32)
    ref::softmax_cross_entropy_sparse_forward(x, static_cast<const int32_t*>(labels), p, loss, lse);
  else
    ref::softmax_cross_entropy_sparse_forward(x, static_cast<const int64_t*>(labels), p, loss, lse);
}

void softmax_cross_entropy_sparse_backward(const void* logits, DType dtype, const void* labels, DType label_dtype,
                                           const double* lse, const double* dloss, CrossEntropyParams p,
                                           void* dlogits) {
  check_f64("softmax_cross_entropy_backward", dtype);
  check_labels(labels, label_dtype, p.n, p.c);
  auto x = static_cast<const double*>(logits);
  auto dx = static_cast<double*>(dlogits);
  if (label_dtype == DType::kI32)
    ref::softmax_cross_entropy_sparse_backward(x, static_cast<const int32_t*>(labels), lse, dloss, p, dx);
  else
    ref::softmax_cross_entropy_sparse_backward(x, static_cast<const int64_t*>(labels), lse, dloss, p, dx);
}

void softmax_cross_entropy_dense_forward(const void* logits, DType dtype, const void* probs, DType prob_dtype,
                                         CrossEntropyParams p, double* loss, double* lse) {
  check_f64("softmax_cross_entropy", dtype);
  check_probs(dtype, prob_dtype);
  ref::softmax_cross_entropy_dense_forward(static_cast<const double*>(logits), static_cast<const double*>(probs), p,
                                           loss, lse);
}

void softmax_cross_entropy_dense_backward(const void* logits, DType dtype, const void* probs, DType prob_dtype,
                                          const double* lse, const double* dloss, CrossEntropyParams p,
                                          void* dlogits) {
  check_f64("softmax_cross_entropy_backward", dtype);
  check_probs(dtype, prob_dtype);
  ref::softmax_cross_entropy_dense_backward(static_cast<const double*>(logits), static_cast<const double*>(probs), lse,
                                            dloss, p, static_cast<double*>(dlogits));
}

void mse_forward(const void* x, const void* target, DType dtype, int64_t n, Reduction r, double* loss) {
  check_f64("mse_loss", dtype);
  ref::mse_forward(static_cast<const double*>(x), static_cast<const double*>(target), n, r, loss);
}

void mse_backward(const void* x, const void* target, DType dtype, int64_t n, Reduction r, const double* dloss,
                  void* dx, void* dtarget) {
  check_f64("mse_loss_backward", dtype);
  ref::mse_backward(static_cast<const double*>(x), static_cast<const double*>(target), n, r, dloss,
                    static_cast<double*>(dx), static_cast<double*>(dtarget));
}

}  // namespace demi::kernels
