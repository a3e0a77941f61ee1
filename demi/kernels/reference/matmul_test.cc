#include "demi/kernels/reference/matmul.h"

#include <gtest/gtest.h>

#include <vector>

#include "demi/kernels/internal/matmul_conv_test_util.h"

namespace demi::kernels::ref {
namespace {

using kernels::testing::random_operand;
using kernels::testing::widen;

TEST(RefMatmul, SmallProductWithBiasAndReluByHand) {
  // a (2, 3) . b (3, 2) + bias, then ReLU.
  std::vector<float> a = {1, 2, 3, -4, 5, -6};
  std::vector<float> b = {1, -1, 0, 2, 3, 1};
  std::vector<float> bias = {0.5f, -20.0f};
  std::vector<float> c(4);
  MatmulParams p;
  p.m = 2;
  p.n = 2;
  p.k = 3;
  p.bias = bias.data();
  matmul(p, a.data(), b.data(), c.data());
  // Row 0: (1 + 0 + 9, -1 + 4 + 3) = (10, 6); row 1: (-4 + 0 - 18, 4 + 10 - 6) = (-22, 8).
  EXPECT_EQ(c, (std::vector<float>{10.5f, -14.0f, -21.5f, -12.0f}));
  p.relu = true;
  matmul(p, a.data(), b.data(), c.data());
  EXPECT_EQ(c, (std::vector<float>{10.5f, 0.0f, 0.0f, 0.0f}));
  // Accumulate adds before the ReLU: c = relu(ab + bias + c).
  p.relu = false;
  p.accumulate = true;
  c = {1, 20, 30, 40};
  matmul(p, a.data(), b.data(), c.data());
  EXPECT_EQ(c, (std::vector<float>{11.5f, 6.0f, 8.5f, 28.0f}));
  // A residual adds the same way, from its own matrix (c's old values unread), before the ReLU.
  p.accumulate = false;
  p.relu = true;
  std::vector<float> residual = {1, 20, 30, 40};
  p.residual = residual.data();
  c = {-1, -1, -1, -1};
  matmul(p, a.data(), b.data(), c.data());
  EXPECT_EQ(c, (std::vector<float>{11.5f, 6.0f, 8.5f, 28.0f}));
}

TEST(RefMatmul, TransposedStorageGivesTheSameProduct) {
  const int64_t B = 2, M = 3, N = 4, K = 5;
  auto a = random_operand(DType::kF64, B * M * K, 1);
  auto b = random_operand(DType::kF64, B * K * N, 2);
  std::vector<double> av = widen(a.data(), a.dtype, a.n), bv = widen(b.data(), b.dtype, b.n);
  std::vector<double> at(a.n), bt(b.n);
  for (int64_t bi = 0; bi < B; ++bi) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) at[(bi * K + k) * M + i] = av[(bi * M + i) * K + k];
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) bt[(bi * N + j) * K + k] = bv[(bi * K + k) * N + j];
  }
  MatmulParams p;
  p.batch = B;
  p.m = M;
  p.n = N;
  p.k = K;
  p.a_dtype = p.b_dtype = p.c_dtype = DType::kF64;
  std::vector<double> c0(B * M * N), c1(B * M * N);
  matmul(p, a.data(), b.data(), c0.data());
  p.trans_a = p.trans_b = true;
  matmul(p, at.data(), bt.data(), c1.data());
  for (size_t i = 0; i < c0.size(); ++i) EXPECT_NEAR(c0[i], c1[i], 1e-14);
}

TEST(RefMatmul, LowPrecisionOutputIsOneRoundingOfTheF32Sum) {
  const int64_t M = 4, N = 3, K = 50;
  auto a = random_operand(DType::kBF16, M * K, 3);
  auto b = random_operand(DType::kBF16, K * N, 4);
  MatmulParams p;
  p.m = M;
  p.n = N;
  p.k = K;
  p.a_dtype = p.b_dtype = DType::kBF16;
  std::vector<float> c32(M * N);
  std::vector<BFloat16> c16(M * N);
  matmul(p, a.data(), b.data(), c32.data());
  p.c_dtype = DType::kBF16;
  matmul(p, a.data(), b.data(), c16.data());
  for (size_t i = 0; i < c32.size(); ++i) EXPECT_EQ(c16[i].bits, BFloat16(c32[i]).bits);
}

TEST(RefBiasGrad, ColumnSums) {
  std::vector<float> dy = {1, 2, 3, 4, 5, 6};  // (2, 3)
  std::vector<Half> db(3, Half(1.0f));
  bias_grad(dy.data(), DType::kF32, 2, 3, db.data(), DType::kF16, /*accumulate=*/true);
  EXPECT_EQ(static_cast<float>(db[0]), 6.0f);
  EXPECT_EQ(static_cast<float>(db[1]), 8.0f);
  EXPECT_EQ(static_cast<float>(db[2]), 10.0f);
}

}  // namespace
}  // namespace demi::kernels::ref
