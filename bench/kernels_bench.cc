// Matrix-product and convolution kernel throughput (oneDNN-backed, demi/kernels/onednn), in GFLOP/s, for
// the shapes of the reference models (BENCHMARKS.md) and the classic 1024^3 / 64->64 3x3 anchors, per
// dtype and direction. Each row's label names oneDNN's implementation; the "ceiling" counter is the
// fraction of BENCHMARKS.md's fixed 2-core ceilings (kCeilingF32 and kCeilingBF16 below, measured on a CPU
// without AMX — on a CPU with AMX-BF16 the bf16 rows can exceed 1.0; gemm_bench measures this machine's own
// ceilings in its run). f16 has no oneDNN kernels here: those rows include converting the operands to f32
// and the result back.
//
//   build/release/bench/kernels_bench [--benchmark_filter=conv] [--benchmark_counters_tabular=true]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "demi/core/convert.h"
#include "demi/core/dtype.h"
#include "demi/kernels/conv_params.h"
#include "demi/kernels/cpu/pool.h"
#include "demi/kernels/onednn/conv.h"
#include "demi/kernels/onednn/dense.h"
#include "demi/kernels/onednn/matmul.h"

namespace demi {
namespace {

using kernels::Conv2dParams;
using kernels::MatmulParams;
using kernels::max_pool2d_backward;
using kernels::PadMode;
using kernels::Pool2dParams;
using kernels::relu_max_pool2d_forward;
namespace onednn = kernels::onednn;

constexpr double kCeilingF32 = 427.0;   // GFLOP/s, BENCHMARKS.md
constexpr double kCeilingBF16 = 865.0;  // GFLOP/s, BENCHMARKS.md

using bench::Buffer;

void report(benchmark::State& state, double flops, DType compute, const std::string& impl) {
  const double iters = static_cast<double>(state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(flops * iters / 1e9, benchmark::Counter::kIsRate);
  const double ceiling = compute == DType::kBF16 ? kCeilingBF16 : kCeilingF32;
  state.counters["ceiling"] = benchmark::Counter(flops * iters / 1e9 / ceiling, benchmark::Counter::kIsRate);
  state.SetLabel(impl);
}

// ---- matmul ----------------------------------------------------------------------------------------------

void bm_matmul(benchmark::State& state, int64_t m, int64_t n, int64_t k, DType in, DType out) {
  MatmulParams p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a_dtype = p.b_dtype = in;
  p.c_dtype = out;
  Buffer a(in, m * k, 1), b(in, k * n, 2), c(out, m * n, 3);
  for (auto _ : state) onednn::matmul(p, a.data(), b.data(), c.data());
  report(state, 2.0 * m * n * k, in, onednn::matmul_implementation(p));
}

// ---- Dense (model C: batch 256, 784 -> 1024 -> 1024 -> 10) ------------------------------------------

enum class Dir { kForward, kBackwardData, kBackwardWeights };

// in: dtype of x, w, dy (and y); gradients dx in `in`, dw and db in f32 for low precision (AMP's master
// gradients) — what a training step runs.
void bm_dense(benchmark::State& state, int64_t m, int64_t k, int64_t n, DType in, Dir dir) {
  onednn::DenseParams p;
  p.m = m;
  p.k = k;
  p.n = n;
  p.x_dtype = p.w_dtype = p.y_dtype = in;
  p.bias_dtype = DType::kF32;
  p.relu = n != 10;
  Buffer x(in, m * k, 1), w(in, n * k, 2), y(in, m * n, 3), dw(DType::kF32, n * k, 4), b(DType::kF32, n, 5);
  MatmulParams mp;  // for the implementation name
  mp.a_dtype = mp.b_dtype = in;
  if (dir == Dir::kForward) {
    for (auto _ : state) onednn::dense_forward(p, x.data(), w.data(), b.data(), y.data());
    mp.m = m;
    mp.n = n;
    mp.k = k;
    mp.trans_b = true;
    mp.c_dtype = in;
  } else if (dir == Dir::kBackwardData) {
    for (auto _ : state) onednn::dense_backward_data(p, y.data(), w.data(), x.data());
    mp.m = m;
    mp.n = k;
    mp.k = n;
    mp.c_dtype = in;
  } else {
    p.w_dtype = DType::kF32;
    for (auto _ : state) onednn::dense_backward_weights(p, x.data(), y.data(), dw.data(), b.data());
    mp.m = n;
    mp.n = k;
    mp.k = m;
    mp.trans_a = true;
    mp.c_dtype = DType::kF32;
  }
  report(state, 2.0 * m * n * k, in, onednn::matmul_implementation(mp));
}

// ---- Conv2d ----------------------------------------------------------------------------------------------

void bm_conv(benchmark::State& state, int64_t n, int64_t c, int64_t hw, int64_t oc, int64_t k, int64_t pad,
             DType t, onednn::ConvDirection dir) {
  Conv2dParams p;
  p.n = n;
  p.c = c;
  p.h = p.w = hw;
  p.oc = oc;
  p.kh = p.kw = k;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = pad;
  p.x_dtype = p.w_dtype = p.y_dtype = t;
  Buffer x(t, p.x_numel(), 1), w(t, p.w_numel(), 2), y(t, p.y_numel(), 3), b(DType::kF32, oc, 4);
  Buffer dw(DType::kF32, p.w_numel(), 5);
  bool with_bias = true;
  if (dir == onednn::ConvDirection::kForward) {
    p.relu = true;
    for (auto _ : state) onednn::conv2d_forward(p, x.data(), w.data(), b.data(), y.data());
  } else if (dir == onednn::ConvDirection::kBackwardData) {
    with_bias = false;
    for (auto _ : state) onednn::conv2d_backward_data(p, y.data(), w.data(), x.data());
  } else {
    p.w_dtype = DType::kF32;  // AMP's master gradient: f32 dw (and db) from low-precision x and dy
    for (auto _ : state) onednn::conv2d_backward_weights(p, x.data(), y.data(), dw.data(), b.data());
  }
  const double flops = 2.0 * n * oc * c * k * k * p.out_h() * p.out_w();
  report(state, flops, t, onednn::conv2d_implementation(p, dir, with_bias));
}

// ---- Conv2d -> ReLU -> MaxPool2d 2x2: the fused op against the three steps (conv to NCHW, pool, and the
// same backward), in the storage dtype t (f16 computes the convolution in f32) ----

void bm_conv_pool(benchmark::State& state, int64_t n, int64_t c, int64_t hw, int64_t oc, int64_t pad, DType t,
                  bool fused, bool backward) {
  Conv2dParams p;
  p.n = n;
  p.c = c;
  p.h = p.w = hw;
  p.oc = oc;
  p.kh = p.kw = 3;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = pad;
  p.x_dtype = p.w_dtype = t;
  const DType ct = t == DType::kBF16 ? DType::kBF16 : DType::kF32;
  p.y_dtype = fused ? ct : t;
  const Pool2dParams pool = kernels::make_pool2d_params(n, oc, p.out_h(), p.out_w(), 2, 2, 2, 2, PadMode::kValid);
  Buffer x(t, p.x_numel(), 1), w(t, p.w_numel(), 2), b(DType::kF32, oc, 3), y(t, pool.y_numel(), 4);
  Buffer conv(t, p.y_numel(), 5), dy(t, pool.y_numel(), 6), dw(DType::kF32, p.w_numel(), 7), db(DType::kF32, oc, 8);
  Buffer dx(t, p.x_numel(), 9);
  std::vector<uint8_t> argmax(pool.y_numel());
  void* dxp = c > 3 ? dx.data() : nullptr;  // the first layer's input needs no gradient
  Conv2dParams q = p;
  q.w_dtype = DType::kF32;
  for (auto _ : state) {
    if (fused) {
      if (!backward) {
        onednn::conv2d_relu_max_pool2d_forward(p, pool, x.data(), w.data(), b.data(), t, y.data(), argmax.data());
      } else {
        onednn::conv2d_relu_max_pool2d_backward(p, pool, x.data(), w.data(), t, dy.data(), argmax.data(), dxp,
                                                dw.data(), DType::kF32, db.data(), DType::kF32);
      }
    } else if (!backward) {
      onednn::conv2d_forward(p, x.data(), w.data(), b.data(), conv.data());
      relu_max_pool2d_forward(pool, t, conv.data(), y.data(), argmax.data());
    } else {
      max_pool2d_backward(pool, t, dy.data(), argmax.data(), conv.data());
      onednn::conv2d_backward_weights(q, x.data(), conv.data(), dw.data(), db.data());
      if (dxp) onednn::conv2d_backward_data(p, conv.data(), w.data(), dxp);
    }
  }
}

const char* dtype_tag(DType t) { return t == DType::kF32 ? "f32" : t == DType::kBF16 ? "bf16" : "f16"; }

void register_all() {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    benchmark::RegisterBenchmark((std::string("matmul/1024^3/") + dtype_tag(t)).c_str(), bm_matmul, 1024,
                                 1024, 1024, t, t)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark("matmul/1024^3/bf16->f32", bm_matmul, 1024, 1024, 1024, DType::kBF16,
                               DType::kF32)
      ->UseRealTime();

  struct Layer {
    const char* name;
    int64_t k, n;
  };
  const Layer layers[] = {{"784->1024", 784, 1024}, {"1024->1024", 1024, 1024}, {"1024->10", 1024, 10}};
  const std::pair<Dir, const char*> dirs[] = {
      {Dir::kForward, "fwd"}, {Dir::kBackwardData, "bwd_data"}, {Dir::kBackwardWeights, "bwd_weights"}};
  for (const Layer& l : layers)
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
      for (auto [dir, dname] : dirs)
        benchmark::RegisterBenchmark(
            (std::string("dense/C_") + l.name + "/b256/" + dtype_tag(t) + "/" + dname).c_str(), bm_dense, 256,
            l.k, l.n, t, dir)
            ->UseRealTime();
  // Model D: 32 sequences x 128 tokens = 4096 rows; d 256, QKV 768, FFN 1024.
  const Layer d_layers[] = {{"256->768", 256, 768}, {"256->256", 256, 256}, {"256->1024", 256, 1024},
                            {"1024->256", 1024, 256}};
  for (const Layer& l : d_layers)
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
      for (auto [dir, dname] : dirs)
        benchmark::RegisterBenchmark(
            (std::string("dense/D_") + l.name + "/b4096/" + dtype_tag(t) + "/" + dname).c_str(), bm_dense,
            4096, l.k, l.n, t, dir)
            ->UseRealTime();

  struct Conv {
    const char* name;
    int64_t n, c, hw, oc, k, pad;
  };
  const Conv convs[] = {
      {"64->64_k3_56x56_b8", 8, 64, 56, 64, 3, 1},
      {"A_seed_3->32_k3_valid_32x32_b32", 32, 3, 32, 32, 3, 0},
      {"B1_1->32_k3_pad1_28x28_b128", 128, 1, 28, 32, 3, 1},
      {"B2_32->64_k3_pad1_14x14_b128", 128, 32, 14, 64, 3, 1},
  };
  const std::pair<onednn::ConvDirection, const char*> cdirs[] = {
      {onednn::ConvDirection::kForward, "fwd"},
      {onednn::ConvDirection::kBackwardData, "bwd_data"},
      {onednn::ConvDirection::kBackwardWeights, "bwd_weights"}};
  for (const Conv& c : convs) {
    if (c.c == 64) continue;  // the anchor has no pooling after it
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
      for (bool backward : {false, true})
        for (bool fused : {false, true})
          benchmark::RegisterBenchmark((std::string("convpool/") + c.name + "/" + dtype_tag(t) + "/" +
                                        (backward ? "bwd" : "fwd") + (fused ? "/fused" : "/3-step"))
                                           .c_str(),
                                       bm_conv_pool, c.n, c.c, c.hw, c.oc, c.pad, t, fused, backward)
              ->UseRealTime();
  }
  for (const Conv& c : convs)
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
      for (auto [dir, dname] : cdirs) {
        if (t == DType::kF16 && c.c == 32) continue;  // f16 on the anchor and models A and B1
        benchmark::RegisterBenchmark(
            (std::string("conv/") + c.name + "/" + dtype_tag(t) + "/" + dname).c_str(), bm_conv, c.n, c.c,
            c.hw, c.oc, c.k, c.pad, t, dir)
            ->UseRealTime();
      }
}

}  // namespace
}  // namespace demi

int main(int argc, char** argv) {
  demi::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
