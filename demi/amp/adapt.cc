#include "demi/amp/adapt.h"

#include <algorithm>

namespace demi::amp {

PromotedPolicy::PromotedPolicy(std::shared_ptr<const ops::PrecisionPolicy> base, std::vector<std::string> layers)
    : base_(std::move(base)), layers_(std::move(layers)) {}

bool PromotedPolicy::promoted(const char* layer) const {
  if (layer == nullptr) return false;
  for (const std::string& p : layers_)
    if (!p.empty() && ops::layer_within(layer, p)) return true;
  return false;
}

DType PromotedPolicy::compute_dtype(ops::Op op, DType natural) const {
  if (!layers_.empty() && is_floating(natural) && promoted(ops::current_layer()))
    return natural == DType::kF64 ? DType::kF64 : DType::kF32;
  return base_ ? base_->compute_dtype(op, natural) : natural;
}

bool PromotedPolicy::outputs_to_fp32(ops::Op op) const { return base_ && base_->outputs_to_fp32(op); }

AmpAdapter::AmpAdapter(std::shared_ptr<nn::Cell> net, AdaptOptions options)
    : net_(std::move(net)), options_(options) {
  DEMI_CHECK(net_ != nullptr, "AmpAdapter: no network");
  DEMI_CHECK(options_.window >= 1 && options_.promote_after >= 1 && options_.promote_after <= options_.window,
             "AmpAdapter: need 1 <= promote_after (", options_.promote_after, ") <= window (", options_.window, ")");
  base_ = net_->precision_policy_ptr();
  // A second adapter on one network would compose promotions twice.
  DEMI_CHECK(dynamic_cast<const PromotedPolicy*>(base_.get()) == nullptr, "AmpAdapter: ", net_->describe(),
             " already has an adaptive policy");
}

std::vector<std::string> AmpAdapter::promoted_layers() const {
  std::vector<std::string> out;
  for (const auto& p : promotions_) out.push_back(p.layer);
  return out;
}

void AmpAdapter::apply() {
  net_->set_precision_policy(std::make_shared<PromotedPolicy>(base_, promoted_layers()));
}

std::string AmpAdapter::candidate(const StepResult& r, const LossScaleManager* manager, int64_t step) {
  last_counted_ = false;
  reason_.clear();
  while (!counted_.empty() && counted_.front().first <= step - options_.window) counted_.pop_front();
  const OverflowSource& s = r.overflow_source;
  if (!r.overflow || !s.found || base_ == nullptr) return {};
  // Lowering the loss scale could cure a backward overflow while the scale can still go down.
  bool scale_can_drop = false;
  if (const auto* dyn = dynamic_cast<const DynamicLossScaleManager*>(manager))
    scale_can_drop = r.loss_scale > dyn->min_scale();
  if (s.backward && scale_can_drop) return {};
  if (s.input_nonfinite || s.layer.empty() || s.layer == "(outside any layer)") return {};
  for (const auto& p : promotions_)
    if (p.layer == s.layer) return {};  // promoted already (an overflow below it in FP32 is not its op's)
  counted_.emplace_back(step, s.layer);
  last_counted_ = true;
  const auto n = std::count_if(counted_.begin(), counted_.end(), [&](const auto& c) { return c.second == s.layer; });
  if (n < options_.promote_after) return {};
  reason_ = str_cat(n, " overflows in ", options_.window, " steps, the last: ", s.describe());
  return s.layer;
}

Promotion AmpAdapter::promote(const std::string& layer, int64_t step, std::string reason) {
  std::string type;
  for (auto& [path, cell] : net_->cells_and_names())
    if (path == layer) type = cell->type_name();
  DEMI_CHECK(!type.empty() && !layer.empty(), "AmpAdapter: no layer '", layer, "' to promote in ", net_->describe());
  Promotion p{layer, type, step, reason.empty() ? reason_ : std::move(reason)};
  promotions_.push_back(p);
  std::erase_if(counted_, [&](const auto& c) { return c.second == layer; });
  apply();
  return p;
}

std::vector<Promotion> AmpAdapter::observe(const StepResult& r, const LossScaleManager* manager, int64_t step) {
  std::string layer = candidate(r, manager, step);
  if (layer.empty()) return {};
  return {promote(layer, step, reason_)};
}

void AmpAdapter::restore(const std::vector<std::string>& layers) {
  std::vector<std::string> unknown;
  auto cells = net_->cells_and_names();
  for (const std::string& l : layers) {
    auto it = std::find_if(cells.begin(), cells.end(), [&](const auto& c) { return c.first == l; });
    if (it == cells.end() || l.empty()) {
      unknown.push_back(l);
      continue;
    }
    if (std::none_of(promotions_.begin(), promotions_.end(), [&](const auto& p) { return p.layer == l; }))
      promotions_.push_back({l, it->second->type_name(), 0, "restored from the checkpoint"});
  }
  std::string names;
  for (const auto& u : unknown) names += (names.empty() ? "'" : ", '") + u + "'";
  DEMI_CHECK(unknown.empty(), "AmpAdapter: the checkpoint promotes layers this network does not have: ", names, " (",
             net_->describe(), ")");
  apply();
}

}  // namespace demi::amp
