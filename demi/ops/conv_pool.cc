// Conv2d (bias and ReLU optionally fused) through oneDNN, and max/avg pooling, including the fused
// ReLU -> MaxPool2d and the fused Conv2d -> ReLU -> MaxPool2d that models A and B use. MindSpore's pad_mode
// is resolved here into explicit padding.
#include "demi/kernels/cpu/activation.h"
#include "demi/kernels/cpu/pool.h"
#include "demi/kernels/matmul.h"
#include "demi/kernels/onednn/conv.h"
#include "demi/ops/internal/helpers.h"
#include "demi/ops/ops.h"

namespace demi::ops {
namespace {

using internal::grad_as;

kernels::Pool2dParams pool_params(Op op, const Tensor& x, const Pool2dOptions& o) {
  internal::check_rank(op, x, 4, "x", "(N, C, H, W)");
  return kernels::make_pool2d_params(x.dim(0), x.dim(1), x.dim(2), x.dim(3), o.kernel[0], o.kernel[1], o.stride[0],
                                     o.stride[1], o.pad_mode, o.padding[0], o.padding[2], true, op_name(op));
}

Tensor max_pool_impl(Op op, const Tensor& x_in, const Pool2dOptions& o, bool fuse_relu) {
  internal::check_floating(op, x_in, "x");
  kernels::Pool2dParams p = pool_params(op, x_in, o);
  Dispatch d(op, {&x_in});
  Tensor x = d.input(0);
  Tensor y = empty({p.n, p.c, p.oh, p.ow}, x.dtype());
  Tensor argmax;
  if (d.needs_grad()) argmax = empty({p.n, p.c, p.oh, p.ow}, DType::kU8);
  uint8_t* am = argmax.defined() ? argmax.data<uint8_t>() : nullptr;
  if (fuse_relu)
    kernels::relu_max_pool2d_forward(p, x.dtype(), x.raw_data(), y.raw_data(), am);
  else
    kernels::max_pool2d_forward(p, x.dtype(), x.raw_data(), y.raw_data(), am);
  DType dt = x.dtype();
  return d.finish(y, [p, argmax, dt](const TensorList& g) {
    Tensor gy = grad_as(g[0], dt);
    Tensor dx = empty({p.n, p.c, p.h, p.w}, dt);
    kernels::max_pool2d_backward(p, dt, gy.raw_data(), argmax.data<uint8_t>(), dx.raw_data());
    return TensorList{dx};
  });
}

// Checks a convolution's operands (naming `op`) and resolves its padding.
kernels::Conv2dPadding conv_padding(Op op, const Tensor& x_in, const Tensor& w_in, const Tensor& b_in,
                                    const Conv2dOptions& o) {
  internal::check_floating(op, x_in, "x");
  internal::check_floating(op, w_in, "weight");
  internal::check_rank(op, x_in, 4, "x", "(N, C, H, W)");
  internal::check_rank(op, w_in, 4, "weight", "(OC, C/groups, KH, KW)");
  DEMI_CHECK(o.groups >= 1 && x_in.dim(1) % o.groups == 0 && w_in.dim(0) % o.groups == 0 &&
                 w_in.dim(1) * o.groups == x_in.dim(1),
             "Conv2d: input ", x_in.describe(), " has ", x_in.dim(1), " channels but weight ", w_in.describe(),
             " with groups=", o.groups, " expects ", w_in.dim(1) * o.groups);
  if (b_in.defined())
    DEMI_CHECK(b_in.rank() == 1 && b_in.dim(0) == w_in.dim(0), "Conv2d: expected bias (", w_in.dim(0), "), got ",
               b_in.describe());
  return kernels::resolve_conv2d_padding(
      o.pad_mode, x_in.dim(2), x_in.dim(3), w_in.dim(2), w_in.dim(3), o.stride[0], o.stride[1], o.dilation[0],
      o.dilation[1], o.padding[0], o.padding[1], o.padding[2], o.padding[3]);
}

// The convolution's geometry from its (cast) operands and options; dtypes left to the caller.
kernels::Conv2dParams conv_params(const Tensor& x, const Tensor& w, const Conv2dOptions& o,
                                  const kernels::Conv2dPadding& pad) {
  kernels::Conv2dParams p;
  p.n = x.dim(0), p.c = x.dim(1), p.h = x.dim(2), p.w = x.dim(3);
  p.oc = w.dim(0), p.kh = w.dim(2), p.kw = w.dim(3);
  p.stride_h = o.stride[0], p.stride_w = o.stride[1];
  p.pad_top = pad.top, p.pad_bottom = pad.bottom, p.pad_left = pad.left, p.pad_right = pad.right;
  p.dilation_h = o.dilation[0], p.dilation_w = o.dilation[1];
  p.groups = o.groups;
  return p;
}

}  // namespace

namespace {
// Multiply-adds of the convolution, twice (the forward pass's FLOPs, for the dtype trace).
int64_t conv_flops(const kernels::Conv2dParams& p) {
  return 2 * p.n * p.oc * p.out_h() * p.out_w() * (p.c / std::max<int64_t>(p.groups, 1)) * p.kh * p.kw;
}
}  // namespace

namespace {
// A stride-1 convolution with symmetric padding, as the diagnostics below describe one.
kernels::Conv2dParams diagnostic_params(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t kh, int64_t kw,
                                        int64_t pad) {
  kernels::Conv2dParams p;
  p.n = n;
  p.c = c;
  p.h = h;
  p.w = w;
  p.oc = oc;
  p.kh = kh;
  p.kw = kw;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = pad;
  return p;
}

// The weight of a convolution call: an FP32 one under a low compute dtype is cast for each call that reads
// it — forward, and backward-data (as workspace) — and never kept: no cast cache entry and no
// optimizer-written low copy, so training holds no low-precision copy of the convolution weights between
// calls (model R's were 21 MiB at O2, 8% of its O0 peak). It costs one cast per call, a pass over the weight
// against a product of N·OH·OW multiply-adds per weight element. (Dense needs no cast at all: its products round the weight as
// they pack it, DenseParams::w_round; the convolution kernels, oneDNN's among them, read w as stored.)
internal::CallWeight conv_weight(const Dispatch& d, const Tensor& w_in) {
  return internal::weight_for_call(d, 1, w_in, w_in.dtype() == DType::kF32 && is_low_precision(d.compute_dtype()));
}

// Under F16Products::kBf16 (an explicit option; kernels/matmul.h), a convolution layer whose
// operands are f16 (or f16 and bf16) multiplies them as bf16: x, w and the output's gradient are rounded to
// bf16 before its kernels, which then run as bf16 convolutions (vdpbf16ps, AMX) with f32 sums, and the
// outputs keep their dtypes (y and dx in f16, rounded once; dw, db in the gradient's dtype). The values are
// exactly those of the same layer on bf16-cast operands, as with kernels::matmul's bf16_products.
struct ProductDtypes {
  bool bf16 = false;  // the f16 values are rounded to bf16
  DType x, w;         // the layer's operands as stored (x, w after the AMP cast)
};

// The operand t (stored in `stored`) as the product reads it, as workspace (a value only this call reads).
Tensor product_workspace(const Tensor& t, DType stored, DType dtype) {
  MemCategoryScope cat(MemCategory::kWorkspace);
  return internal::as_product_operand(t, stored, dtype);
}

// A layer's x and w (after the AMP cast) made what its kernels read: rounded to bf16 where its products
// are bf16's (x kept for the weight gradient, w as workspace), else left as they are.
ProductDtypes products_of(Tensor& x, Tensor& w) {
  const ProductDtypes pt{kernels::f16_products_in_bf16(x.dtype(), w.dtype()), x.dtype(), w.dtype()};
  if (pt.bf16) {
    x = internal::as_product_operand(x, pt.x, DType::kBF16);
    w = product_workspace(w, pt.w, DType::kBF16);
  }
  return pt;
}

// The layer's x: the data batch handed to the kernels as it is, read as the compute dtype's values
// (internal::batch_read_as, Conv2dParams::x_round: no rounded copy of it in forward or in backward); any
// other x cast as the op's inputs are.
Tensor layer_input(const Dispatch& d, const Tensor& x_in, kernels::Conv2dParams& p) {
  p.x_round = internal::batch_read_as(d, x_in);
  return p.x_round == DType::kF32 ? d.input(0) : x_in;
}

}  // namespace

std::string conv2d_bf16_kernel(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t kh, int64_t kw,
                               int64_t pad) {
  return kernels::onednn::conv2d_bf16_kernel(diagnostic_params(n, c, h, w, oc, kh, kw, pad));
}

std::string conv2d_kernel_cache() { return kernels::onednn::conv_cache_path(); }

ConvKernelChoice conv2d_direct_kernels(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t kh, int64_t kw,
                                       int64_t pad, DType dtype) {
  kernels::Conv2dParams p = diagnostic_params(n, c, h, w, oc, kh, kw, pad);
  p.x_dtype = dtype;
  return {kernels::onednn::conv2d_direct_kernel(p, kernels::onednn::ConvDirection::kForward),
          kernels::onednn::conv2d_direct_kernel(p, kernels::onednn::ConvDirection::kBackwardWeights)};
}

std::string conv2d_direct_cache() { return kernels::onednn::conv_direct_cache_path(); }

std::string conv2d_forward_kernel(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t kh, int64_t kw,
                                  int64_t pad, DType dtype) {
  kernels::Conv2dParams p = diagnostic_params(n, c, h, w, oc, kh, kw, pad);
  p.x_dtype = dtype;
  return kernels::onednn::conv2d_forward_kernel(p);
}

std::string conv2d_gemm_cache() { return kernels::onednn::conv_gemm_cache_path(); }

Tensor conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Conv2dOptions& o) {
  kernels::Conv2dPadding pad = conv_padding(Op::kConv2d, x_in, w_in, b_in, o);
  Dispatch d(Op::kConv2d, {&x_in, &w_in, &b_in});
  const internal::CallWeight cw = conv_weight(d, w_in);
  kernels::Conv2dParams p = conv_params(x_in, w_in, o, pad);
  Tensor x = layer_input(d, x_in, p), w = cw.now, b = d.input(2);
  const ProductDtypes pt = products_of(x, w);
  p.x_dtype = x.dtype();
  p.w_dtype = w.dtype();
  p.y_dtype = d.compute_dtype();
  p.bias_dtype = b.defined() ? b.dtype() : p.y_dtype;
  p.relu = o.relu;
  d.set_flops(conv_flops(p));
  Tensor y = empty({p.n, p.oc, p.out_h(), p.out_w()}, p.y_dtype);
  kernels::onednn::conv2d_forward(p, x.raw_data(), w.raw_data(), b.defined() ? b.raw_data() : nullptr, y.raw_data());
  bool has_bias = b.defined();
  bool need_dx = d.input_needs_grad(0);
  // The output is saved only when a fused ReLU needs its mask: otherwise it would stay alive until
  // backward for nothing (the largest activation of a conv network).
  Tensor y_saved = p.relu ? y : Tensor();
  // An input that needs no gradient (the data batch) but was cast for AMP is saved as the caller's tensor,
  // which the caller holds anyway, and cast again in backward: the low-precision copy dies right after
  // forward instead of living through the step.
  Tensor x_saved = !need_dx && !x.is_same(x_in) ? x_in : x;
  const DType dw_dtype = d.param_grad_dtype(1, p.w_dtype), db_dtype = d.param_grad_dtype(2, p.bias_dtype);
  return d.finish(y, [x = x_saved, w = cw.saved, y = y_saved, p, pt, has_bias, need_dx, dw_dtype,
                      db_dtype](const TensorList& g) {
    Tensor gy = grad_as(g[0], p.y_dtype);
    if (p.relu) {
      Tensor masked = internal::reuse_or_empty(y);  // y, once nothing else holds it
      kernels::activation_backward(kernels::Activation::kReLU, gy.dtype(), y.raw_data(), gy.raw_data(),
                                   masked.raw_data(), gy.numel());
      gy = masked;
    }
    if (pt.bf16) gy = product_workspace(gy, gy.dtype(), DType::kBF16);
    kernels::Conv2dParams q = p;
    q.relu = false;
    q.y_dtype = gy.dtype();
    Tensor dx;
    if (need_dx) {  // the first layer's input (the data) needs none: skip the whole backward-data pass
      kernels::Conv2dParams qd = q;
      qd.x_dtype = pt.x;  // dx in the input's dtype
      dx = empty(x.shape(), pt.x);
      const Tensor wc = product_workspace(w, pt.w, p.w_dtype);
      kernels::onednn::conv2d_backward_data(qd, gy.raw_data(), wc.raw_data(), dx.raw_data());
    }
    q.w_dtype = dw_dtype;  // the kernel sums in FP32 and stores in these dtypes
    q.bias_dtype = db_dtype;
    Tensor dw = empty(w.shape(), dw_dtype);
    Tensor db = has_bias ? empty({p.oc}, db_dtype) : Tensor();
    Tensor xc = internal::as_product_operand(x, pt.x, p.x_dtype);
    kernels::onednn::conv2d_backward_weights(q, xc.raw_data(), gy.raw_data(), dw.raw_data(),
                                             has_bias ? db.raw_data() : nullptr);
    return TensorList{dx, dw, db};
  });
}

void check_conv2d_transpose_options(const Conv2dTransposeOptions& o) {
  const char* op = "Conv2dTranspose";
  DEMI_CHECK(o.groups >= 1, op, ": groups must be >= 1, got ", o.groups);
  DEMI_CHECK(o.stride[0] >= 1 && o.stride[1] >= 1 && o.dilation[0] >= 1 && o.dilation[1] >= 1, op, ": stride (",
             o.stride[0], ", ", o.stride[1], ") and dilation (", o.dilation[0], ", ", o.dilation[1],
             ") must be >= 1");
  const auto& pd = o.padding;
  DEMI_CHECK(pd[0] >= 0 && pd[1] >= 0 && pd[2] >= 0 && pd[3] >= 0, op,
             ": padding must be non-negative, got (top ", pd[0], ", bottom ", pd[1], ", left ", pd[2], ", right ",
             pd[3], ")");
  DEMI_CHECK(o.pad_mode == PadMode::kPad || (pd[0] == 0 && pd[1] == 0 && pd[2] == 0 && pd[3] == 0), op,
             ": padding must be 0 when pad_mode is \"", pad_mode_name(o.pad_mode), "\" (as in MindSpore), got (",
             pd[0], ", ", pd[1], ", ", pd[2], ", ", pd[3], "); use pad_mode \"pad\" for explicit padding");
  const auto& op_pad = o.output_padding;
  DEMI_CHECK(op_pad[0] >= 0 && op_pad[1] >= 0, op, ": output_padding must be non-negative, got (", op_pad[0], ", ",
             op_pad[1], ")");
  DEMI_CHECK(o.pad_mode == PadMode::kPad || (op_pad[0] == 0 && op_pad[1] == 0), op,
             ": output_padding needs pad_mode \"pad\", got (", op_pad[0], ", ", op_pad[1], ") with pad_mode \"",
             pad_mode_name(o.pad_mode), "\"");
  // Below the stride, the extra rows are the ones a strided convolution leaves unread (its output size is
  // a floor): then the convolution OH -> H exists and this is its adjoint.
  DEMI_CHECK(op_pad[0] < o.stride[0] && op_pad[1] < o.stride[1], op, ": output_padding (", op_pad[0], ", ",
             op_pad[1], ") must be smaller than the stride (", o.stride[0], ", ", o.stride[1], ")");
}

std::array<int64_t, 2> conv2d_transpose_output_size(int64_t h, int64_t w, int64_t kh, int64_t kw,
                                                    const Conv2dTransposeOptions& o) {
  const char* op = "Conv2dTranspose";
  check_conv2d_transpose_options(o);
  DEMI_CHECK(h >= 1 && w >= 1 && kh >= 1 && kw >= 1, op, ": input (", h, "x", w, ") and kernel (", kh, "x", kw,
             ") sizes must be positive");
  const auto& pd = o.padding;
  const auto& op_pad = o.output_padding;
  auto size = [&](const char* dim, int64_t in, int64_t k, int64_t s, int64_t d, int64_t lo, int64_t hi,
                  int64_t extra) {
    const int64_t dk = d * (k - 1) + 1;
    int64_t out = 0;
    switch (o.pad_mode) {
      case PadMode::kSame: out = in * s; break;
      case PadMode::kValid: out = in * s + std::max<int64_t>(dk - s, 0); break;
      case PadMode::kPad: out = (in - 1) * s + dk - lo - hi + extra; break;
    }
    DEMI_CHECK(out >= 1, op, ": the ", dim, " padding (", lo, ", ", hi, ") leaves no output for an input of ", in,
               " with a kernel of ", k, " (dilation ", d, ") and stride ", s);
    return out;
  };
  return {size("height", h, kh, o.stride[0], o.dilation[0], pd[0], pd[1], op_pad[0]),
          size("width", w, kw, o.stride[1], o.dilation[1], pd[2], pd[3], op_pad[1])};
}

// The convolution y (N, OC, OH, OW) -> x (N, IC, H, W) by w (IC, OC/groups, KH, KW) whose adjoint this is:
// forward = its backward-data, backward = its forward (dx) and backward-weights (dw, with x and dy swapped).
Tensor conv2d_transpose(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Conv2dTransposeOptions& o) {
  const Op op = Op::kConv2dTranspose;
  internal::check_floating(op, x_in, "x");
  internal::check_floating(op, w_in, "weight");
  internal::check_rank(op, x_in, 4, "x", "(N, IC, H, W)");
  internal::check_rank(op, w_in, 4, "weight", "(IC, OC/groups, KH, KW)");
  DEMI_CHECK(o.groups >= 1 && w_in.dim(0) % o.groups == 0 && x_in.dim(1) == w_in.dim(0), "Conv2dTranspose: input ",
             x_in.describe(), " has ", x_in.dim(1), " channels but weight ", w_in.describe(), " with groups=",
             o.groups, " expects ", w_in.dim(0), " (its first dimension, divisible by groups)");
  const int64_t oc = w_in.dim(1) * o.groups;
  if (b_in.defined())
    DEMI_CHECK(b_in.rank() == 1 && b_in.dim(0) == oc, "Conv2dTranspose: expected bias (", oc, "), got ",
               b_in.describe());
  const auto [oh, ow] = conv2d_transpose_output_size(x_in.dim(2), x_in.dim(3), w_in.dim(2), w_in.dim(3), o);
  kernels::Conv2dPadding pad = kernels::resolve_conv2d_padding(
      o.pad_mode, oh, ow, w_in.dim(2), w_in.dim(3), o.stride[0], o.stride[1], o.dilation[0], o.dilation[1],
      o.padding[0], o.padding[1], o.padding[2], o.padding[3]);
  DEMI_CHECK(pad.out_h == x_in.dim(2) && pad.out_w == x_in.dim(3), "Conv2dTranspose: internal: the convolution ",
             oh, "x", ow, " -> ", pad.out_h, "x", pad.out_w, " does not map back to the input ", x_in.describe());

  Dispatch d(op, {&x_in, &w_in});
  const internal::CallWeight cw = conv_weight(d, w_in);
  Tensor x = d.input(0), w = cw.now;
  const ProductDtypes pt = products_of(x, w);
  kernels::Conv2dParams p;
  p.n = x.dim(0), p.c = oc, p.h = oh, p.w = ow;
  p.oc = x.dim(1), p.kh = w.dim(2), p.kw = w.dim(3);
  p.stride_h = o.stride[0], p.stride_w = o.stride[1];
  p.pad_top = pad.top, p.pad_bottom = pad.bottom, p.pad_left = pad.left, p.pad_right = pad.right;
  p.dilation_h = o.dilation[0], p.dilation_w = o.dilation[1];
  p.groups = o.groups;
  p.x_dtype = d.compute_dtype();  // the convolution's input is this op's output
  p.w_dtype = w.dtype();
  p.y_dtype = x.dtype();          // and its output this op's input
  p.bias_dtype = p.x_dtype;
  d.set_flops(conv_flops(p));
  Tensor y = empty({p.n, oc, oh, ow}, p.x_dtype);
  kernels::onednn::conv2d_backward_data(p, x.raw_data(), w.raw_data(), y.raw_data());
  const bool need_dx = d.input_needs_grad(0);
  const DType dw_dtype = d.param_grad_dtype(1, p.w_dtype);
  Tensor out = d.finish(y, [x, w = cw.saved, p, pt, need_dx, dw_dtype](const TensorList& g) {
    Tensor gy = grad_as(g[0], p.x_dtype);
    if (pt.bf16) gy = product_workspace(gy, gy.dtype(), DType::kBF16);
    kernels::Conv2dParams q = p;
    q.x_dtype = gy.dtype();
    Tensor dx;
    if (need_dx) {
      kernels::Conv2dParams qd = q;
      qd.y_dtype = pt.x;  // dx in the input's dtype
      dx = empty(x.shape(), pt.x);
      const Tensor wc = product_workspace(w, pt.w, p.w_dtype);
      kernels::onednn::conv2d_forward(qd, gy.raw_data(), wc.raw_data(), nullptr, dx.raw_data());
    }
    q.w_dtype = dw_dtype;
    Tensor dw = empty(w.shape(), dw_dtype);
    kernels::onednn::conv2d_backward_weights(q, gy.raw_data(), x.raw_data(), dw.raw_data(), nullptr);
    return TensorList{dx, dw};
  });
  // MindSpore's Conv2dTranspose adds its bias with BiasAdd after the product; so does this.
  if (!b_in.defined()) return out;
  return add(out, reshape(b_in, {1, oc, 1, 1}));
}

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o) { return max_pool_impl(Op::kMaxPool2d, x, o, false); }

Tensor relu_max_pool2d(const Tensor& x, const Pool2dOptions& o) {
  return max_pool_impl(Op::kReluMaxPool2d, x, o, true);
}

Tensor conv2d_relu_max_pool2d(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Conv2dOptions& o,
                              const Pool2dOptions& po) {
  const Op op = Op::kConv2dReluMaxPool2d;
  kernels::Conv2dPadding pad = conv_padding(op, x_in, w_in, b_in, o);
  kernels::Conv2dParams p = conv_params(x_in, w_in, o, pad);
  DEMI_CHECK(p.out_h() >= 1 && p.out_w() >= 1, op_name(op), ": the convolution's output is empty for input ",
             x_in.describe(), " and weight ", w_in.describe());
  const kernels::Pool2dParams pool =
      kernels::make_pool2d_params(p.n, p.oc, p.out_h(), p.out_w(), po.kernel[0], po.kernel[1], po.stride[0],
                                  po.stride[1], po.pad_mode, po.padding[0], po.padding[2], true, op_name(op));
  if (x_in.dtype() == DType::kF64 || w_in.dtype() == DType::kF64 || o.relu || !kernels::strided_pool_supported(pool))
    return relu_max_pool2d(conv2d(x_in, w_in, b_in, o), po);
  Dispatch d(op, {&x_in, &w_in, &b_in});
  d.set_flops(conv_flops(p));
  const internal::CallWeight cw = conv_weight(d, w_in);
  Tensor x = layer_input(d, x_in, p), w = cw.now, b = d.input(2);
  const ProductDtypes pt = products_of(x, w);
  const DType out = d.compute_dtype();  // the pooled output's dtype, as the two ops would store it
  p.x_dtype = x.dtype();
  p.w_dtype = w.dtype();
  p.y_dtype = out == DType::kBF16 ? DType::kBF16 : DType::kF32;  // the convolution's own output (f16: f32)
  p.bias_dtype = b.defined() ? b.dtype() : DType::kF32;
  Tensor y = empty({pool.n, pool.c, pool.oh, pool.ow}, out);
  Tensor argmax;
  if (d.needs_grad()) argmax = empty({pool.n, pool.c, pool.oh, pool.ow}, DType::kU8);
  kernels::onednn::conv2d_relu_max_pool2d_forward(p, pool, x.raw_data(), w.raw_data(),
                                                  b.defined() ? b.raw_data() : nullptr, out, y.raw_data(),
                                                  argmax.defined() ? argmax.data<uint8_t>() : nullptr);
  const bool has_bias = b.defined(), need_dx = d.input_needs_grad(0);
  Tensor x_saved = !need_dx && !x.is_same(x_in) ? x_in : x;  // as in conv2d: the data batch is recast
  const DType dw_dtype = d.param_grad_dtype(1, p.w_dtype), db_dtype = d.param_grad_dtype(2, p.bias_dtype);
  return d.finish(y, [x = x_saved, w = cw.saved, argmax, p, pt, pool, out, has_bias, need_dx, dw_dtype,
                      db_dtype](const TensorList& g) {
    Tensor gy = grad_as(g[0], out);
    kernels::Conv2dParams q = p;
    // The pooled gradient read as a bf16 convolution output's: rounded as the kernels unpool it (no copy)
    if (pt.bf16) q.y_dtype = DType::kBF16;
    // Where this rule holds x's only reference (and dx has x's dtype), the weight gradient (x's reader) runs
    // first and the data gradient then takes x's bytes: one activation less at the step's peak, which is
    // this backward on model B (its second layer: 1.5 MiB of x at O2, 3 at O0).
    const bool dx_into_x = need_dx && pt.x == x.dtype() && internal::only_holder(x);
    Tensor dw = empty(w.shape(), dw_dtype);
    Tensor db = has_bias ? empty({p.oc}, db_dtype) : Tensor();
    Tensor dx;
    {
      Tensor xc = internal::as_product_operand(x, pt.x, p.x_dtype);
      // (only the data gradient reads the weight)
      const Tensor wc = need_dx ? product_workspace(w, pt.w, p.w_dtype) : Tensor();
      if (need_dx && !dx_into_x) dx = empty(x.shape(), pt.x);
      kernels::onednn::conv2d_relu_max_pool2d_backward(q, pool, xc.raw_data(), dx.defined() ? wc.raw_data() : nullptr,
                                                       gy.dtype(), gy.raw_data(), argmax.data<uint8_t>(),
                                                       dx.defined() ? dx.raw_data() : nullptr, dw.raw_data(),
                                                       dw_dtype, has_bias ? db.raw_data() : nullptr, db_dtype, pt.x);
      if (dx_into_x) {
        xc = Tensor();
        dx = x;
        kernels::onednn::conv2d_relu_max_pool2d_backward(q, pool, nullptr, wc.raw_data(), gy.dtype(), gy.raw_data(),
                                                         argmax.data<uint8_t>(), dx.raw_data(), nullptr, dw_dtype,
                                                         nullptr, db_dtype, pt.x);
      }
    }
    return TensorList{dx, dw, db};
  });
}

Tensor avg_pool2d(const Tensor& x_in, const Pool2dOptions& o) {
  internal::check_floating(Op::kAvgPool2d, x_in, "x");
  kernels::Pool2dParams p = pool_params(Op::kAvgPool2d, x_in, o);
  Dispatch d(Op::kAvgPool2d, {&x_in});
  Tensor x = d.input(0);
  Tensor y = empty({p.n, p.c, p.oh, p.ow}, x.dtype());
  kernels::avg_pool2d_forward(p, x.dtype(), x.raw_data(), y.raw_data());
  DType dt = x.dtype();
  return d.finish(y, [p, dt](const TensorList& g) {
    Tensor gy = grad_as(g[0], dt);
    Tensor dx = empty({p.n, p.c, p.h, p.w}, dt);
    kernels::avg_pool2d_backward(p, dt, gy.raw_data(), dx.raw_data());
    return TensorList{dx};
  });
}

}  // namespace demi::ops
