// The optimizers' updates at every ISA level against the formulas applied one element at a time (as the
// optimizers applied them before they ran on the kernels): the same bits, tails and weight decay included.
#include "demi/kernels/cpu/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "demi/core/half.h"
#include "demi/kernels/cpu/internal/test_util.h"

namespace demi::kernels {
namespace {

using testing::for_each_level;
using testing::random_floats;

// Sizes around each vector width (AVX2 8, AVX-512 16: full vectors and tails) and a long one.
constexpr int64_t kSizes[] = {1, 7, 8, 9, 15, 16, 17, 33, 1031};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(OptimizerKernels, MomentumGivesTheFormulasBitsAtEveryLevel) {
  for_each_level([](CpuLevel) {
    uint64_t seed = 1;
    for (int64_t n : kSizes)
      for (bool nesterov : {false, true})
        for (float wd : {0.0f, 1e-2f}) {
          SCOPED_TRACE(::testing::Message() << "n " << n << (nesterov ? " nesterov" : "") << " wd " << wd);
          const std::vector<float> p0 = random_floats(n, seed++), g = random_floats(n, seed++),
                                   v0 = random_floats(n, seed++);
          const MomentumStep s{0.9f, 0.01f, wd, nesterov};
          std::vector<float> p = p0, v = v0, want_p = p0, want_v = v0;
          momentum_update(s, v.data(), p.data(), g.data(), n);
          for (int64_t i = 0; i < n; ++i) {
            if (nesterov) {
              const float gi = g[i] + wd * want_p[i];
              want_v[i] = s.momentum * want_v[i] + gi;
              want_p[i] -= s.lr * (gi + s.momentum * want_v[i]);
            } else {
              want_v[i] = s.momentum * want_v[i] + g[i] + wd * want_p[i];
              want_p[i] -= s.lr * want_v[i];
            }
          }
          EXPECT_TRUE(same_bits(p, want_p));
          EXPECT_TRUE(same_bits(v, want_v));
        }
  });
}

// A gradient and state stored in other dtypes, in one pass: the bits of widening them (the gradient then
// multiplied by its scale where that is not 1), the formulas, and the state rounded back to bf16.
TEST(OptimizerKernels, MomentumMixedIsTheWidenedUpdateAtEveryLevel) {
  for_each_level([](CpuLevel) {
    uint64_t seed = 50;
    for (int64_t n : kSizes)
      for (DType gt : {DType::kF32, DType::kF16, DType::kBF16})
        for (DType vt : {DType::kF32, DType::kBF16})
          for (bool nesterov : {false, true})
            for (float scale : {1.0f, 0.75f / 1024}) {
              SCOPED_TRACE(::testing::Message() << "n " << n << " g " << dtype_name(gt) << " v " << dtype_name(vt)
                                                << (nesterov ? " nesterov" : "") << " scale " << scale);
              const std::vector<float> p0 = random_floats(n, seed++), g32 = random_floats(n, seed++, -300, 300),
                                       v32 = random_floats(n, seed++);
              std::vector<Half> gh(g32.begin(), g32.end());
              std::vector<BFloat16> gb(g32.begin(), g32.end()), vb(v32.begin(), v32.end());
              std::vector<float> vf = v32;
              const MomentumStep s{0.9f, 0.01f, 1e-2f, nesterov};
              // the widened operands, as the optimizer's buffers hold them
              std::vector<float> g(static_cast<size_t>(n)), want_v(static_cast<size_t>(n)), want_p = p0, p = p0;
              for (size_t i = 0; i < g.size(); ++i) {
                g[i] = gt == DType::kF16 ? static_cast<float>(gh[i]) : gt == DType::kBF16 ? static_cast<float>(gb[i]) : g32[i];
                if (scale != 1.0f) g[i] *= scale;
                want_v[i] = vt == DType::kBF16 ? static_cast<float>(vb[i]) : vf[i];
              }
              momentum_update(s, want_v.data(), want_p.data(), g.data(), n);
              const void* gp = gt == DType::kF16 ? static_cast<const void*>(gh.data())
                               : gt == DType::kBF16 ? static_cast<const void*>(gb.data())
                                                    : static_cast<const void*>(g32.data());
              void* vp = vt == DType::kBF16 ? static_cast<void*>(vb.data()) : static_cast<void*>(vf.data());
              momentum_update_mixed(s, {.g = gp, .g_dtype = gt, .g_scale = scale, .v = vp, .v_dtype = vt}, p.data(), n);
              EXPECT_TRUE(same_bits(p, want_p));
              for (size_t i = 0; i < want_v.size(); ++i) {
                const float got = vt == DType::kBF16 ? static_cast<float>(vb[i]) : vf[i];
                const float want = vt == DType::kBF16 ? static_cast<float>(BFloat16(want_v[i])) : want_v[i];
                ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << "state element " << i;
              }
            }
  });
}

TEST(OptimizerKernels, SgdGivesTheFormulasBitsAtEveryLevel) {
  for_each_level([](CpuLevel) {
    uint64_t seed = 100;
    for (int64_t n : kSizes)
      for (float wd : {0.0f, 1e-2f}) {
        SCOPED_TRACE(::testing::Message() << "n " << n << " wd " << wd);
        const std::vector<float> p0 = random_floats(n, seed++), g = random_floats(n, seed++);
        std::vector<float> p = p0, want = p0;
        sgd_update({0.05f, wd}, p.data(), g.data(), n);
        for (int64_t i = 0; i < n; ++i) want[i] -= 0.05f * (g[i] + wd * want[i]);
        EXPECT_TRUE(same_bits(p, want));
      }
  });
}

TEST(OptimizerKernels, AdamGivesTheFormulasBitsAtEveryLevel) {
  for_each_level([](CpuLevel) {
    uint64_t seed = 200;
    for (int64_t n : kSizes)
      for (bool decoupled : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "n " << n << (decoupled ? " AdamW" : " Adam"));
        const std::vector<float> p0 = random_floats(n, seed++), g = random_floats(n, seed++),
                                 m0 = random_floats(n, seed++, -0.1f, 0.1f);
        std::vector<float> v0 = random_floats(n, seed++, 0.0f, 0.01f);  // (a second moment is never negative)
        AdamStep s;
        s.beta1 = 0.9f;
        s.beta2 = 0.999f;
        s.step = 1e-3f / static_cast<float>(1.0 - std::pow(0.9, 3.0));
        s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(0.999, 3.0)));
        s.eps = 1e-8f;
        s.decay = decoupled ? 1.0f - 1e-3f * 0.1f : 1.0f;
        s.l2 = decoupled ? 0.0f : 0.1f;
        std::vector<float> p = p0, m = m0, v = v0, want_p = p0, want_m = m0, want_v = v0;
        adam_update(s, m.data(), v.data(), p.data(), g.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          const float gi = g[i] + s.l2 * want_p[i];
          want_m[i] = s.beta1 * want_m[i] + (1 - s.beta1) * gi;
          want_v[i] = s.beta2 * want_v[i] + (1 - s.beta2) * gi * gi;
          want_p[i] = want_p[i] * s.decay - s.step * want_m[i] / (std::sqrt(want_v[i]) / s.bias_correction2_sqrt + s.eps);
        }
        EXPECT_TRUE(same_bits(p, want_p));
        EXPECT_TRUE(same_bits(m, want_m));
        EXPECT_TRUE(same_bits(v, want_v));
      }
  });
}

}  // namespace
}  // namespace demi::kernels
