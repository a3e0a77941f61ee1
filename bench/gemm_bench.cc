// demi's GEMM (demi/kernels/cpu/gemm.h; and its few-column dot kernel, cpu/gemm_dot.h, and short-K kernel,
// cpu/gemm_outer.h, where they apply)
// against oneDNN's matmul (demi/kernels/onednn/matmul.h) on the
// reference models' product shapes and 1024^3, per dtype and direction, interleaved in one run (each
// pair alternates; best of the rounds), with the ceilings measured in the same run: f32 FMA, vdpbf16ps and,
// at the amx level, the tile unit's TDPBF16PS (again in every round of a bf16 or f16 row: "pk", the row's
// ceiling) and AVX512-FP16's vfmaddph. demi-amx is demi's AMX GEMM
// (cpu/gemm_amx.h: bf16 values as they are, f16 values exactly as four bf16 products, whose ceiling is
// a quarter of the tile unit's).
// f16 through oneDNN includes widening the operands (it has no f16 kernels); demi converts in packing.
// "f16->bf16": the f16 products with their values rounded to bf16 on the pair kernel (MatmulParams::
// bf16_products, `--f16-products bf16`: other numbers, an explicit option), where the CPU has AVX512-BF16.
//
//   build/release/bench/gemm_bench [--rounds N] [--filter SUBSTRING]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/dtype.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/gemm.h"
#include "demi/kernels/cpu/gemm_amx.h"
#include "demi/kernels/cpu/gemm_dot.h"
#include "demi/kernels/cpu/gemm_outer.h"
#include "demi/kernels/cpu/peak.h"
#include "demi/kernels/matmul.h"
#include "demi/kernels/onednn/matmul.h"

namespace demi {
namespace {

using kernels::MatmulParams;

using bench::Buffer;

const char* tag(DType t) { return t == DType::kF32 ? "f32" : t == DType::kBF16 ? "bf16" : "f16"; }

struct Case {
  std::string name;
  MatmulParams p;
};

// The three products of a Dense layer x (m, k) -> y (m, n) in dtype t: forward (x w^T + bias, ReLU),
// input gradient (dy w) and weight gradient (dy^T x into f32, AMP's master gradient).
void dense_cases(std::vector<Case>& out, const char* model, int64_t m, int64_t k, int64_t n, DType t) {
  const std::string base = std::string(model) + " " + std::to_string(k) + "->" + std::to_string(n) + " " + tag(t);
  MatmulParams f;
  f.m = m;
  f.n = n;
  f.k = k;
  f.trans_b = true;
  f.a_dtype = f.b_dtype = f.c_dtype = t;
  f.relu = true;
  out.push_back({base + " fwd", f});
  MatmulParams d;
  d.m = m;
  d.n = k;
  d.k = n;
  d.a_dtype = d.b_dtype = d.c_dtype = t;
  out.push_back({base + " dx", d});
  if (t != DType::kF32) {  // the FP32 master weight read rounded to t (no low copy): b_round
    f.b_dtype = d.b_dtype = DType::kF32;
    f.b_round = d.b_round = t;
    out.push_back({base + " fwd w32", f});
    out.push_back({base + " dx w32", d});
  }
  MatmulParams w;
  w.m = n;
  w.n = k;
  w.k = m;
  w.trans_a = true;
  w.a_dtype = w.b_dtype = t;
  w.c_dtype = DType::kF32;
  out.push_back({base + " dw", w});
}

}  // namespace
}  // namespace demi

int main(int argc, char** argv) {
  using namespace demi;
  const bench::CompareOptions opts = bench::parse_compare_options(argc, argv);
  if (opts.threads > 0) set_num_threads(opts.threads);
  const int rounds = opts.rounds;
  const std::string& filter = opts.filter;
  std::vector<Case> cases;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    MatmulParams p;
    p.m = p.n = p.k = 1024;
    p.a_dtype = p.b_dtype = p.c_dtype = t;
    cases.push_back({std::string("1024^3 ") + tag(t), p});
    dense_cases(cases, "A", 32, 7200, 10, t);  // the classifier: a few-column forward (demi-dot's case)
    dense_cases(cases, "C", 256, 784, 1024, t);
    dense_cases(cases, "C", 256, 1024, 1024, t);
    dense_cases(cases, "B", 128, 3136, 128, t);
    for (auto [k, n] : {std::pair<int64_t, int64_t>{256, 768}, {256, 256}, {256, 1024}, {1024, 256}})
      dense_cases(cases, "D", 4096, k, n, t);
  }
  const double fma = kernels::cpu::fma_peak_gflops(0.3), bf16 = kernels::cpu::bf16_peak_gflops(0.3);
  const double amx = kernels::cpu::amx_peak_gflops(0.3), fp16 = kernels::cpu::fp16_peak_gflops(0.3);
  std::printf("threads %d, cpu level %s; measured ceilings (GFLOP/s): f32 FMA %.0f, bf16 vdpbf16ps %.0f, AMX "
              "tdpbf16ps %.0f, AVX512-FP16 vfmaddph %.0f (0: not on this CPU)\n",
              num_threads(), std::string(cpu_level_name(cpu_level())).c_str(), fma, bf16, amx, fp16);
  std::printf("%-30s %8s %8s %9s %8s %10s %8s %7s %7s %7s %9s %7s\n", "product (GFLOP/s)", "oneDNN", "demi-f32",
              "demi-bf16", "demi-dot", "demi-outer", "demi-amx", "best/o", "o %pk", "best%pk", "f16->bf16", "pk");
  for (Case& c : cases) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    const MatmulParams& p = c.p;
    Buffer a(p.a_dtype, p.m * p.k, 1), b(p.b_dtype, p.k * p.n, 2), out(p.c_dtype, p.m * p.n, 3), bias(DType::kF32, p.n, 4);
    MatmulParams q = p;
    q.bias = p.trans_b ? bias.data() : nullptr;
    const double flops = 2.0 * p.m * p.n * p.k;
    const bool bf16_in = p.a_dtype == DType::kBF16 && kernels::b_value_dtype(p) == DType::kBF16;
    // A rounded b: oneDNN runs on the rounded copy kernels::matmul makes for the call (its policy pinned
    // to oneDNN for these rows).
    MatmulParams qo = q;
    if (q.b_round != DType::kF32) qo.b_dtype = std::exchange(qo.b_round, DType::kF32);
    std::vector<std::function<void()>> runs = {
        [&] {
          if (q.b_round == DType::kF32) return kernels::onednn::matmul(q, a.data(), b.data(), out.data());
          const kernels::MatmulPolicy saved = kernels::matmul_policy();
          kernels::set_matmul_policy(kernels::MatmulPolicy::kOnednn);
          kernels::matmul(q, a.data(), b.data(), out.data());
          kernels::set_matmul_policy(saved);
        },
        [&] { kernels::cpu::gemm(q, a.data(), b.data(), out.data(), kernels::cpu::GemmPath::kF32); }};
    const bool pairs = bf16_in && kernels::cpu::gemm_has_bf16_dot(), dot = kernels::cpu::gemm_dot_supported(q);
    if (pairs)
      runs.push_back([&] { kernels::cpu::gemm(q, a.data(), b.data(), out.data(), kernels::cpu::GemmPath::kBf16Dot); });
    if (dot) runs.push_back([&] { kernels::cpu::gemm_dot(q, a.data(), b.data(), out.data()); });
    const bool outer = kernels::cpu::gemm_outer_supported(q);
    if (outer) runs.push_back([&] { kernels::cpu::gemm_outer(q, a.data(), b.data(), out.data()); });
    const bool tiles = kernels::cpu::amx_gemm_supported(q);
    if (tiles) runs.push_back([&] { kernels::cpu::amx_gemm(q, a.data(), b.data(), out.data()); });
    // (Last, and apart from the exact kernels' best: it computes other numbers.)
    MatmulParams qb = q;
    qb.bf16_products = true;
    const bool f16_values = p.a_dtype == DType::kF16 && kernels::b_value_dtype(p) == DType::kF16;
    const bool as_bf16 = f16_values && kernels::cpu::gemm_has_bf16_dot();
    if (as_bf16)
      runs.push_back([&] { kernels::cpu::gemm(qb, a.data(), b.data(), out.data(), kernels::cpu::GemmPath::kBf16Dot); });
    // The tile unit's ceiling again in every round, its best kept for this row: on a shared host it swung
    // 2,100-4,700 GFLOP/s on 2 cores within an hour while the FMA ceiling held within 5%, so a ceiling from
    // the start of the run could be from another state of the machine than the row's best times.
    double row_amx = 0;
    const bool amx_row = amx > 0 && (bf16_in || f16_values);
    const std::vector<double> best = bench::best_seconds(runs, rounds, [&] {
      if (amx_row) row_amx = std::max(row_amx, kernels::cpu::amx_peak_gflops(0.02));
    });
    std::vector<double> g;
    for (double t : best) g.push_back(flops / t / 1e9);
    const double demi_best = *std::max_element(g.begin() + 1, g.end() - (as_bf16 ? 1 : 0));
    // The ceiling of the fastest exact kernel for the dtype: bf16 pairs where they beat the FMA rate, the
    // tile unit (a quarter of it for f16 values: four products each), the tile unit's measured in the row's
    // rounds.
    const double tile = amx_row ? row_amx : amx;
    const double peak = bf16_in ? std::max({fma, bf16, tile}) : f16_values ? std::max(fma, tile / 4) : fma;
    auto column = [&](bool has, size_t i) { return has ? std::to_string(static_cast<int>(g[i])) : std::string("-"); };
    const size_t dot_at = 2 + (pairs ? 1 : 0), outer_at = dot_at + (dot ? 1 : 0), amx_at = outer_at + (outer ? 1 : 0);
    std::printf("%-30s %8.1f %8.1f %9s %8s %10s %8s %7.2f %6.0f%% %6.0f%% %9s %7.0f  %s\n", c.name.c_str(), g[0], g[1],
                column(pairs, 2).c_str(), column(dot, dot_at).c_str(), column(outer, outer_at).c_str(),
                column(tiles, amx_at).c_str(),
                demi_best / g[0], 100 * g[0] / peak,
                100 * demi_best / peak, column(as_bf16, g.size() - 1).c_str(), peak,
                kernels::onednn::matmul_implementation(qo).c_str());
  }
  return 0;
}
