// The binding module demi._core: what its files share. Each bind_*.cc adds one part of demi's C++ API; the
// pure-Python package (python/demi) gives it MindSpore's names, signatures and defaults.
//
// Threads and the GIL (docs/DESIGN.md, "Python"): every binding that runs demi's compute or waits on its
// threads releases the GIL (nb::call_guard<nb::gil_scoped_release>); C++ takes it back only to enter Python —
// a Python cell's construct, a Python callback, a Python data source or map function — through
// call_python, which turns a Python exception into a demi::ForeignError that demi carries to the caller
// unchanged and the module raises again as itself.
#pragma once

#include <nanobind/nanobind.h>

#include <optional>
#include <string>
#include <utility>

#include "demi/demi.h"

namespace demi::python {

namespace nb = nanobind;

// A Python object as a new tensor (a copy): a demi Tensor is shared as it is; anything else goes through
// demi._convert.as_array (numpy's conversion, MindSpore's default dtypes for Python scalars and lists),
// then `dtype` where given. Needs the GIL.
Tensor tensor_from_object(nb::handle obj, std::optional<DType> dtype = std::nullopt);
// A numpy array of the tensor's values: a view of its storage that keeps the storage alive, except for
// bfloat16 (numpy has no such type: a float32 copy). Needs the GIL.
nb::object tensor_to_numpy(const Tensor& t);

// Runs fn (which calls into Python) with the GIL held; a Python exception leaves as a demi::ForeignError
// carrying it (raised again as itself when it reaches Python). For C++ code that runs without the GIL.
template <typename F>
decltype(auto) call_python(F&& fn) {
  nb::gil_scoped_acquire gil;
  try {
    return fn();
  } catch (nb::python_error& e) {
    std::string what = e.what();
    throw ForeignError(what, std::make_exception_ptr(std::move(e)));
  }
}

// Whether Python can no longer be entered (not started, or shutting down): C++ code that would release a
// Python reference then leaves it, as a process at its end may.
inline bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

void bind_tensor(nb::module_& m);
void bind_nn(nb::module_& m);
void bind_data(nb::module_& m);
void bind_train(nb::module_& m);

}  // namespace demi::python
