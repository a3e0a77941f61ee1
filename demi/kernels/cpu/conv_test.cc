// demi's convolution on the GEMM against the reference, for every groups-1 geometry of the shared list,
// every dtype pairing, accumulation, and every CPU level (the GEMM's variants).
#include "demi/kernels/cpu/conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/internal/conv_test_util.h"
#include "demi/kernels/internal/matmul_conv_test_util.h"
#include "demi/kernels/reference/conv.h"
#include "demi/kernels/tolerance.h"

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

// The tile unit's tests skip below the amx level, saying so and what runs there instead (`elsewhere`).
#define DEMI_SKIP_WITHOUT_AMX(elsewhere)                                                                   \
  if (max_cpu_level() < CpuLevel::kAmx)                                                                   \
  GTEST_SKIP() << "this CPU runs at most " << cpu_level_name(max_cpu_level())                             \
               << ": the tile unit's convolutions need AMX (Xeons from Sapphire Rapids on); " << (elsewhere)

// The convolutions on the tile unit (bf16, stride 1, channels in multiples of 32: conv_amx.h) against the
// reference, each direction: the forward with bias and ReLU, the data gradient (the forward of dy with
// the flipped weights) and the weight gradient; dilation and asymmetric padding (the taps read the padded
// image at offsets i * dilation_h * wp + j * dilation_w), a 1 x 1 kernel, a 5 x 5 one over more images
// than a thread's chunk of four, with and without accumulation.
TEST(DemiConv, ConvolutionsOnTheTileUnitMatchTheReference) {
  DEMI_SKIP_WITHOUT_AMX("the other levels' are tested everywhere");
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

// f16 values at the amx level: the forward on the tile unit (split exactly into bf16 hi + lo: four products
// each, exact in f32), the gradients on f32 FMAs (conv.cc: split_f16 says why) — each direction against the
// f64 convolution of the f16 values themselves within f32 accumulation, where products of the values rounded
// to bf16 are off by far more. The values are random f16 ones with all 11 significant bits (the shared
// fixture's are exact in bf16, so their lo parts are 0). Accumulating, and one geometry past a thread's chunk
// of four images.
TEST(DemiConv, F16ConvolutionsOnTheTileUnitAreTheProductsOfTheF16Values) {
  DEMI_SKIP_WITHOUT_AMX("f16 convolutions elsewhere are tested against the reference at every level");
  ScopedCpuLevel level(CpuLevel::kAmx);
  using kernels::testing::Operand;
  using kernels::testing::random_operand;
  const Geometry geometries[] = {
      {"model B's second layer", 3, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
      {"dilation (2, 1), asymmetric padding, 9 images", 9, 32, 9, 11, 32, 3, 2, 1, 1, 2, 1, 0, 1, 2, 1, 1}};
  uint64_t seed = 700;
  for (const Geometry& g : geometries) {
    SCOPED_TRACE(g.name);
    Conv2dParams p = kernels::testing::params_of(g);
    p.x_dtype = p.w_dtype = F16;
    p.y_dtype = p.bias_dtype = F32;
    ASSERT_TRUE(conv2d_forward_on_tiles(p));
    const Operand x = random_operand(F16, p.x_numel(), seed++), w = random_operand(F16, p.w_numel(), seed++);
    const Operand dy = random_operand(F16, p.y_numel(), seed++), acc = random_operand(F32, p.x_numel(), seed++);
    const Operand wacc = random_operand(F32, p.w_numel(), seed++);
    // The f64 convolutions of the values given and of their bf16 roundings (bf16 products' error).
    const auto as_f64 = kernels::testing::values_f64;
    Conv2dParams p64 = p;
    p64.x_dtype = p64.w_dtype = p64.y_dtype = p64.bias_dtype = DType::kF64;
    for (bool accumulate : {false, true}) {
      std::vector<double> want[2], want_bf16[2];  // forward, dx, dw: [exact, rounded]
      Conv2dParams q64 = p64;
      q64.accumulate = accumulate;
      std::vector<float> got_y(static_cast<size_t>(p.y_numel())), got_dx = acc.f32, got_dw = wacc.f32;
      Conv2dParams q = p;
      q.accumulate = accumulate;
      // forward (no accumulation: a forward overwrites y)
      std::vector<double> y(static_cast<size_t>(p.y_numel())), y16(y.size());
      ref::conv2d_forward(p64, as_f64(x, false).data(), as_f64(w, false).data(), nullptr, y.data());
      ref::conv2d_forward(p64, as_f64(x, true).data(), as_f64(w, true).data(), nullptr, y16.data());
      conv2d_forward(p, x.data(), w.data(), nullptr, got_y.data());
      // data gradient: dy, w f16 -> dx f32
      std::vector<double> dx(acc.f32.begin(), acc.f32.end()), dx16 = dx;
      ref::conv2d_backward_data(q64, as_f64(dy, false).data(), as_f64(w, false).data(), dx.data());
      ref::conv2d_backward_data(q64, as_f64(dy, true).data(), as_f64(w, true).data(), dx16.data());
      Conv2dParams qd = q;
      qd.y_dtype = F16;
      qd.x_dtype = F32;
      conv2d_backward_data(qd, dy.data(), w.data(), got_dx.data());
      // weight gradient: x, dy f16 -> dw f32 (no bias gradient: its sums are dy's alone)
      std::vector<double> dw(wacc.f32.begin(), wacc.f32.end()), dw16 = dw;
      ref::conv2d_backward_weights(q64, as_f64(x, false).data(), as_f64(dy, false).data(), dw.data(), nullptr);
      ref::conv2d_backward_weights(q64, as_f64(x, true).data(), as_f64(dy, true).data(), dw16.data(), nullptr);
      Conv2dParams qw = q;
      qw.y_dtype = F16;
      qw.w_dtype = F32;
      conv2d_backward_weights(qw, x.data(), dy.data(), got_dw.data(), nullptr);
      const int64_t fwd_terms = p.c * p.kh * p.kw, dx_terms = p.oc * p.kh * p.kw,
                    dw_terms = p.n * p.out_h() * p.out_w();
      struct Check {
        const char* what;
        const std::vector<float>& got;
        const std::vector<double>& exact;
        const std::vector<double>& rounded;
        int64_t terms;
      };
      for (const Check& c : {Check{"forward", got_y, y, y16, fwd_terms}, Check{"backward-data", got_dx, dx, dx16, dx_terms},
                             Check{"backward-weights", got_dw, dw, dw16, dw_terms}}) {
        SCOPED_TRACE(std::string(c.what) + (accumulate ? ", accumulate" : ""));
        EXPECT_TRUE(kernels::testing::all_close(c.got.data(), F32, c.exact, tolerance_for_sum(F32, c.terms, 1.0)));
        double err = 0, err_bf16 = 0;
        for (size_t i = 0; i < c.got.size(); ++i) {
          err = std::max(err, std::abs(c.got[i] - c.exact[i]));
          err_bf16 = std::max(err_bf16, std::abs(c.rounded[i] - c.exact[i]));
        }
        EXPECT_LT(30 * err, err_bf16) << "the f16 values' products, not their bf16 roundings'";
      }
    }
  }
}

// An output gradient made one image at a time (Images::make, as the fused Conv2d -> ReLU -> MaxPool2d
// backward unpools it) gives the bits of the same gradient stored whole, on every path that reads it: the
// indirect data and weight gradients, the per-image data gradient (stride 2), and the per-image weight
// gradient (K x OC partial sums past the indirect form's 2 MiB), at every CPU level.
TEST(DemiConv, AnOutputGradientMadePerImageGivesTheStoredOnesBits) {
  const Geometry wide_k{"K x OC past 2 MiB", 2, 64, 3, 3, 1024, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  for (const Geometry& g : {kGeometries[2], kGeometries[3], wide_k})
    for (DType t : {F32, BF16, F16})
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
