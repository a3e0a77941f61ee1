#include "demi/kernels/matmul.h"
#include "demi/core/settings.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/gemm.h"
#include "demi/kernels/cpu/gemm_amx.h"
#include "demi/kernels/cpu/gemm_dot.h"
#include "demi/kernels/cpu/gemm_outer.h"
#include "demi/kernels/cpu/internal/workspace.h"
#include "demi/kernels/internal/choice_cache.h"
#include "demi/kernels/onednn/matmul.h"
#include "demi/kernels/reference/matmul.h"

namespace demi::kernels {
namespace {

enum class Kernel : uint8_t {
  kOnednn,
  kDemiF32,
  kDemiBf16,
  kOnednnF32,
  kDemiDot,
  kDemiAmx,
  kDemiDotPerThread,
  kDemiOuter
};

// Part of the cache file's name: bumped when the kernels or the tuning change enough that choices made
// before should be made again.
// 6: demi's GEMM splits few-row products by columns, swaps only from K = 256; 7: a swapped product stores
// its tiles through a block, a column-split one shares its block of a between the threads, and a widening
// path holding more than kMaxWideningBytes of copies is never chosen; 8: an f32 a stored by rows is read in
// place (no block of a), and f16 products may be computed in bf16 (F16Products); 9: an operand read rounded
// reaches oneDNN and demi-dot as a copy in its rounded dtype (the cast operand's path, whatever it costs),
// and a ReLU at the store is not part of the key; 10: workspace is priced against time
// (internal::priced_seconds) instead of capped at 2 MiB, and demi's AMX GEMM is a candidate; 11: demi's AMX
// GEMM packs in vector registers, each thread its part of the larger operand, reads a bf16 a in place, and
// multiplies the f16 split as [hi | lo] four ways (half the packed bytes); 12: demi-dot's copy of a converted
// b per thread is a candidate of its own (demi-dot-per-thread), priced against the one shared copy; 13:
// demi's AMX GEMM holds each bf16 C block in the tiles over the whole K, prefetching two steps ahead; 14:
// demi's short-K product (demi-outer) is a candidate; 15: demi's AMX GEMM holds the f16 split's C block in the
// tiles over the whole K (or a K panel), one chain per tile
constexpr int kTuneVersion = 15;
constexpr const char* kKernelNames[] = {"onednn",   "demi-f32", "demi-bf16",           "onednn-f32",
                                        "demi-dot", "demi-amx", "demi-dot-per-thread", "demi-outer"};
static_assert(std::size(kKernelNames) == static_cast<size_t>(Kernel::kDemiOuter) + 1,
              "a kernel needs its name");

MatmulPolicy policy_from_env() {
  const std::string s = env_choice("DEMI_MATMUL");
  return s == "demi" ? MatmulPolicy::kDemi : s == "onednn" ? MatmulPolicy::kOnednn : MatmulPolicy::kAuto;
}

std::atomic<MatmulPolicy>& policy_slot() {
  static std::atomic<MatmulPolicy> p{policy_from_env()};
  return p;
}

// p as computed under the f16-products setting: with kBf16, a product of f16|bf16 values with an f16 one
// among them multiplies its f16 values as bf16.
MatmulParams with_f16_products(const MatmulParams& p) {
  MatmulParams q = p;
  if (f16_products() != F16Products::kBf16) return q;
  q.bf16_products = q.bf16_products || f16_products_in_bf16(a_value_dtype(p), b_value_dtype(p));
  return q;
}

// What decides the fastest kernel: the product's sizes, layout, dtypes and epilogue, where it runs, and
// whether oneDNN is a candidate. Not a ReLU at the store: a product and the same product with a ReLU share
// one choice, so a Dense fused with its ReLU gives the bits of the Dense and the ReLU apart on every CPU
// (tuned apart, near-equal candidates went different ways on an AVX2 run). Packed into integers for the lookup every call makes; the text form
// (key_of, the cache file's) is built only when a product is not in memory yet.
internal::ChoiceCache::Key key_of_params(const MatmulParams& p) {
  const int64_t flags = static_cast<int64_t>(cpu_level()) | int64_t{num_threads()} << 8 |
                        int64_t{p.trans_a} << 24 | int64_t{p.trans_b} << 25 | int64_t{p.bias != nullptr} << 26 |
                        int64_t{p.accumulate} << 28 |
                        int64_t{matmul_policy() == MatmulPolicy::kDemi} << 29 | int64_t{p.bf16_products} << 30 |
                        static_cast<int64_t>(p.a_dtype) << 32 | static_cast<int64_t>(p.b_dtype) << 40 |
                        static_cast<int64_t>(p.c_dtype) << 48 | static_cast<int64_t>(p.b_round) << 56;
  return {p.batch, p.m, p.n, p.k, flags, static_cast<int64_t>(p.a_round) | int64_t{p.residual != nullptr} << 8 |
                                                    int64_t{p.a_row_sums != nullptr} << 9};
}

std::string key_of(const MatmulParams& p) {
  return str_cat(matmul_policy() == MatmulPolicy::kDemi ? "demi-only " : "", cpu_level_name(cpu_level()), " t",
                 num_threads(), " b", p.batch, " ", p.m, "x", p.n, "x", p.k, p.trans_a ? " ta" : " a",
                 p.trans_b ? " tb" : " b", " ", dtype_name(p.a_dtype),
                 p.a_round != DType::kF32 ? str_cat(":", dtype_name(p.a_round)) : "", ",", dtype_name(p.b_dtype),
                 p.b_round != DType::kF32 ? str_cat(":", dtype_name(p.b_round)) : "", "->",
                 dtype_name(p.c_dtype), p.bias ? " bias" : "", p.accumulate ? " acc" : "",
                 p.residual ? " residual" : "", p.a_row_sums ? " row-sums" : "",
                 p.bf16_products ? " f16-as-bf16" : "");
}

internal::ChoiceCache& choices() {
  static auto& c = *new internal::ChoiceCache(  // never destroyed: used until the process ends
      str_cat("matmul-v", kTuneVersion), std::vector<std::string>(std::begin(kKernelNames), std::end(kKernelNames)));
  return c;
}

// How much faster oneDNN's copying and widening paths must be, beyond what their workspace costs
// (internal::priced_seconds).
constexpr double kWidenMargin = 0.1;

// An operand of n f32 values read rounded (MatmulParams::a_round, b_round) as the kernels that do not round
// as they read get it: a copy for the call in the rounded dtype (workspace, freed on return; its cost is
// part of what the tuning measures), exactly the operand cast beforehand, so the kernel takes the path the
// cast operand would take and computes the same bits. (An f32 copy holding the f16 values, one copy fewer
// where oneDNN widens f16, took another path where both operands f16 take the bf16 split on AMX: the input
// gradient of a Dense on its FP32 master weight was not the cast weight's.)
void round_into(const void* x, int64_t n, DType round, void* copy) { convert(x, DType::kF32, copy, round, n); }

// MatmulParams::a_row_sums in a pass of their own, for the kernels that do not take them from their
// packing: op(a)'s rows summed in f32, k ascending (the GEMM's order), a's values as read (a_round). The
// threads take blocks of the sums; a transposed a (a Dense weight gradient's dy) is read a row of K at a
// time across a block, in blocks as narrow as 64 sums so that both threads work on a layer of 256.
void row_sums_of_a(const MatmulParams& p, const void* a) {
  const int64_t M = p.m, K = p.k;
  const size_t esize = dtype_size(p.a_dtype);
  const int64_t threads = num_threads();
  const int64_t block = std::clamp<int64_t>(((M + threads - 1) / threads + 15) / 16 * 16, 64, 256);
  // (On the threads: the conversion kernels directly, not the bulk conversion, which would split a row.)
  const demi::internal::ConvertKernels& cvt = demi::internal::convert_kernels(cpu_level());
  // n values of a from src as f32: an f32 row read as stored, any other widened (and rounded) into buf.
  const bool as_stored = p.a_dtype == DType::kF32 && p.a_round == DType::kF32;
  const auto as_f32 = [&](const char* src, float* buf, int64_t n) -> const float* {
    if (as_stored) return reinterpret_cast<const float*>(src);
    const float* wide = reinterpret_cast<const float*>(src);  // f32 values to round
    if (p.a_dtype != DType::kF32) {
      if (p.a_dtype == DType::kBF16) cvt.bf16_to_f32(reinterpret_cast<const BFloat16*>(src), buf, n);
      else cvt.f16_to_f32(reinterpret_cast<const Half*>(src), buf, n);
      wide = buf;
    }
    if (p.a_round != DType::kF32) round_f32(wide, buf, n, p.a_round);
    return buf;
  };
  parallel_for(0, (M + block - 1) / block, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) float row[256];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t i0 = blk * block, w = std::min(block, M - i0);
      float* sums = p.a_row_sums + i0;
      if (p.trans_a) {
        alignas(64) float acc[256] = {};
        for (int64_t kk = 0; kk < K; ++kk) {
          const float* r = as_f32(static_cast<const char*>(a) + static_cast<size_t>(kk * M + i0) * esize, row, w);
          // (each sum's own order, k ascending, whatever the vector width: GCC's -O2 left this loop scalar)
#pragma omp simd
          for (int64_t i = 0; i < w; ++i) acc[i] += r[i];
        }
        std::copy(acc, acc + w, sums);
        continue;
      }
      for (int64_t i = 0; i < w; ++i) {
        float sum = 0;
        for (int64_t k0 = 0; k0 < K; k0 += 256) {
          const int64_t n = std::min<int64_t>(256, K - k0);
          const float* r = as_f32(static_cast<const char*>(a) + static_cast<size_t>((i0 + i) * K + k0) * esize, row, n);
          for (int64_t j = 0; j < n; ++j) sum += r[j];
        }
        sums[i] = sum;
      }
    }
  });
}

void run(Kernel k, const MatmulParams& p, const void* a, const void* b, void* c) {
  // demi's GEMMs round a and b as they pack them and demi-dot and demi-outer b as they widen it; every other
  // kernel (and demi-dot and demi-outer for a) gets a rounded copy.
  const bool gemm = k == Kernel::kDemiF32 || k == Kernel::kDemiBf16;
  const bool amx = k == Kernel::kDemiAmx;  // (rounds in packing and adds a residual in its store; no row sums)
  // demi's GEMM sums a's rows from its packing (unless it packs other values than a's: f16 ones multiplied
  // as bf16), demi-outer from its f32 copy of a; the other kernels leave them to a pass of their own.
  if (p.a_row_sums != nullptr && ((!gemm && k != Kernel::kDemiOuter) || p.bf16_products)) {
    row_sums_of_a(p, a);
    MatmulParams q = p;
    q.a_row_sums = nullptr;
    return run(k, q, a, b, c);
  }
  // demi's GEMM adds a residual in its store; the other kernels accumulate onto a copy of it in c (the same
  // sum, one pass over c more).
  if (p.residual != nullptr && !gemm && !amx) {
    if (p.residual != c)
      std::memcpy(c, p.residual, static_cast<size_t>(p.batch * p.m * p.n) * dtype_size(p.c_dtype));
    MatmulParams q = p;
    q.residual = nullptr;
    q.accumulate = true;
    return run(k, q, a, b, c);
  }
  if (p.a_round != DType::kF32 && !gemm && !amx) {
    const int64_t n = p.batch * p.m * p.k;
    MatmulParams q = p;
    q.a_dtype = std::exchange(q.a_round, DType::kF32);
    const cpu_internal::Workspace low(static_cast<size_t>(n) * dtype_size(q.a_dtype));
    round_into(a, n, p.a_round, low.f32());
    return run(k, q, low.f32(), b, c);
  }
  if (p.b_round != DType::kF32 && !gemm && !amx && k != Kernel::kDemiDot && k != Kernel::kDemiDotPerThread &&
      k != Kernel::kDemiOuter) {
    const int64_t n = p.batch * p.k * p.n;
    MatmulParams q = p;
    q.b_dtype = std::exchange(q.b_round, DType::kF32);
    const cpu_internal::Workspace low(static_cast<size_t>(n) * dtype_size(q.b_dtype));
    round_into(b, n, p.b_round, low.f32());
    return run(k, q, a, low.f32(), c);
  }
  switch (k) {
    case Kernel::kOnednn: return onednn::matmul(p, a, b, c);
    case Kernel::kDemiF32: return cpu::gemm(p, a, b, c, cpu::GemmPath::kF32);
    case Kernel::kDemiBf16: return cpu::gemm(p, a, b, c, cpu::GemmPath::kBf16Dot);
    case Kernel::kOnednnF32: return onednn::matmul_widened(p, a, b, c);
    case Kernel::kDemiDot: return cpu::gemm_dot(p, a, b, c, cpu::DotCopies::kShared);
    case Kernel::kDemiDotPerThread: return cpu::gemm_dot(p, a, b, c, cpu::DotCopies::kPerThread);
    case Kernel::kDemiAmx: return cpu::amx_gemm(p, a, b, c);
    case Kernel::kDemiOuter: return cpu::gemm_outer(p, a, b, c);
  }
}

// Each candidate once to warm up (oneDNN creates its primitive), then rounds that alternate between them;
// the best time of each decides.
// a or b null (a diagnostic without operands): the candidates run on zeroed scratch operands instead.
Kernel tune(const MatmulParams& p_in, const void* a, const void* b, void* c) {
  MatmulParams p = p_in;
  const bool scratch_in = a == nullptr || b == nullptr;
  const size_t a_bytes = static_cast<size_t>(p.batch * p.m * p.k) * dtype_size(p.a_dtype);
  const size_t b_bytes = static_cast<size_t>(p.batch * p.k * p.n) * dtype_size(p.b_dtype);
  const size_t bias_bytes = static_cast<size_t>(p.n) * dtype_size(p.bias_dtype);
  const size_t c_bytes = static_cast<size_t>(p.batch * p.m * p.n) * dtype_size(p.c_dtype);
  cpu_internal::Workspace sa(scratch_in ? a_bytes : 0), sb(scratch_in ? b_bytes : 0),
      sbias(scratch_in && p.bias ? bias_bytes : 0), sres(scratch_in && p.residual ? c_bytes : 0),
      ssums(scratch_in && p.a_row_sums ? static_cast<size_t>(p.m) * sizeof(float) : 0);
  if (scratch_in) {
    std::memset(sa.f32(), 0, a_bytes);
    std::memset(sb.f32(), 0, b_bytes);
    a = sa.f32();
    b = sb.f32();
    if (p.bias) {
      std::memset(sbias.f32(), 0, bias_bytes);
      p.bias = sbias.f32();
    }
    if (p.residual) {
      std::memset(sres.f32(), 0, c_bytes);
      p.residual = sres.f32();
    }
    if (p.a_row_sums) p.a_row_sums = ssums.f32();
  }
  std::vector<Kernel> cand;
  if (p.bf16_products) {  // demi's kernels, which round f16 values to bf16: the pair kernel first
    cand.push_back(Kernel::kDemiBf16);
    cand.push_back(Kernel::kDemiF32);
  } else {
    if (matmul_policy() != MatmulPolicy::kDemi) cand.push_back(Kernel::kOnednn);
    cand.push_back(Kernel::kDemiF32);
    const bool bf16 = a_value_dtype(p) == DType::kBF16 && b_value_dtype(p) == DType::kBF16;
    if (bf16 && cpu::gemm_has_bf16_dot()) cand.push_back(Kernel::kDemiBf16);
    if (bf16 && matmul_policy() != MatmulPolicy::kDemi) cand.push_back(Kernel::kOnednnF32);
  }
  if (cpu::gemm_dot_supported(p)) {
    cand.push_back(Kernel::kDemiDot);
    // (a copy of b per thread: faster where the other core's half of a shared one is slow to reach, and as
    // many copies as threads — the pricing below weighs them)
    if (cpu::gemm_dot_copies_per_thread(p)) cand.push_back(Kernel::kDemiDotPerThread);
  }
  // (a and a residual as run() gives them: a rounded copy of a, the residual copied into c)
  MatmulParams outer_q = p;
  outer_q.a_round = DType::kF32;
  outer_q.residual = nullptr;
  if (cpu::gemm_outer_supported(outer_q)) cand.push_back(Kernel::kDemiOuter);
  MatmulParams amx_q = p;
  amx_q.a_row_sums = nullptr;  // (summed in a pass of their own for it, as for oneDNN)
  if (cpu::amx_gemm_supported(amx_q)) cand.push_back(Kernel::kDemiAmx);
  if (cand.size() == 1) return cand[0];
  // Output: c itself unless the product reads it (accumulate, or a residual that is c): the chosen
  // kernel's run overwrites it after.
  const bool reads_c = p.accumulate || (p.residual != nullptr && p.residual == c) || c == nullptr;
  cpu_internal::Workspace scratch(reads_c ? c_bytes : 0);
  void* out = reads_c ? static_cast<void*>(scratch.f32()) : c;
  if (out != c) std::memset(out, 0, c_bytes);
  std::vector<double> best(cand.size(), 1e30);
  double total = 0;
  // The first run of each candidate also measures the workspace it holds at once (widened or rounded
  // copies of operands, chunks of f32 output).
  std::vector<int64_t> workspace(cand.size(), 0);
  for (size_t i = 0; i < cand.size(); ++i) {
    const int64_t before = mem_stats().cur(MemCategory::kWorkspace);
    ScopedPeak peak;
    total += internal::seconds_of([&] { run(cand[i], p, a, b, out); });
    workspace[i] = peak.peak().pk(MemCategory::kWorkspace) - before;
  }
  // Each measurement repeats a small product to ~0.5 ms (one call of a tiny product is all noise); up to 7
  // rounds, fewer for products that take long (the tuning stays under ~0.2 s per shape). The best of 3
  // rounds left near-equal candidates to timing noise: model A's 32 x 7200 x 10 f16 product chose
  // oneDNN's widening path (1.2 MiB of f32 copies) in 2 of 4 tunings and demi's (none) in the others.
  const double per_call = total / static_cast<double>(cand.size());
  const int reps = std::clamp(static_cast<int>(5e-4 / std::max(per_call, 1e-9)), 1, 200);
  const int rounds = std::clamp(static_cast<int>(0.2 / std::max(total * reps, 1e-9)), 1, 7);
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < cand.size(); ++i)
      best[i] = std::min(best[i], internal::seconds_of([&] { run(cand[i], p, a, b, out); }, reps));
  // oneDNN's widening paths (f16 always, bf16 as "onednn-f32") copy operands into f32 workspace, a chunk
  // or a whole operand at a time (demi's converts panel by panel), and its runs on an f32 b read rounded
  // (AMP's master weight) get a rounded copy of the whole b per call (run()). Each candidate's time is
  // priced by the workspace it holds beyond the lightest one's (internal::priced_seconds), the copying
  // ones with kWidenMargin besides: model C's 1024 x 784 x 256 f16 weight gradient into bf16 widened its
  // operands and f32 output whole (4.5 MiB, 22% of its O2-fp16 training peak) for a slightly faster
  // product, and its 1024 x 1024 forward at O2-bf16 took oneDNN's bf16 copy of the master weight (2 MiB)
  // when measured a few percent faster than demi's pair kernel (vdpbf16ps): neither is worth its memory.
  // Where oneDNN runs the product on AMX tiles, several times as fast, the copy is.
  const bool f16 = a_value_dtype(p) == DType::kF16 || b_value_dtype(p) == DType::kF16;
  const int64_t lightest = *std::min_element(workspace.begin(), workspace.end());
  const int64_t footprint = p.batch * (p.m * p.k * static_cast<int64_t>(dtype_size(p.a_dtype)) +
                                       p.k * p.n * static_cast<int64_t>(dtype_size(p.b_dtype)) +
                                       p.m * p.n * static_cast<int64_t>(dtype_size(p.c_dtype)));
  for (size_t i = 0; i < cand.size(); ++i) {
    const bool copies = cand[i] == Kernel::kOnednn && (f16 || p.a_round != DType::kF32 || p.b_round != DType::kF32);
    const bool widens = copies || cand[i] == Kernel::kOnednnF32;
    best[i] = internal::priced_seconds(best[i], workspace[i] - lightest, footprint, widens ? kWidenMargin : 0);
  }
  return cand[static_cast<size_t>(std::min_element(best.begin(), best.end()) - best.begin())];
}

// The kernel for p: from memory, else from the cache file, else tuned now and recorded.
// (f16 values multiplied as bf16 run on demi's kernels that compute them so, whatever the policy.)
Kernel choose(const MatmulParams& p, const void* a, const void* b, void* out) {
  if (matmul_policy() == MatmulPolicy::kOnednn && !p.bf16_products) return Kernel::kOnednn;
  return static_cast<Kernel>(choices().choose(
      key_of_params(p), [&] { return key_of(p); }, [&] { return static_cast<int>(tune(p, a, b, out)); }));
}

}  // namespace

void set_matmul_policy(MatmulPolicy policy) { policy_slot().store(policy); }
MatmulPolicy matmul_policy() { return policy_slot().load(); }

bool f16_products_in_bf16(DType a, DType b) {
  return f16_products() == F16Products::kBf16 && is_low_precision(a) && is_low_precision(b) &&
         (a == DType::kF16 || b == DType::kF16);
}

void matmul(const MatmulParams& p_in, const void* a, const void* b, void* c) {
  check_matmul_params(p_in, "matmul");
  if (p_in.c_dtype == DType::kF64) return ref::matmul(p_in, a, b, c);
  const MatmulParams p = with_f16_products(p_in);
  run(choose(p, a, b, c), p, a, b, c);
}

bool matmul_picks_onednn(const MatmulParams& p, const void* a, const void* b) {
  check_matmul_params(p, "matmul");
  return p.c_dtype != DType::kF64 && choose(with_f16_products(p), a, b, nullptr) == Kernel::kOnednn;
}

std::string matmul_kernel(const MatmulParams& p_in) {
  check_matmul_params(p_in, "matmul");
  const MatmulParams p = with_f16_products(p_in);
  if (p.c_dtype == DType::kF64) return "reference";
  const Kernel k = choose(p, nullptr, nullptr, nullptr);
  MatmulParams widened = p;  // what oneDNN runs: rounded copies (see run()), or (onednn-f32) widened operands
  if (widened.a_round != DType::kF32) widened.a_dtype = std::exchange(widened.a_round, DType::kF32);
  if (widened.b_round != DType::kF32) widened.b_dtype = std::exchange(widened.b_round, DType::kF32);
  if (k == Kernel::kOnednnF32) widened.a_dtype = widened.b_dtype = DType::kF32;
  const std::string impl = k == Kernel::kOnednn || k == Kernel::kOnednnF32 ? onednn::matmul_implementation(widened)
                           : k == Kernel::kDemiDot || k == Kernel::kDemiDotPerThread ? cpu::gemm_dot_implementation()
                           : k == Kernel::kDemiOuter                                  ? cpu::gemm_outer_implementation()
                           : k == Kernel::kDemiAmx ? cpu::amx_gemm_implementation(p)
                                                   : cpu::gemm_implementation(p, k == Kernel::kDemiBf16
                                                                                     ? cpu::GemmPath::kBf16Dot
                                                                                     : cpu::GemmPath::kF32);
  return str_cat(kKernelNames[static_cast<int>(k)], " (", impl, ")");
}

std::string matmul_cache_path() { return choices().path(); }
void set_matmul_cache_dir(const std::string& dir) { choices().set_dir(dir); }
void clear_matmul_choices() { choices().clear(); }

}  // namespace demi::kernels
