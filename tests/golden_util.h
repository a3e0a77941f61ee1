// Reads the golden fixtures written by scripts/make_golden.py (PyTorch): one tensor per line,
// "name dtype rank d0 d1 ... : v0 v1 ...".
#pragma once

#include <map>
#include <string>

#include "demi/core/tensor.h"

namespace demi::testing {

// Tensors by name, as float64 (int64 for integer tensors).
std::map<std::string, Tensor> read_golden(const std::string& name);
// The fixture directory (tests/golden in the source tree).
std::string golden_dir();

}  // namespace demi::testing
