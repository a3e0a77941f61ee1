// Throughput of the memory-bound elementwise, reduction, loss, batch-norm and AMP kernels, in f32, bf16
// and f16, on demi's thread pool (every core by default):
//   add (same shape, and the (C, 1, 1) bias broadcast over (N, C, H, W)); sum (all of a tensor, and the
//   bias gradient (N, C, H, W) -> (C, 1, 1)); softmax cross-entropy forward + backward on (256, 10) and
//   (4096, 1000); BatchNorm2d forward (training) and backward on (128, 32, 28, 28); the fused AMP unscale +
//   all-finite check over 1M and 10M f32 gradients; memcpy of the same bytes as the ceiling to compare with.
// GB/s counts the bytes each kernel must move (each input read once, each output written once) per second
// of wall time (the kernels are multi-threaded); compare with memcpy here, this machine's copy rate at the
// same sizes. Working sets of a few MB sit in cache, so small cases can beat DRAM.
//
//   build/release/bench/reduce_bench [--benchmark_filter=bn]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "demi/core/dtype.h"
#include "demi/core/half.h"
#include "demi/kernels/cpu/amp_kernels.h"
#include "demi/kernels/cpu/batchnorm.h"
#include "demi/kernels/cpu/elementwise.h"
#include "demi/kernels/cpu/loss.h"
#include "demi/kernels/cpu/reduce.h"

namespace demi::kernels {
namespace {

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// A 64-byte aligned buffer of n elements of `dtype`, filled with uniform values in [lo, hi] before timing.
class Buffer {
 public:
  Buffer(DType dtype, int64_t n, float lo = -2.0f, float hi = 2.0f, uint64_t seed = 1)
      : dtype_(dtype), bytes_((static_cast<size_t>(n) * dtype_size(dtype) + 63) / 64 * 64),
        data_(std::aligned_alloc(64, bytes_)) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t i = 0; i < n; ++i) {
      float v = dist(rng);
      switch (dtype) {
        case DType::kF32: static_cast<float*>(data_)[i] = v; break;
        case DType::kBF16: static_cast<BFloat16*>(data_)[i] = BFloat16(v); break;
        case DType::kF16: static_cast<Half*>(data_)[i] = Half(v); break;
        default: break;
      }
    }
  }
  ~Buffer() { std::free(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  DType dtype_;
  size_t bytes_;
  void* data_;
};

void set_gbps(benchmark::State& state, double bytes) {
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

std::string label(DType t) { return std::string(dtype_name(t)); }

// The bytes each element costs a kernel that reads `reads` and writes `writes` tensors of dtype t.
double elem_bytes(DType t, int reads, int writes) { return static_cast<double>(dtype_size(t)) * (reads + writes); }

constexpr int64_t kN = 128, kC = 32, kH = 28, kW = 28;  // model B's first conv output
constexpr int64_t kNumel = kN * kC * kH * kW;

void BM_memcpy(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  Buffer a(DType::kF32, bytes / 4), b(DType::kF32, bytes / 4);
  for (auto _ : state) {
    std::memcpy(b.get(), a.get(), static_cast<size_t>(bytes));
    benchmark::ClobberMemory();
  }
  set_gbps(state, 2.0 * static_cast<double>(bytes));
}

void BM_add_same_shape(benchmark::State& state, DType t) {
  Buffer a(t, kNumel), b(t, kNumel, -2, 2, 2), out(t, kNumel);
  std::vector<int64_t> shape = {kN, kC, kH, kW};
  for (auto _ : state) binary(BinaryOp::kAdd, t, a.get(), shape, b.get(), shape, out.get());
  set_gbps(state, elem_bytes(t, 2, 1) * kNumel);
  state.SetLabel(label(t) + " (128,32,28,28)");
}

void BM_add_bias(benchmark::State& state, DType t) {
  Buffer a(t, kNumel), b(t, kC), out(t, kNumel);
  std::vector<int64_t> shape = {kN, kC, kH, kW}, bias = {kC, 1, 1};
  for (auto _ : state) binary(BinaryOp::kAdd, t, a.get(), shape, b.get(), bias, out.get());
  set_gbps(state, elem_bytes(t, 1, 1) * kNumel);
  state.SetLabel(label(t) + " (128,32,28,28)+(32,1,1)");
}

void BM_sum_all(benchmark::State& state, DType t) {
  Buffer x(t, kNumel);
  float y = 0;
  for (auto _ : state) {
    reduce_sum(x.get(), t, AxisView{1, kNumel, 1}, &y, DType::kF32);
    benchmark::DoNotOptimize(y);
  }
  set_gbps(state, elem_bytes(t, 1, 0) * kNumel);
  state.SetLabel(label(t) + " 3.2M -> f32 scalar");
}

void BM_sum_bias_grad(benchmark::State& state, DType t) {
  Buffer g(t, kNumel), out(t, kC);
  std::vector<int64_t> shape = {kN, kC, kH, kW}, bias = {kC, 1, 1};
  for (auto _ : state) sum_to_shape(t, g.get(), shape, out.get(), bias);
  set_gbps(state, elem_bytes(t, 1, 0) * kNumel);
  state.SetLabel(label(t) + " (128,32,28,28)->(32,1,1)");
}

void BM_softmax_ce(benchmark::State& state, DType t) {
  const int64_t n = state.range(0), c = state.range(1);
  Buffer logits(t, n * c, -4, 4), dlogits(t, n * c);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % c);
  std::vector<float> lse(static_cast<size_t>(n));
  CrossEntropyParams p{n, c, Reduction::kMean};
  float loss = 0, dloss = 1.0f;
  for (auto _ : state) {
    softmax_cross_entropy_sparse_forward(logits.get(), t, labels.data(), DType::kI32, p, &loss, lse.data());
    softmax_cross_entropy_sparse_backward(logits.get(), t, labels.data(), DType::kI32, lse.data(), &dloss, p,
                                          dlogits.get());
    benchmark::DoNotOptimize(loss);
  }
  // Forward reads the logits; backward reads them again and writes dlogits.
  set_gbps(state, elem_bytes(t, 2, 1) * static_cast<double>(n * c) + 8.0 * static_cast<double>(n));
  state.SetLabel(label(t) + " (" + std::to_string(n) + "," + std::to_string(c) + ") fwd+bwd");
}

void BM_bn_forward(benchmark::State& state, DType t) {
  Buffer x(t, kNumel, 1, 3), y(t, kNumel);
  std::vector<float> gamma(kC, 1.1f), beta(kC, 0.1f), mean(kC), inv(kC), rm(kC, 0.0f), rv(kC, 1.0f);
  BatchNormParams p;
  p.n = kN, p.c = kC, p.spatial = kH * kW;
  for (auto _ : state)
    batch_norm_forward_training(x.get(), t, gamma.data(), beta.data(), p, y.get(), mean.data(), inv.data(), rm.data(),
                                rv.data());
  set_gbps(state, elem_bytes(t, 1, 1) * kNumel);
  state.SetLabel(label(t) + " (128,32,28,28) training");
}

void BM_bn_backward(benchmark::State& state, DType t) {
  Buffer x(t, kNumel, 1, 3), dy(t, kNumel, -1, 1, 3), dx(t, kNumel);
  std::vector<float> gamma(kC, 1.1f), mean(kC, 2.0f), inv(kC, 1.7f), dg(kC), db(kC);
  BatchNormParams p;
  p.n = kN, p.c = kC, p.spatial = kH * kW;
  for (auto _ : state)
    batch_norm_backward(x.get(), dy.get(), t, gamma.data(), mean.data(), inv.data(), p, true, dx.get(), dg.data(),
                        db.data());
  set_gbps(state, elem_bytes(t, 2, 1) * kNumel);
  state.SetLabel(label(t) + " (128,32,28,28) training");
}

void BM_unscale_all_finite(benchmark::State& state) {
  const int64_t n = state.range(0);
  // Split like a model's parameters: a few large buffers and many small ones.
  Buffer g(DType::kF32, n, -1, 1);
  std::vector<GradBuffer> grads;
  int64_t off = 0;
  for (int64_t size = n / 4; off < n; size = size > 256 ? size / 2 : 256) {
    int64_t k = off + size <= n ? size : n - off;
    grads.push_back({g.as<float>() + off, k, DType::kF32});
    off += k;
  }
  for (auto _ : state) {
    UnscaleResult r = unscale_and_check_finite(grads, 1.0f);  // exact: the values stay put
    benchmark::DoNotOptimize(r);
    r = unscale_and_check_finite(grads, 0.5f);
    r = unscale_and_check_finite(grads, 2.0f);
    benchmark::DoNotOptimize(r);
  }
  // Three passes per iteration: one read-only (inv_scale 1), two read + write.
  set_gbps(state, (4.0 + 8.0 + 8.0) * static_cast<double>(n));
  state.SetLabel("f32 " + std::to_string(n) + " in " + std::to_string(grads.size()) + " buffers, 3 passes");
}

void register_all() {
  benchmark::RegisterBenchmark("memcpy", BM_memcpy)->Arg(kNumel * 4)->Arg(4 << 20)->Unit(benchmark::kMicrosecond)->UseRealTime();
  for (DType t : kDTypes) {
    std::string d = "/";  // not "/" + std::string(...): GCC 12 reports a false -Wrestrict there
    d += dtype_name(t);
    benchmark::RegisterBenchmark(("add_same_shape" + d).c_str(), BM_add_same_shape, t)->Unit(benchmark::kMicrosecond)->UseRealTime();
    benchmark::RegisterBenchmark(("add_bias" + d).c_str(), BM_add_bias, t)->Unit(benchmark::kMicrosecond)->UseRealTime();
    benchmark::RegisterBenchmark(("sum_all" + d).c_str(), BM_sum_all, t)->Unit(benchmark::kMicrosecond)->UseRealTime();
    benchmark::RegisterBenchmark(("sum_bias_grad" + d).c_str(), BM_sum_bias_grad, t)->Unit(benchmark::kMicrosecond)->UseRealTime();
    benchmark::RegisterBenchmark(("softmax_ce" + d).c_str(), BM_softmax_ce, t)
        ->Args({256, 10})
        ->Args({4096, 1000})
        ->Unit(benchmark::kMicrosecond)->UseRealTime();
    benchmark::RegisterBenchmark(("bn_forward" + d).c_str(), BM_bn_forward, t)->Unit(benchmark::kMicrosecond)->UseRealTime();
    benchmark::RegisterBenchmark(("bn_backward" + d).c_str(), BM_bn_backward, t)->Unit(benchmark::kMicrosecond)->UseRealTime();
  }
  benchmark::RegisterBenchmark("unscale_all_finite", BM_unscale_all_finite)
      ->Arg(1 << 20)
      ->Arg(10 << 20)
      ->Unit(benchmark::kMicrosecond)->UseRealTime();
}

}  // namespace
}  // namespace demi::kernels

int main(int argc, char** argv) {
  demi::kernels::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
