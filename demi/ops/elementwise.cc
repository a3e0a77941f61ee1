// Elementwise ops with NumPy broadcasting: add, sub, mul, div, neg, and the scalar forms.
#include "demi/kernels/cpu/elementwise.h"
#include "demi/ops/internal/helpers.h"
#include "demi/ops/ops.h"

namespace demi::ops {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;
using internal::binary;
using internal::grad_as;
using internal::sum_to;

Op op_of(BinaryOp b) {
  switch (b) {
    case BinaryOp::kAdd: return Op::kAdd;
    case BinaryOp::kSub: return Op::kSub;
    case BinaryOp::kMul: return Op::kMul;
    case BinaryOp::kDiv: return Op::kDiv;
  }
  return Op::kAdd;
}

Tensor binary_op(BinaryOp bop, const Tensor& a_in, const Tensor& b_in) {
  Op op = op_of(bop);
  internal::check_floating(op, a_in, "a");
  internal::check_floating(op, b_in, "b");
  Dispatch d(op, {&a_in, &b_in});
  Tensor a = d.input(0), b = d.input(1);
  Tensor y = binary(bop, a, b);
  Shape sa = a.shape(), sb = b.shape();
  DType dt = y.dtype();
  BackwardFn bwd;
  switch (bop) {
    case BinaryOp::kAdd:
      bwd = [sa, sb, dt](const TensorList& g) {
        Tensor gy = grad_as(g[0], dt);
        return TensorList{sum_to(gy, sa), sum_to(gy, sb)};
      };
      break;
    case BinaryOp::kSub:
      bwd = [sa, sb, dt](const TensorList& g) {
        Tensor gy = grad_as(g[0], dt);
        return TensorList{sum_to(gy, sa), internal::affine(sum_to(gy, sb), -1.0, 0.0)};
      };
      break;
    case BinaryOp::kMul:
      bwd = [a, b, dt](const TensorList& g) {
        Tensor gy = grad_as(g[0], dt);
        return TensorList{sum_to(binary(BinaryOp::kMul, gy, b), a.shape()),
                          sum_to(binary(BinaryOp::kMul, gy, a), b.shape())};
      };
      break;
    case BinaryOp::kDiv:
      bwd = [a, b, dt](const TensorList& g) {
        Tensor gy = grad_as(g[0], dt);
        Tensor ga = binary(BinaryOp::kDiv, gy, b);
        // d(a/b)/db = -a/b^2 = -(ga * a / b)
        Tensor gb = internal::affine(binary(BinaryOp::kDiv, binary(BinaryOp::kMul, ga, a), b), -1.0, 0.0);
        return TensorList{sum_to(ga, a.shape()), sum_to(gb, b.shape())};
      };
      break;
  }
  return d.finish(y, std::move(bwd));
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  return kernels::broadcast_shape(a.dims(), b.dims(), op);
}

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kAdd, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kSub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kMul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::kDiv, a, b); }

Tensor neg(const Tensor& x_in) {
  internal::check_floating(Op::kNeg, x_in, "x");
  Dispatch d(Op::kNeg, {&x_in});
  Tensor x = d.input(0);
  Tensor y = internal::unary(UnaryOp::kNeg, x);
  DType dt = y.dtype();
  return d.finish(y, [dt](const TensorList& g) { return TensorList{internal::affine(grad_as(g[0], dt), -1.0, 0.0)}; });
}

Tensor add_scalar(const Tensor& x_in, double s) {
  internal::check_floating(Op::kAddScalar, x_in, "x");
  Dispatch d(Op::kAddScalar, {&x_in});
  Tensor x = d.input(0);
  Tensor y = internal::affine(x, 1.0, s);
  DType dt = y.dtype();
  return d.finish(y, [dt](const TensorList& g) { return TensorList{grad_as(g[0], dt)}; });
}

Tensor mul_scalar(const Tensor& x_in, double s) {
  internal::check_floating(Op::kMulScalar, x_in, "x");
  Dispatch d(Op::kMulScalar, {&x_in});
  Tensor x = d.input(0);
  Tensor y = internal::affine(x, s, 0.0);
  DType dt = y.dtype();
  return d.finish(y, [dt, s](const TensorList& g) { return TensorList{internal::affine(grad_as(g[0], dt), s, 0.0)}; });
}

}  // namespace demi::ops
