// demi._core: the binding module (nanobind). demi's errors become demi.DemiError (a RuntimeError) with
// demi's whole message; a Python exception that went through demi (raised in a data source, a map function
// or a callback) comes back as itself.
#include "bind.h"

NB_MODULE(_core, m) {
  namespace nb = nanobind;
  using namespace demi::python;
  m.doc() = "demi's C++ core; import demi, not this module";

  static nb::object demi_error = nb::exception<demi::Error>(m, "DemiError", PyExc_RuntimeError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const demi::ForeignError& e) {
      try {
        std::rethrow_exception(e.original());
      } catch (nb::python_error& pe) {
        pe.restore();
      }
    }
  });
  // Python objects a dataset or a model holds through C++ (a generator's lambda, a Python callback) may sit
  // in reference cycles that Python's collector cannot see through C++; at exit such instances are left to
  // the process's end rather than reported one by one.
  nb::set_leak_warnings(false);

  bind_tensor(m);
  bind_nn(m);
  bind_data(m);
  bind_train(m);
  m.attr("__version__") = DEMI_VERSION;
}
