#include "demi/amp/attribution.h"

#include <cmath>
#include <cstdio>

#include "demi/core/error.h"
#include "demi/core/tensor.h"

namespace demi::amp {
namespace {

struct Scan {
  int64_t numel = 0, inf = 0, nan = 0;
  double max_finite = 0;
};

void scan(const Tensor& t, Scan& s) {
  if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) return;
  Tensor f = t.dtype() == DType::kF32 ? t : t.to(DType::kF32);
  const float* p = f.data<float>();
  const int64_t n = f.numel();
  s.numel += n;
  for (int64_t i = 0; i < n; ++i) {
    const float v = p[i];
    if (std::isnan(v)) ++s.nan;
    else if (std::isinf(v)) ++s.inf;
    else s.max_finite = std::max(s.max_finite, static_cast<double>(std::fabs(v)));
  }
}

}  // namespace

void OverflowFinder::on_op(const ops::OpEvent& e) {
  if (source_.found) return;
  Scan out;
  DType bad_dtype = DType::kF32;
  for (const Tensor& o : e.outputs) {
    const int64_t before = out.inf + out.nan;
    scan(o, out);
    if (before == 0 && out.inf + out.nan > 0) bad_dtype = o.dtype();
  }
  if (out.inf == 0 && out.nan == 0) return;
  Scan in;
  for (const Tensor* t : e.inputs)
    if (t != nullptr) scan(*t, in);
  source_.found = true;
  source_.layer = e.layer != nullptr ? e.layer : "(outside any layer)";
  source_.op = e.op;
  source_.backward = e.backward;
  source_.dtype = e.compute_dtype;
  source_.output_dtype = bad_dtype;
  source_.numel = out.numel;
  source_.inf = out.inf;
  source_.nan = out.nan;
  source_.max_abs_finite = out.max_finite;
  source_.max_abs_input = in.max_finite;
  source_.input_nonfinite = in.inf + in.nan > 0;
}

std::string OverflowSource::describe() const {
  if (!found) return "no op of this process produced a non-finite value when the step was re-run";
  std::string where = layer == "(outside any layer)" ? layer
                      : layer.empty()               ? str_cat("in the network (", layer_type, ")")
                                                    : str_cat("in layer '", layer, "'", layer_type.empty() ? "" : " (" + layer_type + ")");
  char values[160];
  std::snprintf(values, sizeof values, "; largest finite |output| %.3g, largest finite |input| %.3g", max_abs_finite,
                max_abs_input);
  return str_cat(backward ? "backward of " : "forward ", ops::op_name(op), " ", where, ", ", dtype_name(dtype),
                 output_dtype != dtype ? str_cat(" -> ", dtype_name(output_dtype)) : std::string(), ": ",
                 inf, " of ", numel, " values Inf, ", nan, " NaN", values,
                 input_nonfinite ? " (an input was already non-finite: it came from the data or a parameter)" : "");
}

}  // namespace demi::amp
