// The data pipeline's cost per batch, on the calling thread (no prefetch): what the trainer's producer
// thread spends for each batch of the reference models' image pipelines (BENCHMARKS.md), which on a
// machine with as many compute threads as cores is taken from the step's threads.
//   fashion_c: Fashion-MNIST, map([Rescale, Normalize]) -> shuffle -> batch(256) (model C; B's is batch 128)
//   fashion_c_separate: the same with Rescale and Normalize in two maps (each a pass of its own)
//   fashion_c_batch_then_map: shuffle -> batch(256) -> map([Rescale, Normalize]) (the same values; demi
//     train's pipeline)
// Needs the Fashion-MNIST files (the dataset-fashion-mnist package); skipped without them.
//
//   build/release/bench/data_bench [--benchmark_filter=fashion]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "demi/data/data.h"

namespace demi::data {
namespace {

const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

enum class Order { kOneMap, kTwoMaps, kBatchThenMap };

void run_pipeline(benchmark::State& state, Order order) {
  if (!std::filesystem::exists(kFashionDir)) {
    state.SkipWithError("no Fashion-MNIST files in /usr/share/datasets/fashion-mnist");
    return;
  }
  const int64_t batch = state.range(0), rows_used = state.range(1);
  std::shared_ptr<Dataset> ds = std::make_shared<MnistDataset>(kFashionDir, "train");
  const Rescale rescale(1.0 / 255, 0.0);
  const Normalize normalize({0.2860}, {0.3530});
  if (order == Order::kOneMap) ds = ds->map({rescale, normalize}, {"image"});
  if (order == Order::kTwoMaps) ds = ds->map({rescale}, {"image"})->map({normalize}, {"image"});
  if (rows_used < 60000) ds = ds->take(rows_used);
  ds = ds->shuffle(60000, 1)->batch(batch, /*drop_remainder=*/true);
  if (order == Order::kBatchThenMap) ds = ds->map({rescale, normalize}, {"image"});
  auto it = ds->create_iterator({});
  int64_t rows = 0;
  for (auto _ : state) {
    auto row = it->next();
    if (!row) {
      it->reset();
      row = it->next();
    }
    benchmark::DoNotOptimize(row->at(0).raw_data());
    ++rows;
  }
  state.counters["samples/s"] = benchmark::Counter(static_cast<double>(rows * batch), benchmark::Counter::kIsRate);
}

void BM_fashion_c(benchmark::State& state) { run_pipeline(state, Order::kOneMap); }
void BM_fashion_c_separate(benchmark::State& state) { run_pipeline(state, Order::kTwoMaps); }
void BM_fashion_c_batch_then_map(benchmark::State& state) { run_pipeline(state, Order::kBatchThenMap); }

// {batch, rows used}: model C's and B's batches over the whole split, and model C's over the first 5,120
// rows (the benchmark protocol's --train-samples: 4 MiB of bytes, cache-resident)
BENCHMARK(BM_fashion_c)->Args({256, 60000})->Args({128, 60000})->Args({256, 5120})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_fashion_c_separate)->Args({256, 60000})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_fashion_c_batch_then_map)->Args({256, 60000})->Args({256, 5120})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace demi::data

BENCHMARK_MAIN();
