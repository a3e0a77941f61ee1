// Gradient all-reduce cost on the ranks it is launched with: fp32 MPI_Allreduce(SUM) against the bf16 wire
// scheme of --comm-dtype bf16, for message sizes 4 B .. 64 MiB, and the alpha/beta fit of the fp32 series
// that docs/scaling.md turns into scaling predictions.
//
// The bf16 scheme: each rank rounds its f32 buffer to bf16 (nearest even), MPI_Alltoall of p equal bf16
// chunks (the element count padded up to a multiple of p), a local f32 sum of the p received chunks in rank
// order rounded once to bf16, MPI_Allgather of the summed chunk, and back to f32. It sends the bytes of a
// ring all-reduce at 2 bytes per element but rounds the sum once instead of at every hop (Megatron #6199).
// It is demi's own implementation (demi/distributed), timed whole as training runs it: conversions and the
// hand-over to the communication thread included.
//
// Each timed call follows an MPI_Barrier; a repetition's time is the slowest rank's (max over ranks); the
// table gives the best and the median over repetitions, after warm-up. An MPI program (C API, MPI-3.1),
// not a Google Benchmark binary.
//
// Run: mpirun -np 2 build/release/bench/allreduce_bench [--sizes-max BYTES] [--reps N] [--csv]
//      (docs/scaling.md has the exact command lines; without mpirun it runs as world size 1.)
#define OMPI_SKIP_MPICXX 1  // the C API only: MPI-2's C++ bindings were removed in MPI-3
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "demi/distributed/distributed.h"
#include "demi/distributed/internal/comm.h"

namespace {

constexpr int kUsageError = 2;
constexpr int64_t kLargeBytes = int64_t{4} << 20;  // above this, fewer repetitions (see usage)

struct Options {
  int64_t sizes_max = int64_t{64} << 20;
  int reps = 50;
  bool csv = false;
  bool help = false;
};

const char* const kUsage =
    "usage: allreduce_bench [--sizes-max BYTES] [--reps N] [--csv] [--help]\n"
    "  --sizes-max BYTES  largest message, a multiple of 4, >= 4 (default 67108864 = 64 MiB);\n"
    "                     sizes are 4, 16, 64, ... (powers of 4) up to it, plus BYTES itself\n"
    "  --reps N           timed repetitions per size, N >= 1 (default 50); sizes above 4 MiB\n"
    "                     use max(5, N/4)\n"
    "  --csv              machine-readable lines instead of the table\n"
    "Launch with mpirun -np P; alone it runs as world size 1.\n";

bool parse_int(const char* s, int64_t lo, int64_t hi, int64_t* out) {
  if (s == nullptr || *s == '\0') return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Returns an empty string on success, else the message to print.
std::string parse_options(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    int64_t v = 0;
    if (a == "--help" || a == "-h") {
      o->help = true;
    } else if (a == "--csv") {
      o->csv = true;
    } else if (a == "--sizes-max") {
      if (!parse_int(value, 4, int64_t{1} << 32, &v) || v % 4 != 0)
        return "--sizes-max expects a multiple of 4 between 4 and 4294967296 bytes, got '" +
               std::string(value ? value : "") + "'";
      o->sizes_max = v;
      ++i;
    } else if (a == "--reps") {
      if (!parse_int(value, 1, 1000000, &v))
        return "--reps expects an integer between 1 and 1000000, got '" + std::string(value ? value : "") + "'";
      o->reps = static_cast<int>(v);
      ++i;
    } else {
      return "unknown option '" + a + "'";
    }
  }
  return "";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown" : line.substr(start);
  }
  return "unknown";
}

// demi's bf16 all-reduce itself (dist::internal::all_reduce_bf16_sum: demi's conversion kernels, an
// all-to-all, one FP32 rounding, an all-gather), run where demi runs it, on the communication thread.
struct Bf16Scheme {
  size_t n;
  Bf16Scheme(size_t n_, int) : n(n_) {}
  // in (n f32) -> out (n f32), the sum over ranks.
  void run(const float* in, float* out) const {
    std::copy(in, in + n, out);
    demi::dist::internal::run_on_comm_thread(
        [&] { demi::dist::internal::all_reduce_bf16_sum(out, static_cast<int64_t>(n)); }, "allreduce_bench bf16");
  }
};

struct Stats {
  double best, median;
};

// Best and median over repetitions of the slowest rank's time per repetition.
template <class F>
Stats time_collective(F&& f, int reps) {
  const int warmup = std::max(2, reps / 10);
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    f();
    t[static_cast<size_t>(i)] = MPI_Wtime() - t0;
  }
  MPI_Allreduce(MPI_IN_PLACE, t.data(), reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  std::sort(t.begin(), t.end());
  const size_t m = t.size() / 2;
  const double median = t.size() % 2 ? t[m] : 0.5 * (t[m - 1] + t[m]);
  return {t.front(), median};
}

// A value every rank can regenerate for (rank, i): the checks need every rank's input.
float input_value(int rank, size_t i) {
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(rank + 1) * 40503u;
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  return static_cast<float>(static_cast<int32_t>(x % 20001u) - 10000) * 1e-4f;  // [-1, 1], never all 0
}

// One call of each scheme on a size that is not a multiple of p (the padding path), against a double sum.
// fp32 within 1e-6 of sum|x|, bf16 within 2^-7 of it (two bf16 roundings, 2^-9 each, plus f32 addition).
// Returns false on this rank's failure, after printing it.
bool check_results(int rank, int p) {
  const size_t n = 100003;
  std::vector<float> in(n), out(n);
  for (size_t i = 0; i < n; ++i) in[i] = input_value(rank, i);
  MPI_Allreduce(in.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  std::vector<float> out16(n);
  Bf16Scheme scheme(n, p);
  scheme.run(in.data(), out16.data());
  double err32 = 0, err16 = 0;
  for (size_t i = 0; i < n; ++i) {
    double exact = 0, magnitude = 0;
    for (int r = 0; r < p; ++r) {
      exact += input_value(r, i);
      magnitude += std::fabs(input_value(r, i));
    }
    if (magnitude == 0) continue;
    err32 = std::max(err32, std::fabs(out[i] - exact) / magnitude);
    err16 = std::max(err16, std::fabs(out16[i] - exact) / magnitude);
  }
  const bool ok = err32 <= 1e-6 && err16 <= 1.0 / 128;
  if (!ok)
    std::fprintf(stderr, "allreduce_bench: rank %d: wrong sums (max error / sum|x|: fp32 %.3g, bf16 %.3g)\n",
                 rank, err32, err16);
  return ok;
}

// Least squares t = a + b*S with each size weighted by 1/t^2 (relative residuals), so that the
// microsecond times of small messages set a and the large ones set b.
bool fit_alpha_beta(const std::vector<int64_t>& bytes, const std::vector<double>& t, double* a, double* b) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (!(t[i] > 0)) continue;
    const double w = 1.0 / (t[i] * t[i]), x = static_cast<double>(bytes[i]);
    sw += w;
    sx += w * x;
    sy += w * t[i];
    sxx += w * x * x;
    sxy += w * x * t[i];
  }
  const double det = sw * sxx - sx * sx;
  if (t.size() < 2 || !(det > 0)) return false;
  *b = (sw * sxy - sx * sy) / det;
  *a = (sy - *b * sx) / sw;
  return true;
}

std::string human_bytes(int64_t b) {
  char s[32];
  if (b >= (int64_t{1} << 20) && b % (int64_t{1} << 20) == 0)
    std::snprintf(s, sizeof s, "%lld MiB", static_cast<long long>(b >> 20));
  else if (b >= 1024 && b % 1024 == 0)
    std::snprintf(s, sizeof s, "%lld KiB", static_cast<long long>(b >> 10));
  else
    std::snprintf(s, sizeof s, "%lld B", static_cast<long long>(b));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  demi::dist::init();  // MPI, and the communication thread the bf16 scheme runs on
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);

  Options o;
  const std::string error = parse_options(argc, argv, &o);  // every rank parses the same argv
  if (!error.empty() || o.help) {
    if (rank == 0) {
      if (!error.empty()) std::fprintf(stderr, "allreduce_bench: %s\n", error.c_str());
      std::fputs(kUsage, error.empty() ? stdout : stderr);
    }
    demi::dist::release();
    return error.empty() ? 0 : kUsageError;
  }

  std::vector<int64_t> sizes;
  for (int64_t s = 4; s <= o.sizes_max; s *= 4) sizes.push_back(s);
  if (sizes.back() != o.sizes_max) sizes.push_back(o.sizes_max);

  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string lib_line(lib, static_cast<size_t>(len));
    lib_line = lib_line.substr(0, lib_line.find_first_of(",\n"));
    char host[MPI_MAX_PROCESSOR_NAME];
    MPI_Get_processor_name(host, &len);
    std::printf("# allreduce_bench: world size %d, cpu \"%s\" (rank 0 on %s), %s\n", p, cpu_model().c_str(), host,
                lib_line.c_str());
    std::printf("# time = slowest rank per repetition, after MPI_Barrier; best and median over repetitions\n");
    if (o.csv)
      std::printf("time,bytes,reps,fp32_best_s,fp32_median_s,bf16_best_s,bf16_median_s\n");
    else
      std::printf("%10s %5s %12s %12s %12s %12s %9s %10s %8s\n", "size", "reps", "fp32 best", "fp32 median",
                  "bf16 best", "bf16 median", "bf16/fp32", "fp32 GB/s", "best/fit");
    std::fflush(stdout);
  }

  const bool ok = check_results(rank, p);
  int all_ok = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    demi::dist::release();
    return 1;
  }

  std::vector<double> fp32_best;
  std::vector<Stats> fp32_stats, bf16_stats;
  std::vector<int> reps_used;
  for (const int64_t bytes : sizes) {
    const size_t n = static_cast<size_t>(bytes / 4);
    const int reps = bytes > kLargeBytes ? std::max(5, o.reps / 4) : o.reps;
    std::vector<float> in(n), out(n);
    for (size_t i = 0; i < n; ++i) in[i] = input_value(rank, i);
    fp32_stats.push_back(time_collective(
        [&] { MPI_Allreduce(in.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
        reps));
    Bf16Scheme scheme(n, p);
    bf16_stats.push_back(time_collective([&] { scheme.run(in.data(), out.data()); }, reps));
    fp32_best.push_back(fp32_stats.back().best);
    reps_used.push_back(reps);
  }

  if (rank == 0) {
    double a = 0, b = 0;
    const bool fitted = fit_alpha_beta(sizes, fp32_best, &a, &b);
    for (size_t k = 0; k < sizes.size(); ++k) {
      const Stats& f32 = fp32_stats[k];
      const Stats& b16 = bf16_stats[k];
      const double bytes = static_cast<double>(sizes[k]);
      if (o.csv)
        std::printf("time,%lld,%d,%.9g,%.9g,%.9g,%.9g\n", static_cast<long long>(sizes[k]), reps_used[k], f32.best,
                    f32.median, b16.best, b16.median);
      else
        std::printf("%10s %5d %9.2f us %9.2f us %9.2f us %9.2f us %9.2f %10.3f %8.2f\n", human_bytes(sizes[k]).c_str(),
                    reps_used[k], f32.best * 1e6, f32.median * 1e6, b16.best * 1e6, b16.median * 1e6,
                    b16.best / f32.best, bytes / f32.best * 1e-9, fitted ? f32.best / (a + b * bytes) : 0.0);
    }
    const long long lo = static_cast<long long>(sizes.front()), hi = static_cast<long long>(sizes.back());
    if (!fitted) {
      std::printf("# no fit: it needs at least two sizes (raise --sizes-max)\n");
    } else if (o.csv) {
      std::printf("fit,world_size,alpha_s,beta_s_per_byte,bytes_min,bytes_max,sizes,weighting\n");
      std::printf("fit,%d,%.6g,%.6g,%lld,%lld,%zu,relative\n", p, a, b, lo, hi, sizes.size());
    } else {
      std::printf("\nfp32 fit t(S) = alpha + beta*S, least squares on the best times of all %zu sizes above\n"
                  "(%lld .. %lld bytes, residuals relative to t; column best/fit):\n",
                  sizes.size(), lo, hi);
      std::printf("  alpha = %.3g us, beta = %.4g ns/byte (1/beta = %.3g GB/s), world size %d\n", a * 1e6, b * 1e9,
                  b > 0 ? 1e-9 / b : 0.0, p);
      if (p > 1)
        std::printf("  as a ring (2(p-1) alpha + 2(p-1)/p S beta): per-hop alpha = %.3g us, link 1/beta = %.3g GB/s\n",
                    a / (2.0 * (p - 1)) * 1e6, b > 0 ? 2.0 * (p - 1) / p / b * 1e-9 : 0.0);
      else
        std::printf("  world size 1: no communication, the fit measures a local copy\n");
    }
  }
  demi::dist::release();
  return 0;
}
