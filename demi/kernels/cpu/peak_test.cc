#include "demi/kernels/cpu/peak.h"

#include <gtest/gtest.h>

#include "demi/core/cpu.h"

namespace demi::kernels::cpu {
namespace {

// Each ceiling is measured where its instruction exists at the current level, and only there.
TEST(Peak, MeasuresWhereTheInstructionExists) {
  for (CpuLevel level : supported_cpu_levels()) {
    ScopedCpuLevel scoped(level);
    SCOPED_TRACE(cpu_level_name(level));
    const double fma = fma_peak_gflops(0.01), bf16 = bf16_peak_gflops(0.01);
    if (level >= CpuLevel::kAvx2)
      EXPECT_GT(fma, 1.0);
    else
      EXPECT_EQ(fma, 0.0);
    if (level >= CpuLevel::kAvx512Bf16)
      EXPECT_GT(bf16, 1.0);
    else
      EXPECT_EQ(bf16, 0.0);
    const double amx = amx_peak_gflops(0.01), fp16 = fp16_peak_gflops(0.01);
    if (level >= CpuLevel::kAmx)
      EXPECT_GT(amx, 1.0);
    else
      EXPECT_EQ(amx, 0.0);
    if (level >= CpuLevel::kAmx && cpu_features().avx512_fp16)
      EXPECT_GT(fp16, 1.0);
    else
      EXPECT_EQ(fp16, 0.0);
  }
}

}  // namespace
}  // namespace demi::kernels::cpu
