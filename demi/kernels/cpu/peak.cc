#include "demi/kernels/cpu/peak.h"

#include <atomic>
#include <chrono>

#include "demi/core/cpu.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/peak_kernels.h"

namespace demi::kernels::cpu_internal {

const PeakKernels& peak_kernels_scalar() {
  static const PeakKernels k;  // no vector instruction to measure
  return k;
}

}  // namespace demi::kernels::cpu_internal

namespace demi::kernels::cpu {
namespace {

// Every thread runs `loop` in rounds until `seconds` have passed; GFLOP/s = all FLOPs / wall time.
double measure(double (*loop)(int64_t, float*), double seconds) {
  using Clock = std::chrono::steady_clock;
  const int threads = num_threads();
  std::atomic<double> flops{0};
  float sink = 0;
  loop(1 << 12, &sink);  // warm up (clock ramp, the vector unit's power-up)
  const auto start = Clock::now();
  parallel_for(0, threads, 0, [&](int64_t, int64_t) {
    float s = 0;
    double done = 0;
    while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) done += loop(1 << 16, &s);
    double cur = flops.load();
    while (!flops.compare_exchange_weak(cur, cur + done)) {
    }
    if (s == 12345.0f) flops.store(0);  // never true; keeps s alive
  });
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  return sink == 12345.0f ? 0 : flops.load() / wall / 1e9;
}

const cpu_internal::PeakKernels& peak_kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<PeakKernels> table{DEMI_KERNEL_TABLE_ENTRIES(peak)};
  return table.get();
}

// The loop's rate, or 0 where the level has no such instruction (a null loop).
double measured(double (*loop)(int64_t, float*), double seconds) { return loop != nullptr ? measure(loop, seconds) : 0; }

}  // namespace

double fma_peak_gflops(double seconds) { return measured(peak_kernels().fma_loop, seconds); }
double bf16_peak_gflops(double seconds) { return measured(peak_kernels().bf16_loop, seconds); }
double amx_peak_gflops(double seconds) { return measured(peak_kernels().amx_loop, seconds); }
double fp16_peak_gflops(double seconds) { return measured(peak_kernels().fp16_loop, seconds); }

}  // namespace demi::kernels::cpu
