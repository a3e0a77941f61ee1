// The fast attention-softmax kernels against their reference twins (every probability dtype, every CPU
// level, masks of every layout, fully masked rows), the fp16 overflow case a naive path fails, the f64
// backward against finite differences, and argument checks.
#include "demi/kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "demi/core/error.h"
#include "demi/kernels/cpu/internal/test_util.h"

namespace demi::kernels {
namespace {

using testing::Buffer;
using testing::for_each_level;
using testing::random_floats;

struct MaskCase {
  const char* name;
  int64_t batch_stride, row_stride;  // per AttentionSoftmaxParams; -1: no mask
};

AttentionSoftmaxParams params(int64_t b, int64_t h, int64_t sq, int64_t sk, float scale, MaskCase m) {
  AttentionSoftmaxParams p;
  p.batch = b * h;
  p.heads = h;
  p.rows = sq;
  p.cols = sk;
  p.scale = scale;
  p.mask_batch_stride = m.batch_stride < 0 ? 0 : m.batch_stride;
  p.mask_row_stride = m.row_stride < 0 ? 0 : m.row_stride;
  return p;
}

TEST(AttentionSoftmax, ForwardAndBackwardMatchReference) {
  struct Dims { int64_t b, h, sq, sk; };
  // The last row is longer than the kernel's stack buffer of exponentials (they are recomputed).
  // Causal too: Sq < Sk (a KV cache's queries are the last positions), Sq == Sk, and Sq > Sk (the first
  // rows see no key at all and give zeros).
  for (Dims dm : {Dims{2, 3, 5, 7}, Dims{1, 1, 1, 1}, Dims{2, 4, 33, 128}, Dims{1, 2, 3, 300}, Dims{1, 1, 2, 4100},
                  Dims{2, 2, 40, 40}, Dims{1, 2, 9, 4}})
  for (bool causal : {false, true}) {
    const MaskCase masks[] = {{"none", -1, -1},
                              {"shared (Sq, Sk)", 0, dm.sk},
                              {"per batch (B, Sq, Sk)", dm.sq * dm.sk, dm.sk},
                              {"key padding (B, 1, Sk)", dm.sk, 0}};
    for (const MaskCase& mc : masks) {
      AttentionSoftmaxParams p = params(dm.b, dm.h, dm.sq, dm.sk, 0.125f, mc);
      p.causal = causal;
      SCOPED_TRACE(str_cat("(", p.batch, ", ", p.rows, ", ", p.cols, ") mask ", mc.name, causal ? ", causal" : ""));
      std::vector<float> s = random_floats(p.numel(), 31, -20.0f, 20.0f), dp = random_floats(p.numel(), 32);
      std::vector<float> mask;
      if (mc.batch_stride >= 0) {
        mask = random_floats(dm.b * dm.sq * dm.sk, 33, -3.0f, 0.0f);
        // Mask some keys out entirely, and (for row masks) every key of one row: that row must give zeros.
        for (size_t i = 0; i < mask.size(); i += 3) mask[i] = -std::numeric_limits<float>::infinity();
        if (mc.row_stride > 0 && dm.sq > 1)
          for (int64_t j = 0; j < dm.sk; ++j)
            mask[static_cast<size_t>(dm.sk + j)] = -std::numeric_limits<float>::infinity();
      }
      const float* m = mask.empty() ? nullptr : mask.data();
      for (DType t : testing::kFastDtypes) {
        SCOPED_TRACE(testing::dtype_trace(t));
        Buffer want_p(t, p.numel()), want_ds(t, p.numel());
        testing::visit_fast(t, [&](auto tag) {
          using P = decltype(tag);
          ref::attention_softmax_forward(s.data(), m, p, want_p.as<P>());
          ref::attention_softmax_backward(want_p.as<P>(), dp.data(), p, want_ds.as<P>());
        });
        for_each_level([&](CpuLevel) {
          Buffer got_p(t, p.numel()), got_ds(t, p.numel());
          attention_softmax_forward(s.data(), DType::kF32, m, p, got_p.data(), t);
          attention_softmax_backward(want_p.data(), t, dp.data(), DType::kF32, p, got_ds.data());
          EXPECT_TRUE(testing::all_close(got_p, want_p, tolerance_for(t), "probabilities"));
          EXPECT_TRUE(testing::all_close(got_ds, want_ds, tolerance_for(t), "ds"));
          for (int64_t i = 0; i < p.numel(); ++i) ASSERT_TRUE(std::isfinite(got_p.get(i))) << "element " << i;
        });
      }
    }
  }
}

// Scores of ±6e4 (and a max beyond fp16's 65504 once scaled up) with fp16 probabilities: a naive fp16 path
// (exp in fp16, or a sum of exponentials in fp16) overflows to inf and returns NaN; the kernel subtracts the
// maximum in f32 first and matches the f64 softmax.
TEST(AttentionSoftmax, HugeScoresDoNotOverflowFp16) {
  const int64_t sk = 40;
  std::vector<float> s(static_cast<size_t>(sk));
  for (int64_t j = 0; j < sk; ++j) s[static_cast<size_t>(j)] = 60000.0f - 3.0f * static_cast<float>(j % 7);
  AttentionSoftmaxParams p = params(1, 1, 1, sk, 2.0f, {"none", -1, -1});  // scaled scores reach 1.2e5
  // What a naive fp16 softmax does: exp(x) of any x > 11.1 is inf in fp16.
  EXPECT_TRUE(std::isinf(static_cast<float>(Half(std::exp(12.0f)))));
  std::vector<double> want(static_cast<size_t>(sk));
  double mx = -1e300, sum = 0;
  for (float v : s) mx = std::max(mx, 2.0 * v);
  for (float v : s) sum += std::exp(2.0 * v - mx);
  for (int64_t j = 0; j < sk; ++j) want[static_cast<size_t>(j)] = std::exp(2.0 * s[static_cast<size_t>(j)] - mx) / sum;
  for_each_level([&](CpuLevel) {
    Buffer got(DType::kF16, sk);
    attention_softmax_forward(s.data(), DType::kF32, nullptr, p, got.data(), DType::kF16);
    EXPECT_TRUE(testing::all_close(got.values(), want, tolerance_for(DType::kF16)));
  });
}

TEST(AttentionSoftmax, BackwardMatchesFiniteDifferences) {
  const AttentionSoftmaxParams p = params(2, 2, 3, 5, 0.5f, {"per batch", 15, 5});
  const size_t n = static_cast<size_t>(p.numel());
  std::vector<double> s, w, mask;
  for (float f : random_floats(p.numel(), 41, -2.0f, 2.0f)) s.push_back(f);
  for (float f : random_floats(p.numel(), 42)) w.push_back(f);
  for (float f : random_floats(2 * 15, 43, -1.0f, 0.0f)) mask.push_back(f);
  std::vector<double> probs(n), ds(n);
  auto loss = [&] {
    attention_softmax_forward(s.data(), DType::kF64, mask.data(), p, probs.data(), DType::kF64);
    double l = 0;
    for (size_t i = 0; i < n; ++i) l += w[i] * probs[i];
    return l;
  };
  loss();
  attention_softmax_backward(probs.data(), DType::kF64, w.data(), DType::kF64, p, ds.data());
  EXPECT_TRUE(testing::all_close(ds, testing::numeric_grad(loss, s), kFiniteDiffTolerance));
}

// The kernels take a matrix's rows several at a time (internal/attention_impl.h's attention_rows, where no
// row is causal), interleaving the rows' operations: each row must come out exactly as it does alone. Here
// each row again as a call of its own (one row: attention_row) against the whole call, bit for bit, at
// every level, with every mask layout and a wholly masked row (which sends its group row by row).
TEST(AttentionSoftmax, RowsAtATimeGiveEachRowsOwnBits) {
  const int64_t b = 2, h = 2, sq = 11, sk = 100;
  const MaskCase masks[] = {{"none", -1, -1}, {"per batch (B, Sq, Sk)", sq * sk, sk}, {"key padding (B, 1, Sk)", sk, 0}};
  for (const MaskCase& mc : masks) {
    SCOPED_TRACE(mc.name);
    const AttentionSoftmaxParams p = params(b, h, sq, sk, 0.3f, mc);
    const std::vector<float> s = random_floats(p.numel(), 41, -9.0f, 9.0f), dp = random_floats(p.numel(), 42);
    std::vector<float> mask;
    if (mc.batch_stride >= 0) {
      mask = random_floats(b * sq * sk, 43, -3.0f, 0.0f);
      for (size_t i = 0; i < mask.size(); i += 5) mask[i] = -std::numeric_limits<float>::infinity();
      if (mc.row_stride > 0)
        for (int64_t j = 0; j < sk; ++j) mask[static_cast<size_t>(2 * sk + j)] = -std::numeric_limits<float>::infinity();
    }
    for (DType t : testing::kFastDtypes) {
      SCOPED_TRACE(testing::dtype_trace(t));
      for_each_level([&](CpuLevel) {
        Buffer whole(t, p.numel()), ds_whole(t, p.numel()), alone(t, p.numel()), ds_alone(t, p.numel());
        attention_softmax_forward(s.data(), DType::kF32, mask.empty() ? nullptr : mask.data(), p, whole.data(), t);
        attention_softmax_backward(whole.data(), t, dp.data(), DType::kF32, p, ds_whole.data());
        const size_t es = dtype_size(t);
        for (int64_t n = 0; n < p.batch; ++n)
          for (int64_t i = 0; i < sq; ++i) {
            AttentionSoftmaxParams one = p;
            one.batch = one.heads = one.rows = 1;
            one.mask_batch_stride = one.mask_row_stride = 0;
            const int64_t at = (n * sq + i) * sk;
            const float* m = mask.empty() ? nullptr
                                          : mask.data() + (n / h) * p.mask_batch_stride + i * p.mask_row_stride;
            attention_softmax_forward(s.data() + at, DType::kF32, m, one, static_cast<char*>(alone.data()) + at * es, t);
            attention_softmax_backward(static_cast<char*>(whole.data()) + at * es, t, dp.data() + at, DType::kF32, one,
                                       static_cast<char*>(ds_alone.data()) + at * es);
          }
        for (int64_t i = 0; i < p.numel(); ++i) {
          ASSERT_EQ(std::memcmp(static_cast<char*>(whole.data()) + i * es, static_cast<char*>(alone.data()) + i * es, es), 0)
              << "probability " << i << ": " << whole.get(i) << " vs " << alone.get(i);
          ASSERT_EQ(std::memcmp(static_cast<char*>(ds_whole.data()) + i * es, static_cast<char*>(ds_alone.data()) + i * es, es),
                    0)
              << "ds " << i << ": " << ds_whole.get(i) << " vs " << ds_alone.get(i);
        }
      });
    }
  }
}

TEST(AttentionSoftmax, RejectsBadArguments) {
  std::vector<float> s(6), out(6);
  AttentionSoftmaxParams p = params(1, 1, 2, 3, 1.0f, {"none", -1, -1});
  EXPECT_THROW(attention_softmax_forward(s.data(), DType::kBF16, nullptr, p, out.data(), DType::kBF16), Error);
  EXPECT_THROW(attention_softmax_forward(s.data(), DType::kF32, nullptr, p, out.data(), DType::kF64), Error);
  p.scale = 0;
  EXPECT_THROW(attention_softmax_forward(s.data(), DType::kF32, nullptr, p, out.data(), DType::kF32), Error);
}

}  // namespace
}  // namespace demi::kernels
