#include "demi/amp/numerics.h"

#include <cmath>
#include <cstdio>
#include <map>

#include "demi/autograd/autograd.h"
#include "demi/ops/dispatch.h"

namespace demi::amp {
namespace {

double max_abs(const Tensor& t) {
  Tensor f = t.dtype() == DType::kF32 ? t : t.to(DType::kF32);
  const float* p = f.data<float>();
  double m = 0;
  for (int64_t i = 0; i < f.numel(); ++i) m = std::max(m, static_cast<double>(std::abs(p[i])));
  return m;
}

// The largest |output| of each layer's own forward ops (layers unfused, so each reports its own).
class ActivationObserver : public ops::OpObserver {
 public:
  explicit ActivationObserver(std::map<std::string, double>& max_by_layer) : max_(max_by_layer) {}
  void on_op(const ops::OpEvent& e) override {
    if (e.backward || e.layer == nullptr) return;
    for (const Tensor& o : e.outputs)
      if (o.defined() && is_floating(o.dtype())) {
        double& m = max_[e.layer];
        m = std::max(m, max_abs(o));
      }
  }

 private:
  std::map<std::string, double>& max_;
};

}  // namespace

NumericsReport analyze_numerics(nn::Cell& net, nn::LossCell& loss_fn, const Tensor& data, const Tensor& label,
                                double loss_scale) {
  NumericsReport r;
  r.loss_scale = loss_scale;
  auto params = net.parameters_and_names();
  // Keep the parameters' gradients as they were: the analysis must not leak into training.
  std::vector<Tensor> saved;
  for (auto& [n, p] : params) saved.push_back(p.grad());
  std::map<std::string, double> max_by_layer;
  {
    ops::PrecisionScope fp32(nullptr);
    ops::DTypePinScope pin(DType::kF32);
    ops::FusionScope unfused(false);  // each layer's own output, not a fused op's
    ActivationObserver observer(max_by_layer);
    ops::OpObserverScope observe(&observer);
    for (auto& [n, p] : params) p.set_grad(Tensor());
    Tensor loss = loss_fn(net.call(data), label);
    r.loss = static_cast<float>(loss.item());
    autograd::backward(loss);
  }
  // A layer's value is the largest of its own ops' and its sub-layers' outputs.
  for (auto& [path, cell] : net.cells_and_names()) {
    double m = 0;
    for (const auto& [layer, v] : max_by_layer)
      if (ops::layer_within(layer, path)) m = std::max(m, v);
    r.activations.push_back({path, cell->type_name(), m, m > kHalfMax});
  }
  for (size_t i = 0; i < params.size(); ++i) {
    auto& [name, p] = params[i];
    GradientNumerics g;
    g.name = name;
    g.numel = p.numel();
    Tensor grad = p.grad();
    if (grad.defined()) {
      Tensor f = grad.to(DType::kF32);
      const float* v = f.data<float>();
      int64_t zero = 0, under = 0, over = 0;
      for (int64_t k = 0; k < f.numel(); ++k) {
        double s = std::abs(static_cast<double>(v[k])) * loss_scale;
        g.max_abs = std::max(g.max_abs, static_cast<double>(std::abs(v[k])));
        if (v[k] == 0) ++zero;
        else if (s < kHalfMinSubnormal / 2) ++under;  // rounds to zero in FP16
        else if (s > kHalfMax) ++over;
      }
      double n = static_cast<double>(f.numel());
      g.zero_fraction = static_cast<double>(zero) / n;
      g.underflow_fraction = static_cast<double>(under) / n;
      g.overflow_fraction = static_cast<double>(over) / n;
    }
    r.gradients.push_back(g);
    p.set_grad(saved[i]);
  }
  return r;
}

std::string NumericsReport::to_string() const {
  std::string s;
  char line[256];
  std::snprintf(line, sizeof line, "numerics at loss scale %g (loss %.4f), against FP16's range [%.3g, %g]\n",
                loss_scale, loss, static_cast<double>(kHalfMinSubnormal), static_cast<double>(kHalfMax));
  s += line;
  std::snprintf(line, sizeof line, "%-28s %10s %12s %9s %11s %10s\n", "gradient", "values", "max |g|", "zero",
                "underflow", "overflow");
  s += line;
  for (const auto& g : gradients) {
    std::snprintf(line, sizeof line, "%-28s %10lld %12.4g %8.2f%% %10.2f%% %9.2f%%\n", g.name.c_str(),
                  static_cast<long long>(g.numel), g.max_abs, 100 * g.zero_fraction, 100 * g.underflow_fraction,
                  100 * g.overflow_fraction);
    s += line;
  }
  std::snprintf(line, sizeof line, "%-28s %-16s %14s\n", "layer", "type", "max |output|");
  s += line;
  for (const auto& a : activations) {
    std::snprintf(line, sizeof line, "%-28s %-16s %14.4g%s\n", a.path.empty() ? "(network)" : a.path.c_str(),
                  a.type.c_str(), a.max_abs, a.exceeds_fp16 ? "  > 65504: overflows in FP16" : "");
    s += line;
  }
  return s;
}

}  // namespace demi::amp
