// The losses (softmax cross-entropy, fused; MSE) — always FP32, whatever the level — and the
// normalisation/regularisation ops: BatchNorm (statistics in FP32) and Dropout.
#include <cmath>

#include "demi/kernels/cpu/batchnorm.h"
#include "demi/kernels/cpu/dropout.h"
#include "demi/kernels/cpu/loss.h"
#include "demi/ops/internal/helpers.h"
#include "demi/ops/ops.h"

namespace demi::ops {
namespace {

using internal::grad_as;

Shape loss_shape(Reduction r, int64_t n) { return r == Reduction::kNone ? Shape{n} : Shape{}; }

template <typename Acc>
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, bool sparse, Reduction r, Dispatch& d) {
  kernels::CrossEntropyParams p;
  p.n = logits.dim(0);
  p.c = logits.dim(1);
  p.reduction = r;
  DType acc = dtype_of_v<Acc>;
  Tensor loss = empty(loss_shape(r, p.n), acc);
  Tensor lse = empty({p.n}, acc);
  Tensor target = sparse ? labels : labels.to(logits.dtype());
  if (sparse)
    kernels::softmax_cross_entropy_sparse_forward(logits.raw_data(), logits.dtype(), target.raw_data(), target.dtype(),
                                                  p, loss.data<Acc>(), lse.data<Acc>());
  else
    kernels::softmax_cross_entropy_dense_forward(logits.raw_data(), logits.dtype(), target.raw_data(), target.dtype(),
                                                 p, loss.data<Acc>(), lse.data<Acc>());
  return d.finish(loss, [logits, target, lse, p, sparse, acc](const TensorList& g) {
    Tensor gl = grad_as(g[0], acc);
    Tensor dx = empty(logits.shape(), logits.dtype());
    if (sparse)
      kernels::softmax_cross_entropy_sparse_backward(logits.raw_data(), logits.dtype(), target.raw_data(),
                                                     target.dtype(), lse.data<Acc>(), gl.data<Acc>(), p, dx.raw_data());
    else
      kernels::softmax_cross_entropy_dense_backward(logits.raw_data(), logits.dtype(), target.raw_data(), target.dtype(),
                                                    lse.data<Acc>(), gl.data<Acc>(), p, dx.raw_data());
    return TensorList{dx, Tensor()};
  });
}

}  // namespace

Reduction parse_reduction(std::string_view s) {
  if (s == "mean") return Reduction::kMean;
  if (s == "sum") return Reduction::kSum;
  if (s == "none") return Reduction::kNone;
  DEMI_CHECK(false, "unknown reduction \"", s, "\"; expected \"mean\", \"sum\" or \"none\"");
  return Reduction::kMean;
}

Tensor softmax_cross_entropy(const Tensor& logits_in, const Tensor& labels, bool sparse, Reduction r) {
  const Op op = Op::kSoftmaxCrossEntropy;
  internal::check_floating(op, logits_in, "logits");
  internal::check_rank(op, logits_in, 2, "logits", "(N, C)");
  DEMI_CHECK(labels.defined(), op_name(op), ": labels are undefined");
  if (sparse) {
    DEMI_CHECK(labels.rank() == 1 && labels.dim(0) == logits_in.dim(0) &&
                   (labels.dtype() == DType::kI32 || labels.dtype() == DType::kI64),
               op_name(op), " (sparse=true): expected int32 or int64 labels (", logits_in.dim(0),
               ") for logits ", logits_in.describe(), ", got labels ", labels.describe());
  } else {
    DEMI_CHECK(labels.shape() == logits_in.shape() && is_floating(labels.dtype()), op_name(op),
               " (sparse=false): expected floating labels of the logits' shape ", logits_in.shape(), ", got ",
               labels.describe(), " (pass sparse=true for class-id labels)");
  }
  Dispatch d(op, {&logits_in, sparse ? nullptr : &labels});
  Tensor logits = d.input(0);
  if (logits.dtype() == DType::kF64) return cross_entropy<double>(logits, labels, sparse, r, d);
  return cross_entropy<float>(logits, labels, sparse, r, d);
}

Tensor mse_loss(const Tensor& pred_in, const Tensor& target_in, Reduction r) {
  const Op op = Op::kMseLoss;
  internal::check_floating(op, pred_in, "pred");
  internal::check_floating(op, target_in, "target");
  DEMI_CHECK(pred_in.shape() == target_in.shape(), op_name(op), ": pred ", pred_in.describe(), " and target ",
             target_in.describe(), " must have the same shape");
  Dispatch d(op, {&pred_in, &target_in});
  Tensor x = d.input(0), t = d.input(1);
  bool f64 = x.dtype() == DType::kF64;
  DType acc = f64 ? DType::kF64 : DType::kF32;
  Tensor loss = empty(loss_shape(r, x.numel()), acc);
  if (f64)
    kernels::mse_forward(x.raw_data(), t.raw_data(), x.dtype(), x.numel(), r, loss.data<double>());
  else
    kernels::mse_forward(x.raw_data(), t.raw_data(), x.dtype(), x.numel(), r, loss.data<float>());
  return d.finish(loss, [x, t, r, acc, f64](const TensorList& g) {
    Tensor gl = grad_as(g[0], acc);
    Tensor dx = empty(x.shape(), x.dtype()), dt = empty(x.shape(), x.dtype());
    if (f64)
      kernels::mse_backward(x.raw_data(), t.raw_data(), x.dtype(), x.numel(), r, gl.data<double>(), dx.raw_data(),
                            dt.raw_data());
    else
      kernels::mse_backward(x.raw_data(), t.raw_data(), x.dtype(), x.numel(), r, gl.data<float>(), dx.raw_data(),
                            dt.raw_data());
    return TensorList{dx, dt};
  });
}

Tensor batch_norm(const Tensor& x_in, const Tensor& gamma_in, const Tensor& beta_in, const Tensor& running_mean,
                  const Tensor& running_var, const BatchNormOptions& o) {
  const Op op = Op::kBatchNorm;
  internal::check_floating(op, x_in, "x");
  DEMI_CHECK(x_in.rank() == 2 || x_in.rank() == 4, "BatchNorm: expected x (N, C) or (N, C, H, W), got ",
             x_in.describe());
  int64_t c = x_in.dim(1);
  for (const Tensor* t : {&gamma_in, &beta_in, &running_mean, &running_var})
    DEMI_CHECK(t->defined() && t->rank() == 1 && t->dim(0) == c && is_floating(t->dtype()), "BatchNorm: expected (",
               c, ") parameters and statistics for x ", x_in.describe(), ", got ",
               t->defined() ? t->describe() : std::string("undefined"));
  Dispatch d(op, {&x_in, &gamma_in, &beta_in});
  // Kept in FP32 (O2's black list) with a float16/bfloat16 input: the kernels read the low dtype, compute
  // the statistics and the affine in FP32 inside and write the output in the input's dtype — the values
  // a cast to FP32, an FP32 BatchNorm and a cast back would give (one rounding, at the store), without
  // the two full-size FP32 tensors, and backward likewise (cuDNN's mixed-precision batch norm).
  const bool mixed = d.compute_dtype() == DType::kF32 && is_low_precision(x_in.dtype());
  Tensor x = mixed ? x_in : d.input(0);
  bool f64 = x.dtype() == DType::kF64;
  DType stat = f64 ? DType::kF64 : DType::kF32;
  Tensor gamma = d.input_as(1, stat), beta = d.input_as(2, stat);
  kernels::BatchNormParams p;
  p.n = x.dim(0);
  p.c = c;
  p.spatial = x.rank() == 4 ? x.dim(2) * x.dim(3) : 1;
  p.eps = static_cast<float>(o.eps);
  p.momentum = static_cast<float>(o.momentum);
  if (o.training)
    DEMI_CHECK(p.n * p.spatial >= 2, "BatchNorm in training needs more than one value per channel, got x ",
               x.describe(), " (use a batch larger than 1, or set_train(false))");
  Tensor y = empty(x.shape(), x.dtype());
  Tensor mean = empty({c}, stat), invstd = empty({c}, stat);
  // Running statistics are FP32 buffers; an f64 run (gradient checks) works on f64 copies.
  Tensor rm = running_mean.dtype() == stat ? running_mean : running_mean.to(stat);
  Tensor rv = running_var.dtype() == stat ? running_var : running_var.to(stat);
  if (f64) {
    if (o.training)
      kernels::batch_norm_forward_training(x.raw_data(), x.dtype(), gamma.data<double>(), beta.data<double>(), p,
                                           y.raw_data(), mean.data<double>(), invstd.data<double>(), rm.data<double>(),
                                           rv.data<double>());
    else
      kernels::batch_norm_forward_inference(x.raw_data(), x.dtype(), gamma.data<double>(), beta.data<double>(),
                                            rm.data<double>(), rv.data<double>(), p, y.raw_data());
  } else {
    if (o.training)
      kernels::batch_norm_forward_training(x.raw_data(), x.dtype(), gamma.data<float>(), beta.data<float>(), p,
                                           y.raw_data(), mean.data<float>(), invstd.data<float>(), rm.data<float>(),
                                           rv.data<float>());
    else
      kernels::batch_norm_forward_inference(x.raw_data(), x.dtype(), gamma.data<float>(), beta.data<float>(),
                                            rm.data<float>(), rv.data<float>(), p, y.raw_data(), invstd.data<float>());
  }
  if (o.training && !rm.is_same(running_mean)) {
    Tensor(running_mean).copy_(rm);  // handles share data: this writes the caller's buffers
    Tensor(running_var).copy_(rv);
  }
  if (!o.training) {
    mean = rm.clone();
    if (f64) {
      // the f64 inference kernel does not hand back invstd; compute it here (cheap: C values)
      for (int64_t i = 0; i < c; ++i) invstd.data<double>()[i] = 1.0 / std::sqrt(rv.data<double>()[i] + o.eps);
    }
  }
  bool training = o.training;
  return d.finish(y, [x, gamma, mean, invstd, p, training, f64](const TensorList& g) {
    Tensor gy = grad_as(g[0], x.dtype());
    Tensor dx = empty(x.shape(), x.dtype());
    DType stat_dt = f64 ? DType::kF64 : DType::kF32;
    Tensor dgamma = empty({p.c}, stat_dt), dbeta = empty({p.c}, stat_dt);
    if (f64)
      kernels::batch_norm_backward(x.raw_data(), gy.raw_data(), x.dtype(), gamma.data<double>(), mean.data<double>(),
                                   invstd.data<double>(), p, training, dx.raw_data(), dgamma.data<double>(),
                                   dbeta.data<double>());
    else
      kernels::batch_norm_backward(x.raw_data(), gy.raw_data(), x.dtype(), gamma.data<float>(), mean.data<float>(),
                                   invstd.data<float>(), p, training, dx.raw_data(), dgamma.data<float>(),
                                   dbeta.data<float>());
    return TensorList{dx, dgamma, dbeta};
  });
}

Tensor dropout(const Tensor& x_in, double keep_prob, Generator& gen, bool training) {
  const Op op = Op::kDropout;
  internal::check_floating(op, x_in, "x");
  DEMI_CHECK(keep_prob > 0 && keep_prob <= 1, "Dropout: keep_prob must be in (0, 1], got ", keep_prob);
  if (!training || keep_prob == 1.0) return x_in;
  Dispatch d(op, {&x_in});
  Tensor x = d.input(0);
  int64_t n = x.numel();
  kernels::DropoutParams p = kernels::make_dropout_params(static_cast<float>(keep_prob), gen, n);
  Tensor y = empty(x.shape(), x.dtype());
  Tensor mask = empty({kernels::dropout_mask_bytes(n)}, DType::kU8);
  kernels::dropout_forward(p, x.dtype(), x.raw_data(), y.raw_data(), mask.data<uint8_t>(), n);
  DType dt = x.dtype();
  float kp = p.keep_prob;
  return d.finish(y, [mask, dt, kp, n](const TensorList& g) {
    Tensor gy = grad_as(g[0], dt);
    Tensor dx = empty(gy.shape(), dt);
    kernels::dropout_backward(kp, dt, gy.raw_data(), mask.data<uint8_t>(), dx.raw_data(), n);
    return TensorList{dx};
  });
}

}  // namespace demi::ops
