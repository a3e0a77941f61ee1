// Model D (BENCHMARKS.md: a 4-layer Transformer encoder classifier, 128 random tokens, batch 32) trained
// with SGD(0.01, momentum 0.9) at each AMP level: the median step time after warm-up as samples/s, and
// demi's tracked peak memory (total and activations) over the timed steps. One JSON line per setting, in
// bench/torch_model_d.py's format, so the two can be run interleaved and compared:
//
//   build/release/bench/transformer_bench [--settings O0,O2-bf16,O2-fp16] [--steps 10] [--warmup 3]
//                                         [--batch 32] [--threads N] [--profile]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "demi/amp/train_step.h"
#include "demi/core/memory.h"
#include "demi/core/parallel.h"
#include "demi/core/rng.h"
#include "demi/kernels/matmul.h"
#include "demi/nn/models.h"
#include "demi/ops/dispatch.h"

namespace {

using namespace demi;

struct Setting {
  std::string name;
  amp::Level level;
  DType low;
  bool bf16_products = false;  // O2-fp16bp: f16 matrix products rounded to bf16 (amp::TrainOptions::f16_products = kBf16)
};

Setting parse_setting(const std::string& s) {
  if (s == "O0") return {s, amp::Level::kO0, DType::kBF16};
  if (s == "O2-bf16") return {s, amp::Level::kO2, DType::kBF16};
  if (s == "O2-fp16") return {s, amp::Level::kO2, DType::kF16};
  if (s == "O2-fp16bp") return {s, amp::Level::kO2, DType::kF16, true};
  if (s == "O3-bf16") return {s, amp::Level::kO3, DType::kBF16};
  std::fprintf(stderr, "unknown setting '%s' (O0, O2-bf16, O2-fp16, O2-fp16bp, O3-bf16)\n", s.c_str());
  std::exit(2);
}

void run(const Setting& s, int steps, int warmup, int64_t batch, bool profile) {
  set_seed(0);
  auto net = std::make_shared<nn::TransformerClassifier>();
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.01, 0.9);
  amp::TrainOptions o;
  o.low_dtype = s.low;
  o.f16_products = s.bf16_products ? F16Products::kBf16 : F16Products::kExact;
  auto step = amp::build_train_network(net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                       s.level, o);
  Generator gen(1);
  std::vector<Tensor> xs, ys;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> t(static_cast<size_t>(batch * 128)), l(static_cast<size_t>(batch));
    for (auto& v : t) v = static_cast<int32_t>(gen.next_int(1000));
    for (auto& v : l) v = static_cast<int32_t>(gen.next_int(10));
    xs.push_back(from_vector(t, {batch, 128}));
    ys.push_back(from_vector(l, {batch}));
  }
  std::vector<double> times;
  amp::StepResult r;
  MemStats peak;
  {
    for (int i = 0; i < warmup; ++i) r = (*step)(xs[static_cast<size_t>(i % 4)], ys[static_cast<size_t>(i % 4)]);
    if (profile) {
      ops::reset_profile();
      ops::set_profiling(true);
    }
    ScopedPeak scoped;
    for (int i = 0; i < steps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      r = (*step)(xs[static_cast<size_t>(i % 4)], ys[static_cast<size_t>(i % 4)]);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    peak = scoped.peak();
    if (profile) {
      std::fprintf(stderr, "== %s peak by category (MB):", s.name.c_str());
      for (int c = 0; c < kNumMemCategories; ++c)
        std::fprintf(stderr, " %s %.1f", mem_category_name(static_cast<MemCategory>(c)),
                     static_cast<double>(peak.peak[static_cast<size_t>(c)]) / 1e6);
      std::fprintf(stderr, "; total %.1f\n", static_cast<double>(peak.total_peak) / 1e6);
    }
    if (profile) {
      ops::set_profiling(false);
      std::fprintf(stderr, "== %s\n%s\n", s.name.c_str(), ops::profile_report().c_str());
    }
  }
  std::sort(times.begin(), times.end());
  const double med = times[times.size() / 2];
  std::printf(
      "{\"framework\": \"demi\", \"model\": \"D\", \"setting\": \"%s\", \"batch\": %lld, \"samples_per_second\": %.2f, "
      "\"median_step_ms\": %.2f, \"peak_tracked\": %lld, \"peak_activation\": %lld, \"peak_rss\": %lld, "
      "\"final_loss\": %.4f, \"skipped\": %d}\n",
      s.name.c_str(), static_cast<long long>(batch), static_cast<double>(batch) / med, med * 1e3,
      static_cast<long long>(peak.total_peak),
      static_cast<long long>(peak.peak[static_cast<size_t>(MemCategory::kActivation)]),
      static_cast<long long>(process_peak_rss_bytes()), r.loss, static_cast<int>(r.skipped));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string settings = "O0,O2-bf16,O2-fp16";
  int steps = 10, warmup = 3;
  int64_t batch = 32;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a.rfind("--benchmark", 0) == 0) continue;  // bench/run passes Google Benchmark's flags to every *_bench
    if (a == "--settings") settings = next();
    else if (a == "--steps") steps = std::atoi(next().c_str());
    else if (a == "--warmup") warmup = std::atoi(next().c_str());
    else if (a == "--batch") batch = std::atoll(next().c_str());
    else if (a == "--profile") profile = true;
    else if (a == "--threads") set_num_threads(std::atoi(next().c_str()));
    else {
      std::fprintf(stderr,
                   "usage: %s [--settings O0,O2-bf16,O2-fp16] [--steps N] [--warmup N] [--batch N] [--threads N] "
                   "[--profile]\n",
                   argv[0]);
      return 2;
    }
  }
  size_t pos = 0;
  while (pos <= settings.size()) {
    size_t comma = settings.find(',', pos);
    if (comma == std::string::npos) comma = settings.size();
    if (comma > pos) run(parse_setting(settings.substr(pos, comma - pos)), std::max(1, steps), warmup, batch, profile);
    pos = comma + 1;
  }
  return 0;
}
