// The seed's program, in C++, line for line: MindSpore's mixed-precision tutorial ("way 1", the Model API).
//
//   context.set_context(mode=context.GRAPH_MODE, device_target="CPU", device_id=0)
//   train_ds = create_dataset()                      # 1000 random (3, 32, 32) images, batch 32
//   net = SimpleCNN()
//   loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
//   optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
//   loss_scale_manager = ms.FixedLossScaleManager(1024.0, drop_overflow_update=False)
//   model = Model(net, loss_fn, optimizer, metrics={"Accuracy": nn.Accuracy()}, amp_level="O2",
//                 loss_scale_manager=loss_scale_manager)
//   model.train(epoch=2, train_dataset=train_ds, callbacks=[TimeMonitor(), LossMonitor(per_print_times=10)],
//               dataset_sink_mode=True)
//
// One difference, on purpose: the seed's Conv2d keeps MindSpore's default pad_mode="same", which gives
// 32x32 maps and 32*16*16 features — not the 32*15*15 its Dense expects (the seed calls this
// "simplified"). demi reports that mismatch by layer name; here the conv uses pad_mode="valid", which is
// what the seed's Dense(32 * 15 * 15) means.
#include <cstdio>
#include <iostream>

#include "demi/core/context.h"
#include "demi/data/data.h"
#include "demi/nn/layers.h"
#include "demi/train/model.h"

using namespace demi;

// def get_data(num, img_size=(32, 32), num_classes=10): yield np.random.randn(3, *img_size), randint(0, 10)
data::RowGenerator get_data(int64_t num, Generator& gen, int64_t img = 32, int64_t num_classes = 10) {
  auto count = std::make_shared<int64_t>(0);
  return [=, &gen]() -> std::optional<data::Row> {
    if ((*count)++ >= num) return std::nullopt;
    Tensor image = normal({3, img, img}, 0.0, 1.0, gen);
    Tensor label = full({}, static_cast<double>(gen.next_int(num_classes)), DType::kI32);
    return data::Row{image, label};
  };
}

std::shared_ptr<data::Dataset> create_dataset(Generator& gen, int64_t num_data = 1000, int64_t batch_size = 32) {
  auto dataset = std::make_shared<data::GeneratorDataset>([&gen, num_data] { return get_data(num_data, gen); },
                                                          std::vector<std::string>{"image", "label"});
  return dataset->batch(batch_size);
}

class SimpleCNN : public nn::Cell {
 public:
  explicit SimpleCNN(int64_t num_classes = 10) : Cell("SimpleCNN") {
    conv1 = register_cell("conv1", std::make_shared<nn::Conv2d>(3, 32, 3, nn::Conv2dOptions{.pad_mode = "valid"}));
    relu = register_cell("relu", std::make_shared<nn::ReLU>());
    max_pool = register_cell("max_pool", std::make_shared<nn::MaxPool2d>(2, 2));
    flatten = register_cell("flatten", std::make_shared<nn::Flatten>());
    fc = register_cell("fc", std::make_shared<nn::Dense>(32 * 15 * 15, num_classes));
  }
  Tensor construct(const Tensor& x) override {
    Tensor y = conv1->call(x);
    y = relu->call(y);
    y = max_pool->call(y);
    y = flatten->call(y);
    return fc->call(y);
  }

 private:
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::ReLU> relu;
  std::shared_ptr<nn::MaxPool2d> max_pool;
  std::shared_ptr<nn::Flatten> flatten;
  std::shared_ptr<nn::Dense> fc;
};

int main() {
  try {
    set_context({.mode = ExecMode::kGraph, .device_target = "CPU", .device_id = 0});
    std::printf("demi context: %s, device target CPU:%d\n", exec_mode_name(get_context().mode), get_context().device_id);

    Generator gen(2026);
    auto train_ds = create_dataset(gen);
    std::printf("Dataset created successfully.\n");

    auto net = std::make_shared<SimpleCNN>();
    auto loss_fn = std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(/*sparse=*/true, /*reduction=*/"mean");
    auto optimizer = std::make_shared<optim::Momentum>(net->trainable_params(), /*learning_rate=*/0.01,
                                                       /*momentum=*/0.9);
    auto loss_scale_manager = std::make_shared<amp::FixedLossScaleManager>(1024.0, /*drop_overflow_update=*/false);
    train::Model model(net, loss_fn, optimizer, {{"Accuracy", std::make_shared<train::Accuracy>()}},
                       {.amp_level = amp::Level::kO2, .loss_scale_manager = loss_scale_manager});
    std::printf("Model configured with AMP level O2.\n");

    std::printf("Starting training...\n");
    model.train(2, train_ds, {std::make_shared<train::TimeMonitor>(), std::make_shared<train::LossMonitor>(10)},
                /*dataset_sink_mode=*/true);
    std::printf("Training finished.\n");
    const auto& s = model.last_summary();
    std::printf("%lld steps, %.0f samples/s, final loss %.4f, peak tracked memory %.2f MiB\n",
                static_cast<long long>(s.steps), s.samples_per_second, s.final_loss,
                static_cast<double>(s.peak.total_peak) / (1 << 20));
    // GRAPH_MODE ran conv1 -> relu -> max_pool, called one by one above, as one fused op.
    for (const auto& [key, plan] : model.train_graphs().plans())
      if (!plan.rewrites.empty()) std::printf("graph mode, %s: %s\n", key.c_str(), plan.rewrites.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "seed_simple_cnn: %s\n", e.what());
    return 1;
  }
}
