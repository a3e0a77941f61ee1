// Scaled dot-product attention's bf16 core (demi/kernels/attention.h) at the amx level: the fused kernels
// ("tiles": per matrix on one thread, the scores in the thread's buffer) against the batched products
// around the softmax ("products": the (N, Sq, Sk) f32 scores in memory), forward and backward, interleaved
// in one run (best of the rounds), with the tile unit's ceiling measured in every round. Shapes: model D's
// layer (32 sequences x 4 heads, 128 tokens, 64 per head) and a few around it.
//
//   build/release/bench/attention_bench [--rounds N] [--filter SUBSTRING] [--threads N]
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "demi/core/cpu.h"
#include "demi/core/parallel.h"
#include "demi/kernels/attention.h"
#include "demi/kernels/cpu/peak.h"

int main(int argc, char** argv) {
  using namespace demi;
  const bench::CompareOptions opts = bench::parse_compare_options(argc, argv);
  if (opts.threads > 0) set_num_threads(opts.threads);
  if (cpu_level() < CpuLevel::kAmx) {
    std::printf("attention_bench: the fused kernels run at the amx level only; this CPU's level is %s\n",
                std::string(cpu_level_name(cpu_level())).c_str());
    return 0;
  }
  struct Case {
    const char* name;
    int64_t batch, heads, s, d;
  };
  const std::vector<Case> cases = {{"D 32x4 S128 d64", 128, 4, 128, 64},
                                   {"32x4 S64 d64", 128, 4, 64, 64},
                                   {"8x4 S256 d64", 32, 4, 256, 64},
                                   {"32x8 S128 d32", 256, 8, 128, 32}};
  std::printf("threads %d; GFLOP/s of the four (forward) or ten (backward: with the scores again) products\n",
              num_threads());
  std::printf("%-22s %4s %10s %10s %10s %8s %8s\n", "shape", "dir", "products", "tiles", "in place", "i/p",
              "amx pk");
  for (const Case& c : cases) {
    if (!opts.filter.empty() && std::string(c.name).find(opts.filter) == std::string::npos) continue;
    kernels::AttentionCoreParams p;
    p.softmax.batch = c.batch;
    p.softmax.heads = c.heads;
    p.softmax.rows = p.softmax.cols = c.s;
    p.softmax.scale = 0.125f;
    p.dk = p.dv = c.d;
    const int64_t qkv_elems = c.batch * c.s * c.d, sc = c.batch * c.s * c.s;
    const int64_t n = qkv_elems;
    bench::Buffer q(DType::kBF16, n, 1), k(DType::kBF16, n, 2), v(DType::kBF16, n, 3), dout(DType::kBF16, n, 4),
        probs(DType::kBF16, sc, 5), out(DType::kBF16, n, 6), dq(DType::kBF16, n, 7), dk(DType::kBF16, n, 8),
        dv(DType::kBF16, n, 9);
    double ceiling = 0;
    auto each_round = [&] { ceiling = std::max(ceiling, kernels::cpu::amx_peak_gflops(0.02)); };
    const double flops = 2.0 * c.batch * c.s * c.s * c.d * 2;  // q kᵀ and p v
    // The heads in place (self-attention over a packed (B, S, 3 E) projection, out (B, S, E)): the same work.
    kernels::AttentionCoreParams pp = p;
    pp.packed_heads = true;
    bench::Buffer qkv(DType::kBF16, 3 * qkv_elems, 10), dqkv(DType::kBF16, 3 * qkv_elems, 11);
    for (bool backward : {false, true}) {
      auto run = [&](kernels::AttentionPolicy policy) {
        return [&, policy] {
          kernels::set_attention_policy(policy);
          if (!backward)
            kernels::attention_core_forward(p, q.data(), k.data(), v.data(), nullptr, probs.data(), out.data());
          else
            kernels::attention_core_backward(p, q.data(), k.data(), v.data(), probs.data(), dout.data(), dq.data(),
                                             dk.data(), dv.data());
        };
      };
      auto in_place = [&] {
        if (!backward)
          kernels::attention_core_forward(pp, qkv.data(), nullptr, nullptr, nullptr, probs.data(), out.data());
        else
          kernels::attention_core_backward(pp, qkv.data(), nullptr, nullptr, probs.data(), dout.data(), dqkv.data(),
                                           nullptr, nullptr);
      };
      ceiling = 0;
      const std::vector<double> best = bench::best_seconds(
          {run(kernels::AttentionPolicy::kProducts), run(kernels::AttentionPolicy::kTiles), in_place}, opts.rounds,
          each_round);
      const double f = backward ? 2 * flops : flops;  // (dv, dp, dq, dk)
      std::printf("%-22s %4s %10.1f %10.1f %10.1f %8.2f %8.0f\n", c.name, backward ? "bwd" : "fwd",
                  f / best[0] * 1e-9, f / best[1] * 1e-9, f / best[2] * 1e-9, best[0] / best[2], ceiling);
    }
  }
  kernels::set_attention_policy(kernels::AttentionPolicy::kAuto);
  return 0;
}
