// Adaptive AMP on real data: a regression whose outputs outgrow float16.
//
// Predict how much ink a Fashion-MNIST image holds — the sum of its 784 pixel values, 0..255 each — from
// the (rescaled) image. The targets reach ~1.5e5, past float16's 65504, so at O3 (and O2) float16 the last
// Dense layer's outputs overflow as soon as the network learns the heavy images: every batch holding one
// overflows, its step is skipped, and training stalls however the loss is scaled (the overflow is in the
// forward pass). With adaptive AMP demi attributes the overflows to that layer and promotes it, alone,
// to FP32; everything else stays float16.
//
//   amp_adapt [--amp O3] [--dtype fp16] [--adapt 0|1] [--epochs N] [--train-batches N] [--data DIR]
//             [--report run.html]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "demi/data/data.h"
#include "demi/nn/layers.h"
#include "demi/ops/ops.h"
#include "demi/train/model.h"
#include "demi/train/report.h"
#include "demi/train/report_html.h"

using namespace demi;

int main(int argc, char** argv) {
  std::string level = "O3", dtype = "fp16", dir = "/usr/share/datasets/fashion-mnist", report;
  bool adapt = true;
  int epochs = 1;
  int64_t train_batches = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--amp") level = v;
    else if (k == "--dtype") dtype = v;
    else if (k == "--adapt") adapt = v == "1";
    else if (k == "--epochs") epochs = std::atoi(v.c_str());
    else if (k == "--train-batches") train_batches = std::atoll(v.c_str());
    else if (k == "--data") dir = v;
    else if (k == "--report") report = v;
    else {
      std::fprintf(stderr, "amp_adapt: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    set_seed(1);
    // The whole split as two columns: the image in [0, 1], and its ink (the sum of the raw pixels).
    auto load = [&](const std::string& usage) {
      auto src = std::make_shared<data::MnistDataset>(dir, usage)->map({data::Rescale(1.0 / 255, 0.0)}, {"image"});
      auto all = src->batch(src->get_dataset_size())->create_iterator({})->next();
      Tensor images = (*all)[0].reshape({(*all)[0].dim(0), 784});
      Tensor ink = ops::mul_scalar(ops::sum(images, {1}, /*keepdim=*/true), 255.0);
      return std::make_shared<data::NumpySlicesDataset>(std::vector<Tensor>{images, ink},
                                                        std::vector<std::string>{"image", "ink"});
    };
    std::shared_ptr<data::Dataset> train_ds = load("train")->shuffle(60000)->batch(64, /*drop_remainder=*/true);
    if (train_batches > 0) train_ds = train_ds->take(train_batches);
    auto test_ds = load("test")->batch(500);

    auto net = std::make_shared<nn::SequentialCell>(std::vector<nn::CellPtr>{
        std::make_shared<nn::Dense>(784, 256), std::make_shared<nn::ReLU>(), std::make_shared<nn::Dense>(256, 1)});
    auto optimizer = std::make_shared<optim::Adam>(net->trainable_params(), 0.1);
    train::Model model(net, std::make_shared<nn::MSELoss>("mean"), optimizer,
                       {{"Loss", std::make_shared<train::Loss>()}},
                       {.amp_level = amp::parse_level(level), .low_dtype = parse_dtype(dtype), .amp_adapt = adapt});
    auto recorder = std::make_shared<train::ReportRecorder>();
    recorder->record().title = "ink regression on Fashion-MNIST, " + level + " " + dtype + (adapt ? " adaptive" : "");
    model.train(epochs, train_ds, {std::make_shared<train::LossMonitor>(200), recorder});
    auto metrics = model.eval(test_ds);
    const auto& s = model.last_summary();
    if (!report.empty()) {
      recorder->finish(s, {{"test RMSE", std::sqrt(metrics["Loss"])}});
      train::write_report(report, train::render_report_html(recorder->record()));
    }
    std::string promoted;
    for (const auto& p : s.promotions) promoted += (promoted.empty() ? "" : ", ") + p.layer + " (" + p.type + ")";
    std::printf("%s %s%s: %lld steps, %lld skipped, %.0f samples/s, test RMSE %.0f (ink ranges to ~1.5e5), "
                "promoted to FP32: %s\n",
                level.c_str(), dtype.c_str(), adapt ? " adaptive" : "", static_cast<long long>(s.steps),
                static_cast<long long>(s.skipped_steps), s.samples_per_second, std::sqrt(metrics["Loss"]),
                promoted.empty() ? "none" : promoted.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "amp_adapt: %s\n", e.what());
    return 1;
  }
}
