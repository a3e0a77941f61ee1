#include "golden_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

namespace demi::testing {

std::string golden_dir() { return std::string(DEMI_SOURCE_DIR) + "/tests/golden"; }

Tolerance tolerance_for_terms(DType dtype, int terms) {
  Tolerance t = tolerance_for(dtype);
  double k = std::sqrt(static_cast<double>(terms));
  return {t.rtol * k, t.atol * k};
}

void expect_close(const Tensor& got, const Tensor& want, Tolerance tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(got.numel(), want.numel()) << what << ": shape " << got.shape() << " vs " << want.shape();
  int bad = 0;
  for (int64_t i = 0; i < want.numel() && bad < 5; ++i) {
    if (!tol.close(got.get(i), want.get(i))) {
      ++bad;
      ADD_FAILURE() << what << "[" << i << "]: got " << got.get(i) << ", want " << want.get(i);
    }
  }
}

std::map<std::string, Tensor> read_golden(const std::string& name) {
  std::string path = golden_dir() + "/" + name + ".txt";
  std::ifstream in(path);
  DEMI_CHECK(in.good(), "cannot open golden fixture ", path, " (regenerate with scripts/make_golden.py)");
  std::map<std::string, Tensor> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream ls(line);
    std::string key, dtype, colon;
    int rank = 0;
    ls >> key >> dtype >> rank;
    Shape shape;
    for (int i = 0; i < rank; ++i) {
      int64_t d = 0;
      ls >> d;
      shape.push_back(d);
    }
    ls >> colon;
    DEMI_CHECK(colon == ":", "malformed golden line for ", key, " in ", path);
    if (dtype == "int64") {
      std::vector<int64_t> v(static_cast<size_t>(shape.numel()));
      for (auto& x : v) ls >> x;
      out[key] = from_vector(v, shape);
    } else {
      std::vector<double> v(static_cast<size_t>(shape.numel()));
      for (auto& x : v) ls >> x;
      out[key] = from_vector(v, shape);
    }
    DEMI_CHECK(!ls.fail(), "truncated golden line for ", key, " in ", path);
  }
  return out;
}

}  // namespace demi::testing
