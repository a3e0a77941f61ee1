#include "demi/kernels/cpu/f16_split.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "demi/core/cpu.h"
#include "demi/core/rng.h"

namespace demi::kernels {
namespace {

std::vector<Half> every_f16() {
  std::vector<Half> v(65536);
  for (uint32_t b = 0; b < 65536; ++b) v[b] = Half::from_bits(static_cast<uint16_t>(b));
  return v;
}

// hi + lo is the f16 value exactly, for every one of the 65,536 patterns; Inf keeps lo 0, NaN stays NaN.
TEST(F16Split, HiPlusLoIsExactForEveryPattern) {
  const std::vector<Half> all = every_f16();
  std::vector<BFloat16> out(4 * all.size());
  // One row of 65,536: segments of the whole row, pattern h l h l.
  split_f16_bf16_reference(all.data(), 1, 65536, out.data(), 4 * 65536, 65536, kSplitRhs);
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = static_cast<float>(all[b]);
    const float hi = static_cast<float>(out[b]), lo = static_cast<float>(out[65536 + b]);
    ASSERT_EQ(out[b].bits, out[2 * 65536 + b].bits) << "segment 2 is hi again";
    ASSERT_EQ(out[65536 + b].bits, out[3 * 65536 + b].bits) << "segment 3 is lo again";
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(hi)) << std::hex << b;
      EXPECT_EQ(lo, 0.0f) << std::hex << b;
    } else if (std::isinf(x)) {
      EXPECT_EQ(hi, x) << std::hex << b;
      EXPECT_EQ(lo, 0.0f) << std::hex << b;
    } else {
      EXPECT_EQ(hi + lo, x) << "f16 bits 0x" << std::hex << b;
      EXPECT_LE(std::abs(lo), std::abs(x) * (1.0f / 128)) << "lo is below hi's last bit: 0x" << std::hex << b;
    }
  }
}

// Four bf16 products of the split values give a * b exactly, as f32 products of the f16 values do.
TEST(F16Split, FourProductsReproduceTheF32Product) {
  Generator g(11);
  for (int t = 0; t < 200000; ++t) {
    const Half a = Half::from_bits(static_cast<uint16_t>(g.next_int(65536)));
    const Half b = Half::from_bits(static_cast<uint16_t>(g.next_int(65536)));
    const float fa = static_cast<float>(a), fb = static_cast<float>(b);
    if (!std::isfinite(fa) || !std::isfinite(fb)) continue;
    BFloat16 sa[4], sb[4];
    split_f16_bf16_reference(&a, 1, 1, sa, 4, 1, kSplitLhs);
    split_f16_bf16_reference(&b, 1, 1, sb, 4, 1, kSplitRhs);
    double sum = 0;
    for (int s = 0; s < 4; ++s) sum += double(static_cast<float>(sa[s])) * double(static_cast<float>(sb[s]));
    ASSERT_EQ(sum, double(fa) * double(fb)) << std::hex << a.bits << " * " << b.bits;
  }
}

// The fast kernel (every supported level, several threads) writes exactly the reference's bits, for row
// lengths around the 16-lane width, both layouts (segments within a row, or stacked) and both patterns.
TEST(F16Split, FastKernelMatchesTheReferenceBitForBit) {
  const std::vector<Half> all = every_f16();
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    for (int64_t cols : {1, 15, 16, 17, 33, 256, 1000})
      for (unsigned pattern : {kSplitLhs, kSplitRhs})
        for (bool stacked : {false, true}) {
          const int64_t rows = 65536 / cols;
          const int64_t row_stride = stacked ? cols : 4 * cols, seg_stride = stacked ? rows * cols : cols;
          std::vector<BFloat16> got(4 * rows * cols, BFloat16::from_bits(0x1234)), want = got;
          split_f16_bf16(all.data(), rows, cols, got.data(), row_stride, seg_stride, pattern);
          split_f16_bf16_reference(all.data(), rows, cols, want.data(), row_stride, seg_stride, pattern);
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(BFloat16)), 0)
              << cpu_level_name(level) << " cols " << cols << " pattern " << pattern << (stacked ? " stacked" : "");
        }
  }
}

}  // namespace
}  // namespace demi::kernels
