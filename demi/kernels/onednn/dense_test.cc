// Dense kernels against plain f64 loops written from the formulas in dense.h (independent of the matmul
// parameter mapping in dense.cc), on operands rounded to each dtype.
#include "demi/kernels/onednn/dense.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "demi/core/cpu.h"
#include "demi/core/test_support.h"
#include "demi/kernels/internal/matmul_conv_test_util.h"
#include "demi/kernels/matmul.h"
#include "demi/kernels/onednn/internal/onednn_util.h"
#include "demi/kernels/reference/matmul.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels::onednn {
namespace {

using kernels::testing::all_close;
using kernels::testing::Operand;
using kernels::testing::random_operand;

constexpr DType F32 = DType::kF32, BF16 = DType::kBF16, F16 = DType::kF16;

struct DenseCase {
  int64_t m, k, n;
};

// in: dtype of x, w and dy; out: dtype of y, dx, dw and db (f32 from low precision is AMP's case).
void check_dense(const DenseCase& s, DType in, DType out, bool relu, bool accumulate, uint64_t seed) {
  DenseParams p;
  p.m = s.m;
  p.k = s.k;
  p.n = s.n;
  p.relu = relu;
  p.accumulate = accumulate;
  SCOPED_TRACE(::testing::Message() << "dense M=" << s.m << " K=" << s.k << " N=" << s.n << " in "
                                    << dtype_name(in) << " out " << dtype_name(out) << (relu ? " relu" : "")
                                    << (accumulate ? " accumulate" : ""));
  Operand x = random_operand(in, s.m * s.k, seed), w = random_operand(in, s.n * s.k, seed + 1);
  Operand b = random_operand(out, s.n, seed + 2), dy = random_operand(in, s.m * s.n, seed + 3);
  Operand y = random_operand(out, s.m * s.n, seed + 4), dx = random_operand(out, s.m * s.k, seed + 5);
  Operand dw = random_operand(out, s.n * s.k, seed + 6), db = random_operand(out, s.n, seed + 7);
  const std::vector<float> dx0 = dx.f32, dw0 = dw.f32, db0 = db.f32;

  // Forward: y = act(x w^T + b) in x's dtype, y's dtype out.
  p.x_dtype = p.w_dtype = in;
  p.y_dtype = p.bias_dtype = out;
  dense_forward(p, x.data(), w.data(), b.data(), y.data());
  std::vector<double> want(s.m * s.n);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double v = b.f32[j];
      for (int64_t kk = 0; kk < s.k; ++kk) v += double(x.f32[i * s.k + kk]) * w.f32[j * s.k + kk];
      want[i * s.n + j] = relu ? std::max(v, 0.0) : v;
    }
  EXPECT_TRUE(all_close(y.data(), out, want, tolerance_for_sum(out, s.k, 1.0))) << "forward";

  // Backward: dy in `in`, gradients out in `out`.
  p.y_dtype = p.w_dtype = in;
  p.x_dtype = p.bias_dtype = out;
  dense_backward_data(p, dy.data(), w.data(), dx.data());
  want.assign(s.m * s.k, 0.0);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t kk = 0; kk < s.k; ++kk) {
      double v = accumulate ? dx0[i * s.k + kk] : 0.0;
      for (int64_t j = 0; j < s.n; ++j) v += double(dy.f32[i * s.n + j]) * w.f32[j * s.k + kk];
      want[i * s.k + kk] = v;
    }
  EXPECT_TRUE(all_close(dx.data(), out, want, tolerance_for_sum(out, s.n, 1.0))) << "backward-data";

  // The weight gradient reads x in `in` (as the forward saved it).
  p.x_dtype = in;
  p.w_dtype = out;
  dense_backward_weights(p, x.data(), dy.data(), dw.data(), db.data());
  want.assign(s.n * s.k, 0.0);
  std::vector<double> want_db(s.n);
  for (int64_t j = 0; j < s.n; ++j) {
    double sb = accumulate ? db0[j] : 0.0;
    for (int64_t i = 0; i < s.m; ++i) sb += dy.f32[i * s.n + j];
    want_db[j] = sb;
    for (int64_t kk = 0; kk < s.k; ++kk) {
      double v = accumulate ? dw0[j * s.k + kk] : 0.0;
      for (int64_t i = 0; i < s.m; ++i) v += double(dy.f32[i * s.n + j]) * x.f32[i * s.k + kk];
      want[j * s.k + kk] = v;
    }
  }
  EXPECT_TRUE(all_close(dw.data(), out, want, tolerance_for_sum(out, s.m, 1.0))) << "backward-weights";
  EXPECT_TRUE(all_close(db.data(), out, want_db, tolerance_for_sum(out, s.m, 1.0))) << "bias gradient";
}

TEST(OnednnDense, ForwardAndBackwardMatchTheFormulas) {
  // Model C's layers at a small batch, the 10-way head, batch 1 and odd sizes.
  const DenseCase cases[] = {{5, 784, 33}, {3, 1024, 10}, {1, 17, 1}, {7, 3, 65}};
  uint64_t seed = 1;
  for (const DenseCase& s : cases)
    for (auto [in, out] : {std::pair{F32, F32}, {BF16, BF16}, {BF16, F32}, {F16, F16}, {F16, F32}})
      for (int flags = 0; flags < 2; ++flags) check_dense(s, in, out, flags == 1, flags == 1, seed += 10);
}

// A bf16 weight gradient (f32 or bf16 dw and db, no accumulation) is made by oneDNN's inner-product
// primitive or by the product, whichever measured faster for the shape here (the matmul policy forces
// either: demi's products only, or oneDNN's primitive wherever it applies); the other combinations keep
// the product. Each way against the same formulas, and the measured choice kept in its file, read back by
// a new process instead of measuring again.
TEST(OnednnDense, WeightGradientWaysEachMatchTheFormulasAndTheChoiceIsKept) {
  const bool ip_applies = internal::has_bf16_kernels();  // (oneDNN has no bf16 kernels on an AVX2 CPU)
  const MatmulPolicy saved = matmul_policy();
  const test_support::TempDir tmp("demi-dense-weights-choices");
  const std::string dir = tmp.str();
  set_dense_weights_cache_dir(dir);
  const DenseCase cases[] = {{1024, 64, 33}, {300, 19, 7}};
  uint64_t seed = 500;
  for (MatmulPolicy policy : {MatmulPolicy::kDemi, MatmulPolicy::kOnednn, MatmulPolicy::kAuto}) {
    set_matmul_policy(policy);
    for (const DenseCase& s : cases)
      for (auto [in, out] : {std::pair{BF16, F32}, {BF16, BF16}, {F32, F32}})
        for (int flags = 0; flags < 2; ++flags) check_dense(s, in, out, flags == 1, flags == 1, seed += 10);
    DenseParams p;
    p.m = 300;
    p.k = 19;
    p.n = 7;
    p.x_dtype = p.y_dtype = BF16;
    const std::string way = dense_backward_weights_kernel(p, true);
    SCOPED_TRACE(way);
    if (policy != MatmulPolicy::kAuto) {  // (kAuto: whichever measured faster)
      EXPECT_EQ(way == "onednn-inner-product", policy == MatmulPolicy::kOnednn && ip_applies);
    }
    EXPECT_TRUE(way == "onednn-inner-product" || way.starts_with("product (")) << way;
    p.x_dtype = p.y_dtype = F32;  // an f32 weight gradient: the product, whatever the policy
    EXPECT_TRUE(dense_backward_weights_kernel(p, true).starts_with("product ("));
  }
  // Under kAuto, each bf16 shape above (and dtype of dw and db) was measured once: one line each, or none
  // where the primitive does not apply.
  const std::string path = dense_weights_cache_path();
  ASSERT_NE(path, "");
  const std::vector<std::string> lines = [&] {
    std::ifstream in(path);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }();
  ASSERT_EQ(lines.size(), ip_applies ? 4u : 0u);  // 2 shapes x (f32, bf16) dw and db
  for (const std::string& line : lines)
    EXPECT_TRUE(line.ends_with(" = onednn-inner-product") || line.ends_with(" = product")) << line;
  if (ip_applies) {
    EXPECT_NE(lines[0].find(" 1024x64->33 x bfloat16 dy bfloat16 dw float32 db float32 = "), std::string::npos)
        << lines[0];
  }
  set_dense_weights_cache_dir(dir);  // a new process: reads the file, measures nothing
  for (const DenseCase& s : cases) check_dense(s, BF16, F32, false, false, seed += 10);
  std::ifstream again(path);
  size_t count = 0;
  for (std::string line; std::getline(again, line);) ++count;
  EXPECT_EQ(count, lines.size());
  set_dense_weights_cache_dir("");
  set_matmul_policy(saved);
}

TEST(OnednnDense, BiasGradMatchesReferenceAcrossBlocksAndDtypes) {
  // 300 columns span two column blocks; 1 row and 1 column are the edges.
  struct Rc {
    int64_t rows, cols;
  };
  uint64_t seed = 900;
  for (CpuLevel level : supported_cpu_levels())  // the bf16 / f16 rows are widened by demi's convert kernels
    for (Rc s : {Rc{1, 1}, Rc{37, 300}, Rc{256, 10}, Rc{5, 1024}})
      for (DType dy_t : {F32, BF16, F16})
        for (DType db_t : {F32, BF16, F16})
          for (bool acc : {false, true}) {
            ScopedCpuLevel scoped(level);
            SCOPED_TRACE(::testing::Message()
                         << cpu_level_name(level) << " bias_grad dy(" << s.rows << ", " << s.cols << ") "
                         << dtype_name(dy_t) << " -> " << dtype_name(db_t) << (acc ? " accumulate" : ""));
            Operand dy = random_operand(dy_t, s.rows * s.cols, seed += 3);
            Operand got = random_operand(db_t, s.cols, seed + 1);
            Operand want = got;
            bias_grad(dy.data(), dy_t, s.rows, s.cols, got.data(), db_t, acc);
            ref::bias_grad(dy.data(), dy_t, s.rows, s.cols, want.data(), db_t, acc);
            EXPECT_TRUE(all_close(got.data(), db_t, kernels::testing::widen(want.data(), db_t, s.cols),
                                  tolerance_for_sum(db_t, s.rows, 1.0)));
          }
}

}  // namespace
}  // namespace demi::kernels::onednn
