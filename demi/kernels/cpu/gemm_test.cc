#include "demi/kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/core/parallel.h"
#include "demi/kernels/internal/matmul_conv_test_util.h"
#include "demi/kernels/reference/matmul.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels::cpu {
namespace {


constexpr DType F32 = DType::kF32, BF16 = DType::kBF16, F16 = DType::kF16;

// Blocks small enough that the shapes below cross every block boundary (several K blocks, row blocks
// and column panels), restored afterwards.
class ScopedBlocking {
 public:
  explicit ScopedBlocking(GemmBlocking b) : saved_(gemm_blocking()) { set_gemm_blocking(b); }
  ~ScopedBlocking() { set_gemm_blocking(saved_); }

 private:
  GemmBlocking saved_;
};

// fn(threads) on 1 and 2 threads, at every CPU level this machine has; the thread count restored after.
template <typename Fn>
void at_threads_and_levels(Fn fn) {
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (CpuLevel level : supported_cpu_levels()) {
      ScopedCpuLevel scoped(level);
      fn(threads);
    }
  }
  set_num_threads(saved);
}

// gemm on operands in p's dtypes against ref::matmul in f32 on the same (rounded) values; dyadic operands
// (exact) are compared bit for bit.
void check(const MatmulParams& p, bool with_bias, uint64_t seed, bool exact = false, bool residual = false) {
  SCOPED_TRACE(describe(p) + " at " + std::string(cpu_level_name(cpu_level())) + (exact ? " (dyadic)" : "") +
               (residual ? " + residual" : ""));
  kernels::testing::check_product([](auto&&... args) { cpu::gemm(args...); }, p, with_bias, seed, exact, residual);
}

using Dtypes = kernels::testing::MatmulDtypes;
// The shared mixes, and one more: f16 x f32 into bf16 (three different dtypes in one product).
const std::vector<Dtypes> kDtypes = [] {
  std::vector<Dtypes> v = kernels::testing::kMatmulDtypes;
  v.push_back({F16, F32, BF16});
  return v;
}();

struct Mnk {
  int64_t m, n, k;
};
// Below, at and past the tiles (MR 4 or 6, NR 16 or 64) and the test's blocks (MC 12, KC 10, NC 128).
// (N's last 64-column panel 1 to 64 wide: each count of 16-column vectors a short tile multiplies)
const Mnk kShapes[] = {{1, 1, 1},     {1, 10, 3},    {7, 65, 17},  {33, 1, 31}, {6, 64, 10},
                       {13, 129, 21}, {25, 200, 9},  {9, 90, 11},  {14, 105, 12}, {5, 123, 7}};

MatmulParams params(const Mnk& s, int t, int64_t batch, const Dtypes& d) {
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
  return p;
}

TEST(Gemm, MatchesReferenceAtEveryLevelShapeTransposeAndDtype) {
  ScopedBlocking small({12, 10, 128});
  uint64_t seed = 1;
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    for (const Dtypes& d : kDtypes)
      for (const Mnk& s : kShapes)
        for (int t = 0; t < 4; ++t)
          for (int64_t batch : {int64_t{1}, int64_t{3}}) check(params(s, t, batch, d), false, seed += 10);
  }
}

TEST(Gemm, EpiloguesFuseBiasReluAndAccumulate) {
  ScopedBlocking small({12, 10, 128});
  uint64_t seed = 5000;
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    for (const Dtypes& d : kDtypes)
      for (const Mnk& s : {Mnk{7, 65, 17}, Mnk{13, 129, 21}, Mnk{2, 3, 40}})
        for (int t = 0; t < 4; ++t)
          for (int flags = 1; flags < 8; ++flags) {
            MatmulParams p = params(s, t, 1, d);
            p.relu = flags & 2;
            p.accumulate = flags & 4;
            p.bias_dtype = d.c == F32 ? F32 : d.c;
            check(p, flags & 1, seed += 10);
          }
  }
}

// Products with K >= 256 and fewer rows than columns are computed swapped (c^T = b^T a^T): their tiles go
// through a block of c^T and are stored a row of c at a time with the epilogue (AVX-512), or stored
// transposed tile by tile (other levels). Every epilogue, both threads, several row blocks and K blocks.
TEST(Gemm, SwappedProductsFuseBiasReluAndAccumulate) {
  uint64_t seed = 7000;
  at_threads_and_levels([&](int) {
    for (const Dtypes& d :
         {Dtypes{F32, F32, F32}, Dtypes{BF16, BF16, BF16}, Dtypes{F16, F16, F16}, Dtypes{F16, F16, F32}})
      for (const Mnk& s : {Mnk{20, 300, 260}, Mnk{7, 70, 1500}})  // two row blocks; two K blocks
        for (int t = 0; t < 4; ++t)
          for (int flags : {3, 7}) {
            MatmulParams p = params(s, t, 1, d);
            p.relu = flags & 2;
            p.accumulate = flags & 4;
            p.bias_dtype = d.c;
            check(p, flags & 1, seed += 10);
            check(p, flags & 1, seed += 10, /*exact=*/true);
          }
  });
}

// A residual added in the store (MatmulParams::residual), with the bias and the ReLU after it: against the
// reference, on random and dyadic operands, through small blocks (several K blocks: a low-precision c is
// staged, an f32 one reads the residual in the first block's store and itself after), swapped products
// (their tiles stored through a transposed block) and both threads.
TEST(Gemm, EpiloguesAddAResidual) {
  uint64_t seed = 6000;
  at_threads_and_levels([&](int threads) {
    for (const Dtypes& d : kDtypes)
      for (const Mnk& s : {Mnk{7, 65, 17}, Mnk{13, 129, 21}, Mnk{2, 3, 40}, Mnk{20, 300, 260}, Mnk{7, 70, 1500}})
        for (int t = 0; t < 4; ++t)
          for (int flags : {0, 3}) {
            const bool small = s.k < 100;
            if (threads == 2 && small) continue;
            ScopedBlocking blocks(small ? GemmBlocking{12, 10, 128} : gemm_blocking());
            MatmulParams p = params(s, t, t == 1 ? 2 : 1, d);
            p.relu = flags & 2;
            p.bias_dtype = d.c;
            check(p, flags & 1, seed += 10, /*exact=*/false, /*residual=*/true);
            check(p, flags & 1, seed += 10, /*exact=*/true, /*residual=*/true);
          }
  });
}

// The residual read by the store is the same sum as accumulating onto a copy of it, bit for bit, and it may
// be c itself; with accumulate it is refused.
TEST(Gemm, AResidualIsAccumulatingOntoItsCopyBitForBit) {
  uint64_t seed = 6500;
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    for (const Dtypes& d : {Dtypes{F32, F32, F32}, Dtypes{BF16, BF16, BF16}, Dtypes{F16, F16, F16}})
      for (const Mnk& s : {Mnk{33, 130, 45}, Mnk{20, 300, 1300}, Mnk{130, 70, 300}})
        for (int t = 0; t < 4; ++t) {
          MatmulParams p = params(s, t, 1, d);
          SCOPED_TRACE(describe(p) + " at " + std::string(cpu_level_name(level)));
          auto a = kernels::testing::random_operand(d.a, p.m * p.k, seed += 10);
          auto b = kernels::testing::random_operand(d.b, p.k * p.n, seed + 1);
          auto r = kernels::testing::random_operand(d.c, p.m * p.n, seed + 2);
          auto fused = kernels::testing::random_operand(d.c, p.m * p.n, seed + 3);
          auto copy = r, in_place = r;
          MatmulParams acc = p;
          acc.accumulate = true;
          gemm(acc, a.data(), b.data(), copy.data());
          p.residual = r.data();
          gemm(p, a.data(), b.data(), fused.data());
          const size_t bytes = static_cast<size_t>(p.m * p.n) * dtype_size(d.c);
          EXPECT_EQ(std::memcmp(fused.data(), copy.data(), bytes), 0);
          p.residual = in_place.data();
          gemm(p, a.data(), b.data(), in_place.data());
          EXPECT_EQ(std::memcmp(in_place.data(), copy.data(), bytes), 0);
          p.accumulate = true;
          EXPECT_THROW(gemm(p, a.data(), b.data(), fused.data()), Error);
        }
  }
}

// op(a)'s row sums (MatmulParams::a_row_sums, a Dense weight gradient's bias gradient) taken from what the
// product packs: the blocks of a, or a swapped product's panels of b; across row blocks, K blocks and column
// blocks, both threads, both micro-kernels, an f32 a read rounded: bit for bit the plain f32 sums (k
// ascending) of a's values as read, and the product unchanged.
TEST(Gemm, RowSumsOfAFromThePackingAreThePlainSums) {
  uint64_t seed = 6700;
  at_threads_and_levels([&](int) {
    for (const Dtypes& d : {Dtypes{F32, F32, F32}, Dtypes{BF16, BF16, F32}, Dtypes{F16, F16, BF16},
                            Dtypes{F32, BF16, F32}})
      for (const Mnk& s : {Mnk{13, 129, 21}, Mnk{20, 300, 260}, Mnk{130, 70, 300}, Mnk{7, 70, 1500}})
        for (int t = 0; t < 4; ++t)
          for (GemmPath path : {GemmPath::kBf16Dot, GemmPath::kF32})
            for (DType round : {F32, BF16}) {
              if (round != F32 && d.a != F32) continue;
              ScopedBlocking blocks(s.k < 100 ? GemmBlocking{12, 10, 128} : gemm_blocking());
              MatmulParams p = params(s, t, 1, d);
              p.a_round = round;
              SCOPED_TRACE(describe(p) + " at " + std::string(cpu_level_name(cpu_level())) + ", " +
                           gemm_implementation(p, path));
              auto a = kernels::testing::random_operand(d.a, p.m * p.k, seed += 10);
              auto b = kernels::testing::random_operand(d.b, p.k * p.n, seed + 1);
              std::vector<float> values = a.f32;  // a's values as read
              if (round != F32) {
                std::vector<char> low(values.size() * 2);
                convert(values.data(), F32, low.data(), round, p.m * p.k);
                convert(low.data(), round, values.data(), F32, p.m * p.k);
              }
              std::vector<float> want(static_cast<size_t>(p.m), 0.0f), sums(want.size(), -1.0f);
              for (int64_t i = 0; i < p.m; ++i)
                for (int64_t k = 0; k < p.k; ++k)
                  want[static_cast<size_t>(i)] += values[static_cast<size_t>(p.trans_a ? k * p.m + i : i * p.k + k)];
              auto plain = kernels::testing::random_operand(d.c, p.m * p.n, seed + 2), with = plain;
              gemm(p, a.data(), b.data(), plain.data(), path);
              p.a_row_sums = sums.data();
              gemm(p, a.data(), b.data(), with.data(), path);
              EXPECT_EQ(sums, want);
              EXPECT_EQ(std::memcmp(plain.data(), with.data(), static_cast<size_t>(p.m * p.n) * dtype_size(d.c)), 0);
            }
  });
}

// A row bias (a convolution's per-channel bias, c's row i gets bias[i]) on swapped and unswapped products,
// exact on dyadic operands.
TEST(Gemm, RowBiasIsAddedDownTheRows) {
  uint64_t seed = 8000;
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    for (const Mnk& s : {Mnk{20, 300, 260}, Mnk{13, 129, 21}, Mnk{150, 70, 300}})
      for (int t = 0; t < 4; ++t)
        for (bool relu : {false, true}) {
          MatmulParams p = params(s, t, 1, {F32, F32, F32});
          p.relu = relu;
          SCOPED_TRACE(describe(p) + " at " + std::string(cpu_level_name(level)));
          auto a = kernels::testing::dyadic_operand(F32, p.m * p.k, seed += 10);
          auto b = kernels::testing::dyadic_operand(F32, p.k * p.n, seed + 1);
          auto bias = kernels::testing::dyadic_operand(F32, p.m, seed + 2);
          std::vector<float> want(static_cast<size_t>(p.m * p.n)), got(want.size());
          MatmulParams r = p;
          r.relu = false;
          ref::matmul(r, a.f32.data(), b.f32.data(), want.data());
          for (int64_t i = 0; i < p.m; ++i)
            for (int64_t j = 0; j < p.n; ++j) {
              float& w = want[static_cast<size_t>(i * p.n + j)];
              w += bias.f32[static_cast<size_t>(i)];
              if (relu) w = std::max(w, 0.0f);
            }
          gemm_row_bias(p, a.data(), b.data(), got.data(), bias.f32.data());
          EXPECT_EQ(got, want);
        }
  }
}

// With dyadic operands every partial sum is exact in f32, so the result is exact whatever the
// summation order: the f16 product equals the f32 product of the f16 values, bit for bit, and so does
// bf16's (vdpbf16ps included), at the default blocks and at small ones.
TEST(Gemm, ExactOnDyadicOperandsAtDefaultAndSmallBlocks) {
  uint64_t seed = 9000;
  for (GemmBlocking blk : {GemmBlocking{}, GemmBlocking{12, 10, 128}}) {
    ScopedBlocking scoped_blk(blk);
    for (CpuLevel level : supported_cpu_levels()) {
      ScopedCpuLevel scoped(level);
      for (const Dtypes& d : kDtypes)
        for (const Mnk& s : {Mnk{37, 130, 45}, Mnk{6, 64, 300}, Mnk{200, 70, 33}})
          for (int t = 0; t < 4; ++t) {
            MatmulParams p = params(s, t, 1, d);
            p.accumulate = t == 3;
            p.relu = t == 2;
            p.bias_dtype = F32;
            check(p, t == 1, seed += 10, /*exact=*/true);
          }
    }
  }
}

// Larger products across both threads: row blocks split, and too few rows (column panels split).
TEST(Gemm, ThreadedProductsMatch) {
  uint64_t seed = 12000;
  for (const Dtypes& d : {Dtypes{F32, F32, F32}, Dtypes{BF16, BF16, BF16}, Dtypes{F16, F16, F32}})
    for (const Mnk& s : {Mnk{256, 300, 129}, Mnk{5, 1000, 200}, Mnk{130, 70, 1100},
                         // few rows: the threads split the columns, each packing its own panels; short K
                         // (one wide column block), several K blocks, and the swap's threshold K = 256
                         // (the threads prepare the one block of a together, by rows or by runs of k)
                         Mnk{30, 2500, 10}, Mnk{10, 3000, 32}, Mnk{20, 500, 1700}, Mnk{128, 600, 256},
                         Mnk{70, 190, 300}})
      for (int t = 0; t < 4; ++t) check(params(s, t, 1, d), t == 0, seed += 10);
  // A batch of many small products runs one per thread.
  check(params({17, 33, 20}, 2, 40, {F16, F16, F16}), false, seed + 1);
}

// Every scratch block of a threaded product is taken on the calling thread before the threads start:
// blocks a worker took for itself would be missed by graph mode's recording of the step (it records the
// stepping thread's allocations) and make the tracked peak depend on whether the threads' parts
// overlapped in time (a forecast that differs from the training it forecasts).
TEST(Gemm, ThreadedProductsTakeTheirScratchOnTheCallingThread) {
  const int saved_threads = num_threads();
  set_num_threads(2);
  struct Case {
    Mnk s;
    int t;
    int64_t batch;
    DType a, round, c;
  };
  // Split by rows; few rows split by columns (the shared block of a); swapped (tiles staged, then stored
  // transposed); swapped with a transposed f32 a read rounded to bf16 (its rows staged per thread); a
  // batch of small products run one per thread (attention's products); a batch of large ones in turn.
  const Case cases[] = {{{256, 300, 129}, 0, 1, F32, F32, F32},  {{10, 3000, 32}, 1, 1, F16, F32, F32},
                        {{20, 500, 1700}, 2, 1, F16, F16, F16},  {{70, 190, 300}, 3, 1, BF16, BF16, BF16},
                        {{300, 260, 600}, 2, 1, BF16, BF16, F32}, {{128, 600, 256}, 0, 1, F16, F16, F32},
                        {{17, 33, 20}, 2, 40, F16, F32, F16},    {{64, 64, 300}, 1, 12, BF16, F32, BF16},
                        {{200, 300, 100}, 0, 2, F32, F32, F32}};
  uint64_t seed = 31000;
  for (const Case& k : cases)
    for (GemmPath path : {GemmPath::kBf16Dot, GemmPath::kF32}) {
      MatmulParams p = params(k.s, k.t, k.batch, {k.a, F32, k.c});
      p.b_round = k.round;
      SCOPED_TRACE(describe(p));
      const int64_t na = p.batch * p.m * p.k, nb = p.batch * p.k * p.n, nc = p.batch * p.m * p.n;
      auto a = kernels::testing::random_operand(k.a, na, seed += 10);
      auto b = kernels::testing::random_operand(F32, nb, seed + 1);
      std::vector<char> c(static_cast<size_t>(nc) * dtype_size(k.c));
      const int64_t allocs = mem_stats().allocs;
      ASSERT_TRUE(mem_record_begin());
      gemm(p, a.data(), b.data(), c.data(), path);
      const std::vector<AllocationEvent> recorded = mem_record_end();
      EXPECT_EQ(static_cast<int64_t>(recorded.size()), mem_stats().allocs - allocs);
    }
  set_num_threads(saved_threads);
}

// Runs check(shape, transposes, path, level) over both blockings (the default, and one that crosses every
// block), every CPU level, every shape, the four transposes and both micro-kernel paths, on 2 threads.
template <typename Check>
void for_each_layout(const std::vector<Mnk>& shapes, Check check) {
  const int saved_threads = num_threads();
  set_num_threads(2);
  for (GemmBlocking blk : {GemmBlocking{}, GemmBlocking{12, 10, 128}}) {
    ScopedBlocking scoped_blk(blk);
    for (CpuLevel level : supported_cpu_levels()) {
      ScopedCpuLevel scoped(level);
      for (const Mnk& s : shapes)
        for (int t = 0; t < 4; ++t)
          for (GemmPath path : {GemmPath::kBf16Dot, GemmPath::kF32}) check(s, t, path, level);
    }
  }
  set_num_threads(saved_threads);
}

std::string where(const MatmulParams& p, CpuLevel level, GemmPath path) {
  return describe(p) + " at " + std::string(cpu_level_name(level)) + (path == GemmPath::kF32 ? " (f32 path)" : "");
}

// An f32 b read rounded to bf16|f16 (MatmulParams::b_round: AMP's master weights), an f32 a likewise
// (a_round: AMP's data batch), or both, is rounded as it is packed: bit for bit the product of the cast
// operands, on either micro-kernel, in every layout — including products whose operands are swapped (b then
// packed as a, in both orientations), several K blocks, column-split threads and a batch — and an f32 value
// past f16's range reads as inf, as the cast gives.
TEST(Gemm, AnF32OperandReadRoundedIsBitForBitTheCastOperand) {
  struct Mix {
    DType other, round, c;  // the operand that is not rounded, the rounding, the output
  };
  const Mix mixes[] = {{BF16, BF16, F32}, {BF16, BF16, BF16}, {F16, F16, F32}, {F16, F16, F16}, {F32, BF16, F32}};
  // ({70, 190, 300}: swapped, then too few rows to split: the threads share the rounded block of a.)
  const std::vector<Mnk> shapes = {{7, 65, 17},   {13, 129, 21}, {5, 300, 300}, {40, 70, 600},
                                   {300, 5, 260}, {10, 3000, 32}, {70, 190, 300}};
  uint64_t seed = 20000;
  for (int rounded : {0, 1, 2})  // b, a, both
    for (const Mix& mix : mixes) {
      if (rounded == 2 && mix.other != mix.round) continue;
      const bool round_a = rounded >= 1, round_b = rounded != 1;
      for_each_layout(shapes, [&](const Mnk& s, int t, GemmPath path, CpuLevel level) {
        MatmulParams p = params(s, t, s.m == 7 ? 2 : 1, {round_a ? F32 : mix.other, round_b ? F32 : mix.other, mix.c});
        if (round_a) p.a_round = mix.round;
        if (round_b) p.b_round = mix.round;
        SCOPED_TRACE(where(p, level, path));
        const int64_t na = p.batch * p.m * p.k, nb = p.batch * p.k * p.n, nc = p.batch * p.m * p.n;
        auto a = kernels::testing::random_operand(p.a_dtype, na, seed += 10);
        auto b = kernels::testing::random_operand(p.b_dtype, nb, seed + 1);
        if (round_a) static_cast<float*>(a.data())[na / 3] = -70000.0f;  // -inf in f16
        if (round_b) static_cast<float*>(b.data())[nb / 2] = 70000.0f;   // inf in f16
        std::vector<char> a_low(static_cast<size_t>(na) * dtype_size(mix.round)), b_low(static_cast<size_t>(nb) *
                                                                                       dtype_size(mix.round));
        if (round_a) convert(a.data(), F32, a_low.data(), mix.round, na);
        if (round_b) convert(b.data(), F32, b_low.data(), mix.round, nb);
        std::vector<char> got(static_cast<size_t>(nc) * dtype_size(mix.c)), want(got.size());
        gemm(p, a.data(), b.data(), got.data(), path);
        MatmulParams cast = p;
        if (round_a) cast.a_dtype = mix.round, cast.a_round = F32;
        if (round_b) cast.b_dtype = mix.round, cast.b_round = F32;
        gemm(cast, round_a ? a_low.data() : a.data(), round_b ? b_low.data() : b.data(), want.data(), path);
        ASSERT_EQ(got, want);
      });
    }
}

// MatmulParams::bf16_products: the f16 values (an f16 a or b, an f32 b read as f16) multiplied rounded to
// bf16 give bit for bit the bf16 product of operands cast to bf16 first (f32 -> f16 -> bf16 for a b read as
// f16), over K blocks, swapped products, column splits, transposes and output dtypes, on both paths (the
// pair kernel, and the f32 FMA kernel on rounded panels, at every level); and it is not the exact product.
TEST(Gemm, F16ValuesMultipliedAsBf16AreBitForBitTheProductOfBf16CastOperands) {
  struct Mix {
    DType a, b, round, c;
  };
  const Mix mixes[] = {{F16, F16, F32, F32},  {F16, F16, F32, F16},  {F16, BF16, F32, F32},
                       {BF16, F16, F32, BF16}, {F16, F32, F16, F32}, {F16, F32, F16, F16}};
  const std::vector<Mnk> shapes = {{7, 65, 17},   {13, 129, 21}, {5, 300, 300},
                                   {40, 70, 600}, {300, 5, 260}, {70, 190, 300}};
  uint64_t seed = 30000;
  int differs_from_exact = 0, products = 0;
  for (const Mix& mix : mixes)
    for_each_layout(shapes, [&](const Mnk& s, int t, GemmPath path, CpuLevel level) {
      MatmulParams p = params(s, t, s.m == 7 ? 2 : 1, {mix.a, mix.b, mix.c});
      p.b_round = mix.round;
      p.bf16_products = true;
      SCOPED_TRACE(where(p, level, path));
      const int64_t na = p.batch * p.m * p.k, nb = p.batch * p.k * p.n, nc = p.batch * p.m * p.n;
      auto a = kernels::testing::random_operand(mix.a, na, seed += 10);
      auto b = kernels::testing::random_operand(mix.b, nb, seed + 1);
      // An f16 subnormal (a normal f32 once widened) and, read as f16, an f32 past f16's range (inf).
      if (mix.a == F16) static_cast<Half*>(a.data())[na / 3] = Half(3e-6f);
      if (mix.b == F32) static_cast<float*>(b.data())[nb / 2] = 70000.0f;
      std::vector<char> got(static_cast<size_t>(nc) * dtype_size(mix.c)), want(got.size()), exact(got.size());
      gemm(p, a.data(), b.data(), got.data(), path);
      // The operands cast to bf16 first: an f16 value widened exactly, then rounded once.
      std::vector<BFloat16> a16(static_cast<size_t>(na)), b16(static_cast<size_t>(nb));
      convert(a.data(), mix.a, a16.data(), BF16, na);
      std::vector<Half> b_half(mix.round == F16 ? static_cast<size_t>(nb) : 0);
      if (mix.round == F16) {
        convert(b.data(), F32, b_half.data(), F16, nb);
        convert(b_half.data(), F16, b16.data(), BF16, nb);
      } else {
        convert(b.data(), mix.b, b16.data(), BF16, nb);
      }
      MatmulParams cast = p;
      cast.a_dtype = cast.b_dtype = BF16;
      cast.b_round = F32;
      cast.bf16_products = false;
      gemm(cast, a16.data(), b16.data(), want.data(), path);
      ASSERT_EQ(got, want);
      MatmulParams plain = p;
      plain.bf16_products = false;
      gemm(plain, a.data(), b.data(), exact.data(), path);
      differs_from_exact += exact != got;
      ++products;
    });
  EXPECT_EQ(differs_from_exact, products);  // random f16 values: 11 significant bits make other sums
}

TEST(Gemm, RejectsFloat64AndBadSizes) {
  MatmulParams p = params({2, 2, 2}, 0, 1, {DType::kF64, DType::kF64, DType::kF64});
  std::vector<double> x(8);
  EXPECT_THROW(gemm(p, x.data(), x.data(), x.data()), Error);
  p = params({0, 2, 2}, 0, 1, {F32, F32, F32});
  EXPECT_THROW(gemm(p, x.data(), x.data(), x.data()), Error);
  p = params({2, 2, 2}, 0, 1, {BF16, BF16, F32});
  p.b_round = BF16;  // b must be f32 to be read rounded
  EXPECT_THROW(gemm(p, x.data(), x.data(), x.data()), Error);
  p.b_dtype = F32;
  p.b_round = DType::kI32;
  EXPECT_THROW(gemm(p, x.data(), x.data(), x.data()), Error);
  p.b_round = F32;
  p.a_round = BF16;  // a must be f32 to be read rounded
  EXPECT_THROW(gemm(p, x.data(), x.data(), x.data()), Error);
}

TEST(Gemm, NamesItsVariant) {
  MatmulParams p = params({2, 2, 2}, 0, 1, {BF16, BF16, F32});
  const std::string name = gemm_implementation(p);
  EXPECT_EQ(name.rfind("demi:", 0), 0u) << name;
  if (cpu_level() >= CpuLevel::kAvx512Bf16) {  // (the AMX level runs the avx512_bf16 variant's tiles)
    EXPECT_EQ(name, "demi:avx512_bf16:bf16");
  }
  ScopedCpuLevel scalar(CpuLevel::kScalar);
  EXPECT_EQ(gemm_implementation(p), "demi:scalar:f32");
}

// A product of few rows split by columns packs each panel of b just before it is multiplied, into the task's
// own slot: model A's weight gradient (10 x 7200, K = 32, f16) held a packed f32 copy of all of b (0.9 MiB).
TEST(Gemm, ColumnSplitPacksOnePanelAtATimePerThread) {
  const int saved_threads = num_threads();
  set_num_threads(2);
  MatmulParams p = params({10, 7200, 32}, 1, 1, {F16, F16, F32});  // a^T b, as a weight gradient
  std::vector<Half> a(static_cast<size_t>(p.m * p.k), Half(0.5f)), b(static_cast<size_t>(p.k * p.n), Half(0.25f));
  std::vector<float> c(static_cast<size_t>(p.m * p.n));
  const int64_t before = mem_stats().cur(MemCategory::kWorkspace);
  ScopedPeak peak;
  gemm(p, a.data(), b.data(), c.data());
  const int64_t scratch = peak.peak().pk(MemCategory::kWorkspace) - before;
  // Two 32 x 64 f32 panels and the block of a the threads share (32 x 16 f32 values), with alignment.
  EXPECT_LE(scratch, 2 * 32 * 64 * 4 + 2 * (32 * 16 * 4 + 64)) << "bytes of workspace";
  EXPECT_EQ(c[0], 32 * 0.5f * 0.25f);
  EXPECT_EQ(c.back(), 32 * 0.5f * 0.25f);
  set_num_threads(saved_threads);
}

}  // namespace
}  // namespace demi::kernels::cpu
