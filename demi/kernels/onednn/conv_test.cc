// oneDNN convolutions against the reference on operands exactly representable in every dtype (so one f32
// reference serves f32, bf16 and f16), for each geometry, dtype pairing, layout and direction.
#include "demi/kernels/onednn/conv.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/core/test_support.h"
#include "demi/kernels/cpu/conv.h"
#include "demi/kernels/cpu/pool.h"
#include "demi/kernels/internal/conv_test_util.h"
#include "demi/kernels/internal/matmul_conv_test_util.h"
#include "demi/kernels/onednn/internal/onednn_util.h"
#include "demi/kernels/onednn/primitive_cache.h"
#include "demi/kernels/reference/conv.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels::onednn {
namespace {

using kernels::testing::all_close;
using kernels::testing::cast_operand;
using kernels::testing::dyadic_operand;
using kernels::testing::Operand;
using kernels::testing::random_operand;

constexpr DType F32 = DType::kF32, BF16 = DType::kBF16, F16 = DType::kF16, F64 = DType::kF64;

using kernels::testing::Fixture;
using kernels::testing::Geometry;
using kernels::testing::kGeometries;
using kernels::testing::params_of;

const kernels::testing::ConvKernels kOnednn{conv2d_forward, conv2d_backward_data, conv2d_backward_weights};

// A choice file's lines.
std::vector<std::string> file_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

void check_all_directions(const Fixture& f, DType in, DType out, ConvLayout layout, bool accumulate) {
  kernels::testing::check_all_directions(kOnednn, f, in, out, layout, accumulate);
}

// The direct and indirect-product policies for a scope, restored at its end.
struct ScopedConvPolicies {
  ScopedConvPolicies(ConvDirectPolicy direct, ConvGemmPolicy gemm) {
    set_conv_direct_policy(direct);
    set_conv_gemm_policy(gemm);
  }
  ~ScopedConvPolicies() {
    set_conv_direct_policy(saved_direct);
    set_conv_gemm_policy(saved_gemm);
  }
  const ConvDirectPolicy saved_direct = conv_direct_policy();
  const ConvGemmPolicy saved_gemm = conv_gemm_policy();
};

// Model B's second layer: 32 -> 64, k3, pad 1, on 14 x 14, batch 128, x and w in t, f32 bias.
Conv2dParams model_b_second_layer(DType t) {
  Conv2dParams p;
  p.n = 128, p.c = 32, p.h = p.w = 14, p.oc = 64, p.kh = p.kw = 3;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
  p.x_dtype = p.w_dtype = p.y_dtype = t;
  p.bias_dtype = F32;
  return p;
}

TEST(OnednnConv, MatchesReferenceForEveryGeometryDtypeAndLayout) {
  // Both layouts for f32 and bf16 (different oneDNN kernels); f16 runs the f32 kernels behind a
  // conversion, so the automatic layout suffices there. Accumulation alternates.
  const std::pair<DType, DType> dtypes[] = {{F32, F32}, {BF16, BF16}, {BF16, F32}, {F16, F16}, {F16, F32}};
  for (const Geometry& g : kGeometries) {
    Fixture f(g);
    int i = 0;
    for (auto [in, out] : dtypes) {
      if (in == F16) {
        check_all_directions(f, in, out, ConvLayout::kAuto, (i++ % 2) == 1);
        continue;
      }
      for (ConvLayout layout : {ConvLayout::kPlain, ConvLayout::kBlocked})
        check_all_directions(f, in, out, layout, (i++ % 2) == 1);
    }
  }
}

// bf16 x bf16 either computes in bf16 or in f32 on widened operands (whichever measures faster here):
// both match the reference on every geometry, into bf16 and f32 outputs, plain and accumulated.
TEST(OnednnConv, Bf16NativeAndWidenedBothMatchTheReference) {
  const ConvBf16Policy saved = conv_bf16_policy();
  for (ConvBf16Policy policy : {ConvBf16Policy::kBf16, ConvBf16Policy::kWidenF32}) {
    set_conv_bf16_policy(policy);
    SCOPED_TRACE(policy == ConvBf16Policy::kBf16 ? "bf16 compute" : "widened to f32");
    for (const Geometry& g : kGeometries) {
      Fixture f(g);
      check_all_directions(f, BF16, BF16, ConvLayout::kAuto, false);
      check_all_directions(f, BF16, F32, ConvLayout::kAuto, true);
    }
  }
  set_conv_bf16_policy(saved);
}

// A batch larger than one chunk of images runs chunk by chunk (the last one smaller): every direction and
// dtype matches the reference, a low-precision weight gradient summed over the chunks in f32 and rounded
// once, accumulation included; and the call's workspace stays bounded by a chunk, not the batch.
TEST(OnednnConv, BatchesRunInChunksOfImages) {
  const Geometry big = {"31 images of 8x48x48 -> 8 (chunks: 7 f32, 14 bf16)", 31, 8, 48, 48, 8, 3, 3, 1, 1, 0, 0, 0, 0,
                        1, 1, 1};
  Fixture f(big);
  const ConvBf16Policy saved = conv_bf16_policy();
  int i = 0;
  for (ConvBf16Policy policy : {ConvBf16Policy::kBf16, ConvBf16Policy::kWidenF32}) {
    set_conv_bf16_policy(policy);
    for (auto [in, out] : {std::pair{F32, F32}, {BF16, BF16}, {BF16, F32}, {F16, F16}, {F16, F32}})
      check_all_directions(f, in, out, ConvLayout::kAuto, (i++ % 2) == 1);
  }
  set_conv_bf16_policy(saved);

  // f16 in and out (the widest copies: converted and reordered both ways) on a batch 4x the size above:
  // its workspace is a chunk's, not the batch's (which would be ~4 x 31 x 283 KiB = 34 MiB).
  Geometry huge = big;
  huge.n = 124;
  Conv2dParams p = params_of(huge);
  p.x_dtype = p.w_dtype = p.y_dtype = p.bias_dtype = F16;
  Operand x = random_operand(F16, p.x_numel(), 1), w = random_operand(F16, p.w_numel(), 2);
  Operand b = random_operand(F16, p.oc, 3), y = random_operand(F16, p.y_numel(), 4);
  ScopedPeak peak;
  conv2d_forward(p, x.data(), w.data(), b.data(), y.data());
  conv2d_backward_data(p, y.data(), w.data(), x.data());
  conv2d_backward_weights(p, x.data(), y.data(), w.data(), b.data());
  EXPECT_LT(peak.peak().pk(MemCategory::kWorkspace), int64_t{12} << 20);
}

// A bf16 weight gradient whose f32 sum over chunks would be at least the batch's own copies (large weights
// on small images; f16 activations, whose f32 copies would take 2 chunks here) runs as one chunk, as AMP's
// O2-fp16 runs it (bf16 parameter gradients): it matches the reference, and its workspace holds the
// primitive's f32 dw, not a second weight-sized sum beside it.
TEST(OnednnConv, LargeBf16WeightGradientRunsAsOneChunk) {
  if (!internal::has_bf16_kernels())
    GTEST_SKIP() << "oneDNN has no bf16 kernels at this ISA (" << cpu_level_name(cpu_level())
                 << "): bf16 convolutions compute in f32, with no choice to make";
  const Geometry g = {"140 images of 256x2x2 -> 256, k3 pad 1", 140, 256, 2, 2, 256, 3, 3, 1, 1, 1, 1, 1, 1,
                      1, 1, 1};
  Fixture f(g);
  Conv2dParams p = f.p;
  p.x_dtype = p.y_dtype = F16;
  p.w_dtype = p.bias_dtype = BF16;
  Operand x = cast_operand(f.x, F16), dy = cast_operand(f.dy, F16);
  Operand dw = cast_operand(f.dw0, BF16), db = cast_operand(f.db0, BF16);
  ScopedPeak peak;
  conv2d_backward_weights(p, x.data(), dy.data(), dw.data(), db.data());
  const int64_t terms = p.n * p.out_h() * p.out_w();
  EXPECT_TRUE(all_close(dw.data(), BF16, f.dw, tolerance_for_sum(BF16, terms, 1.0)));
  EXPECT_TRUE(all_close(db.data(), BF16, f.db, tolerance_for_sum(BF16, terms, 1.0)));
  EXPECT_LT(peak.peak().pk(MemCategory::kWorkspace), 2 * p.w_numel() * int64_t{sizeof(float)});
}

TEST(OnednnConv, AutoLayoutAndMixedInputs) {
  Fixture f(kGeometries[2]);
  check_all_directions(f, F32, F32, ConvLayout::kAuto, false);
  check_all_directions(f, BF16, BF16, ConvLayout::kAuto, true);
  // f32 activations with bf16 weights meet in f32.
  Conv2dParams p = f.p;
  p.w_dtype = BF16;
  Operand w = cast_operand(f.w, BF16), y = cast_operand(f.dy, F32);
  p.relu = true;
  conv2d_forward(p, f.x.data(), w.data(), f.bias.data(), y.data());
  EXPECT_TRUE(all_close(y.data(), F32, f.y, tolerance_for_sum(F32, p.c * 9, 1.0)));
}

TEST(OnednnConv, ForwardWithoutBiasOrRelu) {
  Fixture f(kGeometries[0]);
  Conv2dParams p = f.p;
  std::vector<float> want(p.y_numel()), got(p.y_numel());
  ref::conv2d_forward(p, f.x.data(), f.w.data(), nullptr, want.data());
  conv2d_forward(p, f.x.data(), f.w.data(), nullptr, got.data());
  EXPECT_TRUE(all_close(got.data(), F32, kernels::testing::widen(want.data(), F32, p.y_numel()),
                        tolerance_for_sum(F32, p.c * 9, 1.0)));
  std::vector<float> dw(p.w_numel()), want_dw(p.w_numel());
  ref::conv2d_backward_weights(p, f.x.data(), f.dy.data(), want_dw.data(), nullptr);
  conv2d_backward_weights(p, f.x.data(), f.dy.data(), dw.data(), nullptr);
  EXPECT_TRUE(all_close(dw.data(), F32, kernels::testing::widen(want_dw.data(), F32, p.w_numel()),
                        tolerance_for_sum(F32, p.n * p.out_h() * p.out_w(), 1.0)));
}

TEST(OnednnConv, Float64RunsTheReference) {
  Conv2dParams p = params_of(kGeometries[3]);
  p.x_dtype = p.w_dtype = p.y_dtype = p.bias_dtype = F64;
  Operand x = dyadic_operand(F64, p.x_numel(), 1), w = dyadic_operand(F64, p.w_numel(), 2);
  std::vector<double> got(p.y_numel()), want(p.y_numel());
  conv2d_forward(p, x.data(), w.data(), nullptr, got.data());
  ref::conv2d_forward(p, x.data(), w.data(), nullptr, want.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(conv2d_implementation(p, ConvDirection::kForward, false), "reference");
}

TEST(OnednnConv, PrimitivesAreCachedAndScratchIsReturned) {
  const ConvGemmPolicy saved = conv_gemm_policy();
  set_conv_gemm_policy(ConvGemmPolicy::kOff);  // oneDNN's forward, whatever demi's measures here
  Fixture f(kGeometries[2]);
  Conv2dParams p = f.p;
  p.x_dtype = p.w_dtype = p.y_dtype = BF16;
  Operand x = cast_operand(f.x, BF16), w = cast_operand(f.w, BF16), y = cast_operand(f.dy, BF16);
  conv2d_forward(p, x.data(), w.data(), nullptr, y.data());
  const PrimitiveCacheStats before = primitive_cache_stats();
  const int64_t ws_before = mem_stats().cur(MemCategory::kWorkspace);
  for (int i = 0; i < 3; ++i) conv2d_forward(p, x.data(), w.data(), nullptr, y.data());
  EXPECT_EQ(primitive_cache_stats().entries, before.entries);
  EXPECT_GE(primitive_cache_stats().hits, before.hits + 3);
  EXPECT_EQ(mem_stats().cur(MemCategory::kWorkspace), ws_before);
  set_conv_gemm_policy(saved);
}

TEST(OnednnConv, ModelShapesUseOptimisedKernels) {
  // oneDNN's reference convolution is orders of magnitude slower; a layout or dtype combination that silently lands
  // there must fail here, not in a benchmark (bf16 computed in bf16 and widened to f32).
  const ConvBf16Policy saved = conv_bf16_policy();
  for (ConvBf16Policy policy : {ConvBf16Policy::kBf16, ConvBf16Policy::kWidenF32})
  for (int gi : {0, 1, 2})
    for (DType t : {F32, BF16})
      for (ConvDirection dir :
           {ConvDirection::kForward, ConvDirection::kBackwardData, ConvDirection::kBackwardWeights}) {
        Conv2dParams p = params_of(kGeometries[gi]);
        p.x_dtype = p.w_dtype = p.y_dtype = t;
        if (dir == ConvDirection::kBackwardWeights) p.w_dtype = F32;  // AMP's master gradient
        set_conv_bf16_policy(policy);
        std::string impl = conv2d_implementation(p, dir, true);
        EXPECT_EQ(impl.find("ref"), std::string::npos) << describe(p) << ": " << impl;
      }
  set_conv_bf16_policy(saved);
}

// The automatic choice is measured once per geometry and written to the choice file, which a fresh
// process (here: the in-memory choices forgotten) reads instead of measuring again.
TEST(OnednnConv, Bf16ChoiceIsMeasuredOnceAndKeptInTheChoiceFile) {
  if (!internal::has_bf16_kernels())
    GTEST_SKIP() << "oneDNN has no bf16 kernels at this ISA (" << cpu_level_name(cpu_level())
                 << "): bf16 convolutions compute in f32, with no choice to make";
  const test_support::TempDir tmp("demi-conv-choices");
  const std::string dir = tmp.str();
  const ConvBf16Policy saved = conv_bf16_policy();
  const ConvGemmPolicy saved_gemm = conv_gemm_policy();
  set_conv_bf16_policy(ConvBf16Policy::kAuto);
  set_conv_gemm_policy(ConvGemmPolicy::kOff);  // oneDNN's forward: the one that makes the bf16 choice
  set_conv_cache_dir(dir);
  const std::string path = conv_cache_path();
  ASSERT_NE(path, "");
  Fixture f(kGeometries[2]);
  Conv2dParams p = f.p;
  p.x_dtype = p.w_dtype = p.y_dtype = p.bias_dtype = BF16;
  Operand x = cast_operand(f.x, BF16), w = cast_operand(f.w, BF16), b = cast_operand(f.bias, BF16);
  Operand y = cast_operand(f.dy, BF16);
  auto lines = [&] { return file_lines(path); };
  conv2d_forward(p, x.data(), w.data(), b.data(), y.data());
  const std::vector<std::string> first = lines();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_TRUE(first[0].ends_with(" = onednn-bf16") || first[0].ends_with(" = onednn-f32")) << first[0];
  // Every direction of the geometry follows the one choice; a new process reads it.
  conv2d_backward_data(p, y.data(), w.data(), x.data());
  set_conv_cache_dir(dir);
  conv2d_forward(p, x.data(), w.data(), b.data(), y.data());
  EXPECT_EQ(lines(), first);
  set_conv_cache_dir("");
  set_conv_gemm_policy(saved_gemm);
  set_conv_bf16_policy(saved);
}

// A first layer's geometry: the forward and the weight gradient are each measured once (direct or oneDNN),
// kept in the choice file, and read back by a new process; the data gradient and other geometries add none.
TEST(OnednnConv, DirectChoiceIsMeasuredOncePerDirectionAndKeptInTheChoiceFile) {
  const test_support::TempDir tmp("demi-conv-direct-choices");
  const std::string dir = tmp.str();
  const ConvDirectPolicy saved = conv_direct_policy();
  set_conv_direct_policy(ConvDirectPolicy::kAuto);
  set_conv_direct_cache_dir(dir);
  const std::string path = conv_direct_cache_path();
  ASSERT_NE(path, "");
  auto lines = [&] { return file_lines(path); };
  Fixture f(kGeometries[0]);  // model A's 3 -> 32 k3
  Conv2dParams p = f.p;
  Operand x = cast_operand(f.x, F32), w = cast_operand(f.w, F32), b = cast_operand(f.bias, F32);
  Operand y = cast_operand(f.dy, F32), dw = cast_operand(f.dw0, F32), db = cast_operand(f.db0, F32);
  conv2d_forward(p, x.data(), w.data(), b.data(), y.data());
  ASSERT_EQ(lines().size(), 1u);
  EXPECT_TRUE(lines()[0].ends_with(" = demi-direct") || lines()[0].ends_with(" = onednn")) << lines()[0];
  EXPECT_TRUE(all_close(y.data(), F32, [&] {  // whichever won, the values are the convolution's
    Conv2dParams r = p;
    std::vector<float> out(static_cast<size_t>(p.y_numel()));
    ref::conv2d_forward(r, f.x.f32.data(), f.w.f32.data(), f.bias.f32.data(), out.data());
    return std::vector<double>(out.begin(), out.end());
  }(), tolerance_for_sum(F32, p.c * p.kh * p.kw, 1.0)));
  conv2d_backward_weights(p, x.data(), y.data(), dw.data(), db.data());
  conv2d_backward_data(p, y.data(), w.data(), x.data());
  const std::vector<std::string> both = lines();
  ASSERT_EQ(both.size(), 2u);
  EXPECT_NE(both[0].find(" fwd "), std::string::npos) << both[0];
  EXPECT_NE(both[1].find(" dw "), std::string::npos) << both[1];
  Conv2dParams big = params_of(kGeometries[2]);  // K = 288: not a direct geometry, nothing measured
  EXPECT_EQ(conv2d_direct_kernel(big, ConvDirection::kForward), "onednn (not a direct geometry)");
  set_conv_direct_cache_dir(dir);  // a new process: reads the file, measures nothing
  conv2d_forward(p, x.data(), w.data(), b.data(), y.data());
  conv2d_backward_weights(p, x.data(), y.data(), dw.data(), db.data());
  EXPECT_EQ(lines(), both);
  set_conv_direct_cache_dir("");
  set_conv_direct_policy(saved);
}

// oneDNN's f16 paths widen to f32: on model A's first layer at batch 32 the fused backward held 4.39 MiB of
// widened copies (74% of the O2-fp16 training peak) for no measurable speed. The choice prices each time by
// the workspace it holds beyond the other's, as a share of the call's footprint, plus 10% for oneDNN: the
// same rule on every CPU, so a kernel far faster is worth its copies and one a little faster is not.
TEST(OnednnConv, AChoicePricesWorkspaceAgainstTime) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  EXPECT_TRUE(demi_kernel_preferred(2.0, 1.0, 0, 4 * kMiB, 2 * kMiB));   // twice as fast, 3x the footprint
  EXPECT_FALSE(demi_kernel_preferred(3.0, 1.0, 0, 2 * kMiB, 2 * kMiB));  // 3x as fast for the footprint again
  EXPECT_FALSE(demi_kernel_preferred(2.0, 1.0, 4 * kMiB, 4 * kMiB, kMiB));  // the same workspace: by the times
  EXPECT_TRUE(demi_kernel_preferred(1.05, 1.0, 0, 0, kMiB));  // no workspace, within the 10% margin: demi's
  EXPECT_FALSE(demi_kernel_preferred(1.2, 1.0, 0, 0, kMiB));
  EXPECT_FALSE(demi_kernel_preferred(1.0, 1.2, kMiB, 0, kMiB));  // demi's kernel holding more pays too
  // On model A's first layer, the fused f16 backward (whose oneDNN path held 4.39 MiB of widened copies
  // before it widened a chunk of images at a time) holds under 2 MiB on either candidate.
  ScopedConvPolicies policies(conv_direct_policy(), ConvGemmPolicy::kOff);
  Conv2dParams p;  // model A: 3 -> 32, k3, valid, on 32 x 32 images, batch 32, f16
  p.n = 32, p.c = 3, p.h = p.w = 32, p.oc = 32, p.kh = p.kw = 3;
  p.x_dtype = p.w_dtype = F16;
  p.y_dtype = p.bias_dtype = F32;  // the fused op's convolution output for f16 storage
  const Pool2dParams pool = make_pool2d_params(p.n, p.oc, p.out_h(), p.out_w(), 2, 2, 2, 2, PadMode::kValid);
  Operand x = random_operand(F16, p.x_numel(), 1), w = random_operand(F16, p.w_numel(), 2);
  Operand dy = random_operand(F16, pool.y_numel(), 3);
  std::vector<uint8_t> argmax(static_cast<size_t>(pool.y_numel()), 0);
  Operand dw = random_operand(F32, p.w_numel(), 4), db = random_operand(F32, p.oc, 5);
  for (ConvDirectPolicy policy : {ConvDirectPolicy::kOn, ConvDirectPolicy::kOff}) {
    set_conv_direct_policy(policy);
    const int64_t before = mem_stats().cur(MemCategory::kWorkspace);
    ScopedPeak peak;
    conv2d_relu_max_pool2d_backward(p, pool, x.data(), w.data(), F16, dy.data(), argmax.data(), nullptr, dw.data(),
                                    F32, db.data(), F32);
    EXPECT_LE(peak.peak().pk(MemCategory::kWorkspace) - before, 2 * kMiB)
        << (policy == ConvDirectPolicy::kOn ? "the direct kernel" : "oneDNN");
  }
}

// A weight gradient that accumulates (gradient accumulation) and is the geometry's first: the measurement
// runs each candidate into scratch, so dw and db take the sum once, whichever kernel wins.
TEST(OnednnConv, DirectChoiceMeasuredOnAnAccumulatingCallAddsOnce) {
  const test_support::TempDir tmp("demi-conv-direct-acc");
  const std::string dir = tmp.str();
  const ConvDirectPolicy saved = conv_direct_policy();
  set_conv_direct_policy(ConvDirectPolicy::kAuto);
  set_conv_direct_cache_dir(dir);
  Fixture f(kGeometries[1]);  // model B's 1 -> 32 k3p1
  Conv2dParams p = f.p;
  p.accumulate = true;
  Operand x = cast_operand(f.x, F32), dy = cast_operand(f.dy, F32);
  Operand dw = cast_operand(f.dw0, F32), db = cast_operand(f.db0, F32);
  conv2d_backward_weights(p, x.data(), dy.data(), dw.data(), db.data());
  const int64_t terms = p.n * p.out_h() * p.out_w();
  EXPECT_TRUE(all_close(dw.data(), F32, f.dw_acc, tolerance_for_sum(F32, terms, 1.0)));
  EXPECT_TRUE(all_close(db.data(), F32, f.db_acc, tolerance_for_sum(F32, terms, 1.0)));
  set_conv_direct_cache_dir("");
  set_conv_direct_policy(saved);
}

TEST(OnednnConv, ErrorsNameTheOpAndShapes) {
  Conv2dParams p = params_of(kGeometries[5]);
  p.groups = 4;  // 6 channels
  float buf[1] = {};
  try {
    conv2d_backward_weights(p, buf, buf, buf, nullptr);
    FAIL() << "expected demi::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("conv2d backward-weights"), std::string::npos) << msg;
    EXPECT_NE(msg.find("groups (4)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("x(2, 6, 9, 9) float32"), std::string::npos) << msg;
  }
}

// The fused Conv2d -> ReLU -> MaxPool2d gives exactly what the three steps give — forward values and window
// indices, and dw, db, dx from the same pooled gradient — for models A's and B's convolutions (and an odd
// size whose last row and column no window covers), in f32, bf16 (AMX: channels-last) and f16 storage
// (computed in f32).
// demi's indirect forward and stride-1 data gradient (DEMI_CONV_GEMM=on: every geometry they take) through
// the dispatcher, every direction and dtype pairing, plain and accumulated (the weight gradient stays
// oneDNN's or the direct kernel's).
TEST(OnednnConv, GemmForwardMatchesTheReferenceForEveryGeometryAndDtype) {
  const ConvGemmPolicy saved = conv_gemm_policy();
  set_conv_gemm_policy(ConvGemmPolicy::kOn);
  const std::pair<DType, DType> dtypes[] = {{F32, F32}, {BF16, BF16}, {BF16, F32}, {F16, F16}, {F16, F32}};
  for (const Geometry& g : kGeometries) {
    Fixture f(g);
    int i = 0;
    for (auto [in, out] : dtypes) check_all_directions(f, in, out, ConvLayout::kAuto, (i++ % 2) == 1);
  }
  set_conv_gemm_policy(saved);
}

// A geometry's forward, data gradient and weight gradient each measure demi's indirect product against
// oneDNN once (per input dtypes), keep the choice in its file, and a new process reads them back instead of
// measuring.
TEST(OnednnConv, GemmChoiceIsMeasuredOnceAndKeptInTheChoiceFile) {
  if (!kernels::cpu::conv2d_indirect_supported(Fixture(kGeometries[2]).p))
    GTEST_SKIP() << "demi's indirect convolution has no micro-kernel at " << cpu_level_name(cpu_level())
                 << ": oneDNN runs every convolution, with no choice to make";
  const test_support::TempDir tmp("demi-conv-gemm-choices");
  const std::string dir = tmp.str();
  const ConvGemmPolicy saved = conv_gemm_policy();
  set_conv_gemm_policy(ConvGemmPolicy::kAuto);
  set_conv_gemm_cache_dir(dir);
  const std::string path = conv_gemm_cache_path();
  ASSERT_NE(path, "");
  auto lines = [&] { return file_lines(path); };
  Fixture f(kGeometries[2]);  // model B's 32 -> 64 k3p1: K = 288, not a direct geometry
  Conv2dParams p = f.p;
  p.x_dtype = p.w_dtype = F16;
  Operand x = cast_operand(f.x, F16), w = cast_operand(f.w, F16), b = cast_operand(f.bias, F32);
  Operand y = cast_operand(f.dy, F32), dx = cast_operand(f.x, F16);
  conv2d_forward(p, x.data(), w.data(), b.data(), y.data());
  ASSERT_EQ(lines().size(), 1u);
  EXPECT_TRUE(lines()[0].ends_with(" = demi-gemm") || lines()[0].ends_with(" = onednn")) << lines()[0];
  EXPECT_NE(lines()[0].find(" fwd float16 "), std::string::npos) << lines()[0];
  EXPECT_TRUE(all_close(y.data(), F32, [&] {  // whichever won, the values are the convolution's
    Conv2dParams r = p;  // (the fixture's values are exact in f16)
    r.x_dtype = r.w_dtype = F32;
    std::vector<float> out(static_cast<size_t>(p.y_numel()));
    ref::conv2d_forward(r, f.x.f32.data(), f.w.f32.data(), f.bias.f32.data(), out.data());
    return std::vector<double>(out.begin(), out.end());
  }(), tolerance_for_sum(F32, p.c * p.kh * p.kw, 1.0)));
  Conv2dParams pd = p;  // the data gradient (stride 1): measured once too, keyed by dy's dtype
  pd.y_dtype = F32;
  conv2d_backward_data(pd, y.data(), w.data(), dx.data());
  const std::vector<std::string> both = lines();
  ASSERT_EQ(both.size(), 2u);
  EXPECT_NE(both[1].find(" dx float32 "), std::string::npos) << both[1];
  conv2d_backward_data(pd, y.data(), w.data(), dx.data());
  EXPECT_EQ(lines(), both);
  Conv2dParams pw = pd;  // the weight gradient into FP32 masters: a third choice
  pw.w_dtype = pw.bias_dtype = F32;
  Operand dw = cast_operand(f.dw0, F32), db = cast_operand(f.db0, F32);
  conv2d_backward_weights(pw, x.data(), y.data(), dw.data(), db.data());
  const std::vector<std::string> all = lines();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_NE(all[2].find(" dw float16 dy float32 "), std::string::npos) << all[2];
  set_conv_gemm_cache_dir(dir);  // a new process: reads the file, measures nothing
  conv2d_forward(p, x.data(), w.data(), b.data(), y.data());
  conv2d_backward_data(pd, y.data(), w.data(), dx.data());
  conv2d_backward_weights(pw, x.data(), y.data(), dw.data(), db.data());
  EXPECT_EQ(lines(), all);
  set_conv_gemm_cache_dir("");
  set_conv_gemm_policy(saved);
}

// Every path of the fused backward: oneDNN's fused primitive; the direct weight gradient with oneDNN's data
// gradient (pooled a chunk at a time) or demi's; demi's indirect products for both (on the dense gradient);
// oneDNN's bf16 primitives in bf16 and widened to f32 (where an f16 layer's dy is rounded after widening).
TEST(OnednnConv, FusedReluMaxPoolMatchesTheThreeStepsExactly) {
  const ConvGemmPolicy saved_gemm = conv_gemm_policy();
  const ConvDirectPolicy saved_direct = conv_direct_policy();
  const ConvBf16Policy saved_bf16 = conv_bf16_policy();
  for (ConvBf16Policy bf16 : {ConvBf16Policy::kBf16, ConvBf16Policy::kWidenF32})  // oneDNN's bf16 paths
  for (ConvGemmPolicy gemm : {ConvGemmPolicy::kOff, ConvGemmPolicy::kOn})  // oneDNN's forward, then demi's
  for (ConvDirectPolicy direct : {ConvDirectPolicy::kOff, ConvDirectPolicy::kOn}) {
  set_conv_bf16_policy(bf16);
  set_conv_gemm_policy(gemm);
  set_conv_direct_policy(direct);
  SCOPED_TRACE(std::string(gemm == ConvGemmPolicy::kOn ? "demi's indirect products" : "oneDNN's products") +
               (direct == ConvDirectPolicy::kOn ? ", the direct kernels" : "") +
               (bf16 == ConvBf16Policy::kBf16 ? ", oneDNN's bf16 in bf16" : ", oneDNN's bf16 widened"));
  struct Case {
    Geometry g;
    DType in, conv;  // x and w; the convolution's output (compute) dtype
    bool need_dx;
    bool f16_as_bf16 = false;  // an f16 layer's products in bf16: bf16 x, w and dy; f16 y and dx
    bool f32_dy = false;       // dy given in f32 to a bf16 convolution: rounded to bf16 as it is unpooled
  };
  const Geometry odd = {"odd output 9x9 (3->16)", 2, 3, 11, 11, 16, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1};
  const Case cases[] = {{kGeometries[0], F32, F32, false}, {kGeometries[0], BF16, BF16, false},
                        {kGeometries[0], F16, F32, false}, {kGeometries[1], F32, F32, false},
                        {kGeometries[1], BF16, BF16, false}, {kGeometries[2], F32, F32, true},
                        {kGeometries[2], BF16, BF16, true}, {kGeometries[2], F16, F32, true},
                        {odd, F32, F32, true},           {odd, BF16, BF16, true},
                        {kGeometries[0], BF16, F32, false, true}, {kGeometries[2], BF16, F32, true, true},
                        {odd, BF16, F32, true, true},
                        {kGeometries[0], BF16, BF16, false, false, true}, {kGeometries[2], BF16, BF16, true, false, true}};
  uint64_t seed = 300;
  for (const Case& k : cases) {
    Conv2dParams p = params_of(k.g);
    p.x_dtype = p.w_dtype = k.in;
    p.y_dtype = k.conv;
    p.bias_dtype = F32;
    const DType out = k.f16_as_bf16 ? F16 : k.in;  // the pooled output, in the storage dtype
    // its gradient (f16 under f16_as_bf16, or f32: rounded to bf16 as the kernels unpool it)
    const DType grad = k.f32_dy ? F32 : out;
    const DType dx_dtype = k.f16_as_bf16 ? F16 : k.in;
    // The dense gradient's dtype in the three steps: the separate convolution's output dtype (f16 for an f16
    // layer, whose storage is f16 though its fused forward computes in f32: the gradient's values are dy's),
    // or bf16
    const DType dense = k.f16_as_bf16 ? BF16 : k.in == F16 ? F16 : k.conv;
    SCOPED_TRACE(std::string(k.g.name) + " " + std::string(dtype_name(k.in)) +
                 (k.f16_as_bf16 ? " (an f16 layer's products in bf16)" : "") + (k.f32_dy ? " (an f32 dy)" : ""));
    const Pool2dParams pool = make_pool2d_params(p.n, p.oc, p.out_h(), p.out_w(), 2, 2, 2, 2, PadMode::kValid);
    Operand x = random_operand(k.in, p.x_numel(), seed += 10), w = random_operand(k.in, p.w_numel(), seed + 1);
    Operand b = random_operand(F32, p.oc, seed + 2), dy = random_operand(grad, pool.y_numel(), seed + 3);

    // Three steps: conv to NCHW, ReLU + pool, and back.
    Operand conv = random_operand(k.conv, p.y_numel(), 1);
    conv2d_forward(p, x.data(), w.data(), b.data(), conv.data());
    Operand conv_out = random_operand(out, p.y_numel(), 1);
    convert(conv.data(), k.conv, conv_out.data(), out, p.y_numel());  // exact for f32 -> f32, bf16 -> bf16
    Operand want_y = random_operand(out, pool.y_numel(), 2);
    std::vector<uint8_t> want_a(pool.y_numel()), got_a(pool.y_numel());
    if (k.conv == out) {
      relu_max_pool2d_forward(pool, out, conv_out.data(), want_y.data(), want_a.data());
    } else {  // f16 storage: pool the f32 output, round once (max and ReLU commute with rounding)
      Operand pooled = random_operand(F32, pool.y_numel(), 3);
      relu_max_pool2d_forward(pool, F32, conv.data(), pooled.data(), want_a.data());
      convert(pooled.data(), F32, want_y.data(), out, pool.y_numel());
    }
    Operand got_y = random_operand(out, pool.y_numel(), 4);
    conv2d_relu_max_pool2d_forward(p, pool, x.data(), w.data(), b.data(), out, got_y.data(), got_a.data());
    EXPECT_EQ(got_y.bytes, want_y.bytes) << "forward values";
    EXPECT_EQ(got_a, want_a) << "window indices";

    Operand dconv = random_operand(dense, p.y_numel(), 5);
    {
      Operand dy_c = random_operand(dense, pool.y_numel(), 6);
      convert(dy.data(), grad, dy_c.data(), dense, pool.y_numel());
      max_pool2d_backward(pool, dense, dy_c.data(), want_a.data(), dconv.data());
    }
    Conv2dParams q = p;
    q.y_dtype = dense;
    q.w_dtype = F32;
    Operand want_dw = random_operand(F32, p.w_numel(), 7), want_db = random_operand(F32, p.oc, 8);
    conv2d_backward_weights(q, x.data(), dconv.data(), want_dw.data(), want_db.data());
    Operand want_dx = random_operand(dx_dtype, p.x_numel(), 9), got_dx = random_operand(dx_dtype, p.x_numel(), 10);
    Conv2dParams qd = p;
    qd.y_dtype = dense;
    qd.x_dtype = dx_dtype;
    if (k.need_dx) conv2d_backward_data(qd, dconv.data(), w.data(), want_dx.data());
    Operand got_dw = random_operand(F32, p.w_numel(), 11), got_db = random_operand(F32, p.oc, 12);
    Conv2dParams pb = p;  // the fused backward's: its convolution's output dtype (f32 for an f16 layer)
    pb.y_dtype = dense == F16 ? k.conv : dense;
    conv2d_relu_max_pool2d_backward(pb, pool, x.data(), w.data(), grad, dy.data(), want_a.data(),
                                    k.need_dx ? got_dx.data() : nullptr, got_dw.data(), F32, got_db.data(), F32,
                                    dx_dtype);
    EXPECT_EQ(got_dw.bytes, want_dw.bytes) << "dw";
    EXPECT_EQ(got_db.bytes, want_db.bytes) << "db";
    if (k.need_dx) {
      EXPECT_EQ(got_dx.bytes, want_dx.bytes) << "dx";
    }
  }
  }
  set_conv_gemm_policy(saved_gemm);
  set_conv_direct_policy(saved_direct);
  set_conv_bf16_policy(saved_bf16);
}

// An f32 x read as bf16 or f16 values (Conv2dParams::x_round: AMP's cast of the data batch fused into the
// kernels' read) gives, bit for bit, the call on the rounded x: the forward, the weight gradient and both
// fused calls, on the direct kernels (which round as they pad each image; at every CPU level), on oneDNN's
// and demi's other paths (a rounded copy), and under measurement (a geometry's first call measures on a
// rounded copy, the later ones follow the choice). The image holds values that round: halfway cases, a NaN,
// a value past f16's range, a subnormal.
TEST(OnednnConv, AnF32ImageReadAsLowValuesGivesTheRoundedImagesBits) {
  const test_support::TempDir tmp("demi-conv-round-x");
  const std::string dir = tmp.str();
  ScopedConvPolicies policies(conv_direct_policy(), conv_gemm_policy());
  set_conv_direct_cache_dir(dir);
  struct Setting {
    const char* name;
    ConvDirectPolicy direct;
    ConvGemmPolicy gemm;
  };
  const Setting settings[] = {{"direct", ConvDirectPolicy::kOn, ConvGemmPolicy::kAuto},
                              {"oneDNN", ConvDirectPolicy::kOff, ConvGemmPolicy::kOff},
                              {"demi's indirect", ConvDirectPolicy::kOff, ConvGemmPolicy::kOn},
                              {"measured", ConvDirectPolicy::kAuto, ConvGemmPolicy::kAuto}};
  for (CpuLevel level : supported_cpu_levels())
  for (const Setting& s : settings) {
    if (s.direct != ConvDirectPolicy::kOn && level != cpu_level()) continue;  // the other paths at the best level
    ScopedCpuLevel scoped(level);
    set_conv_direct_policy(s.direct);
    set_conv_gemm_policy(s.gemm);
    for (const Geometry& g : {kGeometries[0], kGeometries[1]})  // A's and B's first layers
    for (DType t : {BF16, F16}) {
      SCOPED_TRACE(::testing::Message() << cpu_level_name(level) << " " << s.name << " " << g.name << " "
                                        << dtype_name(t));
      Conv2dParams p = params_of(g);
      p.x_dtype = F32;
      p.x_round = t;
      p.w_dtype = t;
      p.bias_dtype = F32;
      Operand x = random_operand(F32, p.x_numel(), 41);
      auto* xs = static_cast<float*>(x.data());
      for (int64_t i = 0; i < p.x_numel(); i += 7) xs[i] = 1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -11);
      xs[1] = std::nanf("");
      xs[2] = 70000.0f;
      xs[3] = 1e-40f;
      xs[4] = 1.0f + std::ldexp(1.0f, -8);  // a tie: to even in bf16
      Operand xr = random_operand(t, p.x_numel(), 1);
      convert(x.data(), F32, xr.data(), t, p.x_numel());
      Conv2dParams q = p;  // the same call on the rounded image
      q.x_dtype = t;
      q.x_round = F32;
      Operand w = random_operand(t, p.w_numel(), 42), b = random_operand(F32, p.oc, 43);
      const Pool2dParams pool = make_pool2d_params(p.n, p.oc, p.out_h(), p.out_w(), 2, 2, 2, 2, PadMode::kValid);
      const DType conv_out = t == BF16 ? BF16 : F32;  // the fused convolution's own output
      Operand dy = random_operand(t, pool.y_numel(), 44), dz = random_operand(t, p.y_numel(), 45);
      for (int call = 0; call < 2; ++call) {  // (measured: the first call chooses, the second follows)
        for (Conv2dParams* c : {&p, &q}) c->y_dtype = t;
        Operand y1 = random_operand(t, p.y_numel(), 1), y2 = random_operand(t, p.y_numel(), 2);
        conv2d_forward(p, x.data(), w.data(), b.data(), y1.data());
        conv2d_forward(q, xr.data(), w.data(), b.data(), y2.data());
        EXPECT_EQ(y1.bytes, y2.bytes) << "forward, call " << call;
        for (Conv2dParams* c : {&p, &q}) c->w_dtype = c->bias_dtype = F32;
        Operand dw1 = random_operand(F32, p.w_numel(), 3), dw2 = random_operand(F32, p.w_numel(), 4);
        Operand db1 = random_operand(F32, p.oc, 5), db2 = random_operand(F32, p.oc, 6);
        conv2d_backward_weights(p, x.data(), dz.data(), dw1.data(), db1.data());
        conv2d_backward_weights(q, xr.data(), dz.data(), dw2.data(), db2.data());
        EXPECT_EQ(dw1.bytes, dw2.bytes) << "weight gradient, call " << call;
        EXPECT_EQ(db1.bytes, db2.bytes) << "bias gradient, call " << call;
        for (Conv2dParams* c : {&p, &q}) {
          c->y_dtype = conv_out;
          c->w_dtype = t;
        }
        Operand p1 = random_operand(t, pool.y_numel(), 7), p2 = random_operand(t, pool.y_numel(), 8);
        std::vector<uint8_t> a1(static_cast<size_t>(pool.y_numel())), a2(a1.size());
        conv2d_relu_max_pool2d_forward(p, pool, x.data(), w.data(), b.data(), t, p1.data(), a1.data());
        conv2d_relu_max_pool2d_forward(q, pool, xr.data(), w.data(), b.data(), t, p2.data(), a2.data());
        EXPECT_EQ(p1.bytes, p2.bytes) << "fused forward, call " << call;
        EXPECT_EQ(a1, a2) << "fused forward's window indices, call " << call;
        conv2d_relu_max_pool2d_backward(p, pool, x.data(), w.data(), t, dy.data(), a1.data(), nullptr, dw1.data(), F32,
                                        db1.data(), F32);
        conv2d_relu_max_pool2d_backward(q, pool, xr.data(), w.data(), t, dy.data(), a1.data(), nullptr, dw2.data(),
                                        F32, db2.data(), F32);
        EXPECT_EQ(dw1.bytes, dw2.bytes) << "fused weight gradient, call " << call;
        EXPECT_EQ(db1.bytes, db2.bytes) << "fused bias gradient, call " << call;
        for (Conv2dParams* c : {&p, &q}) c->bias_dtype = F32;
      }
    }
  }
  // The reference twin reads it rounded too; demi's indirect product (which kernels::onednn gives a
  // rounded copy) refuses it. An x read as low values must be f32, and has no data gradient.
  {
    Conv2dParams p = params_of(kGeometries[1]);
    p.x_round = BF16;
    Operand x = random_operand(F32, p.x_numel(), 46), xr = random_operand(BF16, p.x_numel(), 1);
    convert(x.data(), F32, xr.data(), BF16, p.x_numel());
    Operand w = random_operand(F32, p.w_numel(), 47), y1 = random_operand(F32, p.y_numel(), 2), y2 = y1;
    ref::conv2d_forward(p, x.data(), w.data(), nullptr, y1.data());
    Conv2dParams q = p;
    q.x_dtype = BF16;
    q.x_round = F32;
    ref::conv2d_forward(q, xr.data(), w.data(), nullptr, y2.data());
    EXPECT_EQ(y1.bytes, y2.bytes) << "the reference forward";
    EXPECT_THROW(kernels::cpu::conv2d_forward(p, x.data(), w.data(), nullptr, y1.data()), Error);
    EXPECT_THROW(conv2d_backward_data(p, y1.data(), w.data(), x.data()), Error);
  }
  Conv2dParams bad = params_of(kGeometries[0]);
  bad.x_dtype = BF16;
  bad.x_round = F16;
  std::vector<float> buf(1 << 16);
  EXPECT_THROW(conv2d_forward(bad, buf.data(), buf.data(), nullptr, buf.data()), Error);
  set_conv_direct_cache_dir("");
}

// A process whose choice file already holds a first layer's direct choice runs the direct kernel on an f32 x
// read as bf16 from its first call: no rounded copy of x (which only a measuring first call needs; model A's
// batch copy was 0.19 MiB of its O2-bf16 training peak when every process's first call made it).
TEST(OnednnConv, AWarmChoiceFileMakesNoRoundedCopyOfTheBatch) {
  const test_support::TempDir tmp("demi-conv-warm");
  const std::string dir = tmp.str();
  ScopedConvPolicies policies(conv_direct_policy(), conv_gemm_policy());
  set_conv_direct_policy(ConvDirectPolicy::kAuto);
  set_conv_direct_cache_dir(dir);
  Conv2dParams p = params_of(kGeometries[0]);  // model A's first layer
  p.n = 64;
  p.x_dtype = F32;
  p.x_round = BF16;
  p.w_dtype = p.y_dtype = BF16;
  p.bias_dtype = F32;
  Operand x = random_operand(F32, p.x_numel(), 51), w = random_operand(BF16, p.w_numel(), 52);
  Operand b = random_operand(F32, p.oc, 53), y = random_operand(BF16, p.y_numel(), 54);
  const int64_t copy = p.x_numel() * 2;  // the rounded x's bytes
  auto workspace_of_a_call = [&] {
    ScopedPeak peak;
    const int64_t before = mem_stats().cur(MemCategory::kWorkspace);
    conv2d_forward(p, x.data(), w.data(), b.data(), y.data());
    return peak.peak().pk(MemCategory::kWorkspace) - before;
  };
  workspace_of_a_call();  // the first call measures (on a rounded copy) and writes the file
  const int64_t second = workspace_of_a_call();
  set_conv_direct_cache_dir(dir);  // a new process: the choice is in the file only
  const int64_t first_of_new = workspace_of_a_call();
  if (conv2d_direct_kernel(p, ConvDirection::kForward).starts_with("demi-direct")) {
    EXPECT_EQ(first_of_new, second) << "a warm file's first call holds what a later call holds, not the "
                                    << copy << " bytes of a rounded x besides";
  } else {
    GTEST_SKIP() << "oneDNN measured faster here: its calls take the rounded copy either way";
  }
  set_conv_direct_cache_dir("");
}

// The fused backward for f16 storage (its forward kept the convolution's output in f32) never holds the
// whole batch's dense gradient in f32: on model B's second layer (6.1 MiB of it in f32) its workspace is
// at most the dense gradient in f16 (3.1 MiB, where a kernel reads it whole) and one chunk of images, on
// every path.
TEST(OnednnConv, FusedF16BackwardHoldsNoF32DenseGradient) {
  const ConvGemmPolicy saved_gemm = conv_gemm_policy();
  const ConvDirectPolicy saved_direct = conv_direct_policy();
  Conv2dParams p;  // model B: 32 -> 64, k3, pad 1, on 14 x 14, batch 128
  p.n = 128, p.c = 32, p.h = p.w = 14, p.oc = 64, p.kh = p.kw = 3;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
  p.x_dtype = p.w_dtype = F16;
  p.y_dtype = p.bias_dtype = F32;
  const Pool2dParams pool = make_pool2d_params(p.n, p.oc, p.out_h(), p.out_w(), 2, 2, 2, 2, PadMode::kValid);
  Operand x = random_operand(F16, p.x_numel(), 1), w = random_operand(F16, p.w_numel(), 2);
  Operand dy = random_operand(F16, pool.y_numel(), 3), dx = random_operand(F16, p.x_numel(), 4);
  Operand dw = random_operand(BF16, p.w_numel(), 5), db = random_operand(F32, p.oc, 6);
  std::vector<uint8_t> argmax(static_cast<size_t>(pool.y_numel()), 3);
  const int64_t dense_f16 = p.y_numel() * 2, bound = dense_f16 + (int64_t{2} << 20);
  ASSERT_LT(bound, p.y_numel() * 4);  // below the f32 dense gradient alone
  for (ConvGemmPolicy gemm : {ConvGemmPolicy::kOff, ConvGemmPolicy::kOn})
    for (ConvDirectPolicy direct : {ConvDirectPolicy::kOff, ConvDirectPolicy::kOn}) {
      set_conv_gemm_policy(gemm);
      set_conv_direct_policy(direct);
      ScopedPeak peak;
      conv2d_relu_max_pool2d_backward(p, pool, x.data(), w.data(), F16, dy.data(), argmax.data(), dx.data(),
                                      dw.data(), BF16, db.data(), F32);
      EXPECT_LE(peak.peak().pk(MemCategory::kWorkspace), bound)
          << (gemm == ConvGemmPolicy::kOn ? "demi's products" : "oneDNN's products")
          << (direct == ConvDirectPolicy::kOn ? ", the direct kernels" : "");
    }
  set_conv_gemm_policy(saved_gemm);
  set_conv_direct_policy(saved_direct);
}

// On demi's products (the indirect data and weight gradients) the fused backward unpools its output
// gradient an image at a time, as the kernels read it (cpu::Images): no batch-sized dense gradient at all.
// On model B's second layer that buffer (6.1 MiB in f32, 3.1 MiB in bf16) was the largest workspace of the
// training peak. The values are the three steps' (FusedReluMaxPoolMatchesTheThreeStepsExactly).
TEST(OnednnConv, FusedBackwardOnDemisProductsHoldsNoDenseGradient) {
  if (!kernels::cpu::conv2d_indirect_supported(model_b_second_layer(F32)))
    GTEST_SKIP() << "demi's indirect convolution has no micro-kernel at " << cpu_level_name(cpu_level());
  ScopedConvPolicies policies(ConvDirectPolicy::kOff, ConvGemmPolicy::kOn);
  for (DType t : {F32, BF16}) {
    const Conv2dParams p = model_b_second_layer(t);
    ASSERT_TRUE(kernels::cpu::conv2d_backward_data_indirect_supported(p));
    ASSERT_TRUE(kernels::cpu::conv2d_backward_weights_indirect_supported(p));
    const Pool2dParams pool = make_pool2d_params(p.n, p.oc, p.out_h(), p.out_w(), 2, 2, 2, 2, PadMode::kValid);
    Operand x = random_operand(t, p.x_numel(), 1), w = random_operand(t, p.w_numel(), 2);
    Operand dy = random_operand(t, pool.y_numel(), 3), dx = random_operand(t, p.x_numel(), 4);
    Operand dw = random_operand(F32, p.w_numel(), 5), db = random_operand(F32, p.oc, 6);
    std::vector<uint8_t> argmax(static_cast<size_t>(pool.y_numel()), 2);
    auto backward = [&] {
      conv2d_relu_max_pool2d_backward(p, pool, x.data(), w.data(), t, dy.data(), argmax.data(), dx.data(), dw.data(),
                                      F32, db.data(), F32);
    };
    backward();  // (any choice still to make: made)
    ScopedPeak peak;
    backward();
    const int64_t dense = p.y_numel() * static_cast<int64_t>(dtype_size(t));
    const int64_t workspace = peak.peak().pk(MemCategory::kWorkspace);
    std::printf("model B's second layer, %.*s: fused backward workspace %lld bytes, dense gradient %lld\n",
                static_cast<int>(dtype_name(t).size()), dtype_name(t).data(), static_cast<long long>(workspace),
                static_cast<long long>(dense));
    EXPECT_LT(workspace, dense / 4) << dtype_name(t);
  }
}

// The fused forward on demi's indirect product holds the convolution's output of a few images at a time
// (the pooling reads it while it is in L2), not 2 MiB of it: on model B's second layer at batch 128 its
// workspace was 2.2 MiB in f32 and bf16 and 2.7 MiB in f16 (f32 output and pooled chunks), the O2 training
// peak's largest part wherever that kernel was chosen. Pooled values and window indices are bit for bit
// the whole batch's convolution, then ReLU -> MaxPool2d (chunks of 10 images and a last one of 8).
TEST(OnednnConv, FusedForwardOnDemisProductsPoolsSmallChunks) {
  if (!kernels::cpu::conv2d_indirect_supported(model_b_second_layer(F32)))
    GTEST_SKIP() << "demi's indirect convolution has no micro-kernel at " << cpu_level_name(cpu_level());
  ScopedConvPolicies policies(ConvDirectPolicy::kOff, ConvGemmPolicy::kOn);
  for (DType t : {F32, BF16, F16}) {
    Conv2dParams p = model_b_second_layer(t);
    p.y_dtype = t == BF16 ? BF16 : F32;  // the fused op's convolution output (f16 storage: f32)
    const Pool2dParams pool = make_pool2d_params(p.n, p.oc, p.out_h(), p.out_w(), 2, 2, 2, 2, PadMode::kValid);
    Operand x = random_operand(t, p.x_numel(), 1), w = random_operand(t, p.w_numel(), 2);
    Operand b = random_operand(F32, p.oc, 3);
    Operand y = random_operand(t, pool.y_numel(), 4), want = random_operand(t, pool.y_numel(), 5);
    std::vector<uint8_t> argmax(static_cast<size_t>(pool.y_numel())), want_argmax(argmax.size());
    auto forward = [&] {
      conv2d_relu_max_pool2d_forward(p, pool, x.data(), w.data(), b.data(), t, y.data(), argmax.data());
    };
    forward();  // (any choice still to make: made)
    const int64_t before = mem_stats().cur(MemCategory::kWorkspace);
    ScopedPeak peak;
    forward();
    const int64_t workspace = peak.peak().pk(MemCategory::kWorkspace) - before;
    EXPECT_LT(workspace, int64_t{1} << 20) << dtype_name(t);
    Operand conv = random_operand(p.y_dtype, p.y_numel(), 6);
    kernels::cpu::conv2d_forward(p, x.data(), w.data(), b.data(), conv.data());
    if (p.y_dtype == t) {
      relu_max_pool2d_forward(pool, t, conv.data(), want.data(), want_argmax.data());
    } else {  // f16 storage: pooled in f32, rounded once
      Operand pooled = random_operand(F32, pool.y_numel(), 7);
      relu_max_pool2d_forward(pool, F32, conv.data(), pooled.data(), want_argmax.data());
      convert(pooled.data(), F32, want.data(), t, pool.y_numel());
    }
    EXPECT_EQ(y.bytes, want.bytes) << dtype_name(t);
    EXPECT_EQ(argmax, want_argmax) << dtype_name(t);
  }
}

TEST(OnednnConv, FusedReluMaxPoolRefusesAPoolThatDoesNotFit) {
  Conv2dParams p = params_of(kGeometries[0]);
  const Pool2dParams wrong = make_pool2d_params(p.n, p.oc, 16, 16, 2, 2, 2, 2, PadMode::kValid);
  std::vector<float> x(p.x_numel()), w(p.w_numel()), y(wrong.y_numel());
  EXPECT_THROW(conv2d_relu_max_pool2d_forward(p, wrong, x.data(), w.data(), nullptr, F32, y.data(), nullptr), Error);
}

}  // namespace
}  // namespace demi::kernels::onednn
