// The seed's "way 2": amp::build_train_network turns the network into a mixed-precision train step, and
// the user writes the loop calling train_step(data, label).
//
//   net_amp = amp.build_train_network(net, optimizer, loss_fn, level="O2")
//   for data, label in train_ds: train_step(data, label)
#include <cstdio>

#include "demi/amp/train_step.h"
#include "demi/data/data.h"
#include "demi/nn/models.h"

using namespace demi;

int main() {
  try {
    set_seed(7);
    auto train_ds = data::make_seed_dataset(/*num_data=*/512, /*batch_size=*/32, /*seed=*/7);
    auto net = std::make_shared<nn::SimpleCNN>();
    auto loss_fn = std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean");
    auto optimizer = std::make_shared<optim::Momentum>(net->trainable_params(), 0.001, 0.9);
    // O2's default for float16 is a DynamicLossScaleManager (MindSpore's), BatchNorm kept in FP32.
    auto train_step = amp::build_train_network(net, optimizer, loss_fn, amp::Level::kO2);

    for (int epoch = 1; epoch <= 3; ++epoch) {
      auto it = train_ds->create_iterator({.epoch = epoch - 1});
      double sum = 0;
      int steps = 0, skipped = 0;
      while (auto batch = it->next()) {
        amp::StepResult r = (*train_step)((*batch)[0], (*batch)[1]);
        if (!r.skipped) {
          sum += r.loss;
          ++steps;
        } else {
          ++skipped;
        }
      }
      std::printf("epoch %d: mean loss %.4f over %d steps, %d skipped for overflow, loss scale now %.0f\n", epoch,
                  sum / std::max(steps, 1), steps, skipped, train_step->loss_scale_manager()->get_loss_scale());
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "custom_loop: %s\n", e.what());
    return 1;
  }
}
