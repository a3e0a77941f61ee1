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
#include "demi/kernels/reference/matmul.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels::cpu {
namespace {

using kernels::testing::all_close;
using kernels::testing::cast_operand;
using kernels::testing::dyadic_operand;
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
  const std::pair<DType, DType> dtypes[] = {{F32, F32}, {BF16, BF16}, {BF16, F32}, {F16, F16}, {F16, F32}};
  uint64_t seed = 70;
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    for (const Shape& s : shapes)
      for (auto [in, out] : dtypes)
        for (int epi = 0; epi < 3; ++epi) {  // plain; bias + ReLU; accumulate + bias
          MatmulParams p;
          p.batch = s.batch;
          p.m = s.m;
          p.n = s.n;
          p.k = s.k;
          p.trans_a = s.trans_a;
          p.a_dtype = p.b_dtype = in;
          p.c_dtype = out;
          p.relu = epi == 1;
          p.accumulate = epi == 2;
          SCOPED_TRACE(::testing::Message() << cpu_level_name(level) << " " << describe(p));
          ASSERT_TRUE(gemm_outer_supported(p));
          Operand a = dyadic_operand(F32, p.batch * p.m * p.k, seed += 7);
          Operand b = dyadic_operand(F32, p.batch * p.k * p.n, seed + 1);
          Operand bias = dyadic_operand(F32, p.n, seed + 2), c0 = dyadic_operand(F32, p.batch * p.m * p.n, seed + 3);
          Operand al = cast_operand(a, in), bl = cast_operand(b, in), cl = cast_operand(c0, out);
          Operand biasl = cast_operand(bias, out);
          if (epi > 0) {
            p.bias = biasl.data();
            p.bias_dtype = out;
          }
          MatmulParams r = p;  // the reference in f32 on the same (exactly representable) values
          r.a_dtype = r.b_dtype = r.c_dtype = r.bias_dtype = F32;
          Operand bias32 = cast_operand(biasl, F32);
          r.bias = epi > 0 ? bias32.data() : nullptr;
          Operand a32 = cast_operand(al, F32), b32 = cast_operand(bl, F32), c32 = cast_operand(cl, F32);
          std::vector<float> want = c32.f32;  // what accumulation adds to
          ref::matmul(r, a32.f32.data(), b32.f32.data(), want.data());
          gemm_outer(p, al.data(), bl.data(), cl.data());
          EXPECT_TRUE(all_close(cl.data(), out, std::vector<double>(want.begin(), want.end()),
                                tolerance_for_sum(out, p.k, 1.0)));
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
      Operand a = kernels::testing::random_operand(t, p.batch * p.m * p.k, 1);
      Operand b = kernels::testing::random_operand(F32, p.batch * p.k * p.n, 2);
      static_cast<float*>(b.data())[5] = 70000.0f;  // inf in f16
      std::vector<char> b_low(static_cast<size_t>(b.n) * dtype_size(t));
      convert(b.data(), F32, b_low.data(), t, b.n);
      std::vector<char> got(static_cast<size_t>(p.batch * p.m * p.n) * dtype_size(t)), want(got.size());
      gemm_outer(p, a.data(), b.data(), got.data());
      MatmulParams cast = p;
      cast.b_dtype = t;
      cast.b_round = F32;
      gemm_outer(cast, a.data(), b_low.data(), want.data());
      EXPECT_EQ(got, want);
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
