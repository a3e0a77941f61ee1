// demi train / eval / compare: thin over the library. compare runs each setting in a fresh process
// (this same binary, `demi train --json`), so that each one's process peak RSS is its own.
#include "tools/demi/training.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <memory>
#include <sstream>
#include <string>

#include "demi/amp/dtype_trace.h"
#include "demi/amp/numerics.h"
#include "demi/core/context.h"
#include "demi/core/parallel.h"
#include "demi/data/iterator.h"
#include "demi/data/data.h"
#include "demi/nn/models.h"
#include "demi/ops/dispatch.h"
#include "demi/dist/dist.h"
#include "demi/io/internal/json.h"
#include "demi/kernels/matmul.h"
#include "demi/train/checkpoint.h"
#include "demi/train/model.h"
#include "demi/train/report.h"
#include "demi/train/report_html.h"
#include "tools/demi/gpt.h"
#include "tools/demi/subprocess.h"

namespace demi::cli {
namespace {

const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

// A memory category as the JSON keys of train --json and plan --json name it: "optimizer state" ->
// optimizer_state.
std::string json_category(int c) {
  std::string name = mem_category_name(static_cast<MemCategory>(c));
  std::replace(name.begin(), name.end(), ' ', '_');
  return name;
}

struct Job {
  std::string model_key;  // A, B, C
  std::shared_ptr<nn::Cell> net;
  std::shared_ptr<data::Dataset> train_ds, test_ds;
  std::string data_name;
  int64_t batch_size = 0;  // resolved (0 on the command line: the model's reference batch)
};

std::string model_key(const std::string& m) {
  if (m == "A" || m == "a" || m == "simplecnn") return "A";
  if (m == "B" || m == "b" || m == "lenet") return "B";
  if (m == "C" || m == "c" || m == "mlp") return "C";
  if (m == "D" || m == "d" || m == "transformer") return "D";
  if (m == "R" || m == "r" || m == "resnet18") return "R";
  throw UsageError("unknown --model '" + m + "'; expected A (simplecnn), B (lenet), C (mlp), D (transformer), "
                   "R (resnet18) or gpt");
}

std::shared_ptr<amp::LossScaleManager> parse_loss_scale(const std::string& s) {
  if (s == "default") return nullptr;
  if (s == "none") return nullptr;
  if (s == "dynamic") return std::make_shared<amp::DynamicLossScaleManager>();
  if (s.rfind("fixed:", 0) == 0) {
    std::optional<double> v = parse_real(std::string_view(s).substr(6));
    if (!v || !(*v > 0)) throw UsageError("--loss-scale fixed:N needs a number N > 0, got '" + s + "'");
    return std::make_shared<amp::FixedLossScaleManager>(*v, true);
  }
  throw UsageError("unknown --loss-scale '" + s + "'; expected default, none, fixed:N or dynamic");
}

}  // namespace

std::optional<bool> parse_param_grads(const std::string& s) {
  if (s == "auto") return std::nullopt;
  if (s == "bf16") return true;
  if (s == "fp32") return false;
  throw UsageError("unknown --param-grads '" + s + "'; expected auto, bf16 or fp32");
}

std::optional<bool> parse_optimizer_in_backward(const std::string& s) {
  if (s == "auto") return std::nullopt;
  if (s == "on") return true;
  if (s == "off") return false;
  throw UsageError("unknown --optimizer-in-backward '" + s + "'; expected auto, on or off");
}

DType parse_optimizer_state(const std::string& s) {
  if (s == "fp32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  throw UsageError("unknown --optimizer-state '" + s + "'; expected fp32 or bf16");
}

namespace {

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
// with the two compute threads for the two cores (model C at O2-bf16: 29k against 55k samples/s), so a
// timed run measured the generator; PyTorch's twins (bench/torch_models.py) also train on tensors in memory.
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

Job make_job(const ParsedArgs& args) {
  Job job;
  job.model_key = model_key(args.get("model"));
  int64_t batch = args.get_int("batch-size");
  if (batch <= 0) batch = job.model_key == "B" ? 128 : job.model_key == "C" ? 256 : 32;  // A, D, R: 32
  job.batch_size = batch;
  int64_t limit = args.get_int("train-samples");
  uint64_t seed = static_cast<uint64_t>(args.get_int("seed"));
  std::string data = args.get("data");
  const bool images3 = job.model_key == "A" || job.model_key == "R";  // 3x32x32 inputs
  if (data == "default") data = images3 || job.model_key == "D" ? "synthetic" : "fashion-mnist";
  job.data_name = data;
  set_seed(seed);
  const bool zoo = args.flag("zoo-style");
  if (zoo && job.model_key != "A" && job.model_key != "B")
    throw UsageError("--zoo-style is for models A and B (their layers called in construct, as the seed writes them)");
  if (job.model_key == "A") job.net = zoo ? std::shared_ptr<nn::Cell>(std::make_shared<nn::SeedSimpleCNN>())
                                          : std::make_shared<nn::SimpleCNN>();
  if (job.model_key == "B")
    job.net = zoo ? std::shared_ptr<nn::Cell>(std::make_shared<nn::ZooLeNet>(args.flag("batch-norm")))
                  : std::make_shared<nn::LeNet>(args.flag("batch-norm"));
  if (args.flag("batch-norm") && job.model_key != "B")
    throw UsageError("--batch-norm is for model B (LeNet with a BatchNorm after each convolution)");
  if (job.model_key == "C") job.net = std::make_shared<nn::MLP>();
  if (job.model_key == "R") job.net = std::make_shared<nn::ResNet18>();
  if (job.model_key == "D") {
    job.net = std::make_shared<nn::TransformerClassifier>();
    if (data != "synthetic") throw UsageError("--model D trains on --data synthetic (random tokens)");
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
  train = train->map(norm, {"image"});
  if (limit > 0) train = train->take(limit);
  job.train_ds = train->shuffle(60000, seed)->batch(batch, /*drop_remainder=*/true);
  job.test_ds = test->map(norm, {"image"})->batch(256);
  return job;
}

std::string mib(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", static_cast<double>(bytes) / (1 << 20));
  return b;
}

struct RunResult {
  std::map<std::string, double> values;  // samples_per_second, peak_*, final_loss, accuracy, ...
};

// One JSON object (flat, numbers and strings) per line.
std::string json_object(const std::map<std::string, std::string>& fields) {
  std::string s = "{";
  bool first = true;
  for (const auto& [k, v] : fields) {
    s += (first ? "\"" : ",\"") + k + "\":" + v;
    first = false;
  }
  return s + "}";
}

std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

class JsonEpochs : public train::Callback {
 public:
  void on_epoch_end(train::RunContext& ctx) override {
    std::map<std::string, std::string> f = {{"kind", json_str("epoch")},
                                            {"epoch", num(ctx.epoch)},
                                            {"loss", num(ctx.metrics.count("loss") ? ctx.metrics["loss"] : ctx.loss)},
                                            {"loss_scale", num(ctx.loss_scale)},
                                            {"seconds", num(ctx.epoch_seconds)},
                                            {"samples_per_second", num(ctx.epoch_samples_per_second)}};
    std::printf("%s\n", json_object(f).c_str());
    std::fflush(stdout);
  }
};

// --report PATH, --report-data PATH: a report must be writable before the run starts, not after it.
void check_report_option(const ParsedArgs& args, const char* option) {
  const std::string path = args.get(option);
  if (path.empty()) return;
  try {
    train::check_report_path(path);
  } catch (const Error& e) {
    throw Error(std::string("--") + option + ": " + e.what());
  }
}

// Writes --report and --report-data from what the recorder holds; `stopped`: the error that ended the run
// early ("" when it finished).
void write_reports(const ParsedArgs& args, train::ReportRecorder& recorder, const std::string& stopped) {
  train::RunRecord& r = recorder.record();
  if (!stopped.empty()) {
    const int epoch = r.steps.empty() ? 1 : r.steps.back().epoch;
    const int64_t step = (r.steps.empty() ? 0 : r.steps.back().step) + 1;  // the step it stopped in
    r.events.push_back({train::ReportEvent::Kind::kWarning, epoch, step, "training stopped: " + stopped});
    r.title += " (stopped)";
  }
  if (args.has("report-data")) train::write_report(args.get("report-data"), train::run_record_to_json(r));
  if (args.has("report")) train::write_report(args.get("report"), train::render_report_html(r));
}

// The run's settings as the report's header shows them (the recorder adds the AMP level, the low dtype,
// the loss-scale manager, the threads, the CPU and the date).
void describe_run(train::RunRecord& r, const ParsedArgs& args, const Job& job, amp::Level level, DType low,
                  int epochs) {
  r.title = "model " + job.model_key + " on " + job.data_name + ", " + amp::level_name(level) + " " +
            (level == amp::Level::kO0 ? std::string("float32") : std::string(dtype_name(low)));
  r.set("model", job.model_key + " (" + job.net->type_name() + ")");
  r.set("data", job.data_name + (args.get_int("train-samples") > 0 ? ", first " + args.get("train-samples") + " samples"
                                                                     : std::string()));
  r.set("batch size", std::to_string(job.batch_size) + " (" + std::to_string(job.train_ds->get_dataset_size()) +
                          " steps per epoch)");
  r.set("epochs", std::to_string(epochs));
  r.set("optimizer", "Momentum 0.9, lr " + args.get("lr"));
  r.set("seed", args.get("seed"));
}

// The settings a checkpoint's state depends on, stored in every checkpoint the CLI writes, each under
// "cli." and its option's name.
io::Metadata run_settings(const ParsedArgs& args, const Job& job) {
  return {{"cli.model", job.model_key},
          {"cli.data", job.data_name},
          {"cli.batch-size", std::to_string(job.batch_size)},
          {"cli.train-samples", args.get("train-samples")},
          {"cli.lr", args.get("lr")},
          {"cli.seed", args.get("seed")},
          {"cli.sink-size", args.get("sink-size")},
          {"cli.optimizer-state", args.get("optimizer-state")},
          {"cli.f16-products", args.get("f16-products")}};
}

// A resume checks the settings the checkpoint was taken with: mid-epoch, another data set, sample count
// or batch size would misalign the data position (refused, exit 2); another learning rate or seed, or
// those at an epoch's end, merely change the run (a warning).
void check_resume_settings(const io::TrainingMeta& meta, const io::Metadata& now, const std::string& file) {
  const bool mid_epoch = meta.data_position > 0;
  for (const auto& [key, value] : now) {
    auto it = meta.extra.find(key);
    if (it == meta.extra.end() || it->second == value) continue;  // older checkpoints have no cli.* keys
    if (key == "cli.lr" && parse_real(it->second) == parse_real(value)) continue;  // 0.01 and 1e-2
    const std::string option = "--" + key.substr(4);
    const bool positional =
        key == "cli.data" || key == "cli.batch-size" || key == "cli.train-samples" || key == "cli.sink-size";
    if (positional && mid_epoch)
      throw UsageError("--resume: " + file + " was taken mid-epoch (after batch " + std::to_string(meta.data_position) +
                       ") with " + option + " " + it->second + "; resuming with " + value +
                       " would not continue at the same data position. Resume with " + option + " " + it->second +
                       ", or start a new --ckpt-dir");
    std::fprintf(stderr, "demi: warning: resuming %s, taken with %s %s, with %s %s: the run changes from here\n",
                 file.c_str(), option.c_str(), it->second.c_str(), option.c_str(), value.c_str());
  }
}

// Under mpirun / srun: every process joins the job, trains data-parallel, and only rank 0 prints
// (warnings and errors still reach standard error from every process).
void start_data_parallel(const ParsedArgs& args) {
  dist::AutoParallelContext dp;
  dp.parallel_mode = dist::ParallelMode::kDataParallel;
  const std::string wire = args.get("comm-dtype");
  if (wire == "fp32") {
    dp.comm_dtype = DType::kF32;
  } else if (wire == "bf16") {
    dp.comm_dtype = DType::kBF16;
  } else {
    throw UsageError("--comm-dtype must be fp32 or bf16, got '" + wire + "'");
  }
  dp.bucket_cap_mb = args.get_real("bucket-mb");
  if (!dist::launched_as_group()) return;  // one process: nothing travels
  dist::init();
  dist::set_auto_parallel_context(dp);
  if (dist::get_rank() != 0) {
    std::fflush(stdout);
    DEMI_CHECK(std::freopen("/dev/null", "w", stdout) != nullptr, "could not silence rank ", dist::get_rank(),
               "'s standard output");
  } else {
    std::fprintf(stderr, "demi: data-parallel training on %d processes (%s gradients)\n", dist::get_group_size(),
                 wire.c_str());
  }
}

// What train and plan build from their options: the job, the precision and the Model.
struct Training {
  Job job;
  amp::Level level = amp::Level::kO0;
  DType low = DType::kF16;
  train::ModelOptions mo;
  std::unique_ptr<train::Model> model;
};

Training build_training(const ParsedArgs& args, bool reporting) {
  Training t{make_job(args)};
  Job& job = t.job;
  if (args.flag("recompute")) {
    auto* d = dynamic_cast<nn::TransformerClassifier*>(job.net.get());
    if (d == nullptr) throw UsageError("--recompute is for --model D (each encoder layer) and gpt (each block)");
    for (auto& layer : d->encoder->layers) layer->recompute();
  }
  if (args.flag("recompute-attention")) {
    auto* d = dynamic_cast<nn::TransformerClassifier*>(job.net.get());
    if (d == nullptr)
      throw UsageError("--recompute-attention is for --model D (each encoder layer) and gpt (each block)");
    for (auto& layer : d->encoder->layers) layer->self_attn->recompute_probabilities = true;
  }
  const amp::Level level = t.level = amp::parse_level(args.get("amp"));
  const DType low = t.low = parse_dtype(args.get("dtype"));
  if (!is_low_precision(low)) throw UsageError("--dtype must be fp16 or bf16, got '" + args.get("dtype") + "'");
  refuse_settings_that_change_nothing(args, level, low);
  double lr = args.get_real("lr");
  auto opt = std::make_shared<optim::Momentum>(job.net->trainable_params(), lr, 0.9);
  opt->set_state_dtype(parse_optimizer_state(args.get("optimizer-state")));
  train::ModelOptions& mo = t.mo;
  mo.amp_level = level;
  mo.low_dtype = low;
  mo.loss_scale_manager = parse_loss_scale(args.get("loss-scale"));
  mo.no_loss_scale = args.get("loss-scale") == "none";  // overrides the level's default manager
  mo.clip_grad_norm = args.get_real("clip-grad-norm");
  mo.low_precision_param_grads = parse_param_grads(args.get("param-grads"));
  mo.optimizer_in_backward = parse_optimizer_in_backward(args.get("optimizer-in-backward"));
  mo.accumulate = static_cast<int>(args.get_int("accumulate"));
  mo.amp_adapt = args.flag("amp-adapt");
  const int64_t step_budget = args.get_int("steps");
  if (step_budget > 0) mo.max_steps = step_budget;
  std::map<std::string, train::MetricPtr> metric_fns = {{"Accuracy", std::make_shared<train::Accuracy>()}};
  if (reporting) metric_fns["Loss"] = std::make_shared<train::Loss>();  // the report shows the test loss too
  t.model = std::make_unique<train::Model>(job.net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                           opt, metric_fns, mo);
  return t;
}

// "512MiB", "2GiB", "1.5GB", "800MB", "65536" (bytes) -> bytes.
int64_t parse_bytes(const std::string& s) {
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(s, &end);
  } catch (...) {
    end = 0;
  }
  const std::string unit = s.substr(end);
  const double mult = unit.empty() || unit == "B" ? 1.0
                      : unit == "KiB"             ? 1024.0
                      : unit == "MiB"             ? 1024.0 * 1024
                      : unit == "GiB"             ? 1024.0 * 1024 * 1024
                      : unit == "KB"              ? 1e3
                      : unit == "MB"              ? 1e6
                      : unit == "GB"              ? 1e9
                                                  : -1.0;
  if (end == 0 || mult < 0 || !(v > 0) || !std::isfinite(v))
    throw UsageError("--max-memory expects a size such as 512MiB, 2GiB or 800MB, got '" + s + "'");
  // (1e30GiB once overflowed to a negative size.)
  if (v * mult > 0x1p60)
    throw UsageError("--max-memory " + s + " is more memory than any machine has (at most 1 EiB)");
  return static_cast<int64_t>(v * mult);
}

// --max-memory: the largest batch size, a multiple of 8, whose forecast training peak fits the budget
// (probes at 8 and 16 give the line, a probe at its prediction and its neighbours settle it).
ParsedArgs with_batch_under_budget(const ParsedArgs& args) {
  const int64_t budget = parse_bytes(args.get("max-memory"));
  if (args.get_int("batch-size") > 0) throw UsageError("give --max-memory or --batch-size, not both");
  if (args.get_int("accumulate") > 1)
    throw UsageError("--max-memory chooses the batch of a one-batch update: not with --accumulate");
  const ParsedArgs base = args.with("max-memory", std::nullopt);
  std::map<int64_t, int64_t> seen;  // batch size -> forecast training peak
  auto peak = [&](int64_t batch) {
    auto it = seen.find(batch);
    if (it != seen.end()) return it->second;
    Training t = build_training(base.with("batch-size", std::to_string(batch)), false);
    auto rows = t.job.train_ds->create_iterator();
    auto first = rows->next();
    DEMI_CHECK(first.has_value(), "--max-memory: the training set is empty");
    const int64_t got = (*first)[0].dim(0);
    DEMI_CHECK(got == batch, "--max-memory: the training set has only ", got, " samples, fewer than a batch of ",
               batch);
    const int64_t p = t.model->forecast((*first)[0], (*first)[1]).train_peak;
    seen.emplace(batch, p);
    return p;
  };
  const int64_t p8 = peak(8);
  if (p8 > budget)
    throw Error(str_cat("--max-memory ", args.get("max-memory"), " (", mib(budget), " MiB) is too little: the ",
                        "smallest batch size it may choose, 8, needs ", mib(p8), " MiB at its peak (demi plan ",
                        "--batch-size 8 shows what of)"));
  const double per_sample = std::max(1.0, static_cast<double>(peak(16) - p8) / 8.0);
  constexpr int64_t kMaxBatch = 1 << 16;
  // fits(b): b's forecast fits; a batch the training set cannot fill does not.
  auto fits = [&](int64_t b) {
    if (b > kMaxBatch) return false;
    try {
      return peak(b) <= budget;
    } catch (const Error&) {
      return false;
    }
  };
  const int64_t predicted = static_cast<int64_t>((static_cast<double>(budget - p8) / per_sample + 8) / 8) * 8;
  int64_t lo = 8, hi = 0;  // lo fits; hi (once found) does not
  int64_t b = std::clamp<int64_t>(predicted, 8, kMaxBatch);
  if (fits(b)) {  // grow from the prediction in doubling steps until one does not fit
    lo = b;
    for (int64_t step = 8; hi == 0; step *= 2) {
      if (fits(lo + step)) lo += step;
      else hi = lo + step;
    }
  } else {  // shrink from it in doubling steps until one fits
    hi = b;
    for (int64_t step = 8; hi - step > 8; step *= 2) {
      if (fits(hi - step)) {
        lo = hi - step;
        break;
      }
      hi -= step;
    }
  }
  while (hi - lo > 8) {  // multiples of 8 between lo (fits) and hi (does not)
    const int64_t mid = (lo + hi) / 16 * 8;
    if (fits(mid)) lo = mid;
    else hi = mid;
  }
  const int64_t batch = lo;
  std::fprintf(stderr, "demi: --max-memory %s MiB: batch size %lld (forecast peak %s MiB; %zu probes)\n",
               mib(budget).c_str(), static_cast<long long>(batch), mib(peak(batch)).c_str(), seen.size());
  return base.with("batch-size", std::to_string(batch));
}

}  // namespace

void refuse_settings_that_change_nothing(const ParsedArgs& args, amp::Level level, DType low) {
  if (level == amp::Level::kO0) {
    if (args.get("param-grads") == "bf16")
      throw UsageError("--param-grads bf16 changes nothing at O0, where every gradient is FP32: use it with "
                       "--amp O1, O2 or O3");
    if (args.flag("amp-adapt"))
      throw UsageError("--amp-adapt adapts a mixed-precision run; at O0 nothing runs in low precision: use it "
                       "with --amp O1, O2 or O3");
  }
  if (args.get("f16-products") == "bf16" && (level == amp::Level::kO0 || low != DType::kF16))
    throw UsageError(str_cat("--f16-products bf16 changes how float16 products multiply, and this run (--amp ",
                             amp::level_name(level), level == amp::Level::kO0 ? "" : " --dtype " + args.get("dtype"),
                             ") has none: use it with --amp O1, O2 or O3 and --dtype fp16"));
  const std::string ckpt_dir = args.get("ckpt-dir");
  if (args.has("ckpt-dir") && ckpt_dir.empty())
    throw UsageError("--ckpt-dir is empty: name the folder for the checkpoints, or leave the option out");
  if (args.flag("resume") && args.flag("start-over"))
    throw UsageError("--resume continues the run in --ckpt-dir and --start-over sets it aside to begin anew: "
                     "give one of them");
  for (const char* name : {"ckpt-every", "keep-ckpt", "start-over"})
    if (args.has(name) && ckpt_dir.empty())
      throw UsageError(str_cat("--", name, " says how checkpoints are kept, and this run writes none: give --ckpt-dir DIR"));
}

int print_forecast(train::Model& model, const Tensor& data, const Tensor& label, const ParsedArgs& args,
                   const std::string& model_key, amp::Level level, DType low, int64_t batch_size) {
  const train::MemForecast f = model.forecast(data, label);
  const std::string dtype = level == amp::Level::kO0 ? "float32" : std::string(dtype_name(low));
  if (args.flag("json")) {
    std::printf("{\"kind\":\"plan\",\"model\":\"%s\",\"amp\":\"%s\",\"dtype\":\"%s\",\"batch_size\":%lld,"
                "\"train_peak\":%lld",
                model_key.c_str(), amp::level_name(level), dtype.c_str(), static_cast<long long>(batch_size),
                static_cast<long long>(f.train_peak));
    std::printf(",\"peak_op\":%s", json_str(f.peak_op).c_str());
    for (int c = 0; c < kNumMemCategories; ++c) {
      if (static_cast<MemCategory>(c) == MemCategory::kData) continue;
      std::printf(",\"at_train_peak_%s\":%lld", json_category(c).c_str(),
                  static_cast<long long>(f.at_peak[static_cast<size_t>(c)]));
    }
    std::printf("}\n");
    return 0;
  }
  std::printf("model %s at %s %s, batch %lld: the training peak, measured by a probe of one batch (forward and "
              "backward twice, nothing trained)\n",
              model_key.c_str(), amp::level_name(level), dtype.c_str(), static_cast<long long>(batch_size));
  for (int c = 0; c < kNumMemCategories; ++c) {
    if (static_cast<MemCategory>(c) == MemCategory::kData) continue;
    std::printf("  %-16s %10.2f MiB\n", mem_category_name(static_cast<MemCategory>(c)),
                static_cast<double>(f.at_peak[static_cast<size_t>(c)]) / (1 << 20));
  }
  std::printf("  %-16s %10.2f MiB\n", "training peak", static_cast<double>(f.train_peak) / (1 << 20));
  std::printf("  %-16s %s\n", "reached in", f.peak_op.c_str());
  return 0;
}

train::CheckpointConfig::OtherRuns checkpoint_other_runs(const ParsedArgs& args) {
  if (args.flag("resume")) return train::CheckpointConfig::OtherRuns::kKeepApart;
  return args.flag("start-over") ? train::CheckpointConfig::OtherRuns::kSetAside
                                 : train::CheckpointConfig::OtherRuns::kRefuse;
}

void refuse_training_only(const ParsedArgs& args) {
  // What only changes how training runs, not what one step holds in memory, has no place in a forecast.
  // (--clip-grad-norm and --amp-adapt do: each needs every gradient before the update, so neither runs
  // the update in backward; the forecast's probe runs the step as they make it run.)
  for (const char* name : {"epochs", "steps", "lr", "ckpt-dir", "ckpt-every", "keep-ckpt", "resume", "start-over",
                           "profile",
                           "report", "report-data", "comm-dtype", "bucket-mb", "sink-size", "eval-every",
                           "eval-windows", "warmup", "weight-decay"})
    if (args.has(name))
      throw UsageError(str_cat("demi plan: --", name, " does not change what a training step holds in memory; ",
                               "leave it out"));
  if (args.get_int("accumulate") > 1)
    throw UsageError("demi plan forecasts a one-batch update: not with --accumulate (its FP32 accumulators)");
}

namespace {

int run_train_or_plan(const ParsedArgs& args, bool plan) {
  start_data_parallel(args);
  if (plan) refuse_training_only(args);
  refuse_settings_that_change_nothing(args, amp::parse_level(args.get("amp")), parse_dtype(args.get("dtype")));
  if (is_gpt_model(args.get("model"))) {
    if (args.has("max-memory")) throw UsageError("--max-memory takes models A, B, C, D and R; not yet gpt");
    if (args.has("sink-size"))
      throw UsageError("--sink-size takes models A, B, C, D and R; the gpt trains by --steps, not by epochs");
    return run_train_gpt(args, plan);
  }
  for (const Option& o : gpt_train_options())  // the GPT's own options mean nothing to the other models
    if (args.has(o.name)) throw UsageError("--" + o.name + " is for --model gpt");
  apply_thread_option(args);
  bool json = args.flag("json");
  // Standard output carries only the JSON lines; what callbacks and Model.train report goes to stderr.
  if (json) train::set_callback_stream(&std::cerr);
  // Rank 0 writes the report (every process agrees on the losses, the overflows and the scale).
  const bool reporting = (args.has("report") || args.has("report-data")) && dist::get_rank() == 0;
  if (reporting) {
    check_report_option(args, "report");
    check_report_option(args, "report-data");
  }
  if (args.has("max-memory")) return run_train_or_plan(with_batch_under_budget(args), plan);
  Training built = build_training(args, reporting);
  Job& job = built.job;
  {  // Data parallel: every setting that changes the result, the same on every process.
    std::vector<std::pair<std::string, std::string>> settings;
    for (const auto& [key, value] : run_settings(args, job)) settings.emplace_back("--" + key.substr(4), value);
    for (const char* name : {"amp", "dtype", "loss-scale", "epochs", "steps", "accumulate", "clip-grad-norm",
                             "param-grads", "optimizer-in-backward", "mode", "graph-fusion", "comm-dtype", "bucket-mb"})
      settings.emplace_back(str_cat("--", name), args.get(name));
    for (const char* flag : {"amp-adapt", "batch-norm", "zoo-style", "recompute", "recompute-attention", "resume"})
      settings.emplace_back(str_cat("--", flag), args.flag(flag) ? "on" : "off");
    dist::check_same_settings(settings);
  }
  if (const int64_t batches = job.train_ds->get_dataset_size(), per_update = dist::get_group_size() * built.mo.accumulate;
      built.mo.accumulate > 1 && batches > 0 && per_update > batches)
    throw UsageError(str_cat("--accumulate ", built.mo.accumulate, " needs ", per_update, " batches per update, and an "
                             "epoch has ", batches, ": no update would be what was asked. Lower --accumulate or "
                             "--batch-size, or give more --train-samples"));
  const amp::Level level = built.level;
  const DType low = built.low;
  const train::ModelOptions& mo = built.mo;
  const int64_t step_budget = args.get_int("steps");
  train::Model& model = *built.model;
  if (args.flag("numerics")) {
    // Before training: which layers overflow FP16, which gradients underflow at the step's loss scale.
    auto it = job.train_ds->create_iterator();
    auto batch = it->next();
    DEMI_CHECK(batch.has_value(), "--numerics: the training set is empty");
    double scale = model.loss_scale_manager() ? model.loss_scale_manager()->get_loss_scale() : 1.0;
    nn::SoftmaxCrossEntropyWithLogits loss(true, "mean");
    // (With --json, standard output holds only JSON lines: the table goes to standard error.)
    std::fprintf(json ? stderr : stdout, "%s\n",
                 amp::analyze_numerics(*job.net, loss, (*batch)[0], (*batch)[1], scale).to_string().c_str());
  }
  if (args.flag("trace-dtypes")) {
    // What AMP does to each op, forward and backward, for the first batch (nothing is updated).
    auto it = job.train_ds->create_iterator();
    auto batch = it->next();
    DEMI_CHECK(batch.has_value(), "--trace-dtypes: the training set is empty");
    std::fprintf(json ? stderr : stdout, "ops of one train step, model %s at %s %s:\n%s\n", job.model_key.c_str(),
                 amp::level_name(level),
                level == amp::Level::kO0 ? "float32" : std::string(dtype_name(low)).c_str(),
                amp::trace_dtypes(model.train_step(), (*batch)[0], (*batch)[1]).to_string().c_str());
  }
  if (plan) {
    auto it = job.train_ds->create_iterator();
    auto batch = it->next();
    DEMI_CHECK(batch.has_value(), "plan: the training set is empty");
    return print_forecast(model, (*batch)[0], (*batch)[1], args, job.model_key, level, low, job.batch_size);
  }
  std::vector<train::CallbackPtr> cbs;
  if (json)
    cbs.push_back(std::make_shared<JsonEpochs>());
  else
    cbs.push_back(std::make_shared<train::ProgressBar>(50));
  // A long sink (--sink-size 10^6) is not silence: a line on stderr every 30 s inside it.
  model.add_hook(std::make_shared<train::SinkProgress>(std::cerr, 30.0));
  if (args.flag("profile")) ops::set_profiling(true);
  int epochs = static_cast<int>(args.get_int("epochs"));
  const int64_t sink_size = args.get_int("sink-size");
  if (step_budget > 0) {
    // --steps N: as many epochs as N updates need (the last one cut short), whatever --epochs says.
    const int64_t batches = job.train_ds->get_dataset_size();
    if (batches <= 0) throw Error("--steps: the training set's size is unknown, so its epochs cannot be counted");
    const int64_t per_update = static_cast<int64_t>(dist::get_group_size()) * mo.accumulate;
    // (With --sink-size N an epoch is one sink of N batches.)
    const int64_t updates_per_epoch =
        sink_size > 0 ? std::max<int64_t>(sink_size / mo.accumulate, 1) : (batches + per_update - 1) / per_update;
    epochs = static_cast<int>(std::min<int64_t>((step_budget + updates_per_epoch - 1) / updates_per_epoch, 1000000));
  }
  std::string ckpt_dir = args.get("ckpt-dir");
  if (args.flag("resume")) {
    if (ckpt_dir.empty()) throw UsageError("--resume needs --ckpt-dir DIR (where the run's checkpoints are)");
    auto last = resume_checkpoint(ckpt_dir, "model" + job.model_key);
    if (last) {
      const io::TrainingState& state = last->state;
      check_resume_settings(state.meta, run_settings(args, job), last->path.string());
      train::restore_checkpoint(state, model);
      if (!json)
        std::printf("resumed from %s: epoch %lld, step %lld\n", last->path.string().c_str(),
                    static_cast<long long>(state.meta.epochs_done + 1), static_cast<long long>(state.meta.step));
    } else if (!json) {
      std::printf("no checkpoint in %s yet: starting from the beginning\n", ckpt_dir.c_str());
    }
  }
  if (!ckpt_dir.empty()) {
    train::CheckpointConfig cc;
    cc.save_checkpoint_steps = args.get_int("ckpt-every");
    cc.save_checkpoint_epochs = 1;  // and at the end of every epoch
    cc.keep_checkpoint_max = static_cast<int>(args.get_int("keep-ckpt"));
    cc.extra = run_settings(args, job);
    cc.other_runs = checkpoint_other_runs(args);
    cbs.push_back(std::make_shared<train::ModelCheckpoint>("model" + job.model_key, ckpt_dir, cc));
  }
  std::shared_ptr<train::ReportRecorder> recorder;
  if (reporting) {
    recorder = std::make_shared<train::ReportRecorder>();
    describe_run(recorder->record(), args, job, level, low, epochs);
    cbs.push_back(recorder);
  }
  int remaining = epochs - static_cast<int>(model.epochs_done());
  if (step_budget > 0 && model.steps_done() >= step_budget) remaining = 0;
  if (remaining < 1) {
    if (!json) {
      if (step_budget > 0) {
        std::printf("the checkpoint already has the %lld step(s) of --steps: nothing left to train\n",
                    static_cast<long long>(step_budget));
      } else {
        std::printf("the checkpoint already has %d epoch(s): nothing left to train\n", epochs);
      }
    }
  } else {
    try {
      model.train(remaining, job.train_ds, cbs, true, sink_size);
    } catch (const Error& e) {
      // A run that stopped (a NaN loss at O0, bad input data) is reported too, up to where it stopped.
      if (recorder) write_reports(args, *recorder, e.what());
      throw;
    }
  }
  auto metrics = model.eval(job.test_ds);
  const train::TrainSummary& s = model.last_summary();
  auto pk = [&](MemCategory c) { return s.peak.pk(c); };
  // Whether each update ran in backward (--optimizer-in-backward; auto: graph mode's choice).
  const bool in_backward = args.get_int("accumulate") == 1 && model.train_step().optimizer_in_backward();
  if (json) {
    std::map<std::string, std::string> f = {
        {"kind", json_str("summary")},
        {"model", json_str(job.model_key)},
        {"data", json_str(job.data_name)},
        {"amp", json_str(amp::level_name(level))},
        {"dtype", json_str(std::string(dtype_name(low)))},
        {"steps", num(static_cast<double>(s.steps))},
        {"samples_per_second", num(s.samples_per_second)},
        {"median_step_ms", num(s.median_step_seconds * 1e3)},
        {"data_wait_fraction", num(s.data_wait_fraction)},
        {"final_loss", num(s.mean_last_epoch_loss)},
        {"skipped_steps", num(static_cast<double>(s.skipped_steps))},
        {"skip_warnings", num(static_cast<double>(s.skip_warnings))},
        {"loss_scale", num(s.final_loss_scale)},
        {"test_accuracy", num(metrics["Accuracy"])},
        {"peak_total", num(static_cast<double>(s.peak.total_peak))},
        {"peak_parameter", num(static_cast<double>(pk(MemCategory::kParameter)))},
        {"peak_gradient", num(static_cast<double>(pk(MemCategory::kGradient)))},
        {"peak_optimizer_state", num(static_cast<double>(pk(MemCategory::kOptimizerState)))},
        {"peak_activation", num(static_cast<double>(pk(MemCategory::kActivation)))},
        {"peak_cast_cache", num(static_cast<double>(pk(MemCategory::kCastCache)))},
        {"peak_workspace", num(static_cast<double>(pk(MemCategory::kWorkspace)))},
        {"peak_data", num(static_cast<double>(pk(MemCategory::kData)))},
        {"peak_rss", num(static_cast<double>(s.peak_rss_bytes))},
        {"steady_steps", num(static_cast<double>(s.steady_steps))},
        {"system_allocs_per_step", num(s.system_allocs_per_step)},
        {"page_faults_per_step", num(s.page_faults_per_step)},
        {"mode", json_str(exec_mode_name(get_context().mode))},
        {"optimizer_in_backward", in_backward ? "true" : "false"},
        {"f16_products", json_str(kernels::f16_products_name(kernels::f16_products()))},
        {"sink_size", num(static_cast<double>(sink_size))},
        {"graph_replayed_steps", num(static_cast<double>(s.graph.replayed_steps))},
        {"graph_diverged_steps", num(static_cast<double>(s.graph.diverged_steps))},
        {"graph_arena", num(static_cast<double>(s.graph_plan.arena_bytes))},
        {"graph_lower_bound", num(static_cast<double>(s.graph_plan.lower_bound))},
        {"graph_upper_bound", num(static_cast<double>(s.graph_plan.upper_bound))},
        {"graph_plan_ms", num(s.graph_plan.plan_seconds * 1e3)},
        {"graph_trace_ms", num(s.graph_plan.trace_seconds * 1e3)},
        {"graph_rewrites", json_str(s.graph_plan.rewrites)},
        {"graph_allocations", num(static_cast<double>(s.graph_plan.allocations))},
        {"reserved_end", num(static_cast<double>(s.reserved_end))},
    };
    f.emplace("peak_train", num(static_cast<double>(s.peak.train_peak)));
    // (kernel tuning's trial runs, a shape's first call on a cold choice cache: in no peak above)
    f.emplace("peak_tuning", num(static_cast<double>(s.peak.tuning_peak)));
    int64_t attributed = 0;
    for (const auto& [op, n] : s.overflow_ops) attributed += n;
    f.emplace("attributed_overflows", num(static_cast<double>(attributed)));
    std::string ops_list, promoted;
    for (const auto& [op, n] : s.overflow_ops) ops_list += (ops_list.empty() ? "" : "; ") + op + " x" + std::to_string(n);
    for (const auto& p : s.promotions) promoted += (promoted.empty() ? "" : ",") + p.layer;
    f.emplace("overflow_ops", io::internal::json_quote(ops_list));
    f.emplace("promotions", io::internal::json_quote(promoted));
    f.emplace("processes", num(static_cast<double>(dist::get_group_size())));
    if (const dist::DataParallel* dp = model.data_parallel(); dp != nullptr && dp->stats().steps > 0) {
      const double steps = static_cast<double>(dp->stats().steps);
      f.emplace("allreduce_ms_per_step", num(1e3 * dp->stats().reduce_seconds / steps));
      f.emplace("allreduce_exposed_ms_per_step", num(1e3 * dp->stats().exposed_seconds / steps));
    }
    for (int c = 0; c < kNumMemCategories; ++c) {
      const std::string name = json_category(c);
      f.emplace("at_peak_" + name, num(static_cast<double>(s.peak.at_peak[c])));
      f.emplace("at_train_peak_" + name, num(static_cast<double>(s.peak.at_train_peak[c])));
    }
    std::printf("%s\n", json_object(f).c_str());
  } else {
    const bool bf16_products = level != amp::Level::kO0 && low == DType::kF16 &&
                               kernels::f16_products() == kernels::F16Products::kBf16;
    std::printf("model %s on %s, %s %s%s: %lld steps, %.0f samples/s (median step %.2f ms), data wait %.2f%%\n",
                job.model_key.c_str(), job.data_name.c_str(), amp::level_name(level),
                level == amp::Level::kO0 ? "float32" : std::string(dtype_name(low)).c_str(),
                bf16_products ? " (products in bfloat16)" : "",
                static_cast<long long>(s.steps), s.samples_per_second, s.median_step_seconds * 1e3,
                100 * s.data_wait_fraction);
    std::printf("final train loss %.4f, test accuracy %.4f, %lld step(s) skipped, loss scale %g\n",
                s.mean_last_epoch_loss, metrics["Accuracy"], static_cast<long long>(s.skipped_steps), s.final_loss_scale);
    for (const auto& [op, n] : s.overflow_ops)
      std::printf("overflow began in %s: %lld step(s), e.g. %s\n", op.c_str(), static_cast<long long>(n),
                  s.overflow_examples.at(op).c_str());
    for (const auto& p : s.promotions)
      std::printf("amp-adapt promoted layer '%s' (%s) to FP32 at step %lld\n", p.layer.c_str(), p.type.c_str(),
                  static_cast<long long>(p.step));
    if (s.graph.traced_steps > 0) {
      // Train-step calls: one per update, or with --accumulate one per micro-batch and one per update.
      const int64_t calls = s.graph.eager_steps + s.graph.traced_steps + s.graph.replayed_steps;
      std::printf("%s: %lld of %lld train-step calls replayed a static memory plan (%lld left it)%s; %s\n",
                  exec_mode_name(get_context().mode), static_cast<long long>(s.graph.replayed_steps),
                  static_cast<long long>(calls), static_cast<long long>(s.graph.diverged_steps),
                  in_backward ? ", each parameter updated in backward" : "", s.graph_plan.describe().c_str());
    }
    std::printf("steady state (%lld steps): %.2f system allocations and %.2f page faults per step\n",
                static_cast<long long>(s.steady_steps), s.system_allocs_per_step, s.page_faults_per_step);
    std::printf("peak tracked memory %s MiB (activations %s, cast cache %s, workspace %s), process peak RSS %s MiB\n",
                mib(s.peak.total_peak).c_str(), mib(pk(MemCategory::kActivation)).c_str(),
                mib(pk(MemCategory::kCastCache)).c_str(), mib(pk(MemCategory::kWorkspace)).c_str(),
                mib(s.peak_rss_bytes).c_str());
  }
  if (const dist::DataParallel* dp = model.data_parallel(); dp != nullptr && !json && dp->stats().steps > 0) {
    const dist::DataParallelStats& d = dp->stats();
    const double steps = static_cast<double>(d.steps);
    std::printf("data parallel, %d processes: per step %.2f ms of gradient all-reduce (%lld bucket(s), %.2f MiB), "
                "%.2f ms of it after backward (%.0f%% hidden behind backward)\n",
                dist::get_group_size(), 1e3 * d.reduce_seconds / steps, static_cast<long long>(dp->num_buckets()),
                static_cast<double>(d.bytes_sent) / steps / (1 << 20), 1e3 * d.exposed_seconds / steps,
                d.reduce_seconds > 0 ? 100 * std::max(0.0, 1 - d.exposed_seconds / d.reduce_seconds) : 0.0);
  }
  if (args.flag("profile")) std::printf("\n%s", ops::profile_report().c_str());
  if (recorder) {
    recorder->finish(s, {{"test accuracy", metrics["Accuracy"]}, {"test loss", metrics["Loss"]}});
    write_reports(args, *recorder, "");
    if (args.has("report") && !json) std::printf("report: %s\n", args.get("report").c_str());
  }
  // A run that did not train is not a success (training_failure).
  if (remaining >= 1 && s.steps > 0)
    return training_exit_status(s.first_loss, s.mean_last_epoch_loss, s.skipped_steps, s.steps);
  return 0;
}


int run_eval(const ParsedArgs& args) {
  apply_thread_option(args);
  if (!args.has("checkpoint")) throw UsageError("eval needs --checkpoint FILE (a demi or PyTorch safetensors file)");
  for (const char* name : {"epochs", "lr", "loss-scale", "train-samples"})  // (accepted before, and ignored)
    if (args.has(name))
      throw UsageError(str_cat("demi eval: --", name, " changes training, and eval trains nothing: leave it out"));
  Job job = make_job(args);
  io::TrainingState state = train::load_checkpoint(args.get("checkpoint"));
  // Every parameter and buffer must come from the file: another model's checkpoint, or one with unrelated
  // tensors, would otherwise report the accuracy of random weights. --allow-partial loads what matches
  // and says what did not.
  const bool partial = args.flag("allow-partial");
  train::LoadReport report;
  try {
    report = train::load_param_into_net(*job.net, state.tensors, /*strict=*/!partial, args.flag("allow-non-finite"));
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "; 'demi eval --allow-partial' loads what matches and lists the rest");
  }
  if (partial) {
    auto list = [](const std::vector<std::string>& names) {
      std::string out;
      for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
      return out.empty() ? std::string("none") : out;
    };
    std::printf("--allow-partial: %zu tensor(s) loaded; not in the file (left at their initial values): %s; in the "
                "file but not in model %s: %s\n",
                report.loaded.size(), list(report.missing).c_str(), job.model_key.c_str(),
                list(report.unexpected).c_str());
    if (report.loaded.empty()) throw Error("--allow-partial: nothing in '" + args.get("checkpoint") +
                                           "' matches a parameter of model " + job.model_key);
  }
  amp::Level level = amp::parse_level(args.get("amp"));
  DType low = parse_dtype(args.get("dtype"));
  if (level != amp::Level::kO0) amp::auto_mixed_precision(*job.net, level, low);
  auto opt = std::make_shared<optim::SGD>(job.net->trainable_params(), 0.0);
  train::Model model(job.net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt,
                     {{"Accuracy", std::make_shared<train::Accuracy>()}, {"Loss", std::make_shared<train::Loss>()}},
                     {.amp_level = level, .low_dtype = low});
  auto metrics = model.eval(job.test_ds);
  std::printf("model %s on %s (test split), %s: accuracy %.4f, loss %.4f\n", job.model_key.c_str(),
              job.data_name.c_str(), amp::level_name(level), metrics["Accuracy"], metrics["Loss"]);
  return 0;
}

int run_train(const ParsedArgs& args) { return run_train_or_plan(args, false); }
int run_plan(const ParsedArgs& args) { return run_train_or_plan(args, true); }

// Minimal reader for the flat JSON summary line run_train prints.
std::map<std::string, std::string> parse_flat_json(const std::string& line) {
  std::map<std::string, std::string> out;
  size_t i = line.find('{');
  if (i == std::string::npos) return out;
  ++i;
  while (i < line.size() && line[i] != '}') {
    size_t k0 = line.find('"', i), k1 = line.find('"', k0 + 1);
    if (k0 == std::string::npos || k1 == std::string::npos) break;
    std::string key = line.substr(k0 + 1, k1 - k0 - 1);
    size_t v0 = line.find(':', k1) + 1;
    size_t v1 = v0;
    if (line[v0] == '"') {
      std::string v;  // unescaped (\" and \\; other escapes kept as written)
      v1 = v0 + 1;
      while (v1 < line.size() && line[v1] != '"') {
        if (line[v1] == '\\' && v1 + 1 < line.size() && (line[v1 + 1] == '"' || line[v1 + 1] == '\\')) ++v1;
        v += line[v1++];
      }
      ++v1;
      out[key] = v;
    } else {
      while (v1 < line.size() && line[v1] != ',' && line[v1] != '}') ++v1;
      out[key] = line.substr(v0, v1 - v0);
    }
    i = v1;
    if (i < line.size() && line[i] == ',') ++i;
  }
  return out;
}

std::string self_path() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("demi") : p.string();
}

// Runs `demi train --json ...` for one setting and returns its summary; with `report_data`, the child
// also writes its run record (every step) there. The child gets an argument vector, never a shell line.
std::map<std::string, std::string> run_setting(const ParsedArgs& args, const std::string& level, const std::string& dtype,
                                               const std::string& report_data = "") {
  std::vector<std::string> argv = {self_path(), "train", "--json"};
  for (const char* name : {"model", "data", "epochs", "batch-size", "lr", "seed", "threads", "train-samples",
                           "loss-scale", "mode", "graph-fusion"}) {
    argv.push_back(str_cat("--", name));
    argv.push_back(args.get(name));
  }
  argv.insert(argv.end(), {"--amp", level, "--dtype", dtype});
  // How float16 products multiply means something only where they are float16 (a low level at fp16).
  if (args.has("f16-products") && level != "O0" && dtype == "fp16")
    argv.insert(argv.end(), {"--f16-products", args.get("f16-products")});
  if (args.flag("batch-norm")) argv.push_back("--batch-norm");
  if (args.flag("zoo-style")) argv.push_back("--zoo-style");
  if (!report_data.empty()) argv.insert(argv.end(), {"--report-data", report_data});
  const ChildResult child = run_child(argv, /*capture_stdout=*/true);
  std::map<std::string, std::string> summary;
  std::istringstream lines(child.out);
  for (std::string line; std::getline(lines, line);)
    if (line.find("\"kind\":\"summary\"") != std::string::npos) summary = parse_flat_json(line);
  DEMI_CHECK(child.ok() && !summary.empty(), "compare: the run at ", level, " ", dtype, " failed (",
             child.describe(), "); run it alone to see why: ", command_line(argv));
  return summary;
}

double as_double(const std::map<std::string, std::string>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? 0.0 : std::atof(it->second.c_str());
}

std::string cell(const char* format, double v) {
  char b[64];
  std::snprintf(b, sizeof b, format, v);
  return b;
}

// A table printed in fixed-width columns (the first left-aligned), the same cells the HTML report shows.
void print_table(const train::ReportTable& t, const std::vector<int>& widths) {
  const auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t i = 0; i < cells.size(); ++i) {
      const int w = i < widths.size() ? widths[i] : 9;
      char b[128];
      std::snprintf(b, sizeof b, i == 0 ? "%-*s" : " %*s", w, cells[i].c_str());
      out += b;
    }
    std::printf("%s\n", out.c_str());
  };
  line(t.columns);
  for (const auto& r : t.rows) line(r);
}

// A scratch folder for the children's run records, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "demi-compare-XXXXXX").string();
    DEMI_CHECK(::mkdtemp(tmpl.data()) != nullptr, "compare: cannot create a scratch folder like '", tmpl, "'");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

int run_compare(const ParsedArgs& args) {
  std::vector<std::string> levels, dtypes;
  {
    std::stringstream a(args.get("levels")), b(args.get("dtypes"));
    for (std::string x; std::getline(a, x, ',');) levels.push_back(amp::level_name(amp::parse_level(x)));
    for (std::string x; std::getline(b, x, ',');) dtypes.push_back(x);
  }
  if (levels.empty()) throw UsageError("--levels is empty: name the AMP levels to compare, e.g. O0,O2");
  if (dtypes.empty()) throw UsageError("--dtypes is empty: name the low-precision dtypes, e.g. fp16,bf16");
  const bool reporting = args.has("report");
  if (reporting) check_report_option(args, "report");
  std::optional<ScratchDir> scratch;
  if (reporting) scratch.emplace();
  struct Row {
    std::string level, dtype;
    std::map<std::string, std::string> s;
    std::string name() const { return level == "O0" ? "O0-fp32" : level + "-" + dtype; }
  };
  std::vector<Row> rows;
  std::vector<std::string> records;  // the children's run records, one per row
  const auto run_one = [&](const std::string& l, const std::string& shown, const std::string& d) {
    std::string data = reporting ? (scratch->path() / (std::to_string(rows.size()) + ".json")).string() : "";
    rows.push_back({l, shown, run_setting(args, l, d, data)});
    records.push_back(data);
  };
  for (const auto& l : levels) {
    if (l == "O0") {
      run_one(l, "fp32", dtypes.empty() ? "bf16" : dtypes[0]);
      continue;
    }
    for (const auto& d : dtypes) run_one(l, d, d);
  }
  const Row* base = nullptr;
  for (const auto& r : rows)
    if (r.level == "O0") base = &r;
  std::string model = rows.empty() ? "" : rows[0].s["model"], data = rows.empty() ? "" : rows[0].s["data"];
  const std::string heading = "model " + model + " on " + data + ", " + args.get("epochs") + " epoch(s), batch " +
                              (args.get_int("batch-size") > 0 ? args.get("batch-size") : std::string("default"));
  std::printf("\n%s — O0 against mixed precision, measured in this run\n\n", heading.c_str());
  const auto ratio = [](double v, double b) { return cell("%.2fx", b > 0 ? v / b : 0); };
  train::ReportTable main_table{"samples/s, memory, loss and accuracy",
                                {"setting", "samples/s", "x O0", "peak MiB", "x O0", "activ.", "cast", "work",
                                 "RSS MiB", "x O0", "loss", "test acc"},
                                {},
                                "peak MiB: tracked tensor memory (parameters, gradients, optimizer state, activations, "
                                "cast cache, workspace, data); activ./cast/work: its activation, cast-cache and "
                                "workspace parts; RSS: the process's peak resident set (each setting runs in its own "
                                "process)."};
  for (const auto& r : rows) {
    double sps = as_double(r.s, "samples_per_second"), peak = as_double(r.s, "peak_total"),
           rss = as_double(r.s, "peak_rss");
    double bsps = base ? as_double(base->s, "samples_per_second") : 0, bpeak = base ? as_double(base->s, "peak_total") : 0,
           brss = base ? as_double(base->s, "peak_rss") : 0;
    main_table.rows.push_back({r.name(), cell("%.0f", sps), ratio(sps, bsps), cell("%.2f", peak / (1 << 20)),
                               ratio(peak, bpeak), cell("%.2f", as_double(r.s, "peak_activation") / (1 << 20)),
                               cell("%.2f", as_double(r.s, "peak_cast_cache") / (1 << 20)),
                               cell("%.2f", as_double(r.s, "peak_workspace") / (1 << 20)), cell("%.1f", rss / (1 << 20)),
                               ratio(rss, brss), cell("%.4f", as_double(r.s, "final_loss")),
                               cell("%.4f", as_double(r.s, "test_accuracy"))});
  }
  print_table(main_table, {9, 10, 7, 10, 7, 9, 9, 9, 9, 7, 8, 9});

  train::ReportTable by_category{"peak tracked memory by category, MiB",
                                 {"setting", "param", "grad", "optim", "activ.", "cast", "work", "data", "total"},
                                 {},
                                 "each column is that category's own peak; total is the peak of the sum"};
  for (const auto& r : rows) {
    auto m = [&](const char* k) { return cell("%.2f", as_double(r.s, k) / (1 << 20)); };
    by_category.rows.push_back({r.name(), m("peak_parameter"), m("peak_gradient"), m("peak_optimizer_state"),
                                m("peak_activation"), m("peak_cast_cache"), m("peak_workspace"), m("peak_data"),
                                m("peak_total")});
  }
  std::printf("\n%s\n", by_category.title.c_str());
  print_table(by_category, {9, 9, 9, 9, 9, 9, 9, 9, 9});
  std::printf("(%s)\n", by_category.note.c_str());

  train::ReportTable train_peak{"the training's own peak (every category but data) and what it is made of, MiB",
                                {"setting", "param", "grad", "optim", "activ.", "cast", "work", "train", "x O0"},
                                {},
                                ""};
  for (const auto& r : rows) {
    auto m = [&](const char* k) { return cell("%.2f", as_double(r.s, std::string("at_train_peak_") + k) / (1 << 20)); };
    double train = as_double(r.s, "peak_train"), btrain = base ? as_double(base->s, "peak_train") : 0;
    train_peak.rows.push_back({r.name(), m("parameter"), m("gradient"), m("optimizer_state"), m("activation"),
                               m("cast_cache"), m("workspace"), cell("%.2f", train / (1 << 20)), ratio(train, btrain)});
  }
  std::printf("\n%s\n", train_peak.title.c_str());
  print_table(train_peak, {9, 9, 9, 9, 9, 9, 9, 9, 7});
  std::printf("\npeak MiB: tracked tensor memory (parameters, gradients, optimizer state, activations, cast cache,\n"
              "workspace, data); activ./cast/work: its activation, cast-cache and workspace parts; RSS: the\n"
              "process's peak resident set (each setting runs in its own process).\n");
  if (reporting) {
    std::vector<train::RunRecord> runs;
    for (size_t i = 0; i < rows.size(); ++i) {
      runs.push_back(train::read_run_record(records[i]));
      runs.back().name = rows[i].name();
    }
    train::write_report(args.get("report"),
                        train::render_comparison_html(runs, {main_table, by_category, train_peak}, "demi compare: " + heading));
    std::printf("report: %s\n", args.get("report").c_str());
  }
  return 0;
}

std::vector<Option> training_options() {
  return {
      {"model", "M", "A (simplecnn), B (lenet), C (mlp), D (transformer), R (resnet18) or gpt (train only)", "A"},
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

}  // namespace

std::optional<train::LoadedCheckpoint> resume_checkpoint(const std::string& dir, const std::string& prefix) {
  std::vector<train::SkippedCheckpoint> skipped;
  auto last = train::latest_loadable_checkpoint(dir, prefix, &skipped, /*set_aside=*/true);
  for (const train::SkippedCheckpoint& s : skipped)
    std::fprintf(stderr, "demi: warning: --resume skips a checkpoint that does not load, kept as %s: %s\n",
                 s.path.string().c_str(), s.error.c_str());
  if (!last && !skipped.empty())
    throw Error("--resume: no checkpoint in " + dir + " loads (" + std::to_string(skipped.size()) +
                " damaged, set aside as .damaged); --start-over trains from the beginning");
  if (!last) {  // a retried --resume: only the damaged ones set aside by an earlier try remain
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind(prefix + "-", 0) == 0 && name.ends_with(".damaged"))
        throw Error("--resume: the checkpoints in " + dir + " are damaged (" + name +
                    " was set aside by an earlier --resume); nothing loads, so nothing is resumed. "
                    "--start-over trains from the beginning");
    }
  }
  return last;
}

void apply_thread_option(const ParsedArgs& args) {
  ContextOptions ctx = get_context();
  int64_t threads = args.get_int("threads");
  const int64_t hardware = hardware_threads();
  // Processes of one job on this machine share its cores: each takes its part unless told.
  if (threads == 0 && dist::is_initialized()) {
    const int64_t local = dist::get_local_group_size();
    if (local > 1) threads = std::max<int64_t>(1, hardware / local);
  }
  if (threads > hardware) {
    std::fprintf(stderr,
                 "demi: --threads %lld is more than the %lld hardware threads of this machine; using %lld "
                 "(oversubscribed workers would make every step wait)\n",
                 static_cast<long long>(threads), static_cast<long long>(hardware), static_cast<long long>(hardware));
    threads = hardware;
  }
  ctx.num_threads = static_cast<int>(threads);
  if (args.has("f16-products")) {
    const std::string products = args.get("f16-products");
    if (products != "exact" && products != "bf16")
      throw UsageError("--f16-products expects exact or bf16, got '" + products + "'");
    kernels::set_f16_products(products == "bf16" ? kernels::F16Products::kBf16 : kernels::F16Products::kExact);
  }
  if (args.has("mode")) {
    const std::string mode = args.get("mode");
    if (mode == "graph") {
      ctx.mode = ExecMode::kGraph;
    } else if (mode == "pynative") {
      ctx.mode = ExecMode::kPyNative;
    } else {
      throw UsageError("--mode expects graph or pynative, got '" + mode + "'");
    }
  }
  if (args.has("graph-fusion")) {
    const std::string fusion = args.get("graph-fusion");
    if (fusion != "on" && fusion != "off") throw UsageError("--graph-fusion expects on or off, got '" + fusion + "'");
    ctx.graph_fusion = fusion == "on";
  }
  set_context(ctx);
}

int run_training_demo(const ParsedArgs& args) {
  (void)args;
  std::string self = self_path();
  std::printf("demi demo: the seed's comparison — the same network trained from the same seed at O0 and at O2\n"
              "(float16 with loss scaling, and bfloat16), measured side by side.\n");
  std::fflush(stdout);
  if (!run_child({self, "compare", "--model", "A", "--data", "synthetic", "--epochs", "3", "--train-samples", "1000"},
                 /*capture_stdout=*/false)
           .ok())
    return 1;
  return run_child({self, "compare", "--model", "B", "--data", "fashion-mnist", "--epochs", "1"}, false).ok() ? 0 : 1;
}

void add_training_commands(std::vector<Command>& cmds) {
  std::vector<Option> train_opts = training_options();
  for (Option& o : gpt_train_options()) train_opts.push_back(std::move(o));
  train_opts.push_back({"amp", "LEVEL", "AMP level: O0, O1, O2, O3", "O0"});
  train_opts.push_back({"dtype", "T", "low-precision dtype: fp16 or bf16", "fp16"});
  train_opts.push_back({"json", "", "print one JSON object per epoch and a summary", ""});
  train_opts.push_back({"profile", "", "print time, calls and bytes per op, forward and backward", ""});
  train_opts.push_back({"ckpt-dir", "DIR", "save checkpoints (safetensors) in DIR", ""});
  train_opts.push_back(int_option("ckpt-every", "N", "save every N steps (0: at the end of each epoch)", "0", 0, 1e12));
  train_opts.push_back(int_option("keep-ckpt", "K", "keep the last K checkpoints (0: all)", "3", 0, 1e6));
  train_opts.push_back({"resume", "", "continue from the latest checkpoint in --ckpt-dir", ""});
  train_opts.push_back({"start-over", "", "train from the beginning in a --ckpt-dir that holds another run's "
                                          "checkpoints, moving them aside into a subfolder (never deleted)", ""});
  train_opts.push_back(real_option("clip-grad-norm", "X", "clip the gradients to global L2 norm X after unscaling "
                                                          "(0: off)", "0", 0, 1e12));
  train_opts.push_back(int_option("accumulate", "N", "batches per update (gradient accumulation)", "1", 1, 1 << 20));
  train_opts.push_back(int_option("sink-size", "N", "sink mode, MindSpore's sink_size: the callbacks (progress, "
                                                    "checkpoints) see each sink of steps once; -1: one sink per "
                                                    "epoch; N > 0: each --epochs is one sink of N batches, the data "
                                                    "running on across the data set's epochs; 0: every step", "0", -1,
                                  1e12));
  train_opts.push_back({"max-memory", "SIZE", "choose the largest batch size (a multiple of 8) whose training peak "
                                             "fits SIZE (512MiB, 2GiB, 800MB), forecast by probes", ""});
  train_opts.push_back({"recompute", "", "recompute each encoder layer (D) or block (gpt) in backward instead of "
                                         "keeping its activations", ""});
  train_opts.push_back({"recompute-attention", "", "recompute the attention probabilities in backward instead of "
                                                   "keeping them (D, gpt): the same gradients, less memory", ""});
  train_opts.push_back({"optimizer-in-backward", "WHEN", "update each parameter as soon as backward completes its "
                                                         "gradient, and free the gradient: on (no loss scale, "
                                                         "clipping or --accumulate), off, or auto (graph mode "
                                                         "wherever nothing waits on every gradient)", "auto"});
  train_opts.push_back({"param-grads", "P", "parameter gradients: bf16 (half the bytes of FP32, FP32's range), fp32, "
                                            "or auto (bf16 at O2/O3, fp32 at O0/O1)", "auto"});
  train_opts.push_back({"optimizer-state", "T", "the optimizer's state (momentum, Adam's moments): fp32, or bf16 "
                                                "(half the bytes; rounded after each update: changes the numerics)",
                        "fp32"});
  train_opts.push_back(int_option("steps", "N", "stop after N updates in all (0: --epochs decides; --model gpt: the run's "
                                               "length, which the learning-rate schedule spans, default 2000)", "0", 0, 1e15));
  train_opts.push_back({"comm-dtype", "T", "under mpirun: gradients travel as fp32 or bf16 (summed in FP32, "
                                            "rounded once)", "fp32"});
  train_opts.push_back(real_option("bucket-mb", "MB", "under mpirun: gradient bucket size in MiB (0: a quarter of "
                                                     "the gradients, within 1..25)", "0", 0, 1e6));
  train_opts.push_back({"amp-adapt", "", "adaptive AMP: a layer that keeps overflowing where the loss scale cannot "
                                         "help is promoted to FP32 for the rest of training", ""});
  train_opts.push_back({"trace-dtypes", "", "before training, print every op of one step (forward and backward) by "
                                            "layer with its compute and output dtypes, and ops and FLOPs per dtype", ""});
  train_opts.push_back({"numerics", "", "before training, report FP16 overflow per layer and gradient underflow "
                                        "per parameter at the loss scale", ""});
  train_opts.push_back({"report", "PATH", "write a self-contained HTML report of the run: settings, key numbers, "
                                          "charts of loss, loss scale, throughput and memory, events", ""});
  train_opts.push_back({"report-data", "PATH", "write the report's data (every step, epoch, memory sample and "
                                               "event) as JSON", ""});
  std::vector<Option> plan_opts = train_opts;
  cmds.push_back({.name = "train",
                  .summary = "Train a reference model at an AMP level, then evaluate it on the test split.",
                  .options = std::move(train_opts),
                  .run = run_train});
  cmds.push_back({.name = "plan",
                  .summary = "Say what training would take at its memory peak, per category, without training.",
                  .options = std::move(plan_opts),
                  .run = run_plan});
  std::vector<Option> eval_opts = training_options();
  eval_opts.push_back({"checkpoint", "FILE", "weights to evaluate (a demi checkpoint or PyTorch safetensors)", ""});
  eval_opts.push_back({"amp", "LEVEL", "AMP level to evaluate at", "O0"});
  eval_opts.push_back({"dtype", "T", "low-precision dtype: fp16 or bf16", "bf16"});
  eval_opts.push_back({"allow-partial", "", "load what matches when the file lacks some parameters (listed) "
                                            "instead of refusing it", ""});
  eval_opts.push_back({"allow-non-finite", "", "load NaN or infinite weights (to inspect a diverged run) instead "
                                               "of refusing them", ""});
  cmds.push_back({.name = "eval",
                  .summary = "Evaluate saved weights on the test split (accuracy and loss).",
                  .options = std::move(eval_opts),
                  .run = run_eval});
  std::vector<Option> cmp = training_options();
  cmp.push_back({"levels", "L", "comma-separated AMP levels", "O0,O2"});
  cmp.push_back({"dtypes", "T", "comma-separated low dtypes for levels above O0", "fp16,bf16"});
  cmp.push_back({"report", "PATH", "write a self-contained HTML page comparing the settings: the tables, their "
                                   "loss, loss-scale and throughput curves, samples/s and memory", ""});
  cmds.push_back({.name = "compare",
                  .summary = "Train the same model from the same seed at each setting; print one table.",
                  .options = std::move(cmp),
                  .run = run_compare});
}

int training_exit_status(double first_loss, double last_loss, int64_t skipped, int64_t steps) {
  // Non-finite: an O2-fp16 run without loss scaling, a learning rate far too high. Diverged: a finite loss
  // that grew (a bf16 run at --lr 10 ends near 1e11 with no overflow to skip); the absolute margin keeps a
  // run resumed at a tiny loss from failing on noise.
  std::string failed;
  if (!std::isfinite(last_loss))
    failed = str_cat("the last loss is ", last_loss);
  else if (2 * skipped > steps)
    failed = str_cat(skipped, " of ", steps, " updates were skipped (non-finite gradients)");
  else if (std::isfinite(first_loss) && last_loss > 10 * first_loss && last_loss > first_loss + 1)
    failed = str_cat("the loss diverged, from ", first_loss, " at the first step to ", last_loss, " at the end");
  if (failed.empty()) return 0;
  std::fprintf(stderr, "demi: training failed: %s; the weights did not learn. Lower --lr, keep the level's loss "
               "scaling (--loss-scale default), or use --amp O0 to compare\n", failed.c_str());
  return 3;
}

}  // namespace demi::cli
