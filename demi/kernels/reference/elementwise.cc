#include "demi/kernels/reference/elementwise.h"

#include <cmath>
#include <vector>

#include "demi/core/error.h"

namespace demi::kernels {

std::string_view binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "add";
    case BinaryOp::kSub: return "sub";
    case BinaryOp::kMul: return "mul";
    case BinaryOp::kDiv: return "div";
  }
  return "?";
}

std::string_view unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg: return "neg";
    case UnaryOp::kAbs: return "abs";
    case UnaryOp::kSquare: return "square";
    case UnaryOp::kSqrt: return "sqrt";
    case UnaryOp::kExp: return "exp";
    case UnaryOp::kLog: return "log";
    case UnaryOp::kReciprocal: return "reciprocal";
  }
  return "?";
}

std::string shape_string(std::span<const int64_t> d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(d[i]);
  }
  return s + ")";
}

Shape broadcast_shape(std::span<const int64_t> a, std::span<const int64_t> b, std::string_view op) {
  DEMI_CHECK(a.size() <= Shape::kMaxRank && b.size() <= Shape::kMaxRank, op, ": shapes ", shape_string(a), " and ",
             shape_string(b), " exceed the maximum rank ", Shape::kMaxRank);
  size_t rank = a.size() > b.size() ? a.size() : b.size();
  int64_t dims[Shape::kMaxRank];
  for (size_t i = 0; i < rank; ++i) {
    // Aligned at the innermost dimension: position i of the result is a's (i - (rank - a.size())).
    int64_t da = i + a.size() >= rank ? a[i + a.size() - rank] : 1;
    int64_t db = i + b.size() >= rank ? b[i + b.size() - rank] : 1;
    DEMI_CHECK(da >= 0 && db >= 0, op, ": negative dimension in shapes ", shape_string(a), " and ", shape_string(b));
    DEMI_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_string(a), " and ", shape_string(b),
               " do not broadcast: dimension ", i, " of the result would need ", da, " and ", db,
               " to match (or one of them to be 1)");
    dims[i] = da == 1 ? db : da;
  }
  return Shape(std::span<const int64_t>(dims, rank));
}

bool broadcasts_to(std::span<const int64_t> from, std::span<const int64_t> to) {
  if (from.size() > to.size()) return false;
  size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != to[lead + i] && from[i] != 1) return false;
  return true;
}

namespace ref {
namespace {

int64_t numel(std::span<const int64_t> d) {
  int64_t n = 1;
  for (int64_t v : d) n *= v;
  return n;
}

// The offset into a tensor of shape `in` (broadcast to `out`) of the element at out's flat index i.
int64_t broadcast_offset(int64_t i, std::span<const int64_t> out, std::span<const int64_t> in) {
  int64_t offset = 0, stride = 1;
  for (size_t k = out.size(); k-- > 0;) {
    int64_t coord = i % out[k];
    i /= out[k];
    size_t lead = out.size() - in.size();
    if (k >= lead) {
      int64_t d = in[k - lead];
      if (d != 1) offset += coord * stride;
      stride *= d;
    }
  }
  return offset;
}

template <typename A>
A apply(BinaryOp op, A a, A b) {
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
  }
  return a;
}

template <typename A>
A apply(UnaryOp op, A x) {
  switch (op) {
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kAbs: return std::abs(x);
    case UnaryOp::kSquare: return x * x;
    case UnaryOp::kSqrt: return std::sqrt(x);
    case UnaryOp::kExp: return std::exp(x);
    case UnaryOp::kLog: return std::log(x);
    case UnaryOp::kReciprocal: return A(1) / x;
  }
  return x;
}

}  // namespace

template <typename T>
void binary(BinaryOp op, const T* a, std::span<const int64_t> a_shape, const T* b, std::span<const int64_t> b_shape,
            T* out) {
  using A = AccT<T>;
  Shape out_shape = broadcast_shape(a_shape, b_shape, binary_op_name(op));
  int64_t n = out_shape.numel();
  for (int64_t i = 0; i < n; ++i) {
    A va = static_cast<A>(a[broadcast_offset(i, out_shape.dims(), a_shape)]);
    A vb = static_cast<A>(b[broadcast_offset(i, out_shape.dims(), b_shape)]);
    out[i] = from_acc<T>(apply(op, va, vb));
  }
}

template <typename T>
void sum_to_shape(const T* grad, std::span<const int64_t> grad_shape, T* out, std::span<const int64_t> out_shape) {
  using A = AccT<T>;
  DEMI_CHECK(broadcasts_to(out_shape, grad_shape), "sum_to_shape: shape ", shape_string(out_shape),
             " does not broadcast to the gradient's shape ", shape_string(grad_shape));
  std::vector<SumT> acc(static_cast<size_t>(numel(out_shape)), SumT(0));
  int64_t n = numel(grad_shape);
  for (int64_t i = 0; i < n; ++i)
    acc[static_cast<size_t>(broadcast_offset(i, grad_shape, out_shape))] += static_cast<A>(grad[i]);
  for (size_t j = 0; j < acc.size(); ++j) out[j] = from_acc<T>(static_cast<A>(acc[j]));
}

template <typename T>
void unary(UnaryOp op, const T* x, T* y, int64_t n) {
  using A = AccT<T>;
  for (int64_t i = 0; i < n; ++i) y[i] = from_acc<T>(apply(op, static_cast<A>(x[i])));
}

template <typename T>
void affine(const T* x, double alpha, double beta, T* y, int64_t n) {
  using A = AccT<T>;
  A al = static_cast<A>(alpha), be = static_cast<A>(beta);
  for (int64_t i = 0; i < n; ++i) {
    A p = al * static_cast<A>(x[i]);  // two roundings, as the fast kernels do
    y[i] = from_acc<T>(p + be);
  }
}

template <typename T>
void axpy(int64_t n, double alpha, const T* x, T* y) {
  using A = AccT<T>;
  A al = static_cast<A>(alpha);
  for (int64_t i = 0; i < n; ++i) {
    A p = al * static_cast<A>(x[i]);
    y[i] = from_acc<T>(static_cast<A>(y[i]) + p);
  }
}

#define DEMI_INSTANTIATE(T)                                                                                   \
  template void binary<T>(BinaryOp, const T*, std::span<const int64_t>, const T*, std::span<const int64_t>, T*); \
  template void sum_to_shape<T>(const T*, std::span<const int64_t>, T*, std::span<const int64_t>);               \
  template void unary<T>(UnaryOp, const T*, T*, int64_t);                                                     \
  template void affine<T>(const T*, double, double, T*, int64_t);                                             \
  template void axpy<T>(int64_t, double, const T*, T*);
DEMI_INSTANTIATE(float)
DEMI_INSTANTIATE(double)
DEMI_INSTANTIATE(Half)
DEMI_INSTANTIATE(BFloat16)
#undef DEMI_INSTANTIATE

}  // namespace ref
}  // namespace demi::kernels
