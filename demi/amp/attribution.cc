#include "demi/amp/attribution.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "demi/core/convert.h"
#include "demi/core/error.h"
#include "demi/core/tensor.h"

namespace demi::amp {
namespace {

struct Scan {
  int64_t numel = 0, inf = 0, nan = 0;
  double max_finite = 0;
};

// Counts t's non-finite values and its largest finite magnitude, reading a low-precision tensor widened a
// chunk at a time on the stack: an FP32 copy of each output would add its size to the re-run's peak (model
// A at O2-fp16: the convolution's output, 0.9 MiB, above the training step's own peak).
void scan(const Tensor& t, Scan& s) {
  if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) return;
  const int64_t n = t.numel();
  s.numel += n;
  auto count = [&s](const float* p, int64_t m) {
    for (int64_t i = 0; i < m; ++i) {
      const float v = p[i];
      if (std::isnan(v)) ++s.nan;
      else if (std::isinf(v)) ++s.inf;
      else s.max_finite = std::max(s.max_finite, static_cast<double>(std::fabs(v)));
    }
  };
  if (t.dtype() == DType::kF32) return count(t.data<float>(), n);
  constexpr int64_t kChunk = 1024;
  float wide[kChunk];
  const char* p = static_cast<const char*>(t.raw_data());
  const size_t elem = dtype_size(t.dtype());
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    convert(p + static_cast<size_t>(i) * elem, t.dtype(), wide, DType::kF32, m);
    count(wide, m);
  }
}

// Whether any of n values (their bits, `mask` the exponent's) is Inf or NaN: an exponent of all ones. A
// loop over the raw bits the compiler vectorises (no conversion, no branch per value), in chunks so that a
// non-finite value ends it early.
template <typename Bits>
bool any_exponent_all_ones(const Bits* p, int64_t n, Bits mask) {
  constexpr int64_t kChunk = 4096;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    bool any = false;
    for (int64_t j = 0; j < m; ++j) any |= (p[i + j] & mask) == mask;
    if (any) return true;
  }
  return false;
}

bool any_nonfinite(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return false;
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kF32: return any_exponent_all_ones(static_cast<const uint32_t*>(t.raw_data()), n, 0x7f800000u);
    case DType::kF64:
      return any_exponent_all_ones(static_cast<const uint64_t*>(t.raw_data()), n, uint64_t{0x7ff0000000000000});
    case DType::kBF16: return any_exponent_all_ones(static_cast<const uint16_t*>(t.raw_data()), n, uint16_t{0x7f80});
    case DType::kF16: return any_exponent_all_ones(static_cast<const uint16_t*>(t.raw_data()), n, uint16_t{0x7c00});
    default: return false;
  }
}

}  // namespace

void OverflowFinder::on_op(const ops::OpEvent& e) {
  if (source_.found) return;
  // Most ops of the re-run are finite: checked on their bits first, counted only where one is not (the
  // counting scan, per value with a conversion, was a noticeable share of a 10-step model D run at O2-fp16
  // with its three overflow steps at the start).
  if (std::none_of(e.outputs.begin(), e.outputs.end(), [](const Tensor& o) { return any_nonfinite(o); })) return;
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
  source_.input_past_f16_range = !e.backward && e.compute_dtype == DType::kF16 && in.max_finite > 65504.0;
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
                 input_nonfinite ? " (an input was already non-finite: it came from the data or a parameter)" : "",
                 input_past_f16_range ? " (an input holds values past float16's range, 65504, which read as float16 "
                                        "are Inf: scale the data down, or keep this layer in FP32)"
                                      : "");
}

}  // namespace demi::amp
