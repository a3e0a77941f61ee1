// The short-K GEMM against the reference: every dtype mix of operands and output, bias, ReLU and
// accumulation, transposed a, odd sizes (N not a multiple of a vector or of the two-vector tile, M past one
// and two row groups, K = 1 and the largest taken), batches, every CPU level; an f32 b read rounded bit for
// bit as the cast b; the same bits on one thread and two, with a's row sums.
#include "demi/kernels/cpu/gemm_outer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/half.h"
#include "demi/core/parallel.h"
#include "demi/kernels/internal/matmul_conv_test_util.h"

namespace demi::kernels::cpu {
namespace {

using kernels::testing::Operand;

constexpr DType F32 = DType::kF32, BF16 = DType::kBF16, F16 = DType::kF16;

TEST(GemmOuter, MatchesTheReferenceForEveryDtypeEpilogueAndLevel) {
  struct Shape {
    int64_t batch, m, n, k;
    bool trans_a;
  };
  // Model A's dx (32 rows: three groups of 12) and dw (10 rows, a transposed) at a narrower N; K = 1; K = 64
  // with 25 rows; N of 5 (under a vector), 40 (a tile and a half vector) and 47; a batch of 3.
  const Shape shapes[] = {{1, 32, 700, 10, false}, {1, 10, 333, 32, true}, {2, 13, 47, 1, false},
                          {1, 25, 129, 64, true},  {1, 1, 5, 3, false},    {3, 7, 40, 17, true}};
  uint64_t seed = 70;
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    for (const Shape& s : shapes)
      for (const kernels::testing::MatmulDtypes& d : kernels::testing::kMatmulDtypes)
        for (int epi = 0; epi < 3; ++epi) {  // plain; bias + ReLU; accumulate + bias
          MatmulParams p;
          p.batch = s.batch;
          p.m = s.m;
          p.n = s.n;
          p.k = s.k;
          p.trans_a = s.trans_a;
          p.a_dtype = d.a;
          p.b_dtype = d.b;
          p.c_dtype = p.bias_dtype = d.c;
          p.relu = epi == 1;
          p.accumulate = epi == 2;
          SCOPED_TRACE(::testing::Message() << cpu_level_name(level) << " " << describe(p));
          ASSERT_TRUE(gemm_outer_supported(p));
          // dyadic values: every f32 partial sum exact, so the result is the reference's, rounded once
          kernels::testing::check_product(
              [](const MatmulParams& q, const void* a, const void* b, void* c) { gemm_outer(q, a, b, c); }, p, epi > 0,
              seed += 7, /*exact=*/true);
        }
  }
}

// An f32 b read rounded to bf16|f16 (MatmulParams::b_round: AMP's master weight) is rounded as the kernel
// loads it: bit for bit the product of the cast b, at every level, with a batch and an f16 overflow to inf.
TEST(GemmOuter, AnF32OperandReadRoundedIsBitForBitTheCastOperand) {
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    for (DType t : {BF16, F16}) {
      MatmulParams p;
      p.batch = 2;
      p.m = 32;
      p.n = 1000;
      p.k = 10;
      p.a_dtype = p.c_dtype = t;
      p.b_dtype = F32;
      p.b_round = t;
      SCOPED_TRACE(describe(p) + " at " + std::string(cpu_level_name(level)));
      kernels::testing::check_rounded_b_is_cast_b(
          [](const MatmulParams& q, const void* a, const void* b, void* c) { gemm_outer(q, a, b, c); }, p);
    }
  }
}

// Each output is one fmadd chain over k: one thread or two (each a run of columns) give the same bits; a's
// row sums (a Dense weight gradient's bias gradient, op(a) = dy^T) are its values summed in f32, k ascending.
TEST(GemmOuter, ResultsDoNotDependOnTheThreadCountAndRowSumsAreAsValues) {
  const int saved = num_threads();
  for (DType t : {F32, BF16, F16}) {
    MatmulParams p;
    p.m = 10;
    p.n = 7200;
    p.k = 32;
    p.trans_a = true;
    p.a_dtype = p.b_dtype = p.c_dtype = t;
    SCOPED_TRACE(describe(p));
    Operand a = kernels::testing::random_operand(t, p.m * p.k, 11), b = kernels::testing::random_operand(t, p.k * p.n, 12);
    std::vector<char> one(static_cast<size_t>(p.m * p.n) * dtype_size(t)), two(one.size());
    std::vector<float> sums_one(static_cast<size_t>(p.m)), sums_two(sums_one.size());
    set_num_threads(1);
    p.a_row_sums = sums_one.data();
    gemm_outer(p, a.data(), b.data(), one.data());
    set_num_threads(2);
    p.a_row_sums = sums_two.data();
    gemm_outer(p, a.data(), b.data(), two.data());
    EXPECT_EQ(one, two);
    EXPECT_EQ(sums_one, sums_two);
    for (int64_t i = 0; i < p.m; ++i) {
      float s = 0.0f;
      for (int64_t k = 0; k < p.k; ++k) s += a.f32[static_cast<size_t>(k * p.m + i)];  // (a stored (K, M))
      EXPECT_EQ(sums_one[static_cast<size_t>(i)], s) << "row " << i;
    }
  }
  set_num_threads(saved);
}

// Each CPU level runs its own kernel: an AVX2-only CPU gets the 8-lane one, not the portable loops.
TEST(GemmOuter, EachLevelRunsItsVariant) {
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    const std::string want = level == CpuLevel::kScalar ? "demi-outer:scalar"
                             : level == CpuLevel::kAvx2 ? "demi-outer:avx2"
                                                        : "demi-outer:avx512";
    EXPECT_EQ(gemm_outer_implementation(), want) << cpu_level_name(level);
  }
}

TEST(GemmOuter, TakesShortKProductsOfASmallAOnly) {
  MatmulParams p;
  p.m = 4;
  p.n = 100;
  p.k = 8;
  EXPECT_TRUE(gemm_outer_supported(p));
  p.trans_b = true;
  EXPECT_FALSE(gemm_outer_supported(p));  // b transposed: its rows do not run along N
  p.trans_b = false;
  p.k = kOuterMaxK + 1;
  EXPECT_FALSE(gemm_outer_supported(p));
  p.k = 8;
  p.m = kOuterMaxA / 8 + 1;
  EXPECT_FALSE(gemm_outer_supported(p));
  p.m = 4;
  p.a_dtype = p.b_dtype = F16;
  p.bf16_products = true;
  EXPECT_FALSE(gemm_outer_supported(p));  // f16 products in bf16: demi's pair kernels
  p.bf16_products = false;
  p.b_dtype = F16;
  p.b_round = BF16;  // (b_round is for an f32 b)
  EXPECT_FALSE(gemm_outer_supported(p));
  p.b_round = F32;
  p.trans_b = true;
  std::vector<float> buf(4096);
  EXPECT_THROW(gemm_outer(p, buf.data(), buf.data(), buf.data()), Error);
}

}  // namespace
}  // namespace demi::kernels::cpu
