// The job a training command line names: the model (from the registry of models the CLI trains: A, B, C,
// D, R, gpt), its data (synthetic, Fashion-MNIST, MNIST, CIFAR-10) and the batch size, and the options every
// training command shares.
#include <cctype>
#include <memory>
#include <string>

#include "demi/data/data.h"
#include "demi/nn/models.h"
#include "tools/demi/gpt.h"
#include "tools/demi/training.h"

namespace demi::cli {
namespace {

const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

// Model D's data: random tokens (B, 128) of a 1000-word vocabulary; the label is the first token mod 10
// (learnable, so the loss falls), drawn per row from (seed, epoch, row).
std::shared_ptr<data::Dataset> token_dataset(int64_t n, int64_t batch, uint64_t seed) {
  data::RandomAccessSource src;
  src.size = n;
  src.get = [seed](int64_t i) {
    Generator g(seed * 7919 + static_cast<uint64_t>(i));
    std::vector<int32_t> tokens(128);
    for (auto& t : tokens) t = static_cast<int32_t>(g.next_int(1000));
    return data::Row{from_vector(tokens, {128}), full({}, tokens[0] % 10, DType::kI32)};
  };
  return std::make_shared<data::GeneratorDataset>(src, std::vector<std::string>{"tokens", "label"})->batch(batch);
}

// The seed's random images (epoch 0 of data::seed_data_source) generated once and held in memory, as a
// loaded data set is. Drawn afresh per row and epoch in the prefetch thread, the normal deviates competed
// with the compute threads for the cores, so a timed run measured the generator (`demi train --json`'s
// samples_per_second shows it); PyTorch's twins (bench/torch_models.py) also train on tensors in memory.
std::shared_ptr<data::Dataset> synthetic_images(int64_t n, int64_t batch, uint64_t seed, data::SeedDataOptions o) {
  MemCategoryScope scope(MemCategory::kData);
  const int64_t per_row = o.channels * o.height * o.width;
  Tensor images = empty({n, o.channels, o.height, o.width}, DType::kF32);
  Tensor labels = empty({n}, DType::kI32);
  data::RowGenerator rows = data::seed_data_source(n, seed, o)(0);
  for (int64_t i = 0; i < n; ++i) {
    std::optional<data::Row> r = rows();
    DEMI_ASSERT(r && (*r)[0].numel() == per_row, "seed_data_source yielded ", i, " of ", n, " rows");
    std::copy_n((*r)[0].data<float>(), per_row, images.data<float>() + i * per_row);
    labels.data<int32_t>()[i] = (*r)[1].data<int32_t>()[0];
  }
  return std::make_shared<data::NumpySlicesDataset>(std::vector<Tensor>{images, labels},
                                                    std::vector<std::string>{"image", "label"})
      ->batch(batch);
}

// 3x32x32 images (synthetic, cifar10:DIR) or 1x28x28 ones (fashion-mnist, mnist:DIR, synthetic).
std::shared_ptr<nn::Cell> model_a(const ParsedArgs& args) {
  if (args.flag("zoo-style")) return std::make_shared<nn::SeedSimpleCNN>();
  return std::make_shared<nn::SimpleCNN>();
}
std::shared_ptr<nn::Cell> model_b(const ParsedArgs& args) {
  if (args.flag("zoo-style")) return std::make_shared<nn::ZooLeNet>(args.flag("batch-norm"));
  return std::make_shared<nn::LeNet>(args.flag("batch-norm"));
}

}  // namespace

const std::vector<ModelEntry>& models() {
  using enum ModelInputs;
  static const std::vector<ModelEntry> entries = {
      {"A", "simplecnn", "the seed's CNN", 32, kImages3, model_a, nullptr},
      {"B", "lenet", "LeNet-5", 128, kImages1, model_b, nullptr},
      {"C", "mlp", "a 784-1024-1024-10 MLP", 256, kImages1,
       [](const ParsedArgs&) -> std::shared_ptr<nn::Cell> { return std::make_shared<nn::MLP>(); }, nullptr},
      {"D", "transformer", "a Transformer encoder classifier", 32, kTokens,
       [](const ParsedArgs&) -> std::shared_ptr<nn::Cell> { return std::make_shared<nn::TransformerClassifier>(); },
       nullptr},
      {"R", "resnet18", "ResNet-18", 32, kImages3,
       [](const ParsedArgs&) -> std::shared_ptr<nn::Cell> { return std::make_shared<nn::ResNet18>(); }, nullptr},
      {"gpt", "gpt", "a character GPT on a text", 0, kText, nullptr, run_train_gpt},
  };
  return entries;
}

std::string model_list() {
  std::string out;
  const std::vector<ModelEntry>& all = models();
  for (size_t i = 0; i < all.size(); ++i) {
    const ModelEntry& m = all[i];
    out += str_cat(i == 0 ? "" : i + 1 == all.size() ? " or " : ", ", m.key,
                   m.name != m.key ? str_cat(" (", m.name, ")") : std::string());
  }
  return out;
}

const ModelEntry& find_model(const std::string& name) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  for (const ModelEntry& m : models())
    if (lower(name) == lower(std::string(m.key)) || lower(name) == m.name) return m;
  throw UsageError("unknown --model '" + name + "'; expected " + model_list());
}

Job make_job(const ParsedArgs& args) {
  Job job;
  const ModelEntry& entry = find_model(args.get("model"));
  if (entry.build == nullptr)
    throw UsageError(str_cat("--model ", entry.key, " (", entry.summary, ") is taken by demi train and demi plan only"));
  job.model_key = std::string(entry.key);
  int64_t batch = args.get_int("batch-size");
  if (batch <= 0) batch = entry.batch;
  job.batch_size = batch;
  int64_t limit = args.get_int("train-samples");
  uint64_t seed = static_cast<uint64_t>(args.get_int("seed"));
  std::string data = args.get("data");
  const bool images3 = entry.inputs == ModelInputs::kImages3;
  if (data == "default") data = entry.inputs == ModelInputs::kImages1 ? "fashion-mnist" : "synthetic";
  job.data_name = data;
  set_seed(seed);
  if (args.flag("zoo-style") && entry.build != model_a && entry.build != model_b)
    throw UsageError("--zoo-style is for models A and B (their layers called in construct, as the seed writes them)");
  if (args.flag("batch-norm") && entry.build != model_b)
    throw UsageError("--batch-norm is for model B (LeNet with a BatchNorm after each convolution)");
  job.net = entry.build(args);
  if (entry.inputs == ModelInputs::kTokens) {
    if (data != "synthetic") throw UsageError("--model " + job.model_key + " trains on --data synthetic (random tokens)");
    int64_t n = limit > 0 ? limit : 1024;
    job.train_ds = token_dataset(n, batch, seed);
    job.test_ds = token_dataset(std::max<int64_t>(n / 4, batch), batch, seed + 1);
    job.data_name = "synthetic tokens";
    return job;
  }
  if (data == "synthetic") {
    data::SeedDataOptions o;
    if (!images3) o.channels = 1, o.height = 28, o.width = 28;
    int64_t n = limit > 0 ? limit : 1000;
    job.train_ds = synthetic_images(n, batch, seed, o);
    job.test_ds = synthetic_images(std::max<int64_t>(n / 4, batch), 256, seed + 1, o);
    return job;
  }
  std::string dir;
  bool cifar = false;
  if (data == "fashion-mnist") dir = kFashionDir;
  else if (data.rfind("mnist:", 0) == 0) dir = data.substr(6);
  else if (data.rfind("cifar10:", 0) == 0) dir = data.substr(8), cifar = true;
  else throw UsageError("unknown --data '" + data + "'; expected synthetic, fashion-mnist, mnist:DIR or cifar10:DIR");
  if (cifar != images3)
    throw UsageError("--model " + job.model_key + " takes " + (images3 ? "3x32x32 images (synthetic, cifar10:DIR)" :
                                                         "1x28x28 images (fashion-mnist, mnist:DIR, synthetic)"));
  std::vector<data::Transform> norm;
  std::shared_ptr<data::Dataset> train, test;
  if (cifar) {
    norm = {data::Rescale(1.0 / 255, 0.0), data::Normalize({0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616})};
    train = std::make_shared<data::Cifar10Dataset>(dir, "train");
    test = std::make_shared<data::Cifar10Dataset>(dir, "test");
  } else {
    norm = {data::Rescale(1.0 / 255, 0.0), data::Normalize({0.2860}, {0.3530})};
    train = std::make_shared<data::MnistDataset>(dir, "train");
    test = std::make_shared<data::MnistDataset>(dir, "test");
  }
  // The bytes batched, then normalized a batch at a time: the same values as each image mapped before
  // `batch` (Rescale and Normalize are per element and per channel, and an NCHW batch keeps the image's
  // channel axis; Map.NormalizingABatchOfBytesIsEachImageNormalized), but one table pass and one float
  // tensor per batch instead of one per image and a copy of each into the batch (bench/data_bench).
  if (limit > 0) train = train->take(limit);
  job.train_ds = train->shuffle(60000, seed)->batch(batch, /*drop_remainder=*/true)->map(norm, {"image"});
  job.test_ds = test->batch(256)->map(norm, {"image"});
  return job;
}

std::vector<Option> training_options() {
  return {
      {"model", "M", model_list(), "A"},
      {"data", "D", "synthetic, fashion-mnist, mnist:DIR, cifar10:DIR (default: synthetic for A, D, R, else "
                    "fashion-mnist); gpt: text:PATH (default: the King James Bible)", "default"},
      int_option("epochs", "N", "epochs", "1", 1, 1e6),
      int_option("batch-size", "N", "batch size (0: the model's reference batch: A 32, B 128, C 256, D 32, R 32)", "0", 0,
                 1 << 20),
      real_option("lr", "LR", "learning rate (Momentum 0.9)", "0.01", 1e-12, 1e3),
      int_option("seed", "S", "random seed (weights, data order, synthetic data)", "1", 0, 1e18),
      int_option("threads", "N", "threads (0: every core)", "0", 0, 4096),
      {"mode", "M", "graph (GRAPH_MODE: each update replays a static memory plan, one arena) or pynative", "graph"},
      {"graph-fusion", "F", "on: graph mode runs the eager fusions on any network's layer calls (off: PYNATIVE's "
                            "bits on every network)", "on"},
      {"f16-products", "P", "how float16 products (Dense, MatMul, convolutions and their gradients) multiply: exact "
                            "(the f16 values: the f32 FMA rate on a CPU without fp16 arithmetic) or bf16 (rounded to "
                            "bfloat16 on the bf16 kernels: up to twice as fast with AVX512-BF16, other numbers)",
       "exact"},
      int_option("train-samples", "N", "use only the first N training samples (0: all)", "0", 0, 1e12),
      {"loss-scale", "S", "default (the level's), none, fixed:N or dynamic", "default"},
      {"batch-norm", "", "model B with a BatchNorm after each convolution (kept FP32 at O2: the black list)", ""},
      {"zoo-style", "", "models A and B written as the seed and MindSpore's model zoo write networks: each layer "
                        "called in construct, no SequentialCell, no hand-fused call (graph mode fuses the calls)",
       ""},
  };
}

}  // namespace demi::cli
