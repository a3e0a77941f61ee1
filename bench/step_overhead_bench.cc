// Host overhead per op call: a train step of a network so small that its kernels take almost no time
// (a 3-layer MLP 16-32-32-10 on a batch of 8), so the step's time is what demi spends around the kernels:
// op dispatch and the precision policy, autograd nodes, the cast cache, allocation, the optimizer's loop.
// Each setting runs in PYNATIVE mode and in GRAPH_MODE (the step's allocations replayed from a static
// plan, graph/step_graph.h), so the two modes' host cost per op stand side by side.
//
// Counters: ops/step (forward and backward op calls, counted by an observer once), ns/op (step time
// divided by them), and the step time. Reference: each reference model's step makes 14 (A) to ~200 (D)
// op calls; set ops/step x ns/op against a model's whole step, which `demi train --json` reports (median_step_ms).
//
// Run: build/release/bench/step_overhead_bench   (or `make bench`)
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>

#include "demi/amp/train_step.h"
#include "demi/core/context.h"
#include "demi/core/rng.h"
#include "demi/nn/layers.h"
#include "demi/ops/observer.h"

namespace {

using namespace demi;

class CountOps : public ops::OpObserver {
 public:
  void on_op(const ops::OpEvent&) override { ++calls; }
  int64_t calls = 0;
};

void BM_TinyTrainStep(benchmark::State& state) {
  const auto level = static_cast<amp::Level>(state.range(0));
  // 0: PYNATIVE; 1: GRAPH_MODE (its choice: at O0 and O2-bf16 each update placed in backward); 2: GRAPH_MODE
  // with the update after backward, as PYNATIVE's, so that the replay's own cost shows alone.
  const bool graph = state.range(1) != 0, update_after = state.range(1) == 2;
  ExecModeScope in_mode(graph ? ExecMode::kGraph : ExecMode::kPyNative);
  set_seed(1);
  auto net = std::make_shared<nn::SequentialCell>();
  net->append(std::make_shared<nn::Dense>(16, 32));
  net->append(std::make_shared<nn::ReLU>());
  net->append(std::make_shared<nn::Dense>(32, 32));
  net->append(std::make_shared<nn::ReLU>());
  net->append(std::make_shared<nn::Dense>(32, 10));
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.01, 0.9);
  amp::TrainOptions o;
  o.low_dtype = DType::kBF16;
  if (update_after) o.optimizer_in_backward = false;
  auto step = amp::build_train_network(net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                       level, o);
  Generator g(2);
  Tensor x = normal({8, 16}, 0, 1, g);
  Tensor y = from_vector(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});
  for (int i = 0; i < 5; ++i) (*step)(x, y);  // warm-up, trace, first replays
  CountOps count;
  {
    ops::OpObserverScope observe(&count);
    (*step)(x, y);
  }
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize((*step)(x, y).loss);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double ops_per_step = static_cast<double>(count.calls);
  state.counters["ops/step"] = ops_per_step;
  state.counters["ns/op"] = seconds * 1e9 / static_cast<double>(state.iterations()) / ops_per_step;
  state.SetLabel(str_cat(amp::level_name(level), graph ? " GRAPH_MODE" : " PYNATIVE",
                         update_after ? " update after backward" : ""));
}
// (level, mode: 0 PYNATIVE, 1 GRAPH_MODE, 2 GRAPH_MODE with the update after backward)
BENCHMARK(BM_TinyTrainStep)
    ->Args({static_cast<int>(amp::Level::kO0), 0})
    ->Args({static_cast<int>(amp::Level::kO0), 1})
    ->Args({static_cast<int>(amp::Level::kO0), 2})
    ->Args({static_cast<int>(amp::Level::kO2), 0})
    ->Args({static_cast<int>(amp::Level::kO2), 1})
    ->Args({static_cast<int>(amp::Level::kO2), 2})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
