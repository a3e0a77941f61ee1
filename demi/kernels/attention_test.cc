// Scaled dot-product attention's bf16 and f16 core (attention.h): the fused kernels on the tile unit and the
// batched products, each against the attention computed in f64 from the same values, forward and
// backward, over D's shape and odd ones (sizes not multiples of the tiles, dk != dv), causal rows, every mask
// layout and a wholly masked row; the two ways against each other; the choice measured once and kept. The
// kernels run at the amx level only: elsewhere these tests skip, saying so.
#include "demi/kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <unistd.h>
#include <vector>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/test_support.h"
#include "demi/kernels/cpu/internal/test_util.h"
#include "demi/kernels/tolerance.h"

namespace demi::kernels {
namespace {

using testing::Buffer;
using testing::random_floats;

struct Case {
  int64_t b, h, sq, sk, dk, dv;
  bool causal;
  int mask;  // 0 none, 1 shared (Sq, Sk), 2 per batch (B, Sq, Sk), 3 key padding (B, 1, Sk)
};

AttentionCoreParams params(const Case& c) {
  AttentionCoreParams p;
  p.softmax.batch = c.b * c.h;
  p.softmax.heads = c.h;
  p.softmax.rows = c.sq;
  p.softmax.cols = c.sk;
  p.softmax.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  p.softmax.causal = c.causal;
  p.softmax.mask_batch_stride = c.mask == 2 ? c.sq * c.sk : c.mask == 3 ? c.sk : 0;
  p.softmax.mask_row_stride = c.mask == 1 || c.mask == 2 ? c.sk : 0;
  p.dk = c.dk;
  p.dv = c.dv;
  return p;
}

// The f64 attention of the values as stored: p = softmax(scale q kᵀ + mask), out = p v; backward from dout:
// dv = pᵀ dO, ds = scale p (dp - sum(dp p)) with dp = dO vᵀ, dq = ds k, dk = dsᵀ q.
struct Reference {
  std::vector<double> probs, out, dq, dk, dv;
};
Reference reference(const AttentionCoreParams& a, const Buffer& q, const Buffer& k, const Buffer& v,
                    const std::vector<float>& mask, const Buffer& dout) {
  const AttentionSoftmaxParams& s = a.softmax;
  const int64_t n = s.batch, sq = s.rows, sk = s.cols, dk = a.dk, dv = a.dv;
  Reference r;
  r.probs.assign(static_cast<size_t>(n * sq * sk), 0.0);
  r.out.assign(static_cast<size_t>(n * sq * dv), 0.0);
  r.dq.assign(static_cast<size_t>(n * sq * dk), 0.0);
  r.dk.assign(static_cast<size_t>(n * sk * dk), 0.0);
  r.dv.assign(static_cast<size_t>(n * sk * dv), 0.0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < sq; ++i) {
      const int64_t visible = s.visible_keys(i);
      std::vector<double> z(static_cast<size_t>(sk), -std::numeric_limits<double>::infinity());
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        double d = 0;
        for (int64_t t = 0; t < dk; ++t) d += q.get((b * sq + i) * dk + t) * k.get((b * sk + j) * dk + t);
        d *= s.scale;
        if (!mask.empty()) d += mask[static_cast<size_t>((b / s.heads) * s.mask_batch_stride + i * s.mask_row_stride + j)];
        z[static_cast<size_t>(j)] = d;
        mx = std::max(mx, d);
      }
      if (mx == -std::numeric_limits<double>::infinity()) continue;  // attends to nothing: zeros
      double sum = 0;
      for (int64_t j = 0; j < visible; ++j) sum += std::exp(z[static_cast<size_t>(j)] - mx);
      for (int64_t j = 0; j < visible; ++j)
        r.probs[static_cast<size_t>((b * sq + i) * sk + j)] = std::exp(z[static_cast<size_t>(j)] - mx) / sum;
    }
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < sq; ++i) {
      const double* p = &r.probs[static_cast<size_t>((b * sq + i) * sk)];
      for (int64_t t = 0; t < dv; ++t) {
        double o = 0;
        for (int64_t j = 0; j < sk; ++j) o += p[j] * v.get((b * sk + j) * dv + t);
        r.out[static_cast<size_t>((b * sq + i) * dv + t)] = o;
      }
      std::vector<double> dp(static_cast<size_t>(sk));
      double dot = 0;
      for (int64_t j = 0; j < sk; ++j) {
        double g = 0;
        for (int64_t t = 0; t < dv; ++t) g += dout.get((b * sq + i) * dv + t) * v.get((b * sk + j) * dv + t);
        dp[static_cast<size_t>(j)] = g;
        dot += g * p[j];
      }
      for (int64_t j = 0; j < sk; ++j) {
        const double ds = s.scale * p[j] * (dp[static_cast<size_t>(j)] - dot);
        for (int64_t t = 0; t < dk; ++t) {
          r.dq[static_cast<size_t>((b * sq + i) * dk + t)] += ds * k.get((b * sk + j) * dk + t);
          r.dk[static_cast<size_t>((b * sk + j) * dk + t)] += ds * q.get((b * sq + i) * dk + t);
        }
        for (int64_t t = 0; t < dv; ++t)
          r.dv[static_cast<size_t>((b * sk + j) * dv + t)] += p[j] * dout.get((b * sq + i) * dv + t);
      }
    }
  return r;
}

// Within bf16's rounding of each output, plus the f32 sums' and the bf16 probabilities' (and ds') error,
// which grows with the terms summed: relative to the largest |value| of the output.
::testing::AssertionResult close_to(const Buffer& got, const std::vector<double>& want, int64_t terms,
                                    const char* what) {
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  const double atol = 2e-2 * std::max(scale, 1e-3) * std::sqrt(static_cast<double>(terms) / 16.0 + 1.0);
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got.get(static_cast<int64_t>(i));
    if (!std::isfinite(g) || std::abs(g - want[i]) > 2e-2 * std::abs(want[i]) + atol)
      return ::testing::AssertionFailure() << what << " element " << i << ": got " << g << ", want " << want[i]
                                           << " (atol " << atol << ")";
  }
  return ::testing::AssertionSuccess();
}

bool skip_without_tiles(AttentionCoreParams p) {
  p.softmax.batch = p.softmax.heads = p.softmax.rows = p.softmax.cols = 1;
  p.dk = p.dv = 1;
  return !attention_core_supported(p);
}

TEST(AttentionCore, EachWayMatchesTheF64Attention) {
  const Case cases[] = {{8, 4, 128, 128, 64, 64, false, 0}, {2, 2, 128, 128, 64, 64, true, 0},
                        {1, 3, 5, 37, 24, 40, false, 3},    {2, 2, 33, 70, 64, 16, false, 2},
                        {2, 1, 40, 40, 32, 32, true, 1},    {1, 2, 9, 4, 8, 8, true, 0},
                        {3, 1, 17, 1, 48, 20, false, 0}};
  if (skip_without_tiles(params(cases[0]))) GTEST_SKIP() << "the fused attention kernels need the amx level; this CPU runs " << cpu_level_name(cpu_level());
  for (DType t : {DType::kBF16, DType::kF16})
  for (const Case& c : cases) {
    AttentionCoreParams p = params(c);
    p.dtype = t;
    const AttentionSoftmaxParams& s = p.softmax;
    SCOPED_TRACE(str_cat(dtype_name(t), " N ", s.batch, " heads ", s.heads, " ", s.rows, "x", s.cols, " dk ", p.dk,
                         " dv ", p.dv, c.causal ? " causal" : "", " mask ", c.mask));
    const int64_t n = s.batch;
    Buffer q(t, random_floats(n * s.rows * p.dk, 1, -2.0f, 2.0f)),
        k(t, random_floats(n * s.cols * p.dk, 2, -2.0f, 2.0f)),
        v(t, random_floats(n * s.cols * p.dv, 3)), dout(t, random_floats(n * s.rows * p.dv, 4));
    std::vector<float> mask;
    if (c.mask != 0) {
      const int64_t rows = c.mask == 1 ? s.rows : c.mask == 2 ? c.b * s.rows : c.b;
      mask = random_floats(rows * s.cols, 5, -2.0f, 0.0f);
      for (size_t i = 0; i < mask.size(); i += 4) mask[i] = -std::numeric_limits<float>::infinity();
      if (c.mask != 3 && s.rows > 1)  // a row that sees no key: zeros
        for (int64_t j = 0; j < s.cols; ++j) mask[static_cast<size_t>(s.cols + j)] = -std::numeric_limits<float>::infinity();
    }
    const Reference want = reference(p, q, k, v, mask, dout);
    Buffer probs[2] = {Buffer(t, s.numel()), Buffer(t, s.numel())};
    for (AttentionPolicy policy : {AttentionPolicy::kProducts, AttentionPolicy::kTiles}) {
      const bool tiles = policy == AttentionPolicy::kTiles;
      SCOPED_TRACE(tiles ? "tiles" : "products");
      set_attention_policy(policy);
      Buffer& pr = probs[tiles ? 1 : 0];
      Buffer out(t, n * s.rows * p.dv), dq(t, n * s.rows * p.dk),
          dk(t, n * s.cols * p.dk), dv(t, n * s.cols * p.dv);
      attention_core_forward(p, q.data(), k.data(), v.data(), mask.empty() ? nullptr : mask.data(), pr.data(),
                             out.data());
      // The probabilities alone (out null: backward's recomputation) are the same bits.
      Buffer again(t, s.numel());
      attention_core_forward(p, q.data(), k.data(), v.data(), mask.empty() ? nullptr : mask.data(), again.data(),
                             nullptr);
      for (int64_t i = 0; i < s.numel(); ++i) ASSERT_EQ(again.get(i), pr.get(i)) << "recomputed probability " << i;
      // (backward from the reference's probabilities rounded as the kernels' are: the same for both ways)
      Buffer p_in(t, s.numel());
      for (int64_t i = 0; i < s.numel(); ++i) p_in.set(i, want.probs[static_cast<size_t>(i)]);
      attention_core_backward(p, q.data(), k.data(), v.data(), p_in.data(), dout.data(), dq.data(), dk.data(),
                              dv.data());
      EXPECT_TRUE(close_to(pr, want.probs, 1, "probs"));
      EXPECT_TRUE(close_to(out, want.out, s.cols, "out"));
      EXPECT_TRUE(close_to(dq, want.dq, s.cols, "dq"));
      EXPECT_TRUE(close_to(dk, want.dk, s.rows, "dk"));
      EXPECT_TRUE(close_to(dv, want.dv, s.rows, "dv"));
    }
    // The same softmax rows from scores summed alike (f32 sums of exact bf16 products): the probabilities
    // agree to bf16's rounding wherever the two ways' score sums agree to f32's.
    for (int64_t i = 0; i < s.numel(); ++i)
      ASSERT_NEAR(probs[0].get(i), probs[1].get(i), 1e-2 * std::abs(probs[0].get(i)) + 1e-6) << "probability " << i;
  }
  set_attention_policy(AttentionPolicy::kAuto);
}

// packed_heads: the heads read in place from one (B, S, 3 E) tensor and the output written merged (B, S, E) —
// the same sums, so the same bits as the contiguous (N, S, d) operands a permutation would make, forward and
// backward, with a key-padding mask and causal rows, odd sizes included.
TEST(AttentionCore, HeadsReadInPlaceGiveTheBitsOfThePermutedOperands) {
  struct Packed {
    int64_t b, h, s, d;
    bool causal;
    bool mask;
  };
  // (16 heads of 64: q's rows 3072 values apart, a multiple of 1024, where a's tiles do not load in place)
  for (DType t : {DType::kBF16, DType::kF16})
  for (const Packed c : {Packed{4, 4, 128, 64, false, false}, Packed{2, 3, 37, 24, false, true},
                         Packed{3, 2, 50, 32, true, false}, Packed{1, 16, 20, 64, false, true}}) {
    AttentionCoreParams p = params({c.b, c.h, c.s, c.s, c.d, c.d, c.causal, c.mask ? 3 : 0});
    p.dtype = t;
    if (skip_without_tiles(p)) GTEST_SKIP() << "the fused attention kernels need the amx level; this CPU runs " << cpu_level_name(cpu_level());
    SCOPED_TRACE(str_cat(dtype_name(t), " B ", c.b, " heads ", c.h, " S ", c.s, " d ", c.d, c.causal ? " causal" : "", c.mask ? " mask" : ""));
    const int64_t n = c.b * c.h, e = c.h * c.d, cells = n * c.s * c.s, per = n * c.s * c.d;
    const Buffer qkv(t, random_floats(c.b * c.s * 3 * e, 7, -2.0f, 2.0f));
    const Buffer dout_merged(t, random_floats(c.b * c.s * e, 8));
    std::vector<float> mask;
    if (c.mask) {
      mask = random_floats(c.b * c.s, 9, -2.0f, 0.0f);
      for (size_t i = 0; i < mask.size(); i += 3) mask[i] = -std::numeric_limits<float>::infinity();
    }
    // (B, S, [3,] H, d) element of matrix i = b H + h, row r, column j
    auto merged_at = [&](int64_t part, int64_t parts, int64_t i, int64_t r, int64_t j) {
      return ((i / c.h) * c.s + r) * parts * e + part * e + (i % c.h) * c.d + j;
    };
    Buffer q(t, per), k(t, per), v(t, per), dout(t, per);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < c.s; ++r)
        for (int64_t j = 0; j < c.d; ++j) {
          const int64_t at = (i * c.s + r) * c.d + j;
          q.set(at, qkv.get(merged_at(0, 3, i, r, j)));
          k.set(at, qkv.get(merged_at(1, 3, i, r, j)));
          v.set(at, qkv.get(merged_at(2, 3, i, r, j)));
          dout.set(at, dout_merged.get(merged_at(0, 1, i, r, j)));
        }
    set_attention_policy(AttentionPolicy::kTiles);
    const float* m = mask.empty() ? nullptr : mask.data();
    Buffer probs(t, cells), out(t, per), dq(t, per), dk(t, per),
        dv(t, per);
    attention_core_forward(p, q.data(), k.data(), v.data(), m, probs.data(), out.data());
    attention_core_backward(p, q.data(), k.data(), v.data(), probs.data(), dout.data(), dq.data(), dk.data(), dv.data());
    p.packed_heads = true;
    Buffer probs_p(t, cells), out_p(t, c.b * c.s * e), dqkv(t, c.b * c.s * 3 * e);
    attention_core_forward(p, qkv.data(), nullptr, nullptr, m, probs_p.data(), out_p.data());
    attention_core_backward(p, qkv.data(), nullptr, nullptr, probs_p.data(), dout_merged.data(), dqkv.data(), nullptr,
                            nullptr);
    set_attention_policy(AttentionPolicy::kAuto);
    for (int64_t i = 0; i < cells; ++i) ASSERT_EQ(probs_p.get(i), probs.get(i)) << "probability " << i;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < c.s; ++r)
        for (int64_t j = 0; j < c.d; ++j) {
          const int64_t at = (i * c.s + r) * c.d + j;
          ASSERT_EQ(out_p.get(merged_at(0, 1, i, r, j)), out.get(at)) << "out " << at;
          ASSERT_EQ(dqkv.get(merged_at(0, 3, i, r, j)), dq.get(at)) << "dq " << at;
          ASSERT_EQ(dqkv.get(merged_at(1, 3, i, r, j)), dk.get(at)) << "dk " << at;
          ASSERT_EQ(dqkv.get(merged_at(2, 3, i, r, j)), dv.get(at)) << "dv " << at;
        }
  }
}

// Under auto the first call of a shape measures the two ways and writes one line per direction; a process
// that has not measured (the in-memory choices forgotten) reads the file and measures nothing.
TEST(AttentionCore, TheChoiceIsMeasuredOnceAndKept) {
  const AttentionCoreParams p = params({4, 2, 64, 64, 32, 32, false, 0});
  if (skip_without_tiles(p)) GTEST_SKIP() << "the fused attention kernels need the amx level; this CPU runs " << cpu_level_name(cpu_level());
  const test_support::TempDir tmp("demi_attention_test");
  const std::string dir = tmp.str();
  set_attention_cache_dir(dir);
  set_attention_policy(AttentionPolicy::kAuto);
  const std::string path = attention_cache_path();
  ASSERT_FALSE(path.empty()) << "no cache folder could be written";
  const std::string fwd = attention_core_kernel(p, false), bwd = attention_core_kernel(p, true);
  for (const std::string& k : {fwd, bwd}) EXPECT_TRUE(k == "tiles" || k == "products") << k;
  auto read = [&] {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string text = read();
  EXPECT_NE(text.find("fwd bfloat16 n8 h2 64x64 dk32 dv32 = " + fwd), std::string::npos) << text;
  EXPECT_NE(text.find("bwd bfloat16 n8 h2 64x64 dk32 dv32 = " + bwd), std::string::npos) << text;
  // Forged: the file's word is taken, nothing measured again.
  {
    std::string forged = text;
    const std::string from = "fwd bfloat16 n8 h2 64x64 dk32 dv32 = " + fwd;
    forged.replace(forged.find(from), from.size(), "fwd bfloat16 n8 h2 64x64 dk32 dv32 = " + std::string(fwd == "tiles" ? "products" : "tiles"));
    std::ofstream(path, std::ios::trunc) << forged;
  }
  set_attention_cache_dir(dir);  // (forgets the in-memory choices)
  EXPECT_EQ(attention_core_kernel(p, false), fwd == "tiles" ? "products" : "tiles");
  EXPECT_EQ(attention_core_kernel(p, true), bwd);
  set_attention_policy(AttentionPolicy::kTiles);
  EXPECT_EQ(attention_core_kernel(p, false), "tiles");
  set_attention_policy(AttentionPolicy::kAuto);
  set_attention_cache_dir("");
}

}  // namespace
}  // namespace demi::kernels
