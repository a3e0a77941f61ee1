// demi's convolution on the GEMM against the reference, for every groups-1 geometry of the shared list,
// every dtype pairing, accumulation, and every CPU level (the GEMM's variants).
#include "demi/kernels/cpu/conv.h"

#include <gtest/gtest.h>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/kernels/internal/conv_test_util.h"

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
