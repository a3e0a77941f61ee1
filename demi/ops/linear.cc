// Matrix products: matmul, batch_matmul and Dense (x·wᵀ + b, ReLU optionally fused), through oneDNN.
//
// Under AMP the activations arrive in the low dtype and Dense's FP32 weight is read rounded to it by the
// products themselves (no cast, no low-precision copy); the weight and bias gradients are summed in FP32
// inside the product and stored once in the dtype Dispatch::param_grad_dtype gives (FP32 or bf16).
#include "demi/kernels/onednn/dense.h"
#include "demi/kernels/matmul.h"
#include "demi/ops/internal/helpers.h"
#include "demi/ops/observer.h"
#include "demi/ops/ops.h"

namespace demi::ops {

std::string matmul_kernel(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, DType a, DType b, DType c,
                          bool bias, bool relu) {
  kernels::MatmulParams p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.a_dtype = a;
  p.b_dtype = b;
  p.c_dtype = c;
  const float bias_mark = 0;  // matmul_kernel only tests whether a bias is present
  p.bias = bias ? &bias_mark : nullptr;
  p.relu = relu;
  return kernels::matmul_kernel(p);
}

std::string matmul_kernel_cache() { return kernels::matmul_cache_path(); }

std::string dense_weights_kernel(int64_t rows, int64_t in, int64_t out, DType dtype) {
  kernels::onednn::DenseParams p;
  p.m = rows;
  p.k = in;
  p.n = out;
  p.x_dtype = p.y_dtype = dtype;
  p.w_dtype = p.bias_dtype = DType::kF32;
  return kernels::onednn::dense_backward_weights_kernel(p, true);
}

std::string dense_weights_kernel_cache() { return kernels::onednn::dense_weights_cache_path(); }

namespace {

using internal::grad_as;

Tensor product(const Tensor& a, const Tensor& b, bool ta, bool tb, int64_t batch, Shape out_shape, DType out_dtype,
               bool accumulate_into, Tensor* into) {
  kernels::MatmulParams p;
  p.batch = batch;
  int64_t ar = a.dim(-2), ac = a.dim(-1), br = b.dim(-2), bc = b.dim(-1);
  p.m = ta ? ac : ar;
  p.k = ta ? ar : ac;
  p.n = tb ? br : bc;
  p.trans_a = ta;
  p.trans_b = tb;
  p.a_dtype = a.dtype();
  p.b_dtype = b.dtype();
  p.c_dtype = out_dtype;
  p.accumulate = accumulate_into;
  Tensor c = into ? *into : empty(out_shape, out_dtype);
  kernels::matmul(p, a.raw_data(), b.raw_data(), c.raw_data());
  return c;
}

Tensor matmul_impl(Op op, const Tensor& a_in, const Tensor& b_in, bool ta, bool tb, int rank) {
  internal::check_floating(op, a_in, "a");
  internal::check_floating(op, b_in, "b");
  DEMI_CHECK(a_in.rank() == rank && b_in.rank() == rank, op_name(op), ": expected ", rank == 2 ? "2-D" : "3-D",
             " operands, got a ", a_in.describe(), " and b ", b_in.describe());
  int64_t batch = rank == 3 ? a_in.dim(0) : 1;
  DEMI_CHECK(rank == 2 || b_in.dim(0) == batch, op_name(op), ": batch sizes differ: a ", a_in.describe(), ", b ",
             b_in.describe());
  int64_t m = ta ? a_in.dim(-1) : a_in.dim(-2), ka = ta ? a_in.dim(-2) : a_in.dim(-1);
  int64_t kb = tb ? b_in.dim(-1) : b_in.dim(-2), n = tb ? b_in.dim(-2) : b_in.dim(-1);
  DEMI_CHECK(ka == kb, op_name(op), ": inner dimensions differ: a ", a_in.describe(), (ta ? " (transposed)" : ""),
             " has K=", ka, ", b ", b_in.describe(), (tb ? " (transposed)" : ""), " has K=", kb);
  Dispatch d(op, {&a_in, &b_in});
  Tensor a = d.input(0), b = d.input(1);
  Shape out = rank == 3 ? Shape{batch, m, n} : Shape{m, n};
  Tensor y = product(a, b, ta, tb, batch, out, d.compute_dtype(), false, nullptr);
  DType dt = y.dtype();
  const DType gb_dtype = d.param_grad_dtype(1, b.dtype());
  return d.finish(y, [a, b, ta, tb, batch, dt, gb_dtype](const TensorList& g) {
    Tensor gy = grad_as(g[0], dt);
    // y = op(a) op(b):  d op(a) = gy op(b)^T,  d op(b) = op(a)^T gy
    // b's gradient first (the product sums in FP32 and stores it in gb_dtype, Dispatch::param_grad_dtype):
    // it is a's last reader, so a's gradient can then take a's bytes where this rule holds a's only
    // reference (as Dense's data gradient does).
    Tensor gb = tb ? product(gy, a, true, ta, batch, b.shape(), gb_dtype, false, nullptr)
                   : product(a, gy, !ta, false, batch, b.shape(), gb_dtype, false, nullptr);
    Tensor ga_buffer = internal::reuse_or_empty(a);
    Tensor ga = ta ? product(b, gy, tb, true, batch, a.shape(), a.dtype(), false, &ga_buffer)
                   : product(gy, b, false, !tb, batch, a.shape(), a.dtype(), false, &ga_buffer);
    return TensorList{ga, gb};
  });
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  return matmul_impl(Op::kMatmul, a, b, trans_a, trans_b, 2);
}

Tensor batch_matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  return matmul_impl(Op::kBatchMatmul, a, b, trans_a, trans_b, 3);
}

namespace {

void check_dense(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in) {
  internal::check_floating(Op::kDense, x_in, "x");
  internal::check_floating(Op::kDense, w_in, "weight");
  DEMI_CHECK(x_in.rank() == 2 && w_in.rank() == 2 && x_in.dim(1) == w_in.dim(1), "Dense: expected x (M, K) and ",
             "weight (N, K) with the same K, got x ", x_in.describe(), " and weight ", w_in.describe());
  if (b_in.defined())
    DEMI_CHECK(b_in.rank() == 1 && b_in.dim(0) == w_in.dim(0), "Dense: expected bias (", w_in.dim(0), "), got ",
               b_in.describe());
}

// Dense, with the residual r_in (undefined: none) added in the product's store; dense_add decides when.
Tensor dense_impl(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, bool relu, const Tensor& r_in) {
  Dispatch d(Op::kDense, {&x_in, &w_in, &b_in, &r_in});
  // An FP32 weight (AMP's master) under a low compute dtype is not cast: the products read it rounded to
  // that dtype as they pack it (DenseParams::w_round), bit for bit a product of the cast weight, so no
  // low-precision copy of it is held — not in the cast cache, not as the optimizer's low copy, not saved
  // for backward (the layer keeps the parameter itself).
  const bool round_w = w_in.dtype() == DType::kF32 && is_low_precision(d.compute_dtype());
  // Any other weight cast to the low dtype (a bf16 weight at O2-fp16, say) is kept for backward (in the
  // per-step cast cache) only when recasting it would cost a noticeable share of the layer: with M rows
  // the three products take 6·M·N·K flops and a recast one pass over N·K elements, so from kRecastRows rows
  // on (recast < ~1% of the products) the copy is freed after the forward product and the weight recast in
  // backward.
  constexpr int64_t kRecastRows = 2048;
  const bool recast_w = !round_w && x_in.dim(0) >= kRecastRows && w_in.dtype() != d.compute_dtype();
  const internal::CallWeight cw =
      round_w ? internal::CallWeight{w_in, w_in} : internal::weight_for_call(d, 1, w_in, recast_w);
  // The data batch is not cast: the products read it rounded as they pack it (internal::batch_read_as,
  // DenseParams::x_round), in forward and in the weight gradient, bit for bit the cast batch.
  const DType x_round = internal::batch_read_as(d, x_in);
  Tensor x = x_round == DType::kF32 ? d.input(0) : x_in, w = cw.now, b = d.input(2);
  kernels::onednn::DenseParams p;
  p.m = x.dim(0);
  p.k = x.dim(1);
  p.n = w.dim(0);
  p.x_dtype = x.dtype();
  p.w_dtype = w.dtype();
  p.w_round = round_w ? d.compute_dtype() : DType::kF32;
  p.x_round = x_round;
  p.y_dtype = d.compute_dtype();
  p.bias_dtype = b.defined() ? b.dtype() : p.y_dtype;
  p.relu = relu;
  Tensor y = empty({p.m, p.n}, p.y_dtype);
  const bool residual = r_in.defined();
  DEMI_ASSERT(!residual || (r_in.dtype() == p.y_dtype && r_in.shape() == y.shape() && !relu),
              "Dense: a residual ", r_in.describe(), " is added in the store of a ", dtype_name(p.y_dtype), " ",
              y.shape(), " product without ReLU only");
  kernels::onednn::dense_forward(p, x.raw_data(), w.raw_data(), b.defined() ? b.raw_data() : nullptr, y.raw_data(),
                                 residual ? r_in.raw_data() : nullptr);
  bool has_bias = b.defined();
  DType b_dtype = has_bias ? b.dtype() : p.y_dtype;
  bool need_dx = d.input_needs_grad(0);
  // A fused ReLU's mask, as bits (not y: see ops/activation.cc).
  Tensor mask = relu && d.needs_grad() ? internal::relu_mask_of(y) : Tensor();
  // As in conv2d: a cast input that needs no gradient is saved as the caller's tensor and recast in backward.
  Tensor x_saved = !need_dx && !x.is_same(x_in) ? x_in : x;
  const DType dw_dtype = d.param_grad_dtype(1, round_w ? p.w_round : p.w_dtype);
  const DType db_dtype = d.param_grad_dtype(2, b_dtype);
  return d.finish(y, [x = x_saved, w_saved = cw.saved, mask, p, has_bias, b_dtype, relu, need_dx, dw_dtype,
                      db_dtype, residual](const TensorList& g) {
    Tensor gy = grad_as(g[0], p.y_dtype);
    if (relu) gy = internal::relu_backward_from_mask(g[0], gy, mask);
    kernels::onednn::DenseParams q = p;
    q.relu = false;
    Tensor dx, dw, db;
    auto data_gradient = [&](Tensor buffer) {
      const Tensor wc = internal::as_dtype_for_call(w_saved, p.w_dtype);
      dx = std::move(buffer);
      kernels::onednn::dense_backward_data(q, gy.raw_data(), wc.raw_data(), dx.raw_data());
    };
    auto weight_gradient = [&] {
      kernels::onednn::DenseParams qw = q;
      qw.w_dtype = dw_dtype;  // the kernels sum in FP32 and store in these dtypes
      qw.bias_dtype = db_dtype;
      dw = empty(w_saved.shape(), dw_dtype);
      db = has_bias ? empty({p.n}, db_dtype) : Tensor();
      const Tensor xc = x.dtype() == p.x_dtype ? x : x.to(p.x_dtype);
      kernels::onednn::dense_backward_weights(qw, xc.raw_data(), gy.raw_data(), dw.raw_data(),
                                              has_bias ? db.raw_data() : nullptr);
    };
    // Where this rule holds x's only reference, the weight gradient (x's last reader) runs first and the
    // data gradient (x's shape and dtype) then takes x's bytes: one activation less at the step's peak,
    // which is this backward on models A, B and D. Otherwise the data gradient runs first. So it does where
    // the data gradient's products read the FP32 weight rounded (AMP's master: a rounded copy of it, up
    // to 2 MiB, may be packed) and x is smaller than the weight gradient: that copy alive beside dW costs
    // more than reusing x saves (model C's 1024 x 1024 layer at O2-bf16, 0.5 MiB of x against a 2 MiB dW:
    // its training peak went 19.13 -> 20.78 MB when its ReLU stopped holding x and the weight gradient ran
    // first). With x no smaller than dW the weight gradient first is never worse: x + dW + the copy (at
    // most dW's bytes) against x + dx + dW (model B's 3136 -> 128 layer, x and dW 0.77 MiB each in bf16).
    const int64_t x_bytes = x.numel() * static_cast<int64_t>(dtype_size(x.dtype()));
    const int64_t dw_bytes = w_saved.numel() * static_cast<int64_t>(dtype_size(dw_dtype));
    const bool rounded_w = p.w_round != DType::kF32;
    if (need_dx && internal::only_holder(x) && (!rounded_w || x_bytes >= dw_bytes)) {
      weight_gradient();
      data_gradient(x);
    } else {
      if (need_dx) data_gradient(empty(x.shape(), x.dtype()));  // a first layer's data needs no gradient
      weight_gradient();
    }
    // The residual's gradient is the output's (the add passes it through), as the Add's backward gives it.
    return TensorList{dx, dw, db, residual ? gy : Tensor()};
  });
}

}  // namespace

Tensor dense(const Tensor& x, const Tensor& w, const Tensor& b, bool relu) {
  check_dense(x, w, b);
  return dense_impl(x, w, b, relu, Tensor());
}

Tensor dense_add(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& residual) {
  check_dense(x, w, b);
  internal::check_floating(Op::kDense, residual, "residual");
  DEMI_CHECK(residual.rank() == 2 && residual.dim(0) == x.dim(0) && residual.dim(1) == w.dim(0),
             "Dense: expected a residual (", x.dim(0), ", ", w.dim(0), ") for x ", x.describe(), " and weight ",
             w.describe(), ", got ", residual.describe());
  // The product's dtype as Dense alone would compute it (the residual not counted), and whether an Add of
  // it and the residual would compute and return that dtype: only then is the fused sum the Add's but for
  // its one rounding.
  const DType out = Dispatch(Op::kDense, {&x, &w, &b}).compute_dtype();
  const PrecisionPolicy* policy = current_precision_policy();
  const bool to_fp32 = policy != nullptr && !current_dtype_pin() &&
                       (policy->outputs_to_fp32(Op::kDense) || policy->outputs_to_fp32(Op::kAdd));
  const bool fuse = fusion_enabled() && residual.dtype() == out && !to_fp32 &&
                    resolve_compute_dtype(Op::kAdd, out) == out;
  if (!fuse) return add(residual, dense(x, w, b));
  return dense_impl(x, w, b, false, residual);
}

}  // namespace demi::ops
