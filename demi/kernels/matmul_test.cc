#include "demi/kernels/matmul.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/test_support.h"
#include "demi/kernels/cpu/gemm.h"
#include "demi/kernels/cpu/gemm_dot.h"
#include "demi/kernels/internal/matmul_conv_test_util.h"
#include "demi/kernels/onednn/matmul.h"
#include "demi/kernels/reference/matmul.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels {
namespace {

using testing::all_close;
using testing::Operand;
using testing::random_operand;
using testing::widen;

MatmulParams product(int64_t m, int64_t n, int64_t k, DType t) {
  MatmulParams p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.trans_b = true;
  p.a_dtype = p.b_dtype = p.c_dtype = t;
  return p;
}

// Whichever kernel is picked, the product is the reference's.
TEST(Matmul, EveryPolicyMatchesTheReference) {
  for (MatmulPolicy policy : {MatmulPolicy::kAuto, MatmulPolicy::kDemi, MatmulPolicy::kOnednn})
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      set_matmul_policy(policy);
      MatmulParams p = product(37, 70, 45, t);
      SCOPED_TRACE(describe(p) + " -> " + matmul_kernel(p));
      Operand a = random_operand(t, p.m * p.k, 1), b = random_operand(t, p.n * p.k, 2);
      std::vector<float> want(static_cast<size_t>(p.m * p.n));
      MatmulParams r = p;
      r.a_dtype = r.b_dtype = r.c_dtype = DType::kF32;
      ref::matmul(r, a.f32.data(), b.f32.data(), want.data());
      Operand c = random_operand(t, p.m * p.n, 3);
      matmul(p, a.data(), b.data(), c.data());
      EXPECT_TRUE(all_close(c.data(), t, widen(want.data(), DType::kF32, c.n), tolerance_for_sum(t, p.k, 1.0)));
    }
  set_matmul_policy(MatmulPolicy::kAuto);
}

// A residual added to the product (MatmulParams::residual): demi's GEMM reads it in its store, every other
// kernel accumulates onto a copy of it in c; under every policy the sum is the reference's, with the bias
// and ReLU, for a residual beside c and for c itself (the copy skipped). A product oneDNN runs directly
// refuses one (it would be ignored).
TEST(Matmul, AResidualIsAddedUnderEveryPolicy) {
  uint64_t seed = 300;
  for (MatmulPolicy policy : {MatmulPolicy::kAuto, MatmulPolicy::kDemi, MatmulPolicy::kOnednn})
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
      for (int64_t n : {int64_t{70}, int64_t{5}}) {  // 5 columns: demi-dot's shape too
        set_matmul_policy(policy);
        MatmulParams p = product(37, n, 45, t);
        p.bias_dtype = t;
        p.relu = n == 5;
        SCOPED_TRACE(describe(p) + " + residual -> " + matmul_kernel(p));
        testing::check_product([](auto&&... args) { matmul(args...); }, p, true, seed += 10, false, true);
        Operand a = random_operand(t, p.m * p.k, seed + 1), b = random_operand(t, p.n * p.k, seed + 2);
        Operand c = random_operand(t, p.m * p.n, seed + 3), copy = c;
        MatmulParams q = p;
        q.residual = c.data();
        matmul(q, a.data(), b.data(), c.data());
        q.residual = nullptr;
        q.accumulate = true;
        std::vector<float> want = copy.f32;
        MatmulParams r = q;
        r.a_dtype = r.b_dtype = r.c_dtype = DType::kF32;
        ref::matmul(r, a.f32.data(), b.f32.data(), want.data());
        EXPECT_TRUE(all_close(c.data(), t, widen(want.data(), DType::kF32, c.n), tolerance_for_sum(t, p.k, 1.0)));
      }
  set_matmul_policy(MatmulPolicy::kAuto);
  MatmulParams p = product(4, 4, 4, DType::kF32);
  std::vector<float> a(16, 1.0f), b(16, 1.0f), c(16, 0.0f), r(16, 2.0f);
  p.residual = r.data();
  EXPECT_THROW(onednn::matmul(p, a.data(), b.data(), c.data()), Error);
  EXPECT_THROW(cpu::gemm_dot(p, a.data(), b.data(), c.data()), Error);
}

// op(a)'s row sums (MatmulParams::a_row_sums) under every policy, from demi's GEMM's packing or from a pass
// of their own (oneDNN, demi-dot, f16 values multiplied as bf16): bit for bit the plain f32 sums, k
// ascending, of a's values, both layouts of a, an f32 a read rounded to f16.
TEST(Matmul, RowSumsOfAAreThePlainSumsUnderEveryPolicy) {
  uint64_t seed = 500;
  for (MatmulPolicy policy : {MatmulPolicy::kAuto, MatmulPolicy::kDemi, MatmulPolicy::kOnednn})
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
      for (int64_t n : {int64_t{300}, int64_t{5}})
        for (bool ta : {false, true}) {
          set_matmul_policy(policy);
          MatmulParams p = product(70, n, 45, t);
          p.trans_a = ta;
          p.trans_b = !ta;  // (x . w^T, demi-dot's layout, untransposed)
          p.c_dtype = DType::kF32;
          if (t == DType::kF32 && n == 5) p.a_round = DType::kF16;
          SCOPED_TRACE(describe(p) + " -> " + matmul_kernel(p));
          Operand a = random_operand(t, p.m * p.k, seed += 10), b = random_operand(t, p.n * p.k, seed + 1);
          std::vector<float> values = a.f32;
          if (p.a_round != DType::kF32) values = testing::cast_operand(testing::cast_operand(a, DType::kF16),
                                                                       DType::kF32).f32;
          std::vector<float> want(static_cast<size_t>(p.m), 0.0f), sums(want.size(), -1.0f);
          for (int64_t i = 0; i < p.m; ++i)
            for (int64_t k = 0; k < p.k; ++k)
              want[static_cast<size_t>(i)] += values[static_cast<size_t>(ta ? k * p.m + i : i * p.k + k)];
          Operand c = random_operand(DType::kF32, p.m * p.n, seed + 2);
          p.a_row_sums = sums.data();
          matmul(p, a.data(), b.data(), c.data());
          EXPECT_EQ(sums, want);
        }
  set_matmul_policy(MatmulPolicy::kAuto);
}

// A product with a residual and row sums named before it ever ran (`demi info`'s path): the tuning runs the
// candidates on zeroed scratch for a, b, the residual and the sums, and records the choice under its own key.
TEST(Matmul, AProductWithAResidualAndRowSumsIsTunedWithoutOperands) {
  const test_support::TempDir tmp("demi_matmul_epilogue_test");
  const std::string dir = tmp.str();
  set_matmul_cache_dir(dir);
  const float mark = 0;  // (only whether each is present matters without operands)
  float sums_mark = 0;
  for (DType t : {DType::kF32, DType::kBF16}) {
    MatmulParams p = product(37, 70, 45, t);
    p.trans_a = true;
    p.trans_b = false;
    p.residual = &mark;
    p.a_row_sums = &sums_mark;
    const std::string kernel = matmul_kernel(p);
    EXPECT_FALSE(kernel.empty());
  }
  std::ifstream in(matmul_cache_path());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("37x70x45 ta b float32,float32->float32 residual row-sums = "), std::string::npos) << text;
  EXPECT_NE(text.find("37x70x45 ta b bfloat16,bfloat16->bfloat16 residual row-sums = "), std::string::npos) << text;
  EXPECT_EQ(sums_mark, 0.0f) << "the caller's sums are not written without operands";
  set_matmul_cache_dir("");
}

// An f32 b read rounded to bf16|f16 (AMP's master weight), or an f32 a (AMP's data batch): every policy
// gives the product of the cast operand — the reference's within the product's tolerance, and under oneDNN
// (which gets a rounded copy: bf16, or f32 holding the f16 values) bit for bit oneDNN's product of the cast
// operand; few output columns (demi-dot's shape, which gets a rounded copy of a) included.
TEST(Matmul, AnF32OperandReadRoundedIsTheCastOperandsProductUnderEveryPolicy) {
  for (MatmulPolicy policy : {MatmulPolicy::kAuto, MatmulPolicy::kDemi, MatmulPolicy::kOnednn})
    for (bool round_a : {false, true})
    for (DType t : {DType::kBF16, DType::kF16})
      for (int64_t n : {int64_t{70}, int64_t{10}}) {
        set_matmul_policy(policy);
        MatmulParams p = product(37, n, 45, t);
        (round_a ? p.a_dtype : p.b_dtype) = DType::kF32;
        (round_a ? p.a_round : p.b_round) = t;
        SCOPED_TRACE(describe(p) + " -> " + matmul_kernel(p));
        Operand a = random_operand(p.a_dtype, p.m * p.k, 1), b = random_operand(p.b_dtype, p.n * p.k, 2);
        const Operand& rounded = round_a ? a : b;
        std::vector<char> low(static_cast<size_t>(rounded.n) * dtype_size(t));
        convert(rounded.data(), DType::kF32, low.data(), t, rounded.n);
        std::vector<float> want(static_cast<size_t>(p.m * p.n));
        MatmulParams r = p;
        r.a_dtype = r.b_dtype = r.c_dtype = DType::kF32;
        ref::matmul(r, a.f32.data(), b.f32.data(), want.data());  // (ref rounds the operand itself)
        Operand c = random_operand(t, p.m * p.n, 3), c_cast = c;
        matmul(p, a.data(), b.data(), c.data());
        EXPECT_TRUE(all_close(c.data(), t, widen(want.data(), DType::kF32, c.n), tolerance_for_sum(t, p.k, 1.0)));
        if (policy == MatmulPolicy::kOnednn) {
          MatmulParams cast = p;
          (round_a ? cast.a_dtype : cast.b_dtype) = t;
          cast.a_round = cast.b_round = DType::kF32;
          matmul(cast, round_a ? low.data() : a.data(), round_a ? b.data() : low.data(), c_cast.data());
          EXPECT_EQ(c.bytes, c_cast.bytes);
        }
      }
  set_matmul_policy(MatmulPolicy::kAuto);
}

// F16Products::kBf16 (an explicit opt-in): every product with f16 values among f16|bf16 operands runs one
// of demi's kernels, which round them to bf16 (the pair kernel; the f32 one on rounded panels or demi-dot
// where those measure faster), under every policy (within an F16ProductsScope), and is the reference's product of those values rounded to bf16
// (ref::matmul honours MatmulParams::bf16_products: the reference twin); f32 and bf16 x bf16 products are
// untouched. Without AVX512-BF16 the setting is refused.
TEST(Matmul, F16ProductsInBf16RunThePairKernelOnBf16RoundedValues) {
  for (CpuLevel level : supported_cpu_levels()) {  // refused where the pair kernel is missing, kept as it was
    ScopedCpuLevel scoped(level);
    if (cpu::gemm_has_bf16_dot()) continue;
    EXPECT_THROW(F16ProductsScope(F16Products::kBf16), Error) << cpu_level_name(level);
    EXPECT_EQ(f16_products(), F16Products::kExact);
  }
  if (!cpu::gemm_has_bf16_dot()) return;
  std::optional<F16ProductsScope> scope(F16Products::kBf16);
  for (MatmulPolicy policy : {MatmulPolicy::kAuto, MatmulPolicy::kDemi, MatmulPolicy::kOnednn})
    for (int shape = 0; shape < 4; ++shape) {
      set_matmul_policy(policy);
      MatmulParams p = product(37, shape == 3 ? 10 : 70, 45, DType::kF16);
      if (shape == 1) p.c_dtype = DType::kF32;              // a weight gradient's f32 sums
      if (shape == 2) p.b_dtype = DType::kF32, p.b_round = DType::kF16;  // the master weight read as f16
      SCOPED_TRACE(describe(p) + " -> " + matmul_kernel(p));
      EXPECT_EQ(matmul_kernel(p).rfind("demi-", 0), 0u);  // never oneDNN's, which multiplies f16 exactly
      Operand a = random_operand(p.a_dtype, p.m * p.k, 1), b = random_operand(p.b_dtype, p.n * p.k, 2);
      std::vector<float> want(static_cast<size_t>(p.m * p.n)), exact(want.size());
      MatmulParams r = p;
      r.bf16_products = true;
      r.c_dtype = DType::kF32;
      ref::matmul(r, a.data(), b.data(), want.data());
      r.bf16_products = false;
      ref::matmul(r, a.data(), b.data(), exact.data());
      EXPECT_NE(want, exact);  // the setting changes the numbers
      Operand c = random_operand(p.c_dtype, p.m * p.n, 3);
      matmul(p, a.data(), b.data(), c.data());
      EXPECT_TRUE(all_close(c.data(), p.c_dtype, widen(want.data(), DType::kF32, c.n),
                            tolerance_for_sum(p.c_dtype, p.k, 1.0)));
    }
  set_matmul_policy(MatmulPolicy::kOnednn);
  EXPECT_EQ(matmul_kernel(product(8, 8, 8, DType::kF32)).rfind("onednn (", 0), 0u);
  EXPECT_EQ(matmul_kernel(product(8, 8, 8, DType::kBF16)).rfind("onednn (", 0), 0u);
  set_matmul_policy(MatmulPolicy::kAuto);
  scope.reset();
  EXPECT_EQ(f16_products(), F16Products::kExact);  // the scope's end puts the thread's choice back
  set_matmul_policy(MatmulPolicy::kOnednn);
  EXPECT_EQ(matmul_kernel(product(8, 8, 8, DType::kF16)).rfind("onednn (", 0), 0u);
  set_matmul_policy(MatmulPolicy::kAuto);
}

TEST(Matmul, PoliciesNameTheirKernels) {
  MatmulParams p = product(8, 8, 8, DType::kF16);
  set_matmul_policy(MatmulPolicy::kOnednn);
  EXPECT_EQ(matmul_kernel(p).rfind("onednn (", 0), 0u) << matmul_kernel(p);
  set_matmul_policy(MatmulPolicy::kDemi);
  // (one of demi's kernels: which one, demi's f32 GEMM or demi-dot, is measured per shape on the machine)
  const std::string demi = matmul_kernel(p);
  EXPECT_TRUE(demi.rfind("demi-f32 (demi:", 0) == 0 || demi.rfind("demi-dot (demi-dot:", 0) == 0) << demi;
  set_matmul_policy(MatmulPolicy::kAuto);
  p.a_dtype = p.b_dtype = p.c_dtype = DType::kF64;
  EXPECT_EQ(matmul_kernel(p), "reference");
}

// A choice is written to the cache file once and read back by a process that has not tuned it (here: after
// forgetting the in-memory choices); the first choice written wins over tuning again.
TEST(Matmul, ChoicesPersistInTheCacheFile) {
  const test_support::TempDir tmp("demi_matmul_test");
  const std::string dir = tmp.str();
  set_matmul_cache_dir(dir);
  const std::string path = matmul_cache_path();
  ASSERT_FALSE(path.empty()) << "no cache folder could be written";
  MatmulParams p = product(41, 43, 47, DType::kBF16);
  const std::string first = matmul_kernel(p);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("41x43x47"), std::string::npos) << path;
  // Forge an entry for another shape: a fresh process (no memory) must take the file's word for it.
  MatmulParams q = product(53, 59, 61, DType::kF16);
  const std::string probe = matmul_kernel(q);  // tunes and records q
  clear_matmul_choices();
  const bool was_onednn = probe.rfind("onednn", 0) == 0;
  {
    std::ifstream r(path);
    std::string all((std::istreambuf_iterator<char>(r)), std::istreambuf_iterator<char>());
    std::string line;
    std::istringstream lines(all);
    std::string rewritten;
    while (std::getline(lines, line)) {
      if (line.find("53x59x61") != std::string::npos)
        line = line.substr(0, line.rfind(" = ")) + (was_onednn ? " = demi-f32" : " = onednn");
      rewritten += line + "\n";
    }
    std::ofstream w(path, std::ios::trunc);
    w << rewritten;
  }
  EXPECT_EQ(matmul_kernel(q).rfind(was_onednn ? "demi-f32" : "onednn", 0), 0u) << matmul_kernel(q);
  EXPECT_EQ(matmul_kernel(p), first);
  set_matmul_cache_dir("");
}

}  // namespace
}  // namespace demi::kernels
