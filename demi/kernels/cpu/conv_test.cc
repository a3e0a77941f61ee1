// demi's convolution on the GEMM against the reference, for every groups-1 geometry of the shared list,
// every dtype pairing, accumulation, and every CPU level (the GEMM's variants).
#include "demi/kernels/cpu/conv.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/internal/conv_test_util.h"
#include "demi/kernels/internal/matmul_conv_test_util.h"

namespace demi::kernels::cpu {
namespace {

using kernels::testing::Fixture;
using kernels::testing::Geometry;
using kernels::testing::kGeometries;

constexpr DType F32 = DType::kF32, BF16 = DType::kBF16, F16 = DType::kF16;

const kernels::testing::ConvKernels kDemi{conv2d_forward, conv2d_backward_data, conv2d_backward_weights};

TEST(DemiConv, MatchesReferenceForEveryGeometryDtypeAndLevel) {
  const std::pair<DType, DType> dtypes[] = {{F32, F32}, {BF16, BF16}, {BF16, F32}, {F16, F16}, {F16, F32}};
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    SCOPED_TRACE(cpu_level_name(level));
    int i = 0;
    for (const Geometry& g : kGeometries) {
      if (g.groups != 1) continue;
      Fixture f(g);
      for (auto [in, out] : dtypes) kernels::testing::check_all_directions(kDemi, f, in, out, ConvLayout::kAuto, (i++ % 2) == 1);
    }
  }
}

// The convolutions on the tile unit (bf16, stride 1, channels in multiples of 32: conv_amx.h) against the
// reference, each direction: the forward with bias and ReLU, the data gradient (the forward of dy with
// the flipped weights) and the weight gradient; dilation and asymmetric padding (the taps read the padded
// image at offsets i * dilation_h * wp + j * dilation_w), a 1 x 1 kernel, a 5 x 5 one over more images
// than a thread's chunk of four, with and without accumulation.
TEST(DemiConv, ConvolutionsOnTheTileUnitMatchTheReference) {
  if (max_cpu_level() < CpuLevel::kAmx)
    GTEST_SKIP() << "this CPU runs at most " << cpu_level_name(max_cpu_level())
                 << ": the tile unit's convolutions need AMX (Xeons from Sapphire Rapids on); the other "
                    "levels' are tested everywhere";
  ScopedCpuLevel level(CpuLevel::kAmx);
  const Geometry geometries[] = {
      {"dilation (2, 1), asymmetric padding", 5, 32, 9, 11, 64, 3, 2, 1, 1, 2, 1, 0, 1, 2, 1, 1},
      {"1x1, 64 -> 32", 3, 64, 7, 5, 32, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
      {"5x5 pad 2, 11 images", 11, 32, 6, 7, 32, 5, 5, 1, 1, 2, 2, 2, 2, 1, 1, 1}};
  for (const Geometry& g : geometries) {
    Fixture f(g);
    kernels::testing::check_all_directions(kDemi, f, BF16, BF16, ConvLayout::kAuto, false);
    kernels::testing::check_all_directions(kDemi, f, BF16, BF16, ConvLayout::kAuto, true);
  }
}

// An output gradient made one image at a time (Images::make, as the fused Conv2d -> ReLU -> MaxPool2d
// backward unpools it) gives the bits of the same gradient stored whole, on every path that reads it: the
// indirect data and weight gradients, the per-image data gradient (stride 2), and the per-image weight
// gradient (K x OC partial sums past the indirect form's 2 MiB), at every CPU level.
TEST(DemiConv, AnOutputGradientMadePerImageGivesTheStoredOnesBits) {
  const Geometry wide_k{"K x OC past 2 MiB", 2, 64, 3, 3, 1024, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  for (const Geometry& g : {kGeometries[2], kGeometries[3], wide_k})
    for (DType t : {F32, BF16})
      for (CpuLevel level : supported_cpu_levels()) {
        ScopedCpuLevel scoped(level);
        SCOPED_TRACE(std::string(g.name) + " " + std::string(dtype_name(t)) + " at " + std::string(cpu_level_name(level)));
        Conv2dParams p = kernels::testing::params_of(g);
        p.x_dtype = p.w_dtype = p.y_dtype = t;
        p.bias_dtype = F32;
        using kernels::testing::random_operand;
        const auto x = random_operand(t, p.x_numel(), 1), w = random_operand(t, p.w_numel(), 2);
        const auto dy = random_operand(t, p.y_numel(), 3);
        const size_t image_bytes = static_cast<size_t>(p.y_numel() / p.n) * dtype_size(t);
        std::atomic<int64_t> made{0};
        const Images per_image{.make =
                                   [&](int64_t n, void* dst) {
                                     std::memcpy(dst, static_cast<const char*>(dy.data()) + n * image_bytes,
                                                 image_bytes);
                                     ++made;
                                   },
                               .make_bytes = image_bytes};
        auto dx_stored = random_operand(t, p.x_numel(), 4), dx_made = dx_stored;
        conv2d_backward_data(p, dy.data(), w.data(), dx_stored.data());
        conv2d_backward_data(p, per_image, w.data(), dx_made.data());
        EXPECT_EQ(dx_made.bytes, dx_stored.bytes) << "dx";
        Conv2dParams pw = p;
        pw.w_dtype = F32;
        auto dw_stored = random_operand(F32, p.w_numel(), 5), dw_made = dw_stored;
        auto db_stored = random_operand(F32, p.oc, 6), db_made = db_stored;
        conv2d_backward_weights(pw, x.data(), dy.data(), dw_stored.data(), db_stored.data());
        conv2d_backward_weights(pw, x.data(), per_image, dw_made.data(), db_made.data());
        EXPECT_EQ(dw_made.bytes, dw_stored.bytes) << "dw";
        EXPECT_EQ(db_made.bytes, db_stored.bytes) << "db";
        EXPECT_GE(made.load(), 2 * p.n) << "every image made, for both gradients";
      }
  EXPECT_FALSE(conv2d_backward_data_indirect_supported(kernels::testing::params_of(kGeometries[3])));
  EXPECT_FALSE(conv2d_backward_weights_indirect_supported(kernels::testing::params_of(wide_k)));
}

TEST(DemiConv, RejectsGroupsAndFloat64) {
  Conv2dParams p = kernels::testing::params_of(kGeometries[5]);  // groups 2
  EXPECT_FALSE(conv2d_supported(p));
  std::vector<float> buf(4096);
  EXPECT_THROW(conv2d_forward(p, buf.data(), buf.data(), nullptr, buf.data()), Error);
  p.groups = 1;
  p.x_dtype = p.w_dtype = p.y_dtype = p.bias_dtype = DType::kF64;
  EXPECT_FALSE(conv2d_supported(p));
}

}  // namespace
}  // namespace demi::kernels::cpu
