// The seed's SimpleCNN trained at O2 (float16, the seed's fixed loss scale of 1024) for 20 steps on one
// batch of its random data, built outside demi's tree (tests/consumer/run.sh). Prints each step's loss;
// fails unless every loss is finite and the last five steps' mean is below the first five's.
#include <cmath>
#include <cstdio>
#include <vector>

#include "demi/demi.h"

int main() {
  using namespace demi;
  try {
    set_seed(7);
    auto train_ds = data::make_seed_dataset(/*num_data=*/32, /*batch_size=*/32, /*seed=*/7);
    auto net = std::make_shared<nn::SimpleCNN>();
    auto loss_fn = std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(/*sparse=*/true, "mean");
    auto optimizer = std::make_shared<optim::Momentum>(net->trainable_params(), 0.001, 0.9);
    // The seed's fixed loss scale (O2 with float16 would default to a dynamic one).
    auto train_step = amp::build_train_network(
        net, optimizer, loss_fn, amp::Level::kO2,
        {.loss_scale_manager = std::make_shared<amp::FixedLossScaleManager>(1024.0, /*drop_overflow_update=*/false)});

    std::vector<double> losses;
    // One batch of the seed's random images and labels, 20 steps on it: random labels are learnt by heart.
    auto batch = train_ds->create_iterator({.epoch = 0})->next();
    for (int step = 1; step <= 20; ++step) {
      amp::StepResult r = (*train_step)((*batch)[0], (*batch)[1]);
      losses.push_back(r.loss);
      std::printf("step %d: loss %.4f%s\n", step, r.loss, r.skipped ? " (skipped: overflow)" : "");
      if (!std::isfinite(r.loss)) {
        std::fprintf(stderr, "seed_consumer: non-finite loss at step %d\n", step);
        return 1;
      }
    }
    if (losses.size() != 20) {
      std::fprintf(stderr, "seed_consumer: %zu steps, expected 20\n", losses.size());
      return 1;
    }
    double first = 0, last = 0;
    for (int i = 0; i < 5; ++i) {
      first += losses[static_cast<size_t>(i)] / 5;
      last += losses[losses.size() - 5 + static_cast<size_t>(i)] / 5;
    }
    std::printf("mean loss, first 5 steps %.4f, last 5 steps %.4f\n", first, last);
    std::fflush(stdout);
    if (!(last < first)) {
      std::fprintf(stderr, "seed_consumer: the loss did not fall\n");
      return 1;
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "seed_consumer: %s\n", e.what());
    return 1;
  }
}
