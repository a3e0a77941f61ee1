#include "demi/kernels/onednn/matmul.h"

#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <initializer_list>

#include <string>
#include <thread>
#include <vector>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/kernels/internal/matmul_conv_test_util.h"
#include "demi/kernels/onednn/primitive_cache.h"
#include "demi/kernels/reference/matmul.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels::onednn {
namespace {

using kernels::testing::all_close;
using kernels::testing::Operand;
using kernels::testing::random_operand;
using kernels::testing::widen;

constexpr DType F32 = DType::kF32, BF16 = DType::kBF16, F16 = DType::kF16, F64 = DType::kF64;

// onednn::matmul on random operands in p's dtypes against the f32 reference on the same values.
void check(const MatmulParams& p, bool with_bias, uint64_t seed) {
  SCOPED_TRACE(describe(p));
  kernels::testing::check_product([](auto&&... args) { onednn::matmul(args...); }, p, with_bias, seed);
}

using Dtypes = kernels::testing::MatmulDtypes;
const std::vector<Dtypes>& kDtypes = kernels::testing::kMatmulDtypes;

TEST(OnednnMatmul, MatchesReferenceOverShapesTransposesAndDtypes) {
  struct Mnk {
    int64_t m, n, k;
  };
  const Mnk shapes[] = {{1, 10, 3}, {7, 65, 17}, {33, 1, 300}, {33, 10, 17}, {7, 1, 3}};
  uint64_t seed = 100;
  for (const Dtypes& d : kDtypes)
    for (const Mnk& s : shapes)
      for (int t = 0; t < 4; ++t)
        for (int64_t batch : {1, 3}) {
          if (batch == 3 && (t == 1 || t == 2)) continue;  // batched: plain and both-transposed
          MatmulParams p;
          p.batch = batch;
          p.m = s.m;
          p.n = s.n;
          p.k = s.k;
          p.trans_a = t & 1;
          p.trans_b = t & 2;
          p.a_dtype = d.a;
          p.b_dtype = d.b;
          p.c_dtype = d.c;
          check(p, false, seed += 10);
        }
}

TEST(OnednnMatmul, BiasReluAndAccumulateFuse) {
  uint64_t seed = 5000;
  for (const Dtypes& d : kDtypes)
    for (int flags = 1; flags < 8; ++flags) {
      MatmulParams p;
      p.batch = flags == 7 ? 2 : 1;
      p.m = 9;
      p.n = 65;
      p.k = 37;
      p.trans_b = flags & 1;
      p.a_dtype = d.a;
      p.b_dtype = d.b;
      p.c_dtype = d.c;
      p.bias_dtype = flags & 4 ? F32 : d.c;
      p.relu = flags & 2;
      p.accumulate = flags & 4;
      check(p, (flags & 3) != 0, seed += 10);
    }
}

TEST(OnednnMatmul, Float16PathAtEveryCpuLevel) {
  // f16 operands are widened (and the result narrowed) by demi's ISA-dispatched convert kernels.
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    SCOPED_TRACE(cpu_level_name(level));
    MatmulParams p;
    p.m = 19;
    p.n = 33;
    p.k = 70;
    p.trans_a = true;
    p.a_dtype = p.b_dtype = p.c_dtype = p.bias_dtype = F16;
    p.accumulate = true;
    check(p, true, 7000 + static_cast<uint64_t>(level));
  }
}

struct ScopedF16Matmul {
  F16Matmul saved = f16_matmul();
  explicit ScopedF16Matmul(F16Matmul m) { set_f16_matmul(m); }
  ~ScopedF16Matmul() { set_f16_matmul(saved); }
};

// Products with both operands `low`, into `low` and f32, for every transpose and epilogue (flags: 0 plain,
// 1 bias in `low` + accumulate, 2 ReLU, 3 batched), over small and odd shapes; f(p, with_bias).
void for_each_low_precision_product(DType low, std::initializer_list<std::array<int64_t, 3>> shapes,
                                    const std::function<void(const MatmulParams&, bool)>& f) {
  for (DType c : {low, F32})
    for (const auto& [m, n, k] : shapes)
      for (int t = 0; t < 4; ++t)
        for (int flags = 0; flags < 4; ++flags) {
          MatmulParams p;
          p.batch = flags == 3 ? 3 : 1;
          p.m = m;
          p.n = n;
          p.k = k;
          p.trans_a = t & 1;
          p.trans_b = t & 2;
          p.a_dtype = p.b_dtype = low;
          p.c_dtype = c;
          p.bias_dtype = flags == 1 ? low : F32;
          p.relu = flags == 2;
          p.accumulate = flags == 1;
          f(p, flags != 0);
        }
}

// f16 x f16 both ways — split into bf16 pairs over 4K, and converted to f32 — against the f32 reference
// at the output dtype's tolerance: f32 outputs hold the split path to f32 accuracy (its products are
// exact). Every transpose, batched, with bias, ReLU and accumulation.
TEST(OnednnMatmul, Float16SplitAndConvertPathsMatchTheReference) {
  uint64_t seed = 9000;
  for (int chunking = 0; chunking < 2; ++chunking)
    for (F16Matmul mode : {F16Matmul::kSplitBf16, F16Matmul::kConvertF32}) {
      ScopedF16Matmul scoped(mode);
      // Chunks of 5+ rows (or ~400 elements): M and, for a^T b into f32, K run in several chunks.
      set_f16_matmul_chunking(chunking ? 5 : 256, chunking ? 400 : int64_t{1} << 20);
      SCOPED_TRACE(mode == F16Matmul::kSplitBf16 ? "split" : "convert");
      for_each_low_precision_product(F16, {{1, 10, 3}, {7, 65, 17}, {33, 40, 300}, {64, 48, 80}},
                                     [&](const MatmulParams& p, bool with_bias) {
                                       EXPECT_EQ(f16_matmul_splits(p), mode == F16Matmul::kSplitBf16);
                                       check(p, with_bias, seed += 10);
                                     });
    }
  set_f16_matmul_chunking(256, int64_t{1} << 20);
}

// bf16 operands widened to f32 (the "onednn-f32" candidate of kernels::matmul) through each path — row
// chunks, K chunks for a weight gradient, whole operands for the rest — into bf16 and f32 outputs.
TEST(OnednnMatmul, WidenedBFloat16MatchesTheReferenceOnEveryPath) {
  uint64_t seed = 19000;
  for (int chunking = 0; chunking < 2; ++chunking) {
    set_f16_matmul_chunking(chunking ? 5 : 256, chunking ? 400 : int64_t{1} << 20);
    for_each_low_precision_product(BF16, {{1, 10, 3}, {7, 65, 17}, {33, 40, 300}},
                                   [&](const MatmulParams& p, bool with_bias) {
                                     SCOPED_TRACE(describe(p));
                                     kernels::testing::check_product(
                                         [](auto&&... args) { onednn::matmul_widened(args...); }, p, with_bias,
                                         seed += 10);
                                   });
  }
  set_f16_matmul_chunking(256, int64_t{1} << 20);
}

// Widened products hold a bounded workspace: a batched one runs in chunks of whole batch entries, and the
// row chunks count a low-precision output's f32 rows too (model D's attention backward widened 16 MiB of
// probabilities at once; its 4096 x 1024 data gradient from K = 256 took 16 MiB of f32 output).
TEST(OnednnMatmul, WideningHoldsAChunkOfF32AtATime) {
  const size_t target = size_t{1} << 20;  // the chunk target, in f32 elements (4 MiB)
  const size_t own = size_t{1} << 18;     // the primitive's own scratchpad (oneDNN's; 128 KiB here)
  auto scratch_of = [](const MatmulParams& p, bool widened) {
    std::vector<uint16_t> a(static_cast<size_t>(p.batch * p.m * p.k), 0x3c00);
    std::vector<uint16_t> b(static_cast<size_t>(p.batch * p.k * p.n), 0x3c00);
    std::vector<uint16_t> c(static_cast<size_t>(p.batch * p.m * p.n));
    const int64_t before = mem_stats().cur(MemCategory::kWorkspace);
    ScopedPeak peak;
    widened ? onednn::matmul_widened(p, a.data(), b.data(), c.data()) : onednn::matmul(p, a.data(), b.data(), c.data());
    return static_cast<size_t>(peak.peak().pk(MemCategory::kWorkspace) - before);
  };
  MatmulParams attention;  // pᵀ · dO of D's attention: 128 batch entries of 128 x 64 from K = 128, bf16
  attention.batch = 128, attention.m = 128, attention.n = 64, attention.k = 128, attention.trans_a = true;
  attention.a_dtype = attention.b_dtype = attention.c_dtype = BF16;
  EXPECT_LE(scratch_of(attention, true), target * 4 + own) << "the batched product, in chunks";
  MatmulParams data_grad;  // dy · w of D's second feed-forward product, f16
  data_grad.m = 4096, data_grad.n = 1024, data_grad.k = 256;
  data_grad.a_dtype = data_grad.b_dtype = data_grad.c_dtype = F16;
  ScopedF16Matmul convert(F16Matmul::kConvertF32);
  // b widened whole (K x N), then rows of a and of the f32 output within the target.
  EXPECT_LE(scratch_of(data_grad, false), (target + 256 * 1024) * 4 + own) << "rows of a and of the output";
}

TEST(OnednnMatmul, Float64RunsTheReferenceExactly) {
  MatmulParams p;
  p.m = 5;
  p.n = 4;
  p.k = 3;
  p.trans_a = true;
  p.a_dtype = p.b_dtype = p.c_dtype = p.bias_dtype = F64;
  Operand a = random_operand(F64, 15, 1), b = random_operand(F64, 12, 2), bias = random_operand(F64, 4, 3);
  p.bias = bias.data();
  std::vector<double> got(20), want(20);
  matmul(p, a.data(), b.data(), got.data());
  ref::matmul(p, a.data(), b.data(), want.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(matmul_implementation(p), "reference");
}

TEST(OnednnMatmul, PrimitivesAreCreatedOncePerShape) {
  MatmulParams p;
  p.m = 13;
  p.n = 11;
  p.k = 29;
  p.a_dtype = p.b_dtype = BF16;
  Operand a = random_operand(BF16, 13 * 29, 1), b = random_operand(BF16, 29 * 11, 2);
  std::vector<float> c(13 * 11);
  matmul(p, a.data(), b.data(), c.data());
  PrimitiveCacheStats before = primitive_cache_stats();
  for (int i = 0; i < 3; ++i) matmul(p, a.data(), b.data(), c.data());
  PrimitiveCacheStats after = primitive_cache_stats();
  EXPECT_EQ(after.entries, before.entries);
  EXPECT_GE(after.hits, before.hits + 3);
  p.m = 14;  // a new shape is a new primitive
  std::vector<float> c2(14 * 11);
  Operand a2 = random_operand(BF16, 14 * 29, 3);
  matmul(p, a2.data(), b.data(), c2.data());
  EXPECT_EQ(primitive_cache_stats().entries, after.entries + 1);
}

TEST(OnednnMatmul, ScratchIsTrackedWorkspaceAndReturned) {
  MatmulParams p;
  p.m = 64;
  p.n = 48;
  p.k = 80;
  p.a_dtype = p.b_dtype = p.c_dtype = F16;
  ScopedF16Matmul convert(F16Matmul::kConvertF32);  // operands converted to f32 in workspace
  Operand a = random_operand(F16, 64 * 80, 1), b = random_operand(F16, 80 * 48, 2);
  std::vector<Half> c(64 * 48);
  const int64_t before = mem_stats().cur(MemCategory::kWorkspace);
  ScopedPeak peak;
  matmul(p, a.data(), b.data(), c.data());
  EXPECT_GE(peak.peak().pk(MemCategory::kWorkspace) - before, (64 * 80 + 80 * 48 + 64 * 48) * 4);
  EXPECT_EQ(mem_stats().cur(MemCategory::kWorkspace), before);
}

TEST(OnednnMatmul, ConcurrentCallersGetCorrectResults) {
  // Two threads share cached primitives (same shape) and create others (distinct shapes) at once.
  auto work = [](uint64_t seed, bool* ok) {
    *ok = true;
    for (int i = 0; i < 4; ++i) {
      MatmulParams p;
      p.m = 17;
      p.n = 19 + (i % 2) * static_cast<int64_t>(seed % 7);
      p.k = 23;
      Operand a = random_operand(F32, p.m * p.k, seed + i), b = random_operand(F32, p.k * p.n, seed + 50 + i);
      std::vector<float> got(p.m * p.n), want(p.m * p.n);
      matmul(p, a.data(), b.data(), got.data());
      ref::matmul(p, a.data(), b.data(), want.data());
      *ok = *ok &&
            all_close(got.data(), F32, widen(want.data(), F32, p.m * p.n), tolerance_for_sum(F32, p.k, 1.0));
    }
  };
  bool ok1 = false, ok2 = false;
  std::thread t1(work, 1, &ok1), t2(work, 2, &ok2);
  t1.join();
  t2.join();
  EXPECT_TRUE(ok1);
  EXPECT_TRUE(ok2);
}

TEST(OnednnMatmul, ErrorsNameTheOpShapesAndDtypes) {
  auto message = [](const MatmulParams& p) -> std::string {
    float x[4] = {};
    try {
      matmul(p, x, x, x);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  MatmulParams p;
  p.m = 0;
  p.n = 2;
  p.k = 2;
  std::string msg = message(p);
  EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
  EXPECT_NE(msg.find("M=0"), std::string::npos) << msg;
  p.m = 2;
  p.a_dtype = F64;
  msg = message(p);
  EXPECT_NE(msg.find("float64 cannot be mixed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a(2, 2) float64 x b(2, 2) float32 -> c(2, 2) float32"), std::string::npos) << msg;
  p.a_dtype = DType::kI32;
  EXPECT_NE(message(p).find("floating"), std::string::npos);
}

TEST(OnednnMatmul, LargeProductsUseOptimisedKernels) {
  // Falling back to oneDNN's reference kernels would be a slowdown of orders of magnitude; catch it here.
  for (DType t : {F32, BF16})
    for (int tr = 0; tr < 4; ++tr) {
      MatmulParams p;
      p.m = 256;
      p.n = 1024;
      p.k = 784;
      p.trans_a = tr & 1;
      p.trans_b = tr & 2;
      p.a_dtype = p.b_dtype = t;
      p.accumulate = true;
      std::string impl = matmul_implementation(p);
      EXPECT_EQ(impl.find("ref"), std::string::npos) << describe(p) << ": " << impl;
    }
}

}  // namespace
}  // namespace demi::kernels::onednn
