// A convolutional autoencoder on Fashion-MNIST: two strided Conv2d layers squeeze a 28x28 image into
// 32 maps of 7x7, two Conv2dTranspose layers (MindSpore's pad_mode "pad" with output_padding, then "same")
// bring it back to 28x28. Trained on mean squared reconstruction error at any AMP level; the test split's
// error is compared with that of the best constant answer, the mean training image.
//
//   autoencoder [--amp O2] [--dtype bf16] [--epochs N] [--train-batches N] [--data DIR]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "demi/data/data.h"
#include "demi/nn/layers.h"
#include "demi/ops/ops.h"
#include "demi/train/model.h"

using namespace demi;

int main(int argc, char** argv) {
  std::string level = "O2", dtype = "bf16", dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 1;
  int64_t train_batches = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--amp") level = v;
    else if (k == "--dtype") dtype = v;
    else if (k == "--epochs") epochs = std::atoi(v.c_str());
    else if (k == "--train-batches") train_batches = std::atoll(v.c_str());
    else if (k == "--data") dir = v;
    else {
      std::fprintf(stderr, "autoencoder: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    set_seed(1);
    // The images in [0, 1], twice: the input and the target.
    auto images_of = [&](const std::string& usage) {
      auto src = std::make_shared<data::MnistDataset>(dir, usage)->map({data::Rescale(1.0 / 255, 0.0)}, {"image"});
      return (*src->batch(src->get_dataset_size())->create_iterator({})->next())[0];
    };
    Tensor train_images = images_of("train"), test_images = images_of("test");
    auto pairs = [](const Tensor& x) {
      return std::make_shared<data::NumpySlicesDataset>(std::vector<Tensor>{x, x},
                                                        std::vector<std::string>{"image", "target"});
    };
    std::shared_ptr<data::Dataset> train_ds = pairs(train_images)->shuffle(60000)->batch(64, true);
    if (train_batches > 0) train_ds = train_ds->take(train_batches);
    auto test_ds = pairs(test_images)->batch(500);

    nn::Conv2dOptions down{.stride = {2, 2}, .has_bias = true};
    nn::Conv2dTransposeOptions up_pad{.stride = {2, 2}, .pad_mode = "pad", .padding = {1, 1, 1, 1},
                                      .output_padding = {1, 1}, .has_bias = true};
    nn::Conv2dTransposeOptions up_same{.stride = {2, 2}, .has_bias = true};
    auto net = std::make_shared<nn::SequentialCell>(std::vector<nn::CellPtr>{
        std::make_shared<nn::Conv2d>(1, 16, 3, down), std::make_shared<nn::ReLU>(),             // 16 x 14 x 14
        std::make_shared<nn::Conv2d>(16, 32, 3, down), std::make_shared<nn::ReLU>(),            // 32 x 7 x 7
        std::make_shared<nn::Conv2dTranspose>(32, 16, 3, up_pad), std::make_shared<nn::ReLU>(),  // 16 x 14 x 14
        std::make_shared<nn::Conv2dTranspose>(16, 1, 3, up_same), std::make_shared<nn::Sigmoid>()});  // 1 x 28 x 28
    auto optimizer = std::make_shared<optim::Adam>(net->trainable_params(), 2e-3);
    train::Model model(net, std::make_shared<nn::MSELoss>("mean"), optimizer, {{"Loss", std::make_shared<train::Loss>()}},
                       {.amp_level = amp::parse_level(level), .low_dtype = parse_dtype(dtype)});
    model.train(epochs, train_ds, {});
    const double mse = model.eval(test_ds)["Loss"];
    // The best constant answer: the mean training image.
    Tensor mean_image = ops::mean(train_images, {0}, /*keepdim=*/true);
    const double baseline = ops::mean(ops::mul(ops::sub(test_images, mean_image), ops::sub(test_images, mean_image))).item();
    const auto& s = model.last_summary();
    std::printf("%s %s: %lld steps, %lld skipped, %.0f samples/s, test MSE %.4f, the mean image's %.4f: ratio %.3f\n",
                level.c_str(), dtype.c_str(), static_cast<long long>(s.steps),
                static_cast<long long>(s.skipped_steps), s.samples_per_second, mse, baseline, mse / baseline);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "autoencoder: %s\n", e.what());
    return 1;
  }
}
