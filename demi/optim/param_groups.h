// Parameter groups for weight decay: the usual large-model recipe (AdamW with decay on the weight matrices
// and none on biases and normalisation parameters), built from a network's named parameters.
//
//   auto groups = optim::weight_decay_groups(net.parameters_and_names(), 0.01);
//   auto opt = std::make_shared<optim::AdamW>(groups, optim::cosine_lr(1e-3, steps, warmup));
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "demi/core/tensor.h"
#include "demi/optim/optimizer.h"

namespace demi::optim {

// Whether a parameter is exempt from weight decay: rank <= 1 (biases, LayerNorm/BatchNorm gamma and beta,
// any per-channel scale), or a name containing one of `extra_names` (say "pos_embedding").
bool exempt_from_weight_decay(const std::string& name, const Tensor& param,
                              const std::vector<std::string>& extra_names = {});

// Two groups over the trainable parameters, in the network's order: {decayed, weight_decay} then
// {exempt, 0}. A group left empty is dropped.
std::vector<ParamGroup> weight_decay_groups(const std::vector<std::pair<std::string, Tensor>>& named_params,
                                            double weight_decay, const std::vector<std::string>& extra_names = {});

}  // namespace demi::optim
