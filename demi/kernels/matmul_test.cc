#include "demi/kernels/matmul.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "demi/core/convert.h"
#include "demi/kernels/internal/matmul_conv_test_util.h"
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

// An f32 b read rounded to bf16|f16 (AMP's master weight): every policy gives the product of the cast b —
// the reference's within the product's tolerance, and under oneDNN (which gets a rounded copy: bf16, or
// f32 holding the f16 values) bit for bit oneDNN's product of the cast b; few output columns (demi-dot's
// shape) included.
TEST(Matmul, AnF32OperandReadRoundedIsTheCastOperandsProductUnderEveryPolicy) {
  for (MatmulPolicy policy : {MatmulPolicy::kAuto, MatmulPolicy::kDemi, MatmulPolicy::kOnednn})
    for (DType t : {DType::kBF16, DType::kF16})
      for (int64_t n : {int64_t{70}, int64_t{10}}) {
        set_matmul_policy(policy);
        MatmulParams p = product(37, n, 45, t);
        p.b_dtype = DType::kF32;
        p.b_round = t;
        SCOPED_TRACE(describe(p) + " -> " + matmul_kernel(p));
        Operand a = random_operand(t, p.m * p.k, 1), b = random_operand(DType::kF32, p.n * p.k, 2);
        std::vector<char> b_low(static_cast<size_t>(p.n * p.k) * dtype_size(t));
        convert(b.data(), DType::kF32, b_low.data(), t, p.n * p.k);
        std::vector<float> want(static_cast<size_t>(p.m * p.n));
        MatmulParams r = p;
        r.a_dtype = r.c_dtype = DType::kF32;
        ref::matmul(r, a.f32.data(), b.f32.data(), want.data());  // (ref rounds b itself)
        Operand c = random_operand(t, p.m * p.n, 3), c_cast = c;
        matmul(p, a.data(), b.data(), c.data());
        EXPECT_TRUE(all_close(c.data(), t, widen(want.data(), DType::kF32, c.n), tolerance_for_sum(t, p.k, 1.0)));
        if (policy == MatmulPolicy::kOnednn) {
          MatmulParams cast = p;
          cast.b_dtype = t;
          cast.b_round = DType::kF32;
          matmul(cast, a.data(), b_low.data(), c_cast.data());
          EXPECT_EQ(c.bytes, c_cast.bytes);
        }
      }
  set_matmul_policy(MatmulPolicy::kAuto);
}

TEST(Matmul, PoliciesNameTheirKernels) {
  MatmulParams p = product(8, 8, 8, DType::kF16);
  set_matmul_policy(MatmulPolicy::kOnednn);
  EXPECT_EQ(matmul_kernel(p).rfind("onednn (", 0), 0u) << matmul_kernel(p);
  set_matmul_policy(MatmulPolicy::kDemi);
  EXPECT_EQ(matmul_kernel(p).rfind("demi-f32 (demi:", 0), 0u) << matmul_kernel(p);
  set_matmul_policy(MatmulPolicy::kAuto);
  p.a_dtype = p.b_dtype = p.c_dtype = DType::kF64;
  EXPECT_EQ(matmul_kernel(p), "reference");
}

// A choice is written to the cache file once and read back by a process that has not tuned it (here: after
// forgetting the in-memory choices); the first choice written wins over tuning again.
TEST(Matmul, ChoicesPersistInTheCacheFile) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("demi_matmul_test_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
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
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace demi::kernels
