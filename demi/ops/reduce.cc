// Reductions (sum, mean, max, argmax) accumulating in f32, and softmax / log-softmax.
#include <algorithm>

#include "demi/core/convert.h"
#include "demi/kernels/cpu/elementwise.h"
#include "demi/kernels/cpu/reduce.h"
#include "demi/kernels/cpu/softmax.h"
#include "demi/ops/internal/helpers.h"
#include "demi/ops/ops.h"

namespace demi::ops {
namespace {

using internal::grad_as;

kernels::AxisView view_of(const Shape& s, int axis) {
  kernels::AxisView v;
  for (int i = 0; i < axis; ++i) v.outer *= s[i];
  v.axis = s[axis];
  for (int i = axis + 1; i < s.rank(); ++i) v.inner *= s[i];
  return v;
}

// Normalised, sorted, unique axes (all axes when empty).
std::vector<int> normalise_axes(const Shape& s, std::vector<int> axes) {
  if (axes.empty())
    for (int i = 0; i < s.rank(); ++i) axes.push_back(i);
  for (int& a : axes) a = s.wrap(a);
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  return axes;
}

Shape reduced_shape(const Shape& s, const std::vector<int>& axes, bool keepdim) {
  Shape out;
  for (int i = 0; i < s.rank(); ++i) {
    bool reduced = std::find(axes.begin(), axes.end(), i) != axes.end();
    if (!reduced)
      out.push_back(s[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

// Sums x over `axes` (sorted), keeping them as size 1; intermediate results in f32 (f64 for f64).
Tensor sum_keepdim(const Tensor& x, const std::vector<int>& axes, DType out_dtype) {
  DType acc = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  if (axes.empty()) return x.to(out_dtype);
  Tensor cur = x;
  Shape shape = x.shape();
  for (size_t i = 0; i < axes.size(); ++i) {
    int a = axes[i];
    kernels::AxisView v = view_of(shape, a);
    shape[a] = 1;
    // The last pass writes the output dtype directly when the kernel can (x's dtype or f32).
    bool last = i + 1 == axes.size();
    DType dt = last && (out_dtype == cur.dtype() || out_dtype == acc) ? out_dtype : acc;
    Tensor y = empty(shape, dt);
    kernels::reduce_sum(cur.raw_data(), cur.dtype(), v, y.raw_data(), y.dtype());
    cur = y;
  }
  return cur.dtype() == out_dtype ? cur : cur.to(out_dtype);
}

}  // namespace

Tensor sum(const Tensor& x_in, std::vector<int> axes_in, bool keepdim) {
  internal::check_floating(Op::kSum, x_in, "x");
  Dispatch d(Op::kSum, {&x_in});
  Tensor x = d.input(0);
  std::vector<int> axes = normalise_axes(x.shape(), std::move(axes_in));
  Tensor kept = sum_keepdim(x, axes, x.dtype());
  Tensor y = kept.reshape(reduced_shape(x.shape(), axes, keepdim));
  Shape xs = x.shape(), ks = kept.shape();
  DType dt = x.dtype();
  return d.finish(y, [xs, ks, dt](const TensorList& g) {
    return TensorList{internal::expand_to(grad_as(g[0], dt).reshape(ks), xs)};
  });
}

Tensor mean(const Tensor& x_in, std::vector<int> axes_in, bool keepdim) {
  internal::check_floating(Op::kMean, x_in, "x");
  Dispatch d(Op::kMean, {&x_in});
  Tensor x = d.input(0);
  std::vector<int> axes = normalise_axes(x.shape(), std::move(axes_in));
  int64_t count = 1;
  for (int a : axes) count *= x.dim(a);
  DType acc = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor kept = sum_keepdim(x, axes, acc);
  Tensor scaled = empty(kept.shape(), x.dtype());
  kernels::affine(acc, kept.raw_data(), 1.0 / static_cast<double>(count), 0.0, kept.raw_data(), kept.numel());
  convert(kept.raw_data(), acc, scaled.raw_data(), x.dtype(), kept.numel());
  Tensor y = scaled.reshape(reduced_shape(x.shape(), axes, keepdim));
  Shape xs = x.shape(), ks = kept.shape();
  DType dt = x.dtype();
  return d.finish(y, [xs, ks, dt, count](const TensorList& g) {
    Tensor gk = internal::affine(grad_as(g[0], dt).reshape(ks), 1.0 / static_cast<double>(count), 0.0);
    return TensorList{internal::expand_to(gk, xs)};
  });
}

Tensor max(const Tensor& x_in, int axis_in, bool keepdim) {
  internal::check_floating(Op::kMax, x_in, "x");
  Dispatch d(Op::kMax, {&x_in});
  Tensor x = d.input(0);
  int axis = x.shape().wrap(axis_in);
  kernels::AxisView v = view_of(x.shape(), axis);
  Shape ks = x.shape();
  ks[axis] = 1;
  Tensor y = empty(ks, x.dtype());
  Tensor idx = empty(ks, DType::kI64);
  kernels::reduce_max(x.raw_data(), x.dtype(), v, y.raw_data(), y.dtype(), idx.data<int64_t>());
  Shape xs = x.shape();
  DType dt = x.dtype();
  Tensor out = y.reshape(reduced_shape(xs, {axis}, keepdim));
  return d.finish(out, [xs, idx, v, dt](const TensorList& g) {
    Tensor gy = grad_as(g[0], dt).to(DType::kF32);
    Tensor dx = zeros(xs, DType::kF32);
    float* px = dx.data<float>();
    const float* pg = gy.data<float>();
    const int64_t* pi = idx.data<int64_t>();
    for (int64_t o = 0; o < v.outer; ++o)
      for (int64_t i = 0; i < v.inner; ++i) {
        int64_t k = o * v.inner + i;
        px[(o * v.axis + pi[k]) * v.inner + i] = pg[k];
      }
    return TensorList{dx.to(dt)};
  });
}

Tensor argmax(const Tensor& x_in, int axis_in) {
  Dispatch d(Op::kArgmax, {&x_in});
  const Tensor& x = x_in;
  int axis = x.shape().wrap(axis_in);
  Tensor idx = empty(reduced_shape(x.shape(), {axis}, false), DType::kI64);
  kernels::reduce_argmax(x.raw_data(), x.dtype(), view_of(x.shape(), axis), idx.data<int64_t>());
  return d.finish(idx);
}

Tensor softmax(const Tensor& x_in, int axis_in) {
  internal::check_floating(Op::kSoftmax, x_in, "x");
  Dispatch d(Op::kSoftmax, {&x_in});
  Tensor x = d.input(0);
  kernels::AxisView v = view_of(x.shape(), x.shape().wrap(axis_in));
  Tensor y = empty(x.shape(), x.dtype());
  kernels::softmax_forward(x.raw_data(), x.dtype(), v, y.raw_data(), y.dtype());
  return d.finish(y, [y, v](const TensorList& g) {
    Tensor gy = grad_as(g[0], y.dtype());
    Tensor dx = empty(y.shape(), y.dtype());
    kernels::softmax_backward(y.raw_data(), gy.raw_data(), y.dtype(), v, dx.raw_data(), dx.dtype());
    return TensorList{dx};
  });
}

Tensor log_softmax(const Tensor& x_in, int axis_in) {
  internal::check_floating(Op::kLogSoftmax, x_in, "x");
  Dispatch d(Op::kLogSoftmax, {&x_in});
  Tensor x = d.input(0);
  kernels::AxisView v = view_of(x.shape(), x.shape().wrap(axis_in));
  Tensor y = empty(x.shape(), x.dtype());
  kernels::log_softmax_forward(x.raw_data(), x.dtype(), v, y.raw_data(), y.dtype());
  return d.finish(y, [y, v](const TensorList& g) {
    Tensor gy = grad_as(g[0], y.dtype());
    Tensor dx = empty(y.shape(), y.dtype());
    kernels::log_softmax_backward(y.raw_data(), gy.raw_data(), y.dtype(), v, dx.raw_data(), dx.dtype());
    return TensorList{dx};
  });
}

}  // namespace demi::ops
