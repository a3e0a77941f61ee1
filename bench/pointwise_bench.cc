// Throughput of the memory-bound pointwise and pooling kernels on the activations of models A and B
// (BENCHMARKS.md), in f32, bf16 and f16, on demi's thread pool (every core by default):
//   relu / gelu forward and backward, MaxPool2d(2, 2) forward (with argmax) and backward, the fused
//   ReLU -> MaxPool2d against ReLU then MaxPool2d (forward and backward), dropout, and model D's attention
//   head split and merge (permute).
// GB/s counts the bytes each variant must move (inputs read once, outputs written once, the 1-byte argmax
// and the 1-bit dropout mask included); compare with the machine's DRAM bandwidth (reduce_bench's memcpy
// rows measure a copy's). Working sets of tens of MB may sit in a large last-level cache, which can lift
// the number past DRAM's.
// "time" is the one to read for fused against separate: they do the same job.
//
//   build/release/bench/pointwise_bench [--threads=N] [--benchmark_filter=relu_maxpool]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "demi/core/dtype.h"
#include "demi/core/half.h"
#include "demi/core/parallel.h"
#include "demi/core/rng.h"
#include "demi/kernels/cpu/activation.h"
#include "demi/kernels/cpu/dropout.h"
#include "demi/kernels/cpu/pool.h"
#include "demi/kernels/cpu/transpose.h"

namespace demi::kernels {
namespace {

struct Shape4 {
  const char* model;
  int64_t n, c, h, w;
  int64_t numel() const { return n * c * h * w; }
};

constexpr Shape4 kShapes[] = {
    {"A", 32, 32, 30, 30},    // model A: conv output before ReLU -> MaxPool2d(2, 2)
    {"B1", 128, 32, 28, 28},  // model B: first conv output
    {"B2", 128, 64, 14, 14},  // model B: second conv output
};
constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// A 64-byte aligned buffer, written once before timing (no page faults inside the loop).
class Buffer {
 public:
  explicit Buffer(size_t bytes) : bytes_((bytes + 63) / 64 * 64), data_(std::aligned_alloc(64, bytes_)) {
    std::memset(data_, 0, bytes_);
  }
  ~Buffer() { std::free(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* get() const { return data_; }
  uint8_t* bytes() const { return static_cast<uint8_t*>(data_); }

 private:
  size_t bytes_;
  void* data_;
};

// Random normal values (a trained network's pre-activation spread), never all zero, in `dtype`.
void fill_random(void* dst, DType dtype, int64_t n, uint64_t seed) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    float v = dist(gen);
    switch (dtype) {
      case DType::kF32: static_cast<float*>(dst)[i] = v; break;
      case DType::kBF16: static_cast<BFloat16*>(dst)[i] = BFloat16(v); break;
      case DType::kF16: static_cast<Half*>(dst)[i] = Half(v); break;
      default: break;
    }
  }
}

void set_rate(benchmark::State& state, double bytes_per_iteration) {
  state.counters["GB/s"] = benchmark::Counter(bytes_per_iteration * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

// The tensors one benchmark touches: x and its gradient at the input size, y and its gradient at the
// pooled size, the argmax and a dropout mask.
struct Tensors {
  Shape4 s;
  DType dtype;
  size_t es;
  Pool2dParams p;
  Buffer x, y, dx, dy, r, pooled, dpooled, argmax, mask;
  Tensors(const Shape4& shape, DType dt)
      : s(shape),
        dtype(dt),
        es(dtype_size(dt)),
        p(make_pool2d_params(shape.n, shape.c, shape.h, shape.w, 2, 2, 2, 2, PadMode::kValid)),
        x(static_cast<size_t>(shape.numel()) * es),
        y(static_cast<size_t>(shape.numel()) * es),
        dx(static_cast<size_t>(shape.numel()) * es),
        dy(static_cast<size_t>(shape.numel()) * es),
        r(static_cast<size_t>(shape.numel()) * es),
        pooled(static_cast<size_t>(p.y_numel()) * es),
        dpooled(static_cast<size_t>(p.y_numel()) * es),
        argmax(static_cast<size_t>(p.y_numel())),
        mask(static_cast<size_t>(dropout_mask_bytes(shape.numel()))) {
    fill_random(x.get(), dt, s.numel(), 1);
    fill_random(dy.get(), dt, s.numel(), 2);
    fill_random(dpooled.get(), dt, p.y_numel(), 3);
    activation_forward(Activation::kReLU, dt, x.get(), r.get(), s.numel());
    relu_max_pool2d_forward(p, dt, x.get(), pooled.get(), argmax.bytes());
  }
  double big() const { return static_cast<double>(s.numel()) * static_cast<double>(es); }  // one input-sized tensor
  double small() const { return static_cast<double>(p.y_numel()) * static_cast<double>(es); }
  double idx() const { return static_cast<double>(p.y_numel()); }
};

// The tensors of the last (shape, dtype) asked for: benchmarks are registered shape by shape and dtype by
// dtype, so consecutive ones share them and the fill is not repeated for every benchmark.
Tensors& tensors(const Shape4& s, DType dt) {
  static std::unique_ptr<Tensors> cached;
  if (!cached || cached->s.numel() != s.numel() || cached->s.c != s.c || cached->dtype != dt) {
    cached.reset();
    cached = std::make_unique<Tensors>(s, dt);
  }
  return *cached;
}

void register_all() {
  for (const Shape4& s : kShapes) {
    for (DType dt : kDTypes) {
      std::string suffix = std::string("/") + s.model + "(" + std::to_string(s.n) + "," + std::to_string(s.c) + "," +
                           std::to_string(s.h) + "," + std::to_string(s.w) + ")/" + std::string(dtype_name(dt));
      auto add = [&](const std::string& name, auto body) {
        benchmark::RegisterBenchmark((name + suffix).c_str(),
                                     [s, dt, body](benchmark::State& state) { body(state, tensors(s, dt)); })
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      };
      // The ceiling in the same run: a parallel memcpy of one input-sized tensor (read + write).
      add("memcpy", [](benchmark::State& state, Tensors& t) {
        size_t bytes = static_cast<size_t>(t.big());
        for (auto _ : state) {
          parallel_for(0, static_cast<int64_t>(bytes), 1 << 16, [&](int64_t b, int64_t e) {
            std::memcpy(t.y.bytes() + b, t.x.bytes() + b, static_cast<size_t>(e - b));
          });
        }
        set_rate(state, 2 * t.big());
      });
      for (Activation a : {Activation::kReLU, Activation::kGelu}) {
        std::string an(activation_name(a));
        add(an + "_fwd", [a](benchmark::State& state, Tensors& t) {
          for (auto _ : state) activation_forward(a, t.dtype, t.x.get(), t.y.get(), t.s.numel());
          set_rate(state, 2 * t.big());
        });
        add(an + "_bwd", [a](benchmark::State& state, Tensors& t) {
          const void* saved = activation_saved(a) == ActivationSaved::kInput ? t.x.get() : t.r.get();
          for (auto _ : state) activation_backward(a, t.dtype, saved, t.dy.get(), t.dx.get(), t.s.numel());
          set_rate(state, 3 * t.big());
        });
      }
      add("maxpool2x2_fwd", [](benchmark::State& state, Tensors& t) {
        for (auto _ : state) max_pool2d_forward(t.p, t.dtype, t.r.get(), t.pooled.get(), t.argmax.bytes());
        set_rate(state, t.big() + t.small() + t.idx());
      });
      add("maxpool2x2_bwd", [](benchmark::State& state, Tensors& t) {
        for (auto _ : state) max_pool2d_backward(t.p, t.dtype, t.dpooled.get(), t.argmax.bytes(), t.dx.get());
        set_rate(state, t.big() + t.small() + t.idx());
      });
      add("relu_maxpool_fused_fwd", [](benchmark::State& state, Tensors& t) {
        for (auto _ : state) relu_max_pool2d_forward(t.p, t.dtype, t.x.get(), t.pooled.get(), t.argmax.bytes());
        set_rate(state, t.big() + t.small() + t.idx());
      });
      add("relu_maxpool_separate_fwd", [](benchmark::State& state, Tensors& t) {
        for (auto _ : state) {
          activation_forward(Activation::kReLU, t.dtype, t.x.get(), t.r.get(), t.s.numel());
          max_pool2d_forward(t.p, t.dtype, t.r.get(), t.pooled.get(), t.argmax.bytes());
        }
        set_rate(state, 3 * t.big() + t.small() + t.idx());
      });
      add("relu_maxpool_fused_bwd", [](benchmark::State& state, Tensors& t) {
        for (auto _ : state) max_pool2d_backward(t.p, t.dtype, t.dpooled.get(), t.argmax.bytes(), t.dx.get());
        set_rate(state, t.big() + t.small() + t.idx());
      });
      add("relu_maxpool_separate_bwd", [](benchmark::State& state, Tensors& t) {
        for (auto _ : state) {
          max_pool2d_backward(t.p, t.dtype, t.dpooled.get(), t.argmax.bytes(), t.dy.get());
          activation_backward(Activation::kReLU, t.dtype, t.r.get(), t.dy.get(), t.dx.get(), t.s.numel());
        }
        set_rate(state, 4 * t.big() + t.small() + t.idx());
      });
      add("dropout_fwd", [](benchmark::State& state, Tensors& t) {
        Generator gen(7);
        for (auto _ : state) {
          DropoutParams dp = make_dropout_params(0.5f, gen, t.s.numel());
          dropout_forward(dp, t.dtype, t.x.get(), t.y.get(), t.mask.bytes(), t.s.numel());
        }
        set_rate(state, 2 * t.big() + static_cast<double>(dropout_mask_bytes(t.s.numel())));
      });
      add("dropout_bwd", [](benchmark::State& state, Tensors& t) {
        for (auto _ : state) dropout_backward(0.5f, t.dtype, t.dy.get(), t.mask.bytes(), t.dx.get(), t.s.numel());
        set_rate(state, 2 * t.big() + static_cast<double>(dropout_mask_bytes(t.s.numel())));
      });
    }
  }
  // Model D's attention layouts (32 sequences x 128 tokens, 4 heads of 64): the packed q, k, v split into
  // heads, (B, S, 3, H, Dh) -> (3, B, H, S, Dh), and the heads merged back, (B, H, S, Dh) -> (B, S, H, Dh):
  // runs of Dh contiguous elements, against a parallel memcpy of the same bytes.
  struct Permutation {
    const char* name;
    std::vector<int64_t> shape;
    std::vector<int> perm;
  };
  const Permutation perms[] = {{"split_heads", {32, 128, 3, 4, 64}, {2, 0, 3, 1, 4}},
                               {"merge_heads", {32, 4, 128, 64}, {0, 2, 1, 3}}};
  for (const Permutation& pm : perms)
    for (DType dt : {DType::kF32, DType::kBF16}) {
      int64_t n = 1;
      for (int64_t d : pm.shape) n *= d;
      const size_t bytes = static_cast<size_t>(n) * dtype_size(dt);
      auto buffers = std::make_shared<std::pair<Buffer, Buffer>>(bytes, bytes);
      const std::string suffix = std::string("/D/") + std::string(dtype_name(dt));
      benchmark::RegisterBenchmark(("permute_" + std::string(pm.name) + suffix).c_str(),
                                   [pm, dt, bytes, buffers](benchmark::State& state) {
                                     for (auto _ : state)
                                       permute(buffers->first.get(), dtype_size(dt), pm.shape, pm.perm,
                                               buffers->second.get());
                                     set_rate(state, 2.0 * static_cast<double>(bytes));
                                   })
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("permute_memcpy" + std::string("_") + pm.name + suffix).c_str(),
                                   [bytes, buffers](benchmark::State& state) {
                                     for (auto _ : state)
                                       parallel_for(0, static_cast<int64_t>(bytes), 1 << 16, [&](int64_t b, int64_t e) {
                                         std::memcpy(buffers->second.bytes() + b, buffers->first.bytes() + b,
                                                     static_cast<size_t>(e - b));
                                       });
                                     set_rate(state, 2.0 * static_cast<double>(bytes));
                                   })
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
}

}  // namespace
}  // namespace demi::kernels

int main(int argc, char** argv) {
  // --threads=N sets demi's thread count (default: every core); the rest goes to Google Benchmark.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0)
      demi::set_num_threads(std::atoi(argv[i] + 10));
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  std::printf("demi threads: %d\n", demi::num_threads());
  demi::kernels::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
