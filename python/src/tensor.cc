// demi._core: Tensor and dtype, numpy in and out, the functional ops a Python construct calls, autograd.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <sstream>

#include "bind.h"
#include "capture.h"

namespace demi::python {
namespace {

nb::dlpack::dtype dlpack_of(DType t) {
  switch (t) {
    case DType::kF32: return nb::dtype<float>();
    case DType::kF64: return nb::dtype<double>();
    case DType::kI32: return nb::dtype<int32_t>();
    case DType::kI64: return nb::dtype<int64_t>();
    case DType::kU8: return nb::dtype<uint8_t>();
    case DType::kBool: return nb::dtype<bool>();
    case DType::kF16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::kBF16: break;
  }
  DEMI_ASSERT(false, "no numpy dtype for ", dtype_name(t));
  return {};
}

std::optional<DType> dtype_of_dlpack(nb::dlpack::dtype d) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(d.code);
  if (d.lanes != 1) return std::nullopt;
  if (code == Code::Float && d.bits == 32) return DType::kF32;
  if (code == Code::Float && d.bits == 64) return DType::kF64;
  if (code == Code::Float && d.bits == 16) return DType::kF16;
  if (code == Code::Bfloat && d.bits == 16) return DType::kBF16;
  if (code == Code::Int && d.bits == 32) return DType::kI32;
  if (code == Code::Int && d.bits == 64) return DType::kI64;
  if (code == Code::UInt && d.bits == 8) return DType::kU8;
  if (code == Code::Bool && d.bits == 8) return DType::kBool;
  return std::nullopt;
}

Shape shape_of(const std::vector<int64_t>& dims) { return Shape(std::span<const int64_t>(dims)); }

nb::tuple shape_tuple(const Shape& s) {
  nb::list out;
  for (int64_t d : s.dims()) out.append(d);
  return nb::tuple(out);
}

// MindSpore's reshape arguments: reshape(2, 3), reshape((2, 3)) or reshape([2, 3]).
Shape shape_from_args(const nb::args& args) {
  std::vector<int64_t> dims;
  if (args.size() == 1 && !nb::isinstance<nb::int_>(args[0])) {
    for (nb::handle d : args[0]) dims.push_back(nb::cast<int64_t>(d));
  } else {
    for (nb::handle d : args) dims.push_back(nb::cast<int64_t>(d));
  }
  return shape_of(dims);
}

// Elementwise comparisons (no gradient): a bool tensor of the broadcast shape.
enum class Cmp { kEq, kNe, kLt, kLe, kGt, kGe };
Tensor compare(const Tensor& a, const Tensor& b, Cmp cmp) {
  const char* names[] = {"==", "!=", "<", "<=", ">", ">="};
  const Shape shape = ops::broadcast_shapes(a.shape(), b.shape(), names[static_cast<int>(cmp)]);
  autograd::NoGradGuard no_grad;
  // Both sides broadcast to the result's shape (an add of zeros keeps the values exact in float64).
  Tensor za = zeros(shape, DType::kF64);
  Tensor x = ops::add(ops::cast(a, DType::kF64), za);
  Tensor y = ops::add(ops::cast(b, DType::kF64), za);
  Tensor out = empty(shape, DType::kBool);
  const double* px = x.data<double>();
  const double* py = y.data<double>();
  bool* po = out.data<bool>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double u = px[i], v = py[i];
    switch (cmp) {
      case Cmp::kEq: po[i] = u == v; break;
      case Cmp::kNe: po[i] = u != v; break;
      case Cmp::kLt: po[i] = u < v; break;
      case Cmp::kLe: po[i] = u <= v; break;
      case Cmp::kGt: po[i] = u > v; break;
      case Cmp::kGe: po[i] = u >= v; break;
    }
  }
  return out;
}

// A Python operand as a tensor: a Tensor as it is, a number as a 0-d tensor of `like`'s dtype when that is
// floating (MindSpore's scalar promotion), else of the number's own.
Tensor operand(nb::handle v, const Tensor& like) {
  if (nb::isinstance<Tensor>(v)) return nb::cast<Tensor>(v);
  if (nb::isinstance<nb::float_>(v) || nb::isinstance<nb::int_>(v) || nb::isinstance<nb::bool_>(v)) {
    const DType t = is_floating(like.dtype()) ? like.dtype()
                    : nb::isinstance<nb::float_>(v) ? DType::kF32
                    : nb::isinstance<nb::bool_>(v) ? DType::kBool
                                                   : like.dtype();
    return full(Shape{}, nb::cast<double>(v), t);
  }
  return tensor_from_object(v);
}

std::vector<int> axes_of(nb::handle axis) {
  std::vector<int> axes;
  if (axis.is_none()) return axes;
  if (nb::isinstance<nb::int_>(axis)) return {nb::cast<int>(axis)};
  for (nb::handle a : axis) axes.push_back(nb::cast<int>(a));
  return axes;
}

// An op from Python: recorded where a construct is being captured (capture.h).
template <typename F>
Tensor unary(const char* what, const Tensor& x, F op) {
  return record1(what, {x}, [op](const std::vector<Tensor>& in) { return op(in[0]); });
}
template <typename F>
Tensor binary(const char* what, const Tensor& a, const Tensor& b, F op) {
  return record1(what, {a, b}, [op](const std::vector<Tensor>& in) { return op(in[0], in[1]); });
}

std::string tensor_repr(const Tensor& t) {
  not_replayable("it prints a tensor");
  std::ostringstream os;
  os << "Tensor(shape=[";
  for (int i = 0; i < t.rank(); ++i) os << (i ? ", " : "") << t.dim(i);
  os << "], dtype=" << dtype_name(t.dtype()) << ", value=\n" << t.to_string(1000) << ")";
  return os.str();
}

}  // namespace

Tensor tensor_from_object(nb::handle obj, std::optional<DType> dtype) {
  if (nb::isinstance<Tensor>(obj)) {
    Tensor t = nb::cast<Tensor>(obj);
    return dtype && *dtype != t.dtype() ? ops::cast(t, *dtype) : t;
  }
  // Looked up once (a data source converts every row through it); the reference lives as long as the process.
  static nb::handle convert = nb::object(nb::module_::import_("demi._convert").attr("as_array")).release();
  nb::object array = convert(obj, dtype ? nb::cast(*dtype) : nb::none());
  auto a = nb::cast<nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>>(array);
  const std::optional<DType> t = dtype_of_dlpack(a.dtype());
  DEMI_ASSERT(t.has_value(), "demi._convert.as_array returned an array of a dtype demi has no name for");
  std::vector<int64_t> dims(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) dims[i] = static_cast<int64_t>(a.shape(i));
  Tensor out = empty(shape_of(dims), *t);
  if (out.nbytes() > 0) std::memcpy(out.raw_data(), a.data(), out.nbytes());
  return dtype && *dtype != out.dtype() ? out.to(*dtype) : out;  // bfloat16: numpy made float32
}

nb::object tensor_to_numpy(const Tensor& t) {
  not_replayable("it reads a tensor's values into Python");
  DEMI_CHECK(t.defined(), "asnumpy: the tensor is undefined (no value)");
  Tensor v = t.dtype() == DType::kBF16 ? t.to(DType::kF32) : t;
  v.raw_data();  // computes a pending value
  std::vector<size_t> shape(v.shape().dims().begin(), v.shape().dims().end());
  auto* keep = new Tensor(v);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  nb::ndarray<nb::numpy> array(v.raw_data(), shape.size(), shape.data(), owner, nullptr, dlpack_of(v.dtype()));
  return nb::cast(array, nb::rv_policy::reference);
}

void bind_tensor(nb::module_& m) {
  nb::enum_<DType>(m, "dtype", "A tensor's element type (demi.float32, demi.float16, demi.bfloat16, ...).")
      .value("float32", DType::kF32)
      .value("float16", DType::kF16)
      .value("bfloat16", DType::kBF16)
      .value("float64", DType::kF64)
      .value("int32", DType::kI32)
      .value("int64", DType::kI64)
      .value("uint8", DType::kU8)
      .value("bool_", DType::kBool)
      .def("__str__", [](DType t) { return std::string(dtype_name(t)); });

  nb::class_<Tensor> tensor(m, "Tensor", nb::is_weak_referenceable());
  tensor.def(nb::init<>())
      .def("__init__",
           [](Tensor* self, nb::handle data, std::optional<DType> dtype) {
             new (self) Tensor(tensor_from_object(data, dtype));
           },
           nb::arg("input_data"), nb::arg("dtype") = nb::none())
      .def_prop_ro("shape", [](const Tensor& t) { return shape_tuple(t.shape()); })
      .def_prop_ro("dtype", &Tensor::dtype)
      .def_prop_ro("ndim", &Tensor::rank)
      .def_prop_ro("size", &Tensor::numel)
      .def_prop_ro("itemsize", &Tensor::element_size)
      .def_prop_ro("nbytes", &Tensor::nbytes)
      .def_prop_ro("defined", &Tensor::defined)
      .def_prop_rw("name", [](const Tensor& t) { return t.name(); },
                   [](Tensor& t, std::string n) { t.set_name(std::move(n)); })
      .def_prop_rw("requires_grad", &Tensor::requires_grad,
                   [](Tensor& t, bool on) { t.set_requires_grad(on); })
      .def_prop_ro("grad", [](const Tensor& t) -> nb::object {
        Tensor g = t.grad();
        return g.defined() ? nb::cast(g) : nb::none();
      })
      .def("_set_grad", [](Tensor& t, std::optional<Tensor> g) { t.set_grad(g ? *g : Tensor()); },
           nb::arg("grad").none())
      .def("asnumpy", &tensor_to_numpy)
      .def("numpy", &tensor_to_numpy)
      .def("__array__", [](const Tensor& t, nb::handle dtype, nb::handle copy) {
        nb::object a = tensor_to_numpy(t);
        return dtype.is_none() ? a : a.attr("astype")(dtype);
      }, nb::arg("dtype") = nb::none(), nb::arg("copy") = nb::none())
      .def("item", [](const Tensor& t) -> nb::object {
        not_replayable("it reads a tensor's value into Python (item)");
        DEMI_CHECK(t.numel() == 1, "item: the tensor has ", t.numel(), " elements (shape ", t.shape(),
                   "); item() needs exactly one");
        const double v = t.item();
        if (t.dtype() == DType::kBool) return nb::bool_(v != 0);
        if (!is_floating(t.dtype())) return nb::int_(static_cast<int64_t>(v));
        return nb::float_(v);
      })
      .def("tolist", [](const Tensor& t) { return tensor_to_numpy(t).attr("tolist")(); })
      .def("astype", [](const Tensor& t, DType d) { return unary("cast", t, [d](const Tensor& x) { return ops::cast(x, d); }); },
           nb::arg("dtype"))
      .def("to", [](const Tensor& t, DType d) { return unary("cast", t, [d](const Tensor& x) { return ops::cast(x, d); }); },
           nb::arg("dtype"))
      .def("copy", [](const Tensor& t) { return unary("copy", t, [](const Tensor& x) { return x.clone(); }); })
      .def("reshape", [](const Tensor& t, nb::args shape) {
        Shape s = shape_from_args(shape);
        return unary("reshape", t, [s](const Tensor& x) { return ops::reshape(x, s); });
      })
      .def("view", [](const Tensor& t, nb::args shape) {
        Shape s = shape_from_args(shape);
        return unary("reshape", t, [s](const Tensor& x) { return ops::reshape(x, s); });
      })
      .def("flatten", [](const Tensor& t, int start_dim) {
        return unary("flatten", t, [start_dim](const Tensor& x) { return ops::flatten(x, start_dim); });
      }, nb::arg("start_dim") = 0)
      .def("transpose", [](const Tensor& t, nb::args perm) {
        std::vector<int> p;
        if (perm.size() == 0) {
          for (int i = t.rank() - 1; i >= 0; --i) p.push_back(i);
        } else if (perm.size() == 1 && !nb::isinstance<nb::int_>(perm[0])) {
          for (nb::handle a : perm[0]) p.push_back(nb::cast<int>(a));
        } else {
          for (nb::handle a : perm) p.push_back(nb::cast<int>(a));
        }
        return unary("transpose", t, [p](const Tensor& x) { return ops::transpose(x, p); });
      })
      .def("sum", [](const Tensor& t, nb::handle axis, bool keepdims) {
        std::vector<int> a = axes_of(axis);
        return unary("sum", t, [a, keepdims](const Tensor& x) { return ops::sum(x, a, keepdims); });
      }, nb::arg("axis") = nb::none(), nb::arg("keepdims") = false)
      .def("mean", [](const Tensor& t, nb::handle axis, bool keepdims) {
        std::vector<int> a = axes_of(axis);
        return unary("mean", t, [a, keepdims](const Tensor& x) { return ops::mean(x, a, keepdims); });
      }, nb::arg("axis") = nb::none(), nb::arg("keepdims") = false)
      .def("argmax", [](const Tensor& t, std::optional<int> axis) {
        return unary("argmax", t, [axis](const Tensor& x) {
          return axis ? ops::argmax(x, *axis) : ops::argmax(ops::reshape(x, Shape{x.numel()}), 0);
        });
      }, nb::arg("axis") = nb::none())
      .def("max", [](const Tensor& t, int axis, bool keepdims) {
        return unary("max", t, [axis, keepdims](const Tensor& x) { return ops::max(x, axis, keepdims); });
      }, nb::arg("axis"), nb::arg("keepdims") = false)
      // Indexing reads values (numpy's indexing, a copy without gradient), as printing and inspecting need.
      .def("__getitem__", [](const Tensor& t, nb::handle key) { return tensor_from_object(tensor_to_numpy(t)[key]); })
      .def("__len__", [](const Tensor& t) {
        DEMI_CHECK(t.rank() > 0, "len() of a 0-d tensor");
        return t.dim(0);
      })
      .def("__bool__", [](const Tensor& t) {
        not_replayable("it branches on a tensor's value (bool)");
        DEMI_CHECK(t.numel() == 1, "the truth value of a tensor of ", t.numel(), " elements is ambiguous");
        return t.item() != 0;
      })
      .def("__float__", [](const Tensor& t) {
        not_replayable("it reads a tensor's value into Python (float)");
        DEMI_CHECK(t.numel() == 1, "float() of a tensor of ", t.numel(), " elements");
        return t.item();
      })
      .def("__int__", [](const Tensor& t) {
        not_replayable("it reads a tensor's value into Python (int)");
        DEMI_CHECK(t.numel() == 1, "int() of a tensor of ", t.numel(), " elements");
        return static_cast<int64_t>(t.item());
      })
      .def("__repr__", &tensor_repr)
      .def("__str__", [](const Tensor& t) { return nb::str(tensor_to_numpy(t)); })
      // By identity, as Python objects hash (== is elementwise, so tensors are not value-hashable).
      .def("__hash__", [](nb::handle self) { return reinterpret_cast<intptr_t>(self.ptr()); })
      .def("__neg__", [](const Tensor& t) { return unary("neg", t, [](const Tensor& x) { return ops::neg(x); }); })
      .def("__add__", [](const Tensor& a, nb::handle b) { return binary("add", a, operand(b, a), ops::add); })
      .def("__radd__", [](const Tensor& a, nb::handle b) { return binary("add", operand(b, a), a, ops::add); })
      .def("__sub__", [](const Tensor& a, nb::handle b) { return binary("sub", a, operand(b, a), ops::sub); })
      .def("__rsub__", [](const Tensor& a, nb::handle b) { return binary("sub", operand(b, a), a, ops::sub); })
      .def("__mul__", [](const Tensor& a, nb::handle b) { return binary("mul", a, operand(b, a), ops::mul); })
      .def("__rmul__", [](const Tensor& a, nb::handle b) { return binary("mul", operand(b, a), a, ops::mul); })
      .def("__truediv__", [](const Tensor& a, nb::handle b) { return binary("div", a, operand(b, a), ops::div); })
      .def("__rtruediv__", [](const Tensor& a, nb::handle b) { return binary("div", operand(b, a), a, ops::div); })
      .def("__matmul__", [](const Tensor& a, const Tensor& b) {
        return binary("matmul", a, b, [](const Tensor& x, const Tensor& y) { return ops::matmul(x, y); });
      });
  const std::pair<const char*, Cmp> comparisons[] = {{"__eq__", Cmp::kEq}, {"__ne__", Cmp::kNe},
                                                     {"__lt__", Cmp::kLt}, {"__le__", Cmp::kLe},
                                                     {"__gt__", Cmp::kGt}, {"__ge__", Cmp::kGe}};
  for (const auto& [name, cmp] : comparisons) {
    tensor.def(name, [cmp](const Tensor& a, nb::handle b) {
      return binary("compare", a, operand(b, a), [cmp](const Tensor& x, const Tensor& y) { return compare(x, y, cmp); });
    });
  }

  // Functional ops (demi.ops): recorded where a construct is captured; compute runs without the GIL.
  auto rel = nb::call_guard<nb::gil_scoped_release>();
  m.def("relu", [](const Tensor& x) { return unary("relu", x, [](const Tensor& t) { return ops::relu(t); }); }, rel);
  m.def("sigmoid", [](const Tensor& x) { return unary("sigmoid", x, [](const Tensor& t) { return ops::sigmoid(t); }); }, rel);
  m.def("tanh", [](const Tensor& x) { return unary("tanh", x, [](const Tensor& t) { return ops::tanh(t); }); }, rel);
  m.def("gelu", [](const Tensor& x, bool approximate) {
    return unary("gelu", x, [approximate](const Tensor& t) { return ops::gelu(t, approximate); });
  }, nb::arg("x"), nb::arg("approximate") = false, rel);
  m.def("silu", [](const Tensor& x) { return unary("silu", x, [](const Tensor& t) { return ops::silu(t); }); }, rel);
  m.def("softmax", [](const Tensor& x, int axis) {
    return unary("softmax", x, [axis](const Tensor& t) { return ops::softmax(t, axis); });
  }, nb::arg("x"), nb::arg("axis") = -1, rel);
  m.def("log_softmax", [](const Tensor& x, int axis) {
    return unary("log_softmax", x, [axis](const Tensor& t) { return ops::log_softmax(t, axis); });
  }, nb::arg("x"), nb::arg("axis") = -1, rel);
  m.def("matmul", [](const Tensor& a, const Tensor& b, bool ta, bool tb) {
    return binary("matmul", a, b, [ta, tb](const Tensor& x, const Tensor& y) {
      return x.rank() == 3 ? ops::batch_matmul(x, y, ta, tb) : ops::matmul(x, y, ta, tb);
    });
  }, nb::arg("a"), nb::arg("b"), nb::arg("transpose_a") = false, nb::arg("transpose_b") = false, rel);
  m.def("add", [](const Tensor& a, const Tensor& b) { return binary("add", a, b, ops::add); }, rel);
  m.def("sub", [](const Tensor& a, const Tensor& b) { return binary("sub", a, b, ops::sub); }, rel);
  m.def("mul", [](const Tensor& a, const Tensor& b) { return binary("mul", a, b, ops::mul); }, rel);
  m.def("div", [](const Tensor& a, const Tensor& b) { return binary("div", a, b, ops::div); }, rel);
  m.def("reshape", [](const Tensor& x, const std::vector<int64_t>& shape) {
    Shape s = shape_of(shape);
    return unary("reshape", x, [s](const Tensor& t) { return ops::reshape(t, s); });
  }, rel);
  m.def("transpose", [](const Tensor& x, std::vector<int> perm) {
    return unary("transpose", x, [perm](const Tensor& t) { return ops::transpose(t, perm); });
  }, rel);
  m.def("concat", [](const std::vector<Tensor>& xs, int axis) {
    return record1("concat", xs, [axis](const std::vector<Tensor>& in) { return ops::concat(in, axis); });
  }, nb::arg("tensors"), nb::arg("axis") = 0, rel);
  m.def("split", [](const Tensor& x, int axis, int64_t sections) {
    return record("split", {x}, [axis, sections](const std::vector<Tensor>& in) { return ops::split(in[0], axis, sections); });
  }, nb::arg("x"), nb::arg("axis"), nb::arg("sections"), rel);
  m.def("sum", [](const Tensor& x, std::vector<int> axes, bool keepdims) {
    return unary("sum", x, [axes, keepdims](const Tensor& t) { return ops::sum(t, axes, keepdims); });
  }, rel);
  m.def("mean", [](const Tensor& x, std::vector<int> axes, bool keepdims) {
    return unary("mean", x, [axes, keepdims](const Tensor& t) { return ops::mean(t, axes, keepdims); });
  }, rel);
  m.def("argmax", [](const Tensor& x, int axis) {
    return unary("argmax", x, [axis](const Tensor& t) { return ops::argmax(t, axis); });
  }, rel);
  m.def("cast", [](const Tensor& x, DType d) { return unary("cast", x, [d](const Tensor& t) { return ops::cast(t, d); }); },
        rel);
  m.def("zeros", [](const std::vector<int64_t>& shape, DType t) { return zeros(shape_of(shape), t); });
  m.def("ones", [](const std::vector<int64_t>& shape, DType t) { return ones(shape_of(shape), t); });

  // Autograd: what value_and_grad is made of.
  m.def("backward", [](const Tensor& root, std::optional<Tensor> grad) {
    not_replayable("it runs backward");
    autograd::backward(root, grad ? *grad : Tensor());
  }, nb::arg("root"), nb::arg("grad") = nb::none(), rel);
  m.def("grad_enabled", &autograd::grad_enabled);
}

}  // namespace demi::python
