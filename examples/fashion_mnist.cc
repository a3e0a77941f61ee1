// Model B (LeNet-style) on Fashion-MNIST, the real data set Debian ships, with evaluation on the test
// split. The AMP level is one argument.
//
//   fashion_mnist [--amp O0|O1|O2|O3] [--dtype fp16|bf16] [--epochs N] [--train-batches N] [--data DIR]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "demi/data/data.h"
#include "demi/nn/models.h"
#include "demi/train/model.h"

using namespace demi;

int main(int argc, char** argv) {
  std::string level = "O2", dtype = "bf16", dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 1;
  int64_t train_batches = -1;  // all
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--amp") level = v;
    else if (k == "--dtype") dtype = v;
    else if (k == "--epochs") epochs = std::atoi(v.c_str());
    else if (k == "--train-batches") train_batches = std::atoll(v.c_str());
    else if (k == "--data") dir = v;
    else {
      std::fprintf(stderr, "fashion_mnist: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    set_seed(1);
    auto normalize = std::vector<data::Transform>{data::Rescale(1.0 / 255, 0.0), data::Normalize({0.2860}, {0.3530})};
    std::shared_ptr<data::Dataset> train_ds = std::make_shared<data::MnistDataset>(dir, "train")
                                                  ->map(normalize, {"image"})
                                                  ->shuffle(60000)
                                                  ->batch(128, /*drop_remainder=*/true);
    if (train_batches > 0) train_ds = train_ds->take(train_batches);
    auto test_ds = std::make_shared<data::MnistDataset>(dir, "test")->map(normalize, {"image"})->batch(256);

    auto net = std::make_shared<nn::LeNet>();
    auto loss_fn = std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean");
    auto optimizer = std::make_shared<optim::Momentum>(net->trainable_params(), 0.01, 0.9);
    train::Model model(net, loss_fn, optimizer, {{"Accuracy", std::make_shared<train::Accuracy>()}},
                       {.amp_level = amp::parse_level(level), .low_dtype = parse_dtype(dtype)});
    model.train(epochs, train_ds, {std::make_shared<train::LossMonitor>(100)});
    auto metrics = model.eval(test_ds);
    const auto& s = model.last_summary();
    std::printf("%s %s: %lld steps, %.0f samples/s, data wait %.2f%%, test accuracy %.4f\n", level.c_str(),
                dtype.c_str(), static_cast<long long>(s.steps), s.samples_per_second, 100 * s.data_wait_fraction,
                metrics["Accuracy"]);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
