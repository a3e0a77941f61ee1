// demi's AMX GEMM against the reference twin: shapes small, odd and past a block, transposes, the dtype
// mixes AMP multiplies in, every epilogue, batches and threads; f16 products (the exact hi/lo split)
// against the f64 product of the f16 values within f32 accumulation; an f32 operand read rounded against
// the cast operand, bit for bit. What it takes is decided on every CPU; the products need AMX and skip
// elsewhere, saying so.
#include "demi/kernels/cpu/gemm_amx.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "demi/core/cpu.h"
#include "demi/core/memory.h"
#include "demi/core/parallel.h"
#include "demi/core/rng.h"
#include "demi/kernels/cpu/internal/amx_gemm.h"
#include "demi/kernels/internal/matmul_conv_test_util.h"

namespace demi::kernels::cpu {
namespace {

using testing::check_product;
using testing::check_rounded_b_is_cast_b;
using testing::Operand;
using testing::random_operand;

constexpr DType F32 = DType::kF32, BF16 = DType::kBF16, F16 = DType::kF16;

#define DEMI_SKIP_WITHOUT_AMX()                                                                            \
  if (max_cpu_level() < CpuLevel::kAmx)                                                                     \
  GTEST_SKIP() << "this CPU runs at most " << cpu_level_name(max_cpu_level())                               \
               << ": the AMX GEMM needs AMX-TILE and AMX-BF16 (Xeons from Sapphire Rapids on) and the Linux " \
                  "permission; what it takes is tested on every CPU"

MatmulParams params(int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType a, DType b, DType c) {
  MatmulParams p;
  p.m = m, p.n = n, p.k = k, p.trans_a = ta, p.trans_b = tb, p.a_dtype = a, p.b_dtype = b, p.c_dtype = c;
  return p;
}

auto amx = [](const MatmulParams& p, const void* a, const void* b, void* c) { amx_gemm(p, a, b, c); };

// The first `cols` columns of a (rows x n) row-major matrix of `es`-byte elements.
std::vector<char> first_columns(const void* src, int64_t rows, int64_t n, int64_t cols, size_t es) {
  std::vector<char> out(static_cast<size_t>(rows * cols) * es);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data() + static_cast<size_t>(r * cols) * es,
                static_cast<const char*>(src) + static_cast<size_t>(r * n) * es, static_cast<size_t>(cols) * es);
  return out;
}

TEST(AmxGemm, TakesProductsOfBf16AndF16ValuesAtTheAmxLevelOnly) {
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    const bool here = level >= CpuLevel::kAmx;
    SCOPED_TRACE(std::string(cpu_level_name(level)));
    EXPECT_EQ(amx_gemm_supported(params(8, 8, 8, false, false, BF16, BF16, F32)), here);
    EXPECT_EQ(amx_gemm_supported(params(8, 8, 8, true, true, F16, F16, F16)), here);
    EXPECT_FALSE(amx_gemm_supported(params(8, 8, 8, false, false, F32, BF16, F32)));  // f32 values: not exact
    MatmulParams master = params(8, 8, 8, false, true, BF16, F32, BF16);
    master.b_round = BF16;  // AMP's f32 master weight read as bf16
    EXPECT_EQ(amx_gemm_supported(master), here);
    MatmulParams sums = params(8, 8, 8, true, false, BF16, BF16, F32);
    float row_sums[8];
    sums.a_row_sums = row_sums;
    EXPECT_FALSE(amx_gemm_supported(sums));
    EXPECT_FALSE(amx_gemm_supported(params(8, 8, 8, false, false, DType::kF64, DType::kF64, DType::kF64)));
  }
  // bf16 values run as they are; any f16 value splits the product (a bf16 operand beside it, lo 0), unless
  // the run multiplies its f16 values as bf16 (bf16_products).
  EXPECT_FALSE(amx_gemm_splits(params(8, 8, 8, false, false, BF16, BF16, F32)));
  EXPECT_TRUE(amx_gemm_splits(params(8, 8, 8, false, false, F16, F16, F32)));
  EXPECT_TRUE(amx_gemm_splits(params(8, 8, 8, false, false, BF16, F16, BF16)));
  MatmulParams as_bf16 = params(8, 8, 8, false, false, F16, F16, F16);
  as_bf16.bf16_products = true;
  EXPECT_FALSE(amx_gemm_splits(as_bf16));
  EXPECT_EQ(amx_gemm_implementation(as_bf16), "demi-amx:bf16");
  EXPECT_EQ(amx_gemm_implementation(params(8, 8, 8, false, false, F16, F16, F32)), "demi-amx:f16-split");
}

TEST(AmxGemm, MatchesTheReferenceOverShapesTransposesDtypesAndEpilogues) {
  DEMI_SKIP_WITHOUT_AMX();
  ScopedCpuLevel level(CpuLevel::kAmx);
  struct Shape {
    int64_t m, n, k;
  };
  // (K a multiple of 32: a bf16 a is read in place, its partial last row block packed; {45, 100, 64} splits
  // the threads by b's columns, {100, 45, 128} by a's rows; a last column block of 1, 13 or 16 columns is
  // one tile column, of 17 two: {64, 49, 64}.)
  const Shape shapes[] = {{1, 1, 1},      {5, 7, 3},      {17, 33, 45},  {32, 32, 32},   {64, 48, 96},
                          {100, 70, 300}, {33, 130, 257}, {45, 100, 64}, {100, 45, 128}, {64, 49, 64}};
  const testing::MatmulDtypes mixes[] = {{BF16, BF16, F32}, {BF16, BF16, BF16}, {F16, F16, F32},
                                         {F16, F16, F16},   {F16, BF16, F16},   {BF16, F16, BF16}};
  uint64_t seed = 1;
  for (const Shape& s : shapes)
    for (const auto& d : mixes)
      for (int t = 0; t < 4; ++t) {
        MatmulParams p = params(s.m, s.n, s.k, t & 1, t & 2, d.a, d.b, d.c);
        SCOPED_TRACE(describe(p));
        check_product(amx, p, false, seed++);
        // Every epilogue on some of them: bias (f32 or in c's dtype), ReLU, accumulate, residual, batches.
        if ((s.m + t) % 3 != 0) continue;
        MatmulParams e = p;
        e.relu = true;
        e.bias_dtype = t & 1 ? d.c : F32;
        e.batch = 2;
        check_product(amx, e, true, seed++);
        e.accumulate = true;
        check_product(amx, e, true, seed++);
        e.accumulate = false;
        check_product(amx, e, false, seed++, false, /*with_residual=*/true);
        if (s.k <= 64) check_product(amx, p, true, seed++, /*exact=*/true);  // dyadic values: every sum exact
      }
}

// Products past one thread's chunk of the larger operand (a's rows, or b's columns, packed a chunk at a time
// into each thread's own buffer) and past one K block (sums held between blocks: the split's always, bf16
// values' at K 1000, not at 1100: more K blocks than blocks() takes), both ways of splitting the threads,
// bf16 values and the split, with a bias and ReLU at the store.
TEST(AmxGemm, ProductsSpanningSeveralChunksAndKBlocks) {
  DEMI_SKIP_WITHOUT_AMX();
  ScopedCpuLevel level(CpuLevel::kAmx);
  uint64_t seed = 100;
  for (auto [m, n] : {std::pair<int64_t, int64_t>{40, 600}, {600, 40}})
    for (DType t : {BF16, F16})
      for (int64_t k : {1000, 1100})
        for (int tr = 0; tr < 4; tr += 3) {  // neither, both transposed
          MatmulParams p = params(m, n, k, tr & 1, tr & 2, t, t, F32);
          if (t == BF16) {
            EXPECT_EQ(cpu_internal_amx::amx_gemm_k_blocks(p, false), k == 1000);
          }
          p.relu = true;
          SCOPED_TRACE(describe(p));
          check_product(amx, p, /*with_bias=*/true, seed++);
        }
}

// Where a call runs K blocks with a's block held in L1 across b's column blocks (the sums stored from the
// tiles and loaded back between K blocks), C's values are those of one pass over the whole K: a product of
// 160 columns (K-blocked) against the same product of its first 32 columns (one column block: one pass), bit
// for bit, both ways of splitting the threads, transposes, bf16 and f32 outputs, every epilogue.
TEST(AmxGemm, KBlocksGiveTheBitsOfOnePassOverTheWholeK) {
  DEMI_SKIP_WITHOUT_AMX();
  ScopedCpuLevel level(CpuLevel::kAmx);
  constexpr int64_t N = 160, N1 = 32;
  uint64_t seed = 400;
  for (int64_t K : {300, 1000})  // K blocks of 160 (two), of 256 (four)
    for (int64_t m : {96, 320})  // b's columns split among the threads; a's rows
      for (int tr = 0; tr < 4; ++tr)
        for (DType c_dtype : {F32, BF16})
          for (int epilogue = 0; epilogue < 3; ++epilogue) {  // none; bias and ReLU; accumulate and a residual
            MatmulParams p = params(m, N, K, tr & 1, tr & 2, BF16, BF16, c_dtype);
            MatmulParams one = p;
            one.n = N1;
            SCOPED_TRACE(describe(p));
            ASSERT_TRUE(cpu_internal_amx::amx_gemm_k_blocks(p, false));
            ASSERT_FALSE(cpu_internal_amx::amx_gemm_k_blocks(one, false));
            const size_t cs = dtype_size(c_dtype);
            Operand a = random_operand(BF16, m * K, seed++), b = random_operand(BF16, K * N, seed++);
            Operand bias = random_operand(F32, N, seed++), residual = random_operand(c_dtype, m * N, seed++);
            Operand c0 = random_operand(c_dtype, m * N, seed++);
            // b's first 32 columns: the first 32 of its rows where it is stored transposed (N x K)
            const std::vector<char> b1 = p.trans_b ? first_columns(b.data(), N1, K, K, 2)
                                                   : first_columns(b.data(), K, N, N1, 2);
            const std::vector<char> r1 = first_columns(residual.data(), m, N, N1, cs);
            std::vector<char> c = first_columns(c0.data(), m, N, N, cs), c1 = first_columns(c0.data(), m, N, N1, cs);
            if (epilogue == 1) {
              p.bias = one.bias = bias.data();
              p.relu = one.relu = true;
            } else if (epilogue == 2) {
              p.accumulate = one.accumulate = true;
              p.residual = residual.data();
              one.residual = r1.data();
            }
            amx_gemm(p, a.data(), b.data(), c.data());
            amx_gemm(one, a.data(), b1.data(), c1.data());
            EXPECT_EQ(first_columns(c.data(), m, N, N1, cs), c1) << "epilogue " << epilogue;
          }
}

// Where a split product's rows of a take K a panel at a time (the threads split a's rows, K past one panel:
// the chains held per row block and column block between panels, a's panel packed per chunk of rows, b's
// a panel at a time), C's
// values are those of one pass over the whole K: a product of 600 rows against the same product of its first
// 32 rows (one row block: the threads split b's columns, no panels), bit for bit — transposes, f32 and f16
// outputs, a bias and ReLU, a last panel partial (K 1100) and whole (4096: model D's weight gradients).
TEST(AmxGemm, KPanelsGiveTheBitsOfOnePassOverTheWholeK) {
  DEMI_SKIP_WITHOUT_AMX();
  ScopedCpuLevel level(CpuLevel::kAmx);
  constexpr int64_t M = 600, M1 = 32, N = 40;
  uint64_t seed = 500;
  for (int64_t K : {1100, 4096})
    for (int tr = 0; tr < 4; ++tr)
      for (DType c_dtype : {F32, F16}) {
        MatmulParams p = params(M, N, K, tr & 1, tr & 2, F16, F16, c_dtype);
        MatmulParams one = p;
        one.m = M1;
        SCOPED_TRACE(describe(p));
        ASSERT_TRUE(cpu_internal_amx::amx_gemm_k_panels(p, true));
        ASSERT_FALSE(cpu_internal_amx::amx_gemm_k_panels(one, true));
        const size_t cs = dtype_size(c_dtype);
        Operand a = random_operand(F16, M * K, seed++), b = random_operand(F16, K * N, seed++);
        Operand bias = random_operand(F32, N, seed++);
        if (tr == 3) {
          p.bias = one.bias = bias.data();
          p.relu = one.relu = true;
        }
        // a's first 32 rows: the first 32 columns of its rows where it is stored transposed (K x M)
        const std::vector<char> a1 =
            p.trans_a ? first_columns(a.data(), K, M, M1, 2) : first_columns(a.data(), M1, K, K, 2);
        std::vector<char> c(static_cast<size_t>(M * N) * cs), c1(static_cast<size_t>(M1 * N) * cs);
        amx_gemm(p, a.data(), b.data(), c.data());
        amx_gemm(one, a1.data(), b.data(), c1.data());
        c.resize(c1.size());  // (its first 32 rows)
        EXPECT_EQ(c, c1);
      }
  // A part's chains held between panels must fit 512 KiB: rows enough for 17 row blocks a thread, each with
  // 8 column blocks' chains (32 KiB), take one pass instead.
  const auto tall = [](int64_t blocks_a_thread) {
    return params(32 * blocks_a_thread * num_threads(), 256, 1100, false, false, F16, F16, F32);
  };
  ASSERT_FALSE(cpu_internal_amx::amx_gemm_k_panels(tall(17), true));
  ASSERT_TRUE(cpu_internal_amx::amx_gemm_k_panels(tall(15), true));
  // A batch of two against the reference, and b an f32 master read rounded (each panel of it rounded and
  // split as it is packed) bit for bit the product on b cast to f16 first, both ways of storing b.
  for (bool trans_b : {false, true}) {
    MatmulParams q = params(M, N, 1100, false, trans_b, F16, F16, F32);
    q.batch = 2;
    SCOPED_TRACE(describe(q));
    ASSERT_TRUE(cpu_internal_amx::amx_gemm_k_panels(q, true));
    check_product(amx, q, true, seed++);
    q.b_dtype = F32;
    q.b_round = F16;
    check_rounded_b_is_cast_b(amx, q);
  }
}

// Where K panels, the only packed b is two panels of it (the one multiplied, the next one being packed), not
// the whole of it: model B's first Dense forward (128 x 128 x 3136, f16 values, the f32 master weight read
// rounded) holds less workspace than its packed b alone would take (128 columns x 3136 x hi | lo).
TEST(AmxGemm, KPanelsHoldTwoPanelsOfPackedBNotTheWhole) {
  DEMI_SKIP_WITHOUT_AMX();
  ScopedCpuLevel level(CpuLevel::kAmx);
  MatmulParams p = params(128, 128, 3136, false, true, F16, F32, F16);
  p.b_round = F16;
  ASSERT_TRUE(cpu_internal_amx::amx_gemm_k_panels(p, true));
  Operand a = random_operand(F16, p.m * p.k, 1), b = random_operand(F32, p.k * p.n, 2);
  std::vector<Half> c(static_cast<size_t>(p.m * p.n));
  ScopedPeak peak;
  amx_gemm(p, a.data(), b.data(), c.data());
  const int64_t scratch = peak.peak().pk(MemCategory::kWorkspace) - mem_stats().cur(MemCategory::kWorkspace);
  const int64_t whole_b = 128 * 2 * 3136 * 2;  // bytes
  EXPECT_GT(scratch, 0);
  EXPECT_LT(scratch, whole_b) << scratch << " bytes of workspace";
}

// A batch of many small products (attention's per-head ones) goes a whole product per thread: against the
// reference with every epilogue, and bit for bit the products computed one at a time (each a batch of one,
// split among the threads by blocks) — bf16 values and the split, K past one of the split's K blocks,
// transposes, an a read in place, an odd count of products for two threads.
TEST(AmxGemm, ManySmallProductsOnePerThreadGiveTheBitsOfOneAtATime) {
  DEMI_SKIP_WITHOUT_AMX();
  ScopedCpuLevel level(CpuLevel::kAmx);
  const int64_t batch = 4 * num_threads() + 1;  // (at least four per thread: that path)
  uint64_t seed = 300;
  struct Shape {
    int64_t m, n, k;
  };
  // ({40, 33, 64} in bf16: a read in place but its last, partial row block packed)
  for (const Shape s : {Shape{17, 33, 45}, Shape{40, 70, 300}, Shape{64, 48, 64}, Shape{40, 33, 64}})
    for (DType t : {BF16, F16})
      for (int tr = 0; tr < 4; ++tr) {
        MatmulParams p = params(s.m, s.n, s.k, tr & 1, tr & 2, t, t, t == BF16 ? BF16 : F32);
        p.batch = batch;
        SCOPED_TRACE(describe(p));
        check_product(amx, p, false, seed++);
        MatmulParams e = p;
        e.relu = true;
        check_product(amx, e, true, seed++);
        e.accumulate = true;
        check_product(amx, e, true, seed++);
        e.accumulate = false;
        check_product(amx, e, false, seed++, false, /*with_residual=*/true);
        Operand a = random_operand(t, batch * s.m * s.k, seed++), b = random_operand(t, batch * s.k * s.n, seed++);
        const size_t cs = dtype_size(p.c_dtype);
        std::vector<char> all(static_cast<size_t>(batch * s.m * s.n) * cs), one(all.size());
        amx_gemm(p, a.data(), b.data(), all.data());
        MatmulParams q = p;
        q.batch = 1;
        for (int64_t i = 0; i < batch; ++i)
          amx_gemm(q, static_cast<const char*>(a.data()) + i * s.m * s.k * dtype_size(t),
                   static_cast<const char*>(b.data()) + i * s.k * s.n * dtype_size(t),
                   one.data() + i * s.m * s.n * cs);
        EXPECT_EQ(all, one);
      }
}

// f16 values of wide magnitudes (2^-12 .. 2^8) multiplied through the split: within f32 accumulation of
// the f64 product of the f16 values themselves, where products of the values rounded to bf16 (what
// bf16_products computes) are off by far more.
TEST(AmxGemm, F16ProductsAreTheProductsOfTheF16ValuesNotOfBf16Roundings) {
  DEMI_SKIP_WITHOUT_AMX();
  ScopedCpuLevel level(CpuLevel::kAmx);
  const int64_t m = 48, n = 40, k = 200;
  for (int t = 0; t < 4; ++t) {
    MatmulParams p = params(m, n, k, t & 1, t & 2, F16, F16, F32);
    SCOPED_TRACE(describe(p));
    std::vector<double> av(static_cast<size_t>(m * k)), bv(static_cast<size_t>(k * n));
    Generator g(7 + t);
    auto fill = [&](std::vector<double>& v) {
      for (double& x : v) x = std::ldexp(2 * g.next_double() - 1, static_cast<int>(g.next_int(21)) - 12);
    };
    fill(av);
    fill(bv);
    std::vector<Half> a(av.size()), b(bv.size());
    convert(av.data(), DType::kF64, a.data(), F16, m * k);
    convert(bv.data(), DType::kF64, b.data(), F16, k * n);
    convert(a.data(), F16, av.data(), DType::kF64, m * k);  // the f16 values, exactly
    convert(b.data(), F16, bv.data(), DType::kF64, k * n);
    std::vector<float> c(static_cast<size_t>(m * n)), c_bf16(c.size());
    amx_gemm(p, a.data(), b.data(), c.data());
    MatmulParams q = p;
    q.bf16_products = true;
    amx_gemm(q, a.data(), b.data(), c_bf16.data());
    double worst = 0, worst_bf16 = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = 0, scale = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double x = av[static_cast<size_t>(t & 1 ? kk * m + i : i * k + kk)];
          const double y = bv[static_cast<size_t>(t & 2 ? j * k + kk : kk * n + j)];
          want += x * y;
          scale += std::abs(x * y);
        }
        worst = std::max(worst, std::abs(c[static_cast<size_t>(i * n + j)] - want) / scale);
        worst_bf16 = std::max(worst_bf16, std::abs(c_bf16[static_cast<size_t>(i * n + j)] - want) / scale);
      }
    EXPECT_LT(worst, 4 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(k)));  // f32 sums of exact products
    EXPECT_GT(worst_bf16, 30 * worst);  // (8-bit values: an error of order 2^-9 per product)
  }
}

// An f32 operand read rounded (MatmulParams::a_round, b_round: AMP's master weight and data batch) is
// packed from its rounded values: the product is the cast operand's, bit for bit.
TEST(AmxGemm, AnF32OperandReadRoundedIsTheCastOperandsProduct) {
  DEMI_SKIP_WITHOUT_AMX();
  ScopedCpuLevel level(CpuLevel::kAmx);
  for (DType round : {BF16, F16})
    for (int t = 0; t < 4; ++t) {
      MatmulParams p = params(37, 45, 70, t & 1, t & 2, round, F32, BF16);
      p.b_round = round;
      SCOPED_TRACE(describe(p));
      Operand a = random_operand(round, p.m * p.k, 3), b = random_operand(F32, p.k * p.n, 4);
      Operand b_cast = testing::cast_operand(b, round);
      std::vector<BFloat16> got(static_cast<size_t>(p.m * p.n)), want(got.size());
      amx_gemm(p, a.data(), b.data(), got.data());
      MatmulParams q = p;
      q.b_dtype = std::exchange(q.b_round, F32);
      amx_gemm(q, a.data(), b_cast.data(), want.data());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(BFloat16)));
      Operand a32 = testing::cast_operand(a, F32);  // the same values stored in f32, read rounded
      MatmulParams r = q;
      r.a_dtype = F32;
      r.a_round = round;
      amx_gemm(r, a32.data(), b_cast.data(), got.data());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(BFloat16)));
    }
}

// Each 32 x 32 block sums its K' in one order whatever thread takes it: one thread and two give the bits.
TEST(AmxGemm, ThreadsGiveTheSameBits) {
  DEMI_SKIP_WITHOUT_AMX();
  ScopedCpuLevel level(CpuLevel::kAmx);
  const MatmulParams p = params(130, 100, 300, false, true, F16, F16, F32);
  Operand a = random_operand(F16, p.m * p.k, 5), b = random_operand(F16, p.k * p.n, 6);
  std::vector<float> one(static_cast<size_t>(p.m * p.n)), two(one.size());
  const int saved = num_threads();
  set_num_threads(1);
  amx_gemm(p, a.data(), b.data(), one.data());
  set_num_threads(2);
  amx_gemm(p, a.data(), b.data(), two.data());
  set_num_threads(saved);
  EXPECT_EQ(one, two);
}

}  // namespace
}  // namespace demi::kernels::cpu
