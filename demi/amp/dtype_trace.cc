#include "demi/amp/dtype_trace.h"

#include <cstdio>

namespace demi::amp {
namespace {

bool matmul_class(ops::Op op) {
  return op == ops::Op::kDense || op == ops::Op::kMatmul || op == ops::Op::kBatchMatmul ||
         op == ops::Op::kAttention || op == ops::Op::kConv2d || op == ops::Op::kConv2dReluMaxPool2d;
}

// Forward FLOPs from the event: the op's own count, else from the shapes.
int64_t forward_flops(const ops::OpEvent& e) {
  if (e.flops >= 0) return e.flops;
  int64_t out = 0;
  for (const Tensor& o : e.outputs)
    if (o.defined()) out += o.numel();
  const Tensor* a = !e.inputs.empty() ? e.inputs[0] : nullptr;
  if (a == nullptr || !a->defined() || a->rank() == 0) return out;
  switch (e.op) {
    case ops::Op::kDense:
    case ops::Op::kMatmul:
    case ops::Op::kBatchMatmul:
      return 2 * out * a->dim(a->rank() - 1);  // (.., K) x (K, N): 2K per output
    case ops::Op::kAttention: {
      // softmax(Q Kᵀ) V: Q (.., Sq, D), K (.., Sk, D): 2·Sq·Sk·D for the scores and as much for · V.
      const Tensor* k = e.inputs.size() > 1 ? e.inputs[1] : nullptr;
      if (k == nullptr || !k->defined() || k->rank() < 2) return out;
      return 4 * out * k->dim(k->rank() - 2);
    }
    default:
      return out;
  }
}

class Tracer : public ops::OpObserver {
 public:
  void on_op(const ops::OpEvent& e) override {
    DTypeTraceRow r;
    r.layer = e.layer != nullptr ? e.layer : "";
    r.op = e.op;
    r.backward = e.backward;
    r.compute = e.compute_dtype;
    for (const Tensor& o : e.outputs)
      if (o.defined()) {
        if (r.outputs.empty()) r.output_shape = o.shape();  // the first: the output, or the input's gradient
        r.outputs.push_back(o.dtype());
      }
    auto& stack = forward_flops_[{r.layer, static_cast<int>(e.op)}];
    if (!e.backward) {
      r.flops = forward_flops(e);
      stack.push_back(r.flops);
    } else {
      int64_t fwd = 0;
      if (!stack.empty()) {
        fwd = stack.back();
        stack.pop_back();
      }
      int64_t out = 0;
      for (const Tensor& o : e.outputs)
        if (o.defined()) out += o.numel();
      r.flops = matmul_class(e.op) ? 2 * fwd : out;
    }
    rows.push_back(std::move(r));
  }
  std::vector<DTypeTraceRow> rows;

 private:
  std::map<std::pair<std::string, int>, std::vector<int64_t>> forward_flops_;
};

std::string human(double v) {
  char b[32];
  if (v >= 1e9) std::snprintf(b, sizeof b, "%.2f G", v / 1e9);
  else if (v >= 1e6) std::snprintf(b, sizeof b, "%.2f M", v / 1e6);
  else if (v >= 1e3) std::snprintf(b, sizeof b, "%.2f k", v / 1e3);
  else std::snprintf(b, sizeof b, "%.0f ", v);
  return b;
}

}  // namespace

DTypeTrace trace_dtypes(TrainStep& step, const Tensor& data, const Tensor& label) {
  Tracer tracer;
  step.run_observed(data, label, tracer);
  DTypeTrace t;
  std::map<std::string, std::string> types;
  for (auto& [path, cell] : step.network().cells_and_names()) types[path] = cell->type_name();
  for (auto& r : tracer.rows) {
    r.type = types.count(r.layer) ? types[r.layer] : "";
    auto& tot = (r.backward ? t.backward : t.forward)[r.compute];
    ++tot.ops;
    tot.flops += r.flops;
    t.rows.push_back(std::move(r));
  }
  return t;
}

std::string DTypeTrace::to_string() const {
  std::string s;
  char line[320];
  std::snprintf(line, sizeof line, "%-4s %-24s %-14s %-30s %-9s %-26s %-18s %10s\n", "dir", "layer", "type", "op",
                "compute", "outputs", "shape", "FLOPs");
  s += line;
  for (const auto& r : rows) {
    std::string outs;
    for (DType d : r.outputs) outs += (outs.empty() ? "" : ",") + std::string(dtype_name(d));
    std::string shape = str_cat(r.output_shape);
    std::snprintf(line, sizeof line, "%-4s %-24s %-14s %-30s %-9s %-26s %-18s %10s\n", r.backward ? "bwd" : "fwd",
                  r.layer.empty() ? "(network)" : r.layer.c_str(), r.type.c_str(), std::string(ops::op_name(r.op)).c_str(),
                  std::string(dtype_name(r.compute)).c_str(), outs.c_str(), shape.c_str(),
                  human(static_cast<double>(r.flops)).c_str());
    s += line;
  }
  int64_t total_ops = 0, total_flops = 0;
  for (const auto* m : {&forward, &backward})
    for (const auto& [d, t] : *m) {
      total_ops += t.ops;
      total_flops += t.flops;
    }
  s += "\nsummary by compute dtype:\n";
  for (const auto& [name, m] : {std::pair{"forward", &forward}, std::pair{"backward", &backward}})
    for (const auto& [d, t] : *m) {
      std::snprintf(line, sizeof line, "  %-8s %-9s %5lld ops  %12sFLOPs  (%5.1f%% of the step's FLOPs)\n", name,
                    std::string(dtype_name(d)).c_str(), static_cast<long long>(t.ops),
                    human(static_cast<double>(t.flops)).c_str(),
                    total_flops > 0 ? 100.0 * static_cast<double>(t.flops) / static_cast<double>(total_flops) : 0.0);
      s += line;
    }
  std::snprintf(line, sizeof line, "  total    %15lld ops  %12sFLOPs\n", static_cast<long long>(total_ops),
                human(static_cast<double>(total_flops)).c_str());
  s += line;
  return s;
}

}  // namespace demi::amp
