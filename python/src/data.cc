// demi._core: datasets. Python sources (a callable returning an iterator, an iterable, a random-access
// object) feed demi's C++ GeneratorDataset: each row is taken from Python with the GIL held for that row only
// and copied into demi tensors; batching, shuffling, C++ transforms and prefetching stay in C++.
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>

#include "bind.h"

namespace demi::python {
namespace {

// A Python object held by C++ code that may drop it on a thread without the GIL (a prefetch thread, a
// dataset freed inside a train() call): the reference is released with the GIL held, and left alone once
// the interpreter is shutting down.
class PyRef {
 public:
  explicit PyRef(nb::object obj) : obj_(std::move(obj)) {}
  ~PyRef() {
    if (python_finalizing()) {
      obj_.release();
      return;
    }
    nb::gil_scoped_acquire gil;
    obj_.reset();
  }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  const nb::object& get() const { return obj_; }

 private:
  nb::object obj_;
};

// A Python row (a tuple or list of columns, or one value for a one-column dataset) as tensors. GIL held.
data::Row row_of(nb::handle item, size_t columns) {
  data::Row row;
  if (nb::isinstance<nb::tuple>(item) || nb::isinstance<nb::list>(item)) {
    for (nb::handle v : item) row.push_back(tensor_from_object(v));
  } else {
    row.push_back(tensor_from_object(item));
  }
  DEMI_CHECK(row.size() == columns, "a row of the Python source has ", row.size(), " columns where column_names names ",
             columns);
  return row;
}

// Each epoch: `open` (called with the GIL) gives the epoch's Python iterator; rows are pulled one at a time.
data::EpochGeneratorSource iterator_source(std::shared_ptr<PyRef> source, bool call, size_t columns) {
  return [source, call, columns](int64_t) -> data::RowGenerator {
    auto it = call_python([&] {
      nb::object iterable = call ? source->get()() : source->get();
      return std::make_shared<PyRef>(nb::iter(iterable));
    });
    return [it, columns]() -> std::optional<data::Row> {
      return call_python([&]() -> std::optional<data::Row> {
        PyObject* next = PyIter_Next(it->get().ptr());
        if (next == nullptr) {
          if (PyErr_Occurred()) throw nb::python_error();
          return std::nullopt;
        }
        nb::object item = nb::steal(next);
        return row_of(item, columns);
      });
    };
  };
}

// MindSpore's vision.Normalize on an HWC image (channels last, its default is_hwc=True): float32
// (x - mean[c]) / std[c] over the last dimension.
class NormalizeHwc final : public data::TensorTransform {
 public:
  NormalizeHwc(std::vector<double> mean, std::vector<double> stddev) : mean_(std::move(mean)), std_(std::move(stddev)) {
    DEMI_CHECK(!mean_.empty() && mean_.size() == std_.size(), "Normalize: mean and std need as many values (", mean_.size(),
               " and ", std_.size(), ")");
    for (double s : std_) DEMI_CHECK(s > 0 && std::isfinite(s), "Normalize: std must be positive and finite, got ", s);
  }
  Tensor apply(const Tensor& x, Generator&) const override {
    const int64_t c = x.rank() > 0 ? x.dim(-1) : 1;
    DEMI_CHECK(mean_.size() == 1 || static_cast<int64_t>(mean_.size()) == c, name(), ": the image ", x.shape(),
               " has ", c, " channels (last dimension, HWC) where mean and std give ", mean_.size());
    Tensor f = x.to(DType::kF32, /*copy=*/true);
    float* p = f.data<float>();
    for (int64_t i = 0; i < f.numel(); ++i) {
      const size_t k = mean_.size() == 1 ? 0 : static_cast<size_t>(i % c);
      p[i] = static_cast<float>((p[i] - mean_[k]) / std_[k]);
    }
    return f;
  }
  std::string name() const override {
    std::string s = "Normalize(mean=[";
    for (size_t i = 0; i < mean_.size(); ++i) s += (i ? ", " : "") + std::to_string(mean_[i]);
    s += "], std=[";
    for (size_t i = 0; i < std_.size(); ++i) s += (i ? ", " : "") + std::to_string(std_[i]);
    return s + "], HWC)";
  }

 private:
  std::vector<double> mean_, std_;
};

data::Transform transform_of(nb::handle op) {
  if (nb::isinstance<data::Transform>(op)) return nb::cast<data::Transform>(op);
  DEMI_CHECK(PyCallable_Check(op.ptr()), "map: an operation must be a demi transform or a callable, got ",
             nb::str(nb::type_name(op.type())).c_str());
  // A Python function of a numpy array (MindSpore's pyfunc): the GIL for each row it sees.
  auto fn = std::make_shared<PyRef>(nb::borrow(op));
  std::string name = nb::cast<std::string>(nb::str(nb::getattr(op, "__name__", nb::str("python function"))));
  return data::Transform(std::make_shared<data::Lambda>(
      [fn](const Tensor& x) {
        return call_python([&] { return tensor_from_object(fn->get()(tensor_to_numpy(x.clone()))); });
      },
      name));
}

nb::tuple tuple_of(const data::Row& row) {
  nb::list out;
  for (const Tensor& t : row) out.append(nb::cast(t));
  return nb::tuple(out);
}

}  // namespace

void bind_data(nb::module_& m) {
  auto rel = nb::call_guard<nb::gil_scoped_release>();

  nb::class_<data::Transform>(m, "Transform")
      .def_prop_ro("name", &data::Transform::name)
      .def("__repr__", &data::Transform::name);
  m.def("TypeCast", [](DType t) { return data::Transform(data::TypeCast(t)); }, nb::arg("data_type"));
  m.def("Rescale", [](double r, double s) { return data::Transform(data::Rescale(r, s)); }, nb::arg("rescale"),
        nb::arg("shift"));
  m.def("Normalize", [](std::vector<double> mean, std::vector<double> stddev, bool is_hwc) {
    if (is_hwc) return data::Transform(std::make_shared<NormalizeHwc>(std::move(mean), std::move(stddev)));
    return data::Transform(data::Normalize(std::move(mean), std::move(stddev)));
  }, nb::arg("mean"), nb::arg("std"), nb::arg("is_hwc") = true);
  m.def("HWC2CHW", [] {
    return data::Transform(data::Lambda([](const Tensor& x) {
      DEMI_CHECK(x.rank() == 3, "HWC2CHW: needs an HWC image (rank 3), got ", x.shape());
      return x.dim(2) == 1 ? ops::reshape(x, Shape{1, x.dim(0), x.dim(1)}) : ops::transpose(x, {2, 0, 1});
    }, "HWC2CHW"));
  });
  m.def("CHW2HWC", [] {
    return data::Transform(data::Lambda([](const Tensor& x) {
      DEMI_CHECK(x.rank() == 3, "CHW2HWC: needs a CHW image (rank 3), got ", x.shape());
      return x.dim(0) == 1 ? ops::reshape(x, Shape{x.dim(1), x.dim(2), 1}) : ops::transpose(x, {1, 2, 0});
    }, "CHW2HWC"));
  });
  m.def("OneHot", [](int64_t n) { return data::Transform(data::OneHot(n)); }, nb::arg("num_classes"));

  nb::class_<data::Dataset>(m, "Dataset")
      .def("get_dataset_size", &data::Dataset::get_dataset_size, rel)
      .def("get_col_names", &data::Dataset::column_names)
      .def("describe", &data::Dataset::describe)
      .def("map", [](const data::Dataset& ds, nb::handle operations, std::vector<std::string> columns, int workers) {
        std::vector<data::Transform> ops;
        if (nb::isinstance<nb::list>(operations) || nb::isinstance<nb::tuple>(operations)) {
          for (nb::handle op : operations) ops.push_back(transform_of(op));
        } else {
          ops.push_back(transform_of(operations));
        }
        return ds.map(std::move(ops), std::move(columns), {.num_parallel_workers = workers});
      }, nb::arg("operations"), nb::arg("input_columns"), nb::arg("num_parallel_workers") = 1)
      .def("batch", &data::Dataset::batch, nb::arg("batch_size"), nb::arg("drop_remainder") = false)
      .def("shuffle", [](const data::Dataset& ds, int64_t n, std::optional<uint64_t> seed) { return ds.shuffle(n, seed); },
           nb::arg("buffer_size"), nb::arg("seed") = nb::none())
      .def("repeat", &data::Dataset::repeat, nb::arg("count") = -1)
      .def("take", &data::Dataset::take, nb::arg("count"))
      .def("skip", &data::Dataset::skip, nb::arg("count"))
      .def("project", &data::Dataset::project, nb::arg("columns"))
      .def("create_iterator", [](const data::Dataset& ds, int64_t epoch) {
        return std::shared_ptr<data::Iterator>(ds.create_iterator({.prefetch = 0, .epoch = epoch}));
      }, nb::arg("epoch"));

  nb::class_<data::Iterator>(m, "Iterator")
      .def("next", [](data::Iterator& it) -> nb::object {
        std::optional<data::Row> row;
        {
          nb::gil_scoped_release release;
          row = it.next();
        }
        if (!row) return nb::none();
        return tuple_of(*row);
      });

  m.def("generator_dataset", [](nb::object source, std::vector<std::string> columns, const std::string& kind,
                                int64_t num_rows) -> std::shared_ptr<data::Dataset> {
    auto ref = std::make_shared<PyRef>(source);
    const size_t n = columns.size();
    data::GeneratorOptions options{.num_rows = num_rows};
    if (kind == "random_access") {
      const int64_t size = static_cast<int64_t>(nb::len(source));
      data::RandomAccessSource ra{size, [ref, n](int64_t i) {
                                    return call_python([&] { return row_of(ref->get()[nb::int_(i)], n); });
                                  }};
      return std::make_shared<data::GeneratorDataset>(std::move(ra), std::move(columns), options);
    }
    DEMI_ASSERT(kind == "callable" || kind == "iterable", "unknown source kind ", kind);
    return std::make_shared<data::GeneratorDataset>(iterator_source(ref, kind == "callable", n), std::move(columns),
                                                    options);
  }, nb::arg("source"), nb::arg("column_names"), nb::arg("kind"), nb::arg("num_rows") = -1);
  m.def("numpy_slices_dataset", [](std::vector<Tensor> columns, std::vector<std::string> names) -> std::shared_ptr<data::Dataset> {
    return std::make_shared<data::NumpySlicesDataset>(std::move(columns), std::move(names));
  });
  m.def("mnist_dataset", [](const std::string& dir, const std::string& usage) -> std::shared_ptr<data::Dataset> {
    return std::make_shared<data::MnistDataset>(dir, usage);
  }, rel);
  m.def("cifar10_dataset", [](const std::string& dir, const std::string& usage) -> std::shared_ptr<data::Dataset> {
    return std::make_shared<data::Cifar10Dataset>(dir, usage);
  }, rel);
}

}  // namespace demi::python
