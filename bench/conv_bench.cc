// demi's convolution on its GEMM (demi/kernels/cpu/conv.h) against oneDNN's (demi/kernels/onednn/conv.h)
// on models A's and B's convolutions, per dtype and direction, interleaved in one run (best of the
// rounds), with the f32 FMA ceiling measured in the same run. AMP's directions: forward in the storage
// dtype (bias, ReLU), input gradient in it, weight and bias gradients into f32.
//
//   build/release/bench/conv_bench [--rounds N] [--filter SUBSTRING] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "demi/core/cpu.h"
#include "demi/core/parallel.h"
#include "demi/kernels/conv_params.h"
#include "demi/kernels/cpu/conv.h"
#include "demi/kernels/cpu/peak.h"
#include "demi/kernels/onednn/conv.h"

namespace {

using demi::DType;
using demi::bench::Buffer;
using demi::kernels::Conv2dParams;

const char* tag(DType t) { return t == DType::kF32 ? "f32" : t == DType::kBF16 ? "bf16" : "f16"; }

}  // namespace

int main(int argc, char** argv) {
  using namespace demi;
  const bench::CompareOptions opts = bench::parse_compare_options(argc, argv);
  if (opts.threads > 0) set_num_threads(opts.threads);
  const int rounds = opts.rounds;
  const std::string& filter = opts.filter;
  struct Layer {
    const char* name;
    int64_t n, c, hw, oc, pad;
  };
  const Layer layers[] = {{"A 3->32 k3 32x32 b32", 32, 3, 32, 32, 0},
                          {"B1 1->32 k3p1 28x28 b128", 128, 1, 28, 32, 1},
                          {"B2 32->64 k3p1 14x14 b128", 128, 32, 14, 64, 1}};
  const double fma = kernels::cpu::fma_peak_gflops(0.3);
  std::printf("threads %d, cpu level %s; measured f32 FMA ceiling %.0f GFLOP/s\n", num_threads(),
              std::string(cpu_level_name(cpu_level())).c_str(), fma);
  std::printf("%-36s %9s %9s %7s %7s\n", "convolution (GFLOP/s)", "oneDNN", "demi", "demi/o", "d %pk");
  for (const Layer& l : layers)
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
      for (int dir = 0; dir < 3; ++dir) {
        const std::string name = std::string(l.name) + " " + tag(t) + (dir == 0 ? " fwd" : dir == 1 ? " dx" : " dw");
        if (!filter.empty() && name.find(filter) == std::string::npos) continue;
        if (dir == 1 && l.c <= 3) continue;  // a first layer needs no input gradient
        Conv2dParams p;
        p.n = l.n;
        p.c = l.c;
        p.h = p.w = l.hw;
        p.oc = l.oc;
        p.kh = p.kw = 3;
        p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = l.pad;
        p.x_dtype = p.w_dtype = p.y_dtype = t;
        if (dir == 0) p.relu = true;
        if (dir == 2) p.w_dtype = p.bias_dtype = DType::kF32;
        Buffer x(t, p.x_numel(), 1), w(p.w_dtype, p.w_numel(), 2), y(t, p.y_numel(), 3), b(DType::kF32, p.oc, 4);
        std::vector<std::function<void()>> runs(2);
        if (dir == 0) {
          runs[0] = [&] { kernels::onednn::conv2d_forward(p, x.data(), w.data(), b.data(), y.data()); };
          runs[1] = [&] { kernels::cpu::conv2d_forward(p, x.data(), w.data(), b.data(), y.data()); };
        } else if (dir == 1) {
          runs[0] = [&] { kernels::onednn::conv2d_backward_data(p, y.data(), w.data(), x.data()); };
          runs[1] = [&] { kernels::cpu::conv2d_backward_data(p, y.data(), w.data(), x.data()); };
        } else {
          runs[0] = [&] { kernels::onednn::conv2d_backward_weights(p, x.data(), y.data(), w.data(), b.data()); };
          runs[1] = [&] { kernels::cpu::conv2d_backward_weights(p, x.data(), y.data(), w.data(), b.data()); };
        }
        const std::vector<double> best = bench::best_seconds(runs, rounds);
        const double flops = 2.0 * p.n * p.oc * p.c * 9 * p.out_h() * p.out_w();
        const double go = flops / best[0] / 1e9, gd = flops / best[1] / 1e9;
        std::printf("%-36s %9.1f %9.1f %7.2f %6.0f%%\n", name.c_str(), go, gd, gd / go, 100 * gd / fma);
      }
  return 0;
}
