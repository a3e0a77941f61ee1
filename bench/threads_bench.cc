// Does demi oversubscribe the cores when its loops alternate with oneDNN's primitives? (PyTorch slows down
// badly here: its OpenMP workers spin while BLAS threads want the same cores.)
//
// demi's parallel_for and oneDNN both run on GNU libgomp, so they share one team. This compares
//   - a memory-bound demi loop alone, a oneDNN 512^3 sgemm alone, and the two alternating;
//   - the same alternation with the loop on a separate std::thread pool, as a second runtime would be;
// each reporting the process's threads. It also measures parallel_for's dispatch overhead (empty body).
// The alternation should cost about the sum of its parts; compare `Alternate*` with `Loop + Sgemm`.
//
//   build/release/bench/threads_bench [--benchmark_filter=Dispatch]
//   OMP_WAIT_POLICY=passive build/release/bench/threads_bench
//
// Run it both ways on a shared machine: libgomp's default wait (spin ~300k pauses, then sleep) keeps a
// core while another process wants it, and a parallel region then waits out scheduler time slices
// (under load, an empty region then costs orders of magnitude more by default than with
// OMP_WAIT_POLICY=passive: compare BM_DispatchParallel both ways).
#include <benchmark/benchmark.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "demi/core/error.h"
#include "demi/core/parallel.h"

namespace {

int process_threads() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// y = a * x + y over 2^21 floats each (16 MiB in all, beyond the L2 caches): bandwidth-bound.
constexpr int64_t kLoopElems = int64_t{1} << 21;
constexpr int64_t kGemmN = 512;

struct Buffers {
  std::vector<float> x = std::vector<float>(kLoopElems, 1.0f);
  std::vector<float> y = std::vector<float>(kLoopElems, 0.0f);
  std::vector<float> a = std::vector<float>(kGemmN * kGemmN, 0.5f);
  std::vector<float> b = std::vector<float>(kGemmN * kGemmN, 0.25f);
  std::vector<float> c = std::vector<float>(kGemmN * kGemmN, 0.0f);
};

void axpy(Buffers& buf, int64_t lo, int64_t hi) {
  float* y = buf.y.data();
  const float* x = buf.x.data();
  for (int64_t i = lo; i < hi; ++i) y[i] = 0.999f * x[i] + y[i];
}

void demi_loop(Buffers& buf) {
  demi::parallel_for(0, kLoopElems, 4096, [&](int64_t lo, int64_t hi) { axpy(buf, lo, hi); });
}

void sgemm(Buffers& buf) {
  dnnl_status_t st = dnnl_sgemm('N', 'N', kGemmN, kGemmN, kGemmN, 1.0f, buf.a.data(), kGemmN, buf.b.data(),
                                kGemmN, 0.0f, buf.c.data(), kGemmN);
  DEMI_CHECK(st == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(st));
}

void report(benchmark::State& state) {
  state.counters["threads"] = process_threads();
  state.counters["demi_threads"] = demi::num_threads();
}

void BM_Loop(benchmark::State& state) {
  Buffers buf;
  for (auto _ : state) demi_loop(buf);
  state.SetBytesProcessed(state.iterations() * kLoopElems * 3 * int64_t{sizeof(float)});
  report(state);
}

void BM_Sgemm(benchmark::State& state) {
  Buffers buf;
  for (auto _ : state) sgemm(buf);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kGemmN * kGemmN * kGemmN * state.iterations(),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  report(state);
}

void BM_AlternateSharedPool(benchmark::State& state) {
  Buffers buf;
  for (auto _ : state) {
    demi_loop(buf);
    sgemm(buf);
  }
  report(state);
}

// A plain std::thread pool (workers sleep on a condition variable; the caller takes chunk 0), standing in
// for a framework whose own pool is not the runtime its BLAS uses.
class SeparatePool {
 public:
  explicit SeparatePool(int threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t, threads] { work(t, threads); });
  }
  ~SeparatePool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    start_.notify_all();
    for (auto& w : workers_) w.join();
  }

  // Calls fn(t, threads) for t in [0, threads) and waits for all.
  void run(std::function<void(int, int)> fn) {
    int threads = static_cast<int>(workers_.size()) + 1;
    {
      std::lock_guard<std::mutex> lock(m_);
      fn_ = std::move(fn);
      pending_ = threads - 1;
      ++generation_;
    }
    start_.notify_all();
    fn_(0, threads);
    std::unique_lock<std::mutex> lock(m_);
    done_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  void work(int t, int threads) {
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(m_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      lock.unlock();
      fn_(t, threads);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable start_, done_;
  std::function<void(int, int)> fn_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

void BM_AlternateSeparatePool(benchmark::State& state) {
  Buffers buf;
  SeparatePool pool(demi::num_threads());
  for (auto _ : state) {
    pool.run([&](int t, int nt) {
      int64_t chunk = (kLoopElems + nt - 1) / nt;
      axpy(buf, t * chunk, std::min(kLoopElems, (t + 1) * chunk));
    });
    sgemm(buf);
  }
  report(state);  // the pool's threads are still alive here
}

// What one parallel_for costs beyond its work: an empty body split across every thread, and the inline
// path (range within one grain) for comparison.
void BM_DispatchParallel(benchmark::State& state) {
  const int64_t n = demi::num_threads();
  for (auto _ : state) {
    demi::parallel_for(0, n, 1, [](int64_t lo, int64_t hi) { benchmark::DoNotOptimize(lo + hi); });
  }
  report(state);
}

void BM_DispatchInline(benchmark::State& state) {
  for (auto _ : state) {
    demi::parallel_for(0, 16, 16, [](int64_t lo, int64_t hi) { benchmark::DoNotOptimize(lo + hi); });
  }
}

BENCHMARK(BM_Loop)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Sgemm)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_AlternateSharedPool)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_DispatchParallel)->UseRealTime();
BENCHMARK(BM_DispatchInline)->UseRealTime();
// Last: its pool's threads are joined when it ends, but run it after the others anyway.
BENCHMARK(BM_AlternateSeparatePool)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
