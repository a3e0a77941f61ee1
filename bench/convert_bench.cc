// Bulk conversion throughput (f32 <-> f16, f32 <-> bf16), one thread, for every ISA variant this machine
// supports, on an L1-resident buffer and on a buffer far larger than the caches (DRAM-bound), reported as
// Gelem/s next to the hardware ceilings measured in BENCHMARKS.md.
//
//   build/release/bench/convert_bench [--benchmark_filter=bf16]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"

namespace demi {
namespace {

constexpr int64_t kL1Elems = 4096;            // 16 KiB of f32 + 8 KiB of f16: fits a 48 KiB L1d
constexpr int64_t kDramElems = int64_t{64} << 20;  // 256 MiB of f32 + 128 MiB of f16

// 64-byte aligned, as demi's allocator hands out tensors (a 64-byte store that splits two cache lines
// costs twice).
template <typename T>
struct Aligned {
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> p;
  explicit Aligned(int64_t n)
      : p(static_cast<T*>(std::aligned_alloc(64, (static_cast<size_t>(n) * sizeof(T) + 63) / 64 * 64))) {}
  T* data() const { return p.get(); }
};

// One f32 and one 16-bit buffer per size, filled once (no first-touch page faults inside the timing)
// with values of a trained network's spread, never all zero.
struct Buffers {
  Aligned<float> f32;
  Aligned<Half> f16;
  Aligned<BFloat16> bf16;

  explicit Buffers(int64_t n) : f32(n), f16(n), bf16(n) {
    std::mt19937 gen(42);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    for (int64_t i = 0; i < n; ++i) f32.data()[i] = dist(gen);
    internal::f32_to_f16_scalar(f32.data(), f16.data(), n);
    internal::f32_to_bf16_scalar(f32.data(), bf16.data(), n);
  }
};

Buffers& buffers(int64_t n) {
  static Buffers l1(kL1Elems);
  if (n == kL1Elems) return l1;
  static Buffers dram(kDramElems);
  return dram;
}

template <typename Src, typename Dst>
void run(benchmark::State& state, void (*kernel)(const Src*, Dst*, int64_t), const Src* src, Dst* dst,
         int64_t n) {
  for (auto _ : state) {
    kernel(src, dst, n);
    benchmark::ClobberMemory();
  }
  state.counters["Gelem/s"] =
      benchmark::Counter(static_cast<double>(n) * static_cast<double>(state.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(n * static_cast<int64_t>(sizeof(Src) + sizeof(Dst))) *
          static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void register_all() {
  for (CpuLevel level : supported_cpu_levels()) {
    const internal::ConvertKernels* k = &internal::convert_kernels(level);
    std::string lv(cpu_level_name(level));
    for (int64_t n : {kL1Elems, kDramElems}) {
      std::string size = n == kL1Elems ? "L1/4096" : "DRAM/64Mi";
      auto reg = [&](const char* dir, auto fn) {
        benchmark::RegisterBenchmark((std::string(dir) + "/" + lv + "/" + size).c_str(), fn)
            ->MinTime(n == kL1Elems ? 0.2 : 0.5)
            ->Unit(benchmark::kMicrosecond);
      };
      reg("f16_to_f32", [k, n](benchmark::State& s) {
        Buffers& b = buffers(n);
        run(s, k->f16_to_f32, b.f16.data(), b.f32.data(), n);
      });
      reg("f32_to_f16", [k, n](benchmark::State& s) {
        Buffers& b = buffers(n);
        run(s, k->f32_to_f16, b.f32.data(), b.f16.data(), n);
      });
      reg("bf16_to_f32", [k, n](benchmark::State& s) {
        Buffers& b = buffers(n);
        run(s, k->bf16_to_f32, b.bf16.data(), b.f32.data(), n);
      });
      reg("f32_to_bf16", [k, n](benchmark::State& s) {
        Buffers& b = buffers(n);
        run(s, k->f32_to_bf16, b.f32.data(), b.bf16.data(), n);
      });
    }
  }
}

}  // namespace
}  // namespace demi

int main(int argc, char** argv) {
  std::printf(
      "Ceilings measured on this machine class (BENCHMARKS.md, one core): F16C f16->f32 ~46 Gelem/s in L1;\n"
      "f32->bf16 ~87 Gelem/s; DRAM ~57-70 GB/s for both cores together. One thread here; best level: %s.\n\n",
      std::string(demi::cpu_level_name(demi::max_cpu_level())).c_str());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  demi::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
