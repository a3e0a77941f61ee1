#include "demi/optim/param_groups.h"

namespace demi::optim {

bool exempt_from_weight_decay(const std::string& name, const Tensor& param, const std::vector<std::string>& extra_names) {
  if (param.rank() <= 1) return true;
  for (const std::string& n : extra_names)
    if (!n.empty() && name.find(n) != std::string::npos) return true;
  return false;
}

std::vector<ParamGroup> weight_decay_groups(const std::vector<std::pair<std::string, Tensor>>& named_params,
                                            double weight_decay, const std::vector<std::string>& extra_names) {
  DEMI_CHECK(weight_decay >= 0, "weight_decay_groups: weight_decay must be >= 0, got ", weight_decay);
  ParamGroup decay, exempt;
  decay.weight_decay = weight_decay;
  exempt.weight_decay = 0;
  for (const auto& [name, p] : named_params) {
    if (!p.requires_grad()) continue;
    (exempt_from_weight_decay(name, p, extra_names) ? exempt : decay).params.push_back(p);
  }
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!exempt.params.empty()) groups.push_back(std::move(exempt));
  return groups;
}

}  // namespace demi::optim
