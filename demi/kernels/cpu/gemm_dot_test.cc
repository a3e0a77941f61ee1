// The few-column dot-product GEMM against the reference: every dtype mix of operands and output, bias,
// ReLU and accumulation, odd sizes (K not a multiple of 16, N past one 12-column tile, odd M), batches, and
// every CPU level.
#include "demi/kernels/cpu/gemm_dot.h"

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

TEST(GemmDot, MatchesTheReferenceForEveryDtypeEpilogueAndLevel) {
  struct Shape {
    int64_t batch, m, n, k;
  };
  // The last two are split across threads: {1, 9, 10, 7203} with each thread's own copy of a converted b,
  // {1, 6, 32, 4200} with one copy (above the per-thread copy's 512 KiB).
  // K's tails: 5, 5, none, 2, 1, 13 (past a half of 8), 3, 8.
  const Shape shapes[] = {{1, 7, 10, 7200 / 16 + 3}, {2, 5, 13, 37}, {1, 1, 32, 16},  {3, 4, 1, 50},
                          {1, 33, 12, 129},           {1, 3, 5, 29},  {1, 9, 10, 7203}, {1, 6, 32, 4200}};
  const std::pair<DType, DType> dtypes[] = {{F32, F32}, {BF16, BF16}, {BF16, F32}, {F16, F16}, {F16, F32}};
  uint64_t seed = 40;
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
          p.trans_b = true;
          p.a_dtype = p.b_dtype = in;
          p.c_dtype = out;
          p.relu = epi == 1;
          p.accumulate = epi == 2;
          SCOPED_TRACE(::testing::Message() << cpu_level_name(level) << " " << describe(p));
          Operand a = dyadic_operand(F32, p.batch * p.m * p.k, seed += 7);
          Operand b = dyadic_operand(F32, p.batch * p.n * p.k, seed + 1);
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
          gemm_dot(p, al.data(), bl.data(), cl.data());
          EXPECT_TRUE(all_close(cl.data(), out, std::vector<double>(want.begin(), want.end()),
                                tolerance_for_sum(out, p.k, 1.0)));
        }
  }
}

// An f32 b read rounded to bf16|f16 (MatmulParams::b_round) is rounded once as the kernel widens b: bit
// for bit the product of the cast b, at every level, with a batch and an f16 overflow to inf.
TEST(GemmDot, AnF32OperandReadRoundedIsBitForBitTheCastOperand) {
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    for (DType t : {BF16, F16})
      for (int64_t k : {45, 7203}) {  // one part; two threads, each rounding b for itself
        MatmulParams p;
        p.batch = 2;
        p.m = 7;
        p.n = 10;
        p.k = k;
        p.trans_b = true;
        p.a_dtype = p.c_dtype = t;
        p.b_dtype = F32;
        p.b_round = t;
        SCOPED_TRACE(describe(p) + " at " + std::string(cpu_level_name(level)));
        kernels::testing::check_rounded_b_is_cast_b(
            [](const MatmulParams& q, const void* a, const void* b, void* c) { gemm_dot(q, a, b, c); }, p);
      }
  }
}

// How a product is split across threads (parts, each part's own converted b or one shared copy: DotCopies,
// a widened in registers, a long K in chunks with each part converting its own) never changes a bit: every
// output's sum has one fixed order.
TEST(GemmDot, ResultsDoNotDependOnTheThreadCount) {
  const int saved = num_threads();
  struct Case {
    int64_t m, n, k;
    DType a, b, round;
    bool copies;  // whether DotCopies::kPerThread takes a copy of the converted b per part
  };
  // (a long K is taken in chunks, each part converting the chunks of b it multiplies: no copy of all of b;
  // a short one converted whole, shared or per part where the copy fits 512 KiB)
  const Case cases[] = {{32, 10, 7200, F16, F32, F16, false}, {32, 10, 7200, BF16, F32, BF16, false},
                        {9, 10, 7203, F16, F16, F32, false},   {6, 32, 4200, BF16, BF16, F32, false},
                        {7, 10, 7203, F32, F32, F32, false},   {32, 10, 1000, F16, F32, F16, true},
                        {9, 12, 1000, BF16, BF16, F32, true}};
  uint64_t seed = 300;
  for (const Case& cs : cases) {
    MatmulParams p;
    p.m = cs.m;
    p.n = cs.n;
    p.k = cs.k;
    p.trans_b = true;
    p.a_dtype = p.c_dtype = cs.a;
    p.b_dtype = cs.b;
    p.b_round = cs.round;
    SCOPED_TRACE(describe(p));
    Operand a = kernels::testing::random_operand(cs.a, p.m * p.k, seed += 2);
    Operand b = kernels::testing::random_operand(cs.b, p.n * p.k, seed + 1);
    std::vector<char> one(static_cast<size_t>(p.m * p.n) * dtype_size(cs.a)), two(one.size()), copies(one.size());
    set_num_threads(1);
    gemm_dot(p, a.data(), b.data(), one.data());
    set_num_threads(2);
    gemm_dot(p, a.data(), b.data(), two.data(), DotCopies::kShared);
    gemm_dot(p, a.data(), b.data(), copies.data(), DotCopies::kPerThread);
    EXPECT_EQ(one, two);
    EXPECT_EQ(one, copies);
    EXPECT_EQ(gemm_dot_copies_per_thread(p), cs.copies);
  }
  set_num_threads(saved);
}

// MatmulParams::bf16_products: f16 values (an f16 a or b, an f32 b read as f16) rounded to bf16 are bit for
// bit the product of operands cast to bf16 first, at every level; and not the exact f16 product.
TEST(GemmDot, F16ValuesMultipliedAsBf16AreBitForBitTheProductOfBf16CastOperands) {
  struct Mix {
    DType a, b, round, c;
  };
  const Mix mixes[] = {{F16, F16, F32, F16}, {F16, F16, F32, F32}, {F16, BF16, F32, F16}, {BF16, F16, F32, BF16},
                       {F16, F32, F16, F16}};
  uint64_t seed = 90;
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    for (const Mix& mix : mixes) {
      MatmulParams p;
      p.batch = 2;
      p.m = 7;
      p.n = 13;
      p.k = 7200 / 16 + 3;
      p.trans_b = true;
      p.a_dtype = mix.a;
      p.b_dtype = mix.b;
      p.b_round = mix.round;
      p.c_dtype = mix.c;
      p.bf16_products = true;
      SCOPED_TRACE(describe(p) + " at " + std::string(cpu_level_name(level)));
      Operand a = kernels::testing::random_operand(mix.a, p.batch * p.m * p.k, seed += 3);
      Operand b = kernels::testing::random_operand(mix.b, p.batch * p.n * p.k, seed + 1);
      std::vector<BFloat16> a16(static_cast<size_t>(a.n)), b16(static_cast<size_t>(b.n));
      convert(a.data(), mix.a, a16.data(), BF16, a.n);
      std::vector<Half> b_half(static_cast<size_t>(b.n));
      if (mix.round == F16) {
        convert(b.data(), F32, b_half.data(), F16, b.n);
        convert(b_half.data(), F16, b16.data(), BF16, b.n);
      } else {
        convert(b.data(), mix.b, b16.data(), BF16, b.n);
      }
      std::vector<char> got(static_cast<size_t>(p.batch * p.m * p.n) * dtype_size(mix.c)), want(got.size()),
          exact(got.size());
      gemm_dot(p, a.data(), b.data(), got.data());
      MatmulParams cast = p;
      cast.a_dtype = cast.b_dtype = BF16;
      cast.b_round = F32;
      cast.bf16_products = false;
      gemm_dot(cast, a16.data(), b16.data(), want.data());
      EXPECT_EQ(got, want);
      MatmulParams plain = p;
      plain.bf16_products = false;
      gemm_dot(plain, a.data(), b.data(), exact.data());
      EXPECT_NE(got, exact);
    }
  }
}

// Each CPU level runs its own tile: an AVX2-only CPU gets the 8-lane tile, not the portable loops.
TEST(GemmDot, EachLevelRunsItsVariant) {
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    const std::string want = level == CpuLevel::kScalar ? "demi-dot:scalar"
                             : level == CpuLevel::kAvx2 ? "demi-dot:avx2"
                                                        : "demi-dot:avx512";
    EXPECT_EQ(gemm_dot_implementation(), want) << cpu_level_name(level);
  }
}

TEST(GemmDot, TakesFewColumnTransposedProductsOnly) {
  MatmulParams p;
  p.m = 4;
  p.n = 10;
  p.k = 8;
  EXPECT_FALSE(gemm_dot_supported(p));  // b not transposed
  p.trans_b = true;
  EXPECT_TRUE(gemm_dot_supported(p));
  p.n = kDotMaxN + 1;
  EXPECT_FALSE(gemm_dot_supported(p));
  std::vector<float> buf(4096);
  EXPECT_THROW(gemm_dot(p, buf.data(), buf.data(), buf.data()), Error);
}

}  // namespace
}  // namespace demi::kernels::cpu
