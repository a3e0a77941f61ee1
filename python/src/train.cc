// demi._core: Model, callbacks (demi's and Python's), metrics, loss scaling, build_train_network, context,
// checkpoints. Training runs in C++ without the GIL.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <ostream>
#include <streambuf>

#include "bind.h"

namespace demi::python {
namespace {

// What demi's callbacks print (TimeMonitor, LossMonitor, warnings) goes to Python's sys.stdout, a line at
// a time, so it interleaves with the program's own prints and is captured where Python's output is.
class PyStdoutBuf final : public std::streambuf {
 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    line_.push_back(static_cast<char>(c));
    if (c == '\n') flush_line();
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    for (std::streamsize i = 0; i < n; ++i) overflow(static_cast<unsigned char>(s[i]));
    return n;
  }
  int sync() override {
    flush_line();
    return 0;
  }

 private:
  void flush_line() {
    if (line_.empty()) return;
    if (python_finalizing()) {
      line_.clear();
      return;
    }
    std::string text;
    text.swap(line_);
    call_python([&] { nb::module_::import_("sys").attr("stdout").attr("write")(text); });
  }
  std::string line_;
};

// A Python callback (demi.train.Callback, or any object with MindSpore's method names): each event calls
// its _demi_event(name, run_context) with the GIL, on a copy of the context; a stop it asks for is copied
// back.
class PyCallback final : public train::Callback {
 public:
  explicit PyCallback(nb::object obj) : obj_(std::move(obj)) {}
  ~PyCallback() override {
    if (python_finalizing()) {
      obj_.release();
      return;
    }
    nb::gil_scoped_acquire gil;
    obj_.reset();
  }
  void on_train_begin(train::RunContext& c) override { event("on_train_begin", c); }
  void on_train_end(train::RunContext& c) override { event("on_train_end", c); }
  void on_epoch_begin(train::RunContext& c) override { event("on_train_epoch_begin", c); }
  void on_epoch_end(train::RunContext& c) override { event("on_train_epoch_end", c); }
  void on_step_begin(train::RunContext& c) override { event("on_train_step_begin", c); }
  void on_step_end(train::RunContext& c) override { event("on_train_step_end", c); }

 private:
  void event(const char* name, train::RunContext& c) {
    call_python([&] {
      nb::object ctx = nb::cast(train::RunContext(c));
      obj_.attr("_demi_event")(name, ctx);
      if (nb::cast<train::RunContext&>(ctx).stop_requested) c.stop_requested = true;
    });
  }
  nb::object obj_;
};

// Ctrl-C during training: Python's handler runs only when Python runs, so every step asks for pending
// signals (on the main thread, where Python handles them); KeyboardInterrupt leaves train() as itself.
class SignalCheck final : public train::Callback {
 public:
  void on_step_end(train::RunContext&) override { check(); }
  void on_epoch_end(train::RunContext&) override { check(); }

 private:
  static void check() {
    call_python([] {
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    });
  }
};

std::vector<train::CallbackPtr> callbacks_of(nb::handle list) {
  std::vector<train::CallbackPtr> out;
  for (nb::handle cb : list.is_none() ? nb::list() : nb::borrow<nb::object>(list)) {
    if (nb::isinstance<train::Callback>(cb)) {
      out.push_back(nb::cast<train::CallbackPtr>(cb));
    } else {
      DEMI_CHECK(nb::hasattr(cb, "_demi_event"), "callbacks: ", nb::str(nb::type_name(cb.type())).c_str(),
                 " is not a callback (derive it from demi.train.Callback)");
      out.push_back(std::make_shared<PyCallback>(nb::borrow(cb)));
    }
  }
  out.push_back(std::make_shared<SignalCheck>());
  return out;
}

// The functional loss scalers' common surface (MindSpore's amp.DynamicLossScaler / StaticLossScaler).
template <typename Scaler>
void bind_scaler(nb::class_<Scaler> c) {
  c.def("scale", &Scaler::scale, nb::call_guard<nb::gil_scoped_release>())
      .def("unscale", [](const Scaler& s, std::vector<Tensor> grads) {
        for (Tensor& g : grads) g = g.clone();  // MindSpore's unscale returns new tensors; the inputs stay
        s.unscale(grads);
        return grads;
      }, nb::call_guard<nb::gil_scoped_release>())
      .def("adjust", &Scaler::adjust, nb::arg("grads_finite"))
      .def_prop_ro("scale_value", &Scaler::scale_value);
}

}  // namespace

void bind_train(nb::module_& m) {
  static PyStdoutBuf stdout_buf;
  static std::ostream stdout_stream(&stdout_buf);
  train::set_callback_stream(&stdout_stream);

  auto rel = nb::call_guard<nb::gil_scoped_release>();

  // Context.
  nb::enum_<ExecMode>(m, "ExecMode").value("GRAPH_MODE", ExecMode::kGraph).value("PYNATIVE_MODE", ExecMode::kPyNative);
  m.def("set_context", [](std::optional<ExecMode> mode, std::optional<std::string> device_target,
                          std::optional<int> device_id, std::optional<int> num_threads) {
    ContextOptions o = get_context();
    if (mode) o.mode = *mode;
    if (device_target) o.device_target = *device_target;
    if (device_id) o.device_id = *device_id;
    if (num_threads) o.num_threads = *num_threads;
    set_context(o);
  }, nb::arg("mode") = nb::none(), nb::arg("device_target") = nb::none(), nb::arg("device_id") = nb::none(),
     nb::arg("num_threads") = nb::none());
  m.def("get_context", [](const std::string& key) -> nb::object {
    const ContextOptions& o = get_context();
    if (key == "mode") return nb::cast(o.mode);
    if (key == "device_target") return nb::cast(o.device_target);
    if (key == "device_id") return nb::cast(o.device_id);
    if (key == "num_threads") return nb::cast(o.num_threads);
    throw Error(str_cat("get_context: unknown key '", key, "' (mode, device_target, device_id, num_threads)"));
  });
  m.def("set_seed", &set_seed);

  // Run context and callbacks.
  nb::class_<train::RunContext>(m, "RunContext")
      .def_ro("epoch", &train::RunContext::epoch)
      .def_ro("epochs", &train::RunContext::epochs)
      .def_ro("step_in_epoch", &train::RunContext::step_in_epoch)
      .def_ro("cur_step_num", &train::RunContext::cur_step_num)
      .def_ro("steps_per_epoch", &train::RunContext::steps_per_epoch)
      .def_ro("batch_size", &train::RunContext::batch_size)
      .def_ro("loss", &train::RunContext::loss)
      .def_ro("loss_scale", &train::RunContext::loss_scale)
      .def_ro("overflow", &train::RunContext::overflow)
      .def_ro("skipped", &train::RunContext::skipped)
      .def_ro("step_seconds", &train::RunContext::step_seconds)
      .def_ro("epoch_seconds", &train::RunContext::epoch_seconds)
      .def_ro("metrics", &train::RunContext::metrics)
      .def_ro("sink_steps", &train::RunContext::sink_steps)
      .def_rw("stop_requested", &train::RunContext::stop_requested);
  nb::class_<train::Callback>(m, "_Callback");
  nb::class_<train::TimeMonitor, train::Callback>(m, "TimeMonitor").def(nb::init<>());
  nb::class_<train::LossMonitor, train::Callback>(m, "LossMonitor")
      .def(nb::init<int64_t>(), nb::arg("per_print_times") = 1);
  nb::class_<train::ModelCheckpoint, train::Callback>(m, "ModelCheckpoint")
      .def("__init__", [](train::ModelCheckpoint* self, std::string prefix, std::string directory, int64_t steps,
                          int64_t epochs, int keep_max) {
        train::CheckpointConfig c;
        c.save_checkpoint_steps = steps;
        c.save_checkpoint_epochs = epochs;
        c.keep_checkpoint_max = keep_max;
        new (self) train::ModelCheckpoint(std::move(prefix), directory, c);
      }, nb::arg("prefix"), nb::arg("directory"), nb::arg("save_checkpoint_steps"), nb::arg("save_checkpoint_epochs"),
         nb::arg("keep_checkpoint_max"))
      .def("latest", [](const train::ModelCheckpoint& c) -> std::optional<std::string> {
        auto p = c.latest();
        return p ? std::optional<std::string>(p->string()) : std::nullopt;
      });

  // Metrics.
  nb::class_<train::Metric>(m, "Metric")
      .def("clear", &train::Metric::clear)
      .def("update", &train::Metric::update, rel)
      .def("eval", &train::Metric::eval)
      .def_prop_ro("name", &train::Metric::name);
  nb::class_<train::Accuracy, train::Metric>(m, "Accuracy").def(nb::init<>());
  nb::class_<train::Loss, train::Metric>(m, "Loss").def(nb::init<>());
  nb::class_<train::TopKCategoricalAccuracy, train::Metric>(m, "TopKCategoricalAccuracy")
      .def(nb::init<int>(), nb::arg("k"));

  // Loss scaling.
  nb::class_<amp::LossScaleManager>(m, "LossScaleManager")
      .def("get_loss_scale", &amp::LossScaleManager::get_loss_scale)
      .def("get_drop_overflow_update", &amp::LossScaleManager::get_drop_overflow_update)
      .def("update_loss_scale", &amp::LossScaleManager::update_loss_scale, nb::arg("overflow"))
      .def("__repr__", &amp::LossScaleManager::describe);
  nb::class_<amp::FixedLossScaleManager, amp::LossScaleManager>(m, "FixedLossScaleManager")
      .def(nb::init<double, bool>(), nb::arg("loss_scale") = 128.0, nb::arg("drop_overflow_update") = true);
  nb::class_<amp::DynamicLossScaleManager, amp::LossScaleManager>(m, "DynamicLossScaleManager")
      .def("__init__", [](amp::DynamicLossScaleManager* self, double init, double factor, int64_t window) {
        new (self) amp::DynamicLossScaleManager(init, factor, window);
      }, nb::arg("init_loss_scale") = 16777216.0, nb::arg("scale_factor") = 2.0, nb::arg("scale_window") = 2000);
  bind_scaler(nb::class_<amp::DynamicLossScaler>(m, "DynamicLossScaler")
                  .def(nb::init<double, double, int64_t>(), nb::arg("scale_value"), nb::arg("scale_factor"),
                       nb::arg("scale_window")));
  bind_scaler(nb::class_<amp::StaticLossScaler>(m, "StaticLossScaler").def(nb::init<double>(), nb::arg("scale_value")));
  m.def("all_finite", [](const std::vector<Tensor>& grads) { return amp::all_finite(grads); }, rel);
  m.def("auto_mixed_precision", [](nn::Cell& net, const std::string& level, DType low) {
    amp::auto_mixed_precision(net, amp::parse_level(level), low);
  }, nb::arg("network"), nb::arg("amp_level"), nb::arg("dtype") = DType::kF16);

  // build_train_network: the step of the seed's way 2.
  nb::class_<amp::StepResult>(m, "StepResult")
      .def_ro("loss", &amp::StepResult::loss)
      .def_ro("overflow", &amp::StepResult::overflow)
      .def_ro("skipped", &amp::StepResult::skipped)
      .def_ro("loss_scale", &amp::StepResult::loss_scale);
  nb::class_<amp::TrainStep>(m, "TrainStep")
      .def("__call__", &amp::TrainStep::operator(), nb::arg("data"), nb::arg("label"), rel)
      .def("loss_scale_manager", &amp::TrainStep::loss_scale_manager, nb::rv_policy::reference_internal);
  m.def("build_train_network", [](std::shared_ptr<nn::Cell> net, std::shared_ptr<optim::Optimizer> opt,
                                  std::shared_ptr<nn::LossCell> loss, const std::string& level, DType low,
                                  std::shared_ptr<amp::LossScaleManager> manager, std::optional<bool> keep_bn) {
    amp::TrainOptions o;
    o.low_dtype = low;
    o.loss_scale_manager = std::move(manager);
    o.keep_batchnorm_fp32 = keep_bn;
    return amp::build_train_network(std::move(net), std::move(opt), std::move(loss), amp::parse_level(level), o);
  }, nb::arg("network"), nb::arg("optimizer"), nb::arg("loss_fn"), nb::arg("level"), nb::arg("dtype"),
     nb::arg("loss_scale_manager").none(), nb::arg("keep_batchnorm_fp32").none());

  // Model.
  nb::class_<train::TrainSummary>(m, "TrainSummary")
      .def_ro("steps", &train::TrainSummary::steps)
      .def_ro("samples", &train::TrainSummary::samples)
      .def_ro("seconds", &train::TrainSummary::seconds)
      .def_ro("samples_per_second", &train::TrainSummary::samples_per_second)
      .def_ro("median_step_seconds", &train::TrainSummary::median_step_seconds)
      .def_ro("final_loss", &train::TrainSummary::final_loss)
      .def_ro("mean_last_epoch_loss", &train::TrainSummary::mean_last_epoch_loss)
      .def_ro("skipped_steps", &train::TrainSummary::skipped_steps)
      .def_ro("final_loss_scale", &train::TrainSummary::final_loss_scale)
      .def_prop_ro("peak_train_bytes", [](const train::TrainSummary& s) { return s.peak.train_peak; });
  nb::class_<train::Model>(m, "Model")
      .def("__init__", [](train::Model* self, std::shared_ptr<nn::Cell> net, std::shared_ptr<nn::LossCell> loss,
                          std::shared_ptr<optim::Optimizer> opt, std::map<std::string, train::MetricPtr> metrics,
                          const std::string& level, DType low, std::shared_ptr<amp::LossScaleManager> manager,
                          std::optional<bool> keep_bn) {
        train::ModelOptions o;
        o.amp_level = amp::parse_level(level);
        o.low_dtype = low;
        o.loss_scale_manager = std::move(manager);
        o.keep_batchnorm_fp32 = keep_bn;
        new (self) train::Model(std::move(net), std::move(loss), std::move(opt), std::move(metrics), o);
      }, nb::arg("network"), nb::arg("loss_fn"), nb::arg("optimizer"), nb::arg("metrics"), nb::arg("amp_level"),
         nb::arg("dtype"), nb::arg("loss_scale_manager").none(), nb::arg("keep_batchnorm_fp32").none())
      .def("train", [](train::Model& model, int epoch, std::shared_ptr<const data::Dataset> ds, nb::handle callbacks,
                       bool sink, int64_t sink_size) {
        std::vector<train::CallbackPtr> cbs = callbacks_of(callbacks);
        nb::gil_scoped_release release;
        model.train(epoch, ds, std::move(cbs), sink, sink_size);
      }, nb::arg("epoch"), nb::arg("train_dataset"), nb::arg("callbacks").none(), nb::arg("dataset_sink_mode"),
         nb::arg("sink_size"))
      .def("eval", &train::Model::eval, nb::arg("valid_dataset"), nb::arg("dataset_sink_mode"), rel)
      .def("predict", &train::Model::predict, nb::arg("input"), rel)
      .def("last_summary", &train::Model::last_summary, nb::rv_policy::reference_internal);

  // Checkpoints: a network's parameters and buffers in a safetensors file (written atomically).
  m.def("save_checkpoint", [](nn::Cell& net, const std::string& path) {
    io::NamedTensors tensors = net.parameters_and_names();
    for (auto& b : net.buffers_and_names()) tensors.push_back(b);
    io::save_safetensors(path, tensors);
  }, rel);
  m.def("load_checkpoint", [](const std::string& path) { return io::load_safetensors(path).tensors; }, rel);
  m.def("load_param_into_net", [](nn::Cell& net, const io::NamedTensors& tensors, bool strict) {
    train::LoadReport r = train::load_param_into_net(net, tensors, strict);
    return std::make_pair(r.missing, r.unexpected);
  }, nb::arg("net"), nb::arg("parameter_dict"), nb::arg("strict_load") = false, rel);
}

}  // namespace demi::python
