#include "demi/ops/internal/helpers.h"

#include <algorithm>

#include "demi/core/convert.h"
#include "demi/core/memory.h"
#include "demi/kernels/cpu/activation.h"
#include "demi/kernels/cpu/elementwise.h"
#include "demi/kernels/matmul.h"

namespace demi::ops::internal {

void check_floating(Op op, const Tensor& x, const char* arg) {
  DEMI_CHECK(x.defined(), op_name(op), ": input ", arg, " is undefined");
  DEMI_CHECK(is_floating(x.dtype()), op_name(op), ": input ", arg, " must be floating, got ", x.describe());
}

void check_rank(Op op, const Tensor& x, int rank, const char* arg, const char* layout) {
  DEMI_CHECK(x.defined(), op_name(op), ": input ", arg, " is undefined");
  DEMI_CHECK(x.rank() == rank, op_name(op), ": expected ", arg, " of rank ", rank, " ", layout, ", got ",
             x.describe());
}

Tensor grad_as(const Tensor& g, DType dtype) { return g.dtype() == dtype ? g : g.to(dtype); }

bool only_holder(const Tensor& saved) {
  return saved.impl_ptr().use_count() == 1 && saved.impl().storage.use_count() == 1;
}

Tensor reuse_or_empty(const Tensor& saved) { return only_holder(saved) ? saved : empty(saved.shape(), saved.dtype()); }

Tensor reuse_incoming_or_empty(const Tensor& incoming, const Tensor& gy) {
  const long handles = gy.is_same(incoming) ? 2 : 1;  // the engine's and the rule's, or the rule's conversion
  const bool own = gy.impl_ptr().use_count() == handles && gy.impl().storage.use_count() == 1;
  return own ? gy : empty(gy.shape(), gy.dtype());
}

Tensor relu_mask_of(const Tensor& y) {
  Tensor bits = empty({kernels::ref::relu_mask_bytes(y.numel())}, DType::kU8);
  kernels::relu_mask(y.dtype(), y.raw_data(), static_cast<uint8_t*>(bits.raw_data()), y.numel());
  return bits;
}

Tensor relu_backward_from_mask(const Tensor& incoming, const Tensor& gy, const Tensor& bits) {
  Tensor dx = reuse_incoming_or_empty(incoming, gy);
  kernels::relu_backward_mask(gy.dtype(), static_cast<const uint8_t*>(bits.raw_data()), gy.raw_data(), dx.raw_data(),
                              gy.numel());
  return dx;
}

CallWeight weight_for_call(const Dispatch& d, size_t index, const Tensor& w_in, bool recast) {
  if (!recast) {
    Tensor w = d.input(index);
    return {w, w};
  }
  return {d.input_uncached(index), w_in};
}

Tensor as_dtype_for_call(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  MemCategoryScope cat(MemCategory::kWorkspace);
  return t.to(dtype);
}

DType batch_read_as(const Dispatch& d, const Tensor& x_in) {
  const DType t = d.compute_dtype();
  const bool read_rounded = x_in.dtype() == DType::kF32 && is_low_precision(t) && !d.input_needs_grad(0) &&
                            !kernels::f16_products_in_bf16(t, t) && fusion_enabled();
  return read_rounded ? t : DType::kF32;
}

Tensor as_product_operand(const Tensor& t, DType stored, DType dtype) {
  if (t.dtype() == dtype) return t;
  if (stored == dtype || t.dtype() == stored || dtype_size(t.dtype()) <= dtype_size(stored)) return t.to(dtype);
  // Through `stored` a chunk at a time on the stack (serial: the callers' tensors are a layer's input or
  // weight): no whole intermediate copy.
  Tensor out = empty(t.shape(), dtype);
  constexpr int64_t kChunk = 4096;
  alignas(64) unsigned char mid[kChunk * 8];
  const size_t in = dtype_size(t.dtype()), to = dtype_size(dtype);
  const auto* s = static_cast<const unsigned char*>(t.raw_data());
  auto* d = static_cast<unsigned char*>(out.raw_data());
  for (int64_t i = 0; i < t.numel(); i += kChunk) {
    const int64_t c = std::min(kChunk, t.numel() - i);
    convert(s + static_cast<size_t>(i) * in, t.dtype(), mid, stored, c);
    convert(mid, stored, d + static_cast<size_t>(i) * to, dtype, c);
  }
  return out;
}

Tensor binary(kernels::BinaryOp op, const Tensor& a, const Tensor& b) {
  DEMI_ASSERT(a.dtype() == b.dtype(), "binary kernel on ", a.describe(), " and ", b.describe());
  Shape out = kernels::broadcast_shape(a.shape().dims(), b.shape().dims(), kernels::binary_op_name(op));
  Tensor y = empty(out, a.dtype());
  kernels::binary(op, a.dtype(), a.raw_data(), a.shape().dims(), b.raw_data(), b.shape().dims(), y.raw_data());
  return y;
}

Tensor unary(kernels::UnaryOp op, const Tensor& x) {
  Tensor y = empty(x.shape(), x.dtype());
  kernels::unary(op, x.dtype(), x.raw_data(), y.raw_data(), x.numel());
  return y;
}

Tensor affine(const Tensor& x, double alpha, double beta) {
  Tensor y = empty(x.shape(), x.dtype());
  kernels::affine(x.dtype(), x.raw_data(), alpha, beta, y.raw_data(), x.numel());
  return y;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  Tensor y = empty(shape, g.dtype());
  kernels::sum_to_shape(g.dtype(), g.raw_data(), g.shape().dims(), y.raw_data(), shape.dims());
  return y;
}

Tensor expand_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  return binary(kernels::BinaryOp::kAdd, zeros(shape, g.dtype()), g);
}

}  // namespace demi::ops::internal
