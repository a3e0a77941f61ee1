// demi._core: Cell (subclassed in Python with construct), demi's layers and losses, the optimizers.
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/trampoline.h>

#include <sstream>

#include "bind.h"
#include "capture.h"

namespace demi::python {
namespace {

// A cell whose construct is Python's. Called from Python or from C++ (a Model's step, a SequentialCell),
// construct takes the GIL and calls the Python method with the call's arguments: the first tensor, then the
// extra ones a Python call passed (a Transformer's mask: Python calls may take several arguments and return
// tuples, C++ calls take one tensor and return one). The C++ operator() around it gives the cell its path in
// errors, its precision policy and its pinned dtype, as for any cell.
class PyCell : public nn::Cell {
 public:
  NB_TRAMPOLINE(nn::Cell, 1);

  Tensor construct(const Tensor& x) override {
    if (call_ == nullptr) {  // a call with one tensor: GRAPH_MODE captures it (capture.h)
      CellCapture::Plan plan = capture_.plan(x, structure_version(), training());
      if (plan.replay != nullptr) {
        ++capture_.replays;
        return plan.replay->replay(x);
      }
      if (plan.record) {
        auto tape = std::make_unique<Tape>(x);
        Tensor y;
        {
          RecordingScope recording(tape.get());
          y = python_construct(x);
        }
        tape->finish(y);
        const std::string why = capture_.recorded(plan.key, std::move(tape));
        if (!why.empty() && !warned_) {
          warned_ = true;
          call_python([&] {
            const std::string msg = str_cat(type_name(), ".construct runs in Python at every call in GRAPH_MODE: ", why,
                                            ". (PYNATIVE_MODE never captures.)");
            if (PyErr_WarnEx(PyExc_RuntimeWarning, msg.c_str(), 1) != 0) throw nb::python_error();
          });
        }
        return y;
      }
    }
    return python_construct(x);
  }

  const CellCapture& capture() const { return capture_; }

  // One Python call: the arguments, and what construct returned when it was not one tensor.
  struct PyCall {
    PyObject* args = nullptr;    // borrowed: the caller's tuple
    PyObject* result = nullptr;  // owned, set by construct
  };
  // Runs a Python call of this cell (any arguments, any result) through operator(). Needs the GIL; drops
  // it while demi runs.
  nb::object call(nb::args args) {
    if (args.size() == 1 && nb::isinstance<Tensor>(args[0])) {
      Tensor x = nb::cast<Tensor>(args[0]);
      Tensor y;
      {
        nb::gil_scoped_release release;
        y = record1("cell", {x}, [this](const std::vector<Tensor>& in) { return (*this)(in[0]); });
      }
      return nb::cast(y);
    }
    not_replayable("a Python cell is called with several arguments, or returns several values");
    PyCall call{args.ptr(), nullptr};
    Tensor first = args.size() > 0 && nb::isinstance<Tensor>(args[0]) ? nb::cast<Tensor>(args[0]) : Tensor();
    Tensor y;
    {
      nb::gil_scoped_release release;
      y = call_with(call_, &call, first);
    }
    nb::object result = call.result ? nb::steal(call.result) : nb::cast(y);
    if (call.result && nb::isinstance<nb::tuple>(result) && nb::len(result) > 0 && y.defined()) {
      nb::list items(result);
      items[0] = nb::cast(y);
      result = nb::tuple(items);
    }
    return result;
  }

  // The Python class's name, which the C++ constructor cannot know (set by the first attribute a
  // subclass's __init__ assigns, or at the first call).
  void name_from_python(nb::handle self) {
    if (named_) return;
    set_type_name(nb::cast<std::string>(nb::getattr(self.type(), "__name__")));
    named_ = true;
  }

  using nn::Cell::add_cell;
  using nn::Cell::register_parameter;

 private:
  // construct in Python: the GIL for the call.
  Tensor python_construct(const Tensor& x) {
    ++capture_.python_calls;
    return call_python([&] {
      nb::object self = nb::borrow(nb_trampoline.base());
      nb::object fn = nb::getattr(self, "construct", nb::none());
      DEMI_CHECK(!fn.is_none(), type_name(), " defines no construct(self, ...)");
      nb::object out;
      if (call_ != nullptr) {
        out = fn(*nb::borrow<nb::tuple>(call_->args));
      } else {
        out = fn(x);
      }
      if (nb::isinstance<Tensor>(out)) return nb::cast<Tensor>(out);
      DEMI_CHECK(call_ != nullptr, type_name(), ".construct returned ", nb::str(nb::type_name(out.type())).c_str(),
                 " where its caller (C++: a Model, a SequentialCell) needs one Tensor; return a tuple only to a "
                 "Python caller");
      call_->result = out.release().ptr();
      // The first tensor of a tuple is the one C++'s cast back to float32 (an AMP level's network output)
      // applies to.
      if (nb::isinstance<nb::tuple>(nb::handle(call_->result)) && nb::len(nb::handle(call_->result)) > 0) {
        nb::handle first = nb::handle(call_->result)[0];
        if (nb::isinstance<Tensor>(first)) return nb::cast<Tensor>(first);
      }
      return Tensor();
    });
  }

  CellCapture capture_;
  bool warned_ = false;
  PyCall* call_ = nullptr;  // set by call() for the run of construct it makes
  bool named_ = false;
};

std::string cell_repr(nn::Cell& cell, int indent) {
  std::ostringstream os;
  os << cell.type_name() << "<";
  auto cells = cell.cells_and_names();
  bool children = false;
  for (auto& [path, c] : cells) {
    if (c == &cell || c->parent() != &cell) continue;
    const std::string name = path.substr(path.rfind('.') == std::string::npos ? 0 : path.rfind('.') + 1);
    os << "\n" << std::string(static_cast<size_t>(indent + 2), ' ') << "(" << name << "): " << cell_repr(*c, indent + 2);
    children = true;
  }
  if (!children) {
    bool first = true;
    for (auto& [name, p] : cell.parameters_and_names()) {
      os << (first ? "" : ", ") << name << "=" << p.shape();
      first = false;
    }
    os << ">";
  } else {
    os << "\n" << std::string(static_cast<size_t>(indent + 2), ' ') << ">";
  }
  return os.str();
}

std::optional<nn::Initializer> initializer_of(nb::handle init) {
  if (init.is_none()) return std::nullopt;
  if (nb::isinstance<nn::Initializer>(init)) return nb::cast<nn::Initializer>(init);
  const std::string name = nb::cast<std::string>(nb::str(init));
  if (name == "zeros" || name == "Zero") return nn::Initializer::Zero();
  if (name == "ones" || name == "One") return nn::Initializer::One();
  if (name == "normal" || name == "Normal") return nn::Initializer::Normal();
  if (name == "uniform" || name == "Uniform") return nn::Initializer::Uniform();
  if (name == "he_uniform" || name == "HeUniform") return nn::Initializer::HeUniform();
  if (name == "he_normal" || name == "HeNormal") return nn::Initializer::HeNormal();
  if (name == "xavier_uniform" || name == "XavierUniform") return nn::Initializer::XavierUniform();
  if (name == "truncated_normal" || name == "TruncatedNormal") return nn::Initializer::TruncatedNormal();
  throw Error(str_cat("unknown initializer '", name,
                      "': zeros, ones, normal, uniform, he_uniform, he_normal, xavier_uniform, truncated_normal"));
}

std::array<int64_t, 2> pair_of(nb::handle v, const char* what) {
  if (nb::isinstance<nb::int_>(v)) {
    const int64_t k = nb::cast<int64_t>(v);
    return {k, k};
  }
  auto items = nb::cast<std::vector<int64_t>>(v);
  DEMI_CHECK(items.size() == 2, what, " must be an int or a pair of ints, got ", items.size(), " values");
  return {items[0], items[1]};
}

std::array<int64_t, 4> padding_of(nb::handle v) {
  if (nb::isinstance<nb::int_>(v)) {
    const int64_t p = nb::cast<int64_t>(v);
    return {p, p, p, p};
  }
  auto items = nb::cast<std::vector<int64_t>>(v);
  DEMI_CHECK(items.size() == 4, "padding must be an int or 4 ints (top, bottom, left, right), got ", items.size());
  return {items[0], items[1], items[2], items[3]};
}

}  // namespace

void bind_nn(nb::module_& m) {
  auto rel = nb::call_guard<nb::gil_scoped_release>();
  m.def("set_python_capture", &set_python_capture);
  m.def("python_capture", &python_capture);

  nb::class_<nn::Initializer>(m, "Initializer")
      .def_static("Zero", &nn::Initializer::Zero)
      .def_static("One", &nn::Initializer::One)
      .def_static("Constant", &nn::Initializer::Constant)
      .def_static("Normal", &nn::Initializer::Normal, nb::arg("sigma") = 0.01, nb::arg("mean") = 0.0)
      .def_static("TruncatedNormal", &nn::Initializer::TruncatedNormal, nb::arg("sigma") = 0.01)
      .def_static("Uniform", &nn::Initializer::Uniform, nb::arg("scale") = 0.07)
      .def_static("HeUniform", &nn::Initializer::HeUniform, nb::arg("negative_slope") = 0.0)
      .def_static("HeNormal", &nn::Initializer::HeNormal, nb::arg("negative_slope") = 0.0)
      .def_static("XavierUniform", &nn::Initializer::XavierUniform, nb::arg("gain") = 1.0);

  nb::class_<nn::Cell, PyCell>(m, "Cell")
      .def("__init__", [](nn::Cell* self, nb::handle auto_prefix, nb::handle flags) {
        DEMI_CHECK(flags.is_none(), "Cell: flags are not supported by demi");
        DEMI_CHECK(nb::cast<bool>(auto_prefix), "Cell: auto_prefix=False is not supported by demi (parameters are "
                   "always named by their path: 'fc.weight')");
        new (self) PyCell("Cell");
      }, nb::arg("auto_prefix") = true, nb::arg("flags") = nb::none())
      .def("__call__", [](nb::handle self, nb::args args) -> nb::object {
        nn::Cell& cell = *nb::inst_ptr<nn::Cell>(self);
        if (auto* py = dynamic_cast<PyCell*>(&cell)) {
          py->name_from_python(self);
          return py->call(args);
        }
        DEMI_CHECK(args.size() == 1 && nb::isinstance<Tensor>(args[0]), cell.type_name(),
                   " takes one Tensor, got ", args.size(), " arguments");
        Tensor x = nb::cast<Tensor>(args[0]);
        Tensor y;
        {
          nb::gil_scoped_release release;
          nn::Cell* c = &cell;
          y = record1("cell", {x}, [c](const std::vector<Tensor>& in) { return (*c)(in[0]); });
        }
        return nb::cast(y);
      })
      .def("__setattr__", [](nb::handle self, nb::str name, nb::handle value) {
        auto* py = dynamic_cast<PyCell*>(nb::inst_ptr<nn::Cell>(self));
        if (py != nullptr) py->name_from_python(self);
        const std::string key = nb::cast<std::string>(name);
        if (py != nullptr && nb::isinstance<nn::Cell>(value)) {
          py->add_cell(key, nb::cast<std::shared_ptr<nn::Cell>>(value));
        } else if (py != nullptr && nb::hasattr(value, "_demi_parameter")) {
          const bool grad = nb::cast<bool>(value.attr("requires_grad"));
          Tensor p = py->register_parameter(key, nb::cast<Tensor>(value), grad);
          nb::inst_ptr<Tensor>(value)->~Tensor();
          new (nb::inst_ptr<Tensor>(value)) Tensor(p);  // the Parameter object now is the cell's parameter
        }
        if (PyObject_GenericSetAttr(self.ptr(), name.ptr(), value.ptr()) != 0) throw nb::python_error();
      })
      .def("trainable_params", &nn::Cell::trainable_params)
      .def("get_parameters", &nn::Cell::trainable_params)
      .def("parameters_and_names", &nn::Cell::parameters_and_names)
      .def("buffers_and_names", &nn::Cell::buffers_and_names)
      .def("set_train", [](nn::Cell& c, bool mode) -> nn::Cell& { c.set_train(mode); return c; },
           nb::arg("mode") = true, nb::rv_policy::reference)
      .def_prop_ro("training", &nn::Cell::training)
      .def("to_float", [](nn::Cell& c, DType t) -> nn::Cell& { return c.to_float(t); }, nb::arg("dst_type"),
           nb::rv_policy::reference)
      .def("recompute", [](nn::Cell& c, bool on) -> nn::Cell& { return c.recompute(on); }, nb::arg("mode") = true,
           nb::rv_policy::reference)
      .def("_capture_stats", [](nn::Cell& c) {
        auto* py = dynamic_cast<PyCell*>(&c);
        DEMI_CHECK(py != nullptr, "_capture_stats: ", c.type_name(), " is not a Python cell");
        return std::make_pair(py->capture().python_calls, py->capture().replays);
      })
      .def_prop_ro("type_name", &nn::Cell::type_name)
      .def_prop_ro("path", &nn::Cell::path)
      .def("num_parameters", &nn::Cell::num_parameters)
      .def("__repr__", [](nb::handle self) {
        nn::Cell& c = *nb::inst_ptr<nn::Cell>(self);
        if (auto* py = dynamic_cast<PyCell*>(&c)) py->name_from_python(self);
        return cell_repr(c, 0);
      });

  nb::class_<nn::Dense, nn::Cell>(m, "Dense")
      .def("__init__", [](nn::Dense* self, int64_t in, int64_t out, nb::handle weight_init, nb::handle bias_init,
                          bool has_bias, std::optional<std::string> activation) {
        new (self) nn::Dense(in, out, {.has_bias = has_bias, .weight_init = initializer_of(weight_init),
                                       .bias_init = initializer_of(bias_init), .activation = activation.value_or("")});
      }, nb::arg("in_channels"), nb::arg("out_channels"), nb::arg("weight_init") = nb::none(),
         nb::arg("bias_init") = nb::none(), nb::arg("has_bias") = true, nb::arg("activation") = nb::none())
      .def_ro("weight", &nn::Dense::weight)
      .def_ro("bias", &nn::Dense::bias)
      .def_ro("in_channels", &nn::Dense::in_channels)
      .def_ro("out_channels", &nn::Dense::out_channels);
  nb::class_<nn::Conv2d, nn::Cell>(m, "Conv2d")
      .def("__init__", [](nn::Conv2d* self, int64_t in, int64_t out, nb::handle kernel, nb::handle stride,
                          const std::string& pad_mode, nb::handle padding, nb::handle dilation, int64_t group,
                          bool has_bias, nb::handle weight_init, nb::handle bias_init) {
        nn::Conv2dOptions o{.stride = pair_of(stride, "stride"), .pad_mode = pad_mode, .padding = padding_of(padding),
                            .dilation = pair_of(dilation, "dilation"), .group = group, .has_bias = has_bias,
                            .weight_init = initializer_of(weight_init), .bias_init = initializer_of(bias_init)};
        new (self) nn::Conv2d(in, out, pair_of(kernel, "kernel_size"), o);
      }, nb::arg("in_channels"), nb::arg("out_channels"), nb::arg("kernel_size"), nb::arg("stride") = 1,
         nb::arg("pad_mode") = "same", nb::arg("padding") = 0, nb::arg("dilation") = 1, nb::arg("group") = 1,
         nb::arg("has_bias") = false, nb::arg("weight_init") = nb::none(), nb::arg("bias_init") = nb::none())
      .def_ro("weight", &nn::Conv2d::weight)
      .def_ro("bias", &nn::Conv2d::bias);
  nb::class_<nn::MaxPool2d, nn::Cell>(m, "MaxPool2d")
      .def(nb::init<int64_t, int64_t, const std::string&>(), nb::arg("kernel_size") = 1, nb::arg("stride") = 1,
           nb::arg("pad_mode") = "valid");
  nb::class_<nn::AvgPool2d, nn::Cell>(m, "AvgPool2d")
      .def(nb::init<int64_t, int64_t, const std::string&>(), nb::arg("kernel_size") = 1, nb::arg("stride") = 1,
           nb::arg("pad_mode") = "valid");
  nb::class_<nn::AdaptiveAvgPool2d, nn::Cell>(m, "AdaptiveAvgPool2d")
      .def("__init__", [](nn::AdaptiveAvgPool2d* self, nb::handle size) {
        new (self) nn::AdaptiveAvgPool2d(pair_of(size, "output_size"));
      }, nb::arg("output_size"));
  nb::class_<nn::ReLU, nn::Cell>(m, "ReLU").def(nb::init<>());
  nb::class_<nn::Sigmoid, nn::Cell>(m, "Sigmoid").def(nb::init<>());
  nb::class_<nn::Tanh, nn::Cell>(m, "Tanh").def(nb::init<>());
  nb::class_<nn::SiLU, nn::Cell>(m, "SiLU").def(nb::init<>());
  nb::class_<nn::Identity, nn::Cell>(m, "Identity").def(nb::init<>());
  nb::class_<nn::GELU, nn::Cell>(m, "GELU").def(nb::init<bool>(), nb::arg("approximate") = true);
  nb::class_<nn::LeakyReLU, nn::Cell>(m, "LeakyReLU").def(nb::init<double>(), nb::arg("alpha") = 0.2);
  nb::class_<nn::Flatten, nn::Cell>(m, "Flatten").def(nb::init<int>(), nb::arg("start_dim") = 1);
  nb::class_<nn::Dropout, nn::Cell>(m, "Dropout").def(nb::init<double>(), nb::arg("keep_prob") = 0.5);
  nb::class_<nn::BatchNorm, nn::Cell>(m, "_BatchNorm");
  nb::class_<nn::BatchNorm1d, nn::BatchNorm>(m, "BatchNorm1d")
      .def("__init__", [](nn::BatchNorm1d* self, int64_t n, double eps, double momentum, bool affine) {
        new (self) nn::BatchNorm1d(n, {.eps = eps, .momentum = momentum, .affine = affine});
      }, nb::arg("num_features"), nb::arg("eps") = 1e-5, nb::arg("momentum") = 0.9, nb::arg("affine") = true);
  nb::class_<nn::BatchNorm2d, nn::BatchNorm>(m, "BatchNorm2d")
      .def("__init__", [](nn::BatchNorm2d* self, int64_t n, double eps, double momentum, bool affine) {
        new (self) nn::BatchNorm2d(n, {.eps = eps, .momentum = momentum, .affine = affine});
      }, nb::arg("num_features"), nb::arg("eps") = 1e-5, nb::arg("momentum") = 0.9, nb::arg("affine") = true);
  nb::class_<nn::Softmax, nn::Cell>(m, "Softmax").def(nb::init<int>(), nb::arg("axis") = -1);
  nb::class_<nn::LogSoftmax, nn::Cell>(m, "LogSoftmax").def(nb::init<int>(), nb::arg("axis") = -1);
  nb::class_<nn::SequentialCell, nn::Cell>(m, "SequentialCell")
      .def(nb::init<std::vector<nn::CellPtr>>(), nb::arg("cells"))
      .def("append", [](nn::SequentialCell& s, nn::CellPtr c) { s.append(std::move(c)); })
      .def("__len__", &nn::SequentialCell::size)
      .def("__getitem__", [](nn::SequentialCell& s, size_t i) -> nn::Cell& { return s[i]; }, nb::rv_policy::reference_internal);

  nb::class_<nn::LossCell>(m, "LossCell")
      .def("__call__", [](nn::LossCell& l, const Tensor& logits, const Tensor& labels) {
        nn::LossCell* loss = &l;
        return record1("loss", {logits, labels}, [loss](const std::vector<Tensor>& in) { return (*loss)(in[0], in[1]); });
      }, nb::arg("logits"), nb::arg("labels"), rel)
      .def_prop_ro("type_name", &nn::LossCell::type_name)
      .def("__repr__", [](const nn::LossCell& l) { return l.type_name() + "<>"; });
  nb::class_<nn::SoftmaxCrossEntropyWithLogits, nn::LossCell>(m, "SoftmaxCrossEntropyWithLogits")
      .def(nb::init<bool, const std::string&>(), nb::arg("sparse") = false, nb::arg("reduction") = "none");
  nb::class_<nn::NLLLoss, nn::LossCell>(m, "NLLLoss").def(nb::init<const std::string&>(), nb::arg("reduction") = "mean");
  nb::class_<nn::L1Loss, nn::LossCell>(m, "L1Loss").def(nb::init<const std::string&>(), nb::arg("reduction") = "mean");
  nb::class_<nn::MSELoss, nn::LossCell>(m, "MSELoss").def(nb::init<const std::string&>(), nb::arg("reduction") = "mean");
  nb::class_<nn::SmoothL1Loss, nn::LossCell>(m, "SmoothL1Loss")
      .def(nb::init<double, const std::string&>(), nb::arg("beta") = 1.0, nb::arg("reduction") = "none");
  nb::class_<nn::BCEWithLogitsLoss, nn::LossCell>(m, "BCEWithLogitsLoss")
      .def(nb::init<const std::string&>(), nb::arg("reduction") = "mean");

  // Optimizers. Their update runs without the GIL.
  nb::class_<optim::Optimizer>(m, "Optimizer")
      .def("step", [](optim::Optimizer& o) {
        not_replayable("it updates parameters");
        o.step();
      }, rel)
      // MindSpore's optimizer(grads): one update from these gradients, in parameters' order.
      .def("__call__", [](optim::Optimizer& o, const std::vector<Tensor>& grads) {
        not_replayable("it updates parameters");
        const auto& params = o.parameters();
        DEMI_CHECK(grads.size() == params.size(), o.name(), ": got ", grads.size(), " gradients for ", params.size(),
                   " parameters");
        for (size_t i = 0; i < params.size(); ++i) {
          if (grads[i].defined()) {
            DEMI_CHECK(grads[i].shape() == params[i].shape(), o.name(), ": the gradient of '", params[i].name(),
                       "' has shape ", grads[i].shape(), ", the parameter ", params[i].shape());
          }
          Tensor p = params[i];
          p.set_grad(grads[i]);
        }
        o.step();
        o.zero_grad();
        return true;
      }, nb::arg("gradients"), rel)
      .def("zero_grad", &optim::Optimizer::zero_grad, rel)
      .def_prop_ro("parameters", &optim::Optimizer::parameters)
      .def_prop_ro("global_step", &optim::Optimizer::global_step)
      .def_prop_ro("learning_rate", &optim::Optimizer::current_lr)
      .def_prop_ro("name", &optim::Optimizer::name);
  nb::class_<optim::Momentum, optim::Optimizer>(m, "Momentum")
      .def(nb::init<std::vector<Tensor>, double, double, double, bool>(), nb::arg("params"),
           nb::arg("learning_rate"), nb::arg("momentum"), nb::arg("weight_decay") = 0.0,
           nb::arg("use_nesterov") = false);
  nb::class_<optim::SGD, optim::Optimizer>(m, "SGD")
      .def(nb::init<std::vector<Tensor>, double, double>(), nb::arg("params"), nb::arg("learning_rate") = 0.1,
           nb::arg("weight_decay") = 0.0);
  nb::class_<optim::Adam, optim::Optimizer>(m, "Adam")
      .def("__init__", [](optim::Adam* self, std::vector<Tensor> params, double lr, double beta1, double beta2,
                          double eps, double weight_decay) {
        new (self) optim::Adam(std::move(params), lr, {.beta1 = beta1, .beta2 = beta2, .eps = eps}, weight_decay);
      }, nb::arg("params"), nb::arg("learning_rate") = 1e-3, nb::arg("beta1") = 0.9, nb::arg("beta2") = 0.999,
         nb::arg("eps") = 1e-8, nb::arg("weight_decay") = 0.0);
  nb::class_<optim::AdamW, optim::Adam>(m, "AdamWeightDecay")
      .def("__init__", [](optim::AdamW* self, std::vector<Tensor> params, double lr, double beta1, double beta2,
                          double eps, double weight_decay) {
        new (self) optim::AdamW(std::move(params), lr, {.beta1 = beta1, .beta2 = beta2, .eps = eps}, weight_decay);
      }, nb::arg("params"), nb::arg("learning_rate") = 1e-3, nb::arg("beta1") = 0.9, nb::arg("beta2") = 0.999,
         nb::arg("eps") = 1e-6, nb::arg("weight_decay") = 0.0);
}

}  // namespace demi::python
