// Reads the golden fixtures written by scripts/make_golden.py (PyTorch): one tensor per line,
// "name dtype rank d0 d1 ... : v0 v1 ...", and compares results with them.
#pragma once

#include <map>
#include <string>

#include "demi/core/tensor.h"
#include "demi/kernels/tolerance.h"

namespace demi::testing {

// Tensors by name, as float64 (int64 for integer tensors).
std::map<std::string, Tensor> read_golden(const std::string& name);
// The fixture directory (tests/golden in the source tree).
std::string golden_dir();

// dtype's tolerance grown with the number of terms a result sums (by their square root).
Tolerance tolerance_for_terms(DType dtype, int terms);
// A test failure per element (the first five) where got and want differ beyond tol.
void expect_close(const Tensor& got, const Tensor& want, Tolerance tol, const std::string& what);

}  // namespace demi::testing
