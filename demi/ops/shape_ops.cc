// Shape ops: views that share storage; their backward reshapes the gradient back.
#include "demi/ops/ops.h"

namespace demi::ops {

Tensor reshape(const Tensor& x, const Shape& shape) {
  Dispatch d(Op::kReshape, {&x});
  Tensor y = x.reshape(shape);
  if (y.shape() == x.shape() && !d.needs_grad()) return y;
  Shape in_shape = x.shape();
  return d.finish(y, [in_shape](const TensorList& g) { return TensorList{g[0].reshape(in_shape)}; });
}

Tensor flatten(const Tensor& x, int start_dim) {
  int s = x.shape().wrap(start_dim);
  Shape out;
  for (int i = 0; i < s; ++i) out.push_back(x.dim(i));
  int64_t rest = 1;
  for (int i = s; i < x.rank(); ++i) rest *= x.dim(i);
  out.push_back(rest);
  return reshape(x, out);
}

}  // namespace demi::ops
