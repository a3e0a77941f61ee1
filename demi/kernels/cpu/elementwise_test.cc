#include "demi/kernels/cpu/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
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
using Dims = std::vector<int64_t>;

int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t v : d) n *= v;
  return n;
}

// Values for the right operand of a division: magnitudes in [0.5, 2], either sign.
std::vector<float> divisor_values(int64_t n, uint64_t seed) {
  auto v = random_floats(n, seed, 0.5f, 2.0f);
  for (size_t i = 0; i < v.size(); i += 3) v[i] = -v[i];
  return v;
}

TEST(BroadcastShape, FollowsNumPy) {
  EXPECT_EQ(broadcast_shape(Dims{2, 1, 3}, Dims{4, 3}), Shape({2, 4, 3}));
  EXPECT_EQ(broadcast_shape(Dims{8, 16, 5, 5}, Dims{16, 1, 1}), Shape({8, 16, 5, 5}));
  EXPECT_EQ(broadcast_shape(Dims{}, Dims{3, 2}), Shape({3, 2}));
  EXPECT_EQ(broadcast_shape(Dims{5, 1}, Dims{1, 4}), Shape({5, 4}));
  EXPECT_TRUE(broadcasts_to(Dims{16, 1, 1}, Dims{8, 16, 5, 5}));
  EXPECT_FALSE(broadcasts_to(Dims{4, 3}, Dims{2, 3}));
}

TEST(BroadcastShape, IncompatibleShapesNameBoth) {
  try {
    broadcast_shape(Dims{2, 3}, Dims{4, 3}, "add");
    FAIL() << "expected demi::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("add"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(2, 3)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(4, 3)"), std::string::npos) << msg;
  }
  std::vector<float> a(6, 1.0f), b(12, 1.0f), out(12);
  EXPECT_THROW(binary(BinaryOp::kMul, DType::kF32, a.data(), Dims{2, 3}, b.data(), Dims{4, 3}, out.data()), Error);
  EXPECT_THROW(binary(BinaryOp::kAdd, DType::kI32, a.data(), Dims{6}, a.data(), Dims{6}, out.data()), Error);
  EXPECT_THROW(sum_to_shape(DType::kF32, b.data(), Dims{4, 3}, a.data(), Dims{2, 3}), Error);
}

struct ShapePair {
  Dims a, b;
};

const std::vector<ShapePair> kBinaryShapes = {
    {{2, 1, 3}, {4, 3}},            // the NumPy example
    {{4, 3}, {2, 1, 3}},            // and reversed
    {{7, 33}, {7, 33}},             // same shape, odd sizes
    {{17, 40}, {40}},               // row (bias over features)
    {{17, 40}, {17, 1}},            // column
    {{}, {5, 6}},                   // scalar on the left
    {{3, 5, 7, 9}, {5, 1, 1}},      // (N, C, H, W) + (C, 1, 1)
    {{1, 5, 3, 3}, {5, 1, 1}},      // batch 1
    {{5, 1}, {1, 4}},               // outer product shape
    {{2, 3, 1, 4, 1}, {3, 5, 4, 2}},  // several broadcast dims
    {{64, 33, 41}, {33, 1}},        // large enough to run in parallel
    {{2, 33001}, {2, 33001}},       // one long row after coalescing, cut into chunks
    {{66001}, {1}},                 // a long row with a scalar
    {{1}, {1}},                     // one element
};

// The reference runs once per case; the fast kernel once per CPU level.
TEST(Binary, MatchesReference) {
  for (DType t : testing::kFastDtypes) {
    SCOPED_TRACE(testing::dtype_trace(t));
    for (const auto& s : kBinaryShapes) {
      Shape out_shape = broadcast_shape(s.a, s.b);
      for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
        SCOPED_TRACE(str_cat(binary_op_name(op), " ", shape_string(s.a), " ", shape_string(s.b)));
        Buffer a(t, random_floats(numel(s.a), 1));
        Buffer b(t, op == BinaryOp::kDiv ? divisor_values(numel(s.b), 2) : random_floats(numel(s.b), 2));
        Buffer want(t, out_shape.numel());
        testing::visit_fast(t, [&](auto tag) {
          using T = decltype(tag);
          ref::binary(op, a.as<T>(), s.a, b.as<T>(), s.b, want.as<T>());
        });
        for_each_level([&](CpuLevel) {
          Buffer got(t, out_shape.numel());
          binary(op, t, a.data(), s.a, b.data(), s.b, got.data());
          EXPECT_TRUE(testing::all_close(got, want, tolerance_for(t)));
        });
      }
    }
  }
}

TEST(Binary, InPlaceAndF64) {
  for_each_level([](CpuLevel) {
    Buffer a(DType::kF32, random_floats(100, 3)), b(DType::kF32, random_floats(10, 4));
    Buffer want(DType::kF32, 100);
    ref::binary(BinaryOp::kAdd, a.as<float>(), Dims{10, 10}, b.as<float>(), Dims{10}, want.as<float>());
    binary(BinaryOp::kAdd, DType::kF32, a.data(), Dims{10, 10}, b.data(), Dims{10}, a.data());
    EXPECT_TRUE(testing::all_close(a, want, tolerance_for(DType::kF32)));
    Buffer a64(DType::kF64, random_floats(6, 5)), b64(DType::kF64, random_floats(2, 6)), o64(DType::kF64, 6);
    binary(BinaryOp::kMul, DType::kF64, a64.data(), Dims{3, 2}, b64.data(), Dims{2}, o64.data());
    for (int i = 0; i < 6; ++i) EXPECT_DOUBLE_EQ(o64.get(i), a64.get(i) * b64.get(i % 2));
  });
}

struct SumCase {
  Dims grad, out;
};

TEST(SumToShape, MatchesReference) {
  const std::vector<SumCase> cases = {
      {{2, 4, 3}, {4, 3}},      {{2, 4, 3}, {2, 1, 3}},      {{3, 5, 7, 9}, {5, 1, 1}},
      {{17, 40}, {40}},         {{17, 40}, {17, 1}},         {{17, 40}, {}},
      {{6, 1, 5}, {1, 1, 5}},   {{5, 4}, {5, 4}},            {{1, 5, 3, 3}, {5, 1, 1}},
      {{64, 9, 300}, {9, 1}},   {{3, 150000}, {3, 1}},       {{300, 1000}, {1}},
      {{2, 3, 4, 5, 6}, {3, 1, 5, 1}},  {{2000, 3, 40}, {3, 1}},  // few outputs, many short runs
  };
  for (DType t : testing::kFastDtypes) {
    SCOPED_TRACE(testing::dtype_trace(t));
    for (const auto& c : cases) {
      SCOPED_TRACE(str_cat(shape_string(c.grad), " -> ", shape_string(c.out)));
      // Positive values keep the long f32 sums well conditioned, so the tolerance measures the kernel.
      Buffer g(t, random_floats(numel(c.grad), 7, 0.25f, 1.0f));
      Buffer want(t, numel(c.out));
      testing::visit_fast(t, [&](auto tag) {
        using T = decltype(tag);
        ref::sum_to_shape(g.as<T>(), c.grad, want.as<T>(), c.out);
      });
      for_each_level([&](CpuLevel) {
        Buffer got(t, numel(c.out));
        sum_to_shape(t, g.data(), c.grad, got.data(), c.out);
        EXPECT_TRUE(testing::all_close(got, want, tolerance_for(t)));
      });
    }
  }
}

// The backward of a broadcast binary op, composed as the ops layer does (binary + sum_to_shape), against
// f64 central finite differences of the forward: L(a, b) = sum(w * op(a, b)).
TEST(SumToShape, IsTheBackwardOfBroadcasting) {
  const std::vector<ShapePair> shapes = {{{2, 1, 3}, {4, 3}}, {{3, 4, 2, 2}, {4, 1, 1}}, {{5, 3}, {5, 1}}};
  for (const auto& s : shapes) {
    Shape out_shape = broadcast_shape(s.a, s.b);
    Dims od(out_shape.dims().begin(), out_shape.dims().end());
    const int64_t n = out_shape.numel();
    for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
      SCOPED_TRACE(str_cat(binary_op_name(op), " ", shape_string(s.a), " ", shape_string(s.b)));
      std::vector<double> a, b, w;
      for (float v : random_floats(numel(s.a), 11)) a.push_back(v);
      for (float v : divisor_values(numel(s.b), 12)) b.push_back(v);
      for (float v : random_floats(n, 13)) w.push_back(v);
      std::vector<double> out(static_cast<size_t>(n));
      auto loss = [&] {
        ref::binary(op, a.data(), s.a, b.data(), s.b, out.data());
        double l = 0;
        for (int64_t i = 0; i < n; ++i) l += w[static_cast<size_t>(i)] * out[static_cast<size_t>(i)];
        return l;
      };
      // dL/da = sum_to_shape(w * dop/da), dL/db = sum_to_shape(w * dop/db), with the partials broadcast.
      std::vector<double> wa(static_cast<size_t>(n)), wb(static_cast<size_t>(n)), ones(w.size(), 1.0);
      std::vector<double> a_full(static_cast<size_t>(n)), b_full(static_cast<size_t>(n));
      ref::binary(BinaryOp::kMul, ones.data(), od, a.data(), s.a, a_full.data());
      ref::binary(BinaryOp::kMul, ones.data(), od, b.data(), s.b, b_full.data());
      for (size_t i = 0; i < w.size(); ++i) {
        switch (op) {
          case BinaryOp::kAdd: wa[i] = w[i], wb[i] = w[i]; break;
          case BinaryOp::kSub: wa[i] = w[i], wb[i] = -w[i]; break;
          case BinaryOp::kMul: wa[i] = w[i] * b_full[i], wb[i] = w[i] * a_full[i]; break;
          case BinaryOp::kDiv: wa[i] = w[i] / b_full[i], wb[i] = -w[i] * a_full[i] / (b_full[i] * b_full[i]); break;
        }
      }
      std::vector<double> da(a.size()), db(b.size());
      ref::sum_to_shape(wa.data(), od, da.data(), s.a);
      ref::sum_to_shape(wb.data(), od, db.data(), s.b);
      EXPECT_TRUE(testing::all_close(da, testing::numeric_grad(loss, a), kFiniteDiffTolerance, "da"));
      EXPECT_TRUE(testing::all_close(db, testing::numeric_grad(loss, b), kFiniteDiffTolerance, "db"));
      // The fast f64 path is the reference; the f32 path agrees with it.
      std::vector<float> wa32(wa.begin(), wa.end()), da32(a.size());
      sum_to_shape(DType::kF32, wa32.data(), od, da32.data(), s.a);
      EXPECT_TRUE(testing::all_close(std::vector<double>(da32.begin(), da32.end()), da, tolerance_for(DType::kF32)));
    }
  }
}

TEST(Unary, MatchesReference) {
  const std::vector<UnaryOp> ops = {UnaryOp::kNeg,  UnaryOp::kAbs, UnaryOp::kSquare,    UnaryOp::kSqrt,
                                    UnaryOp::kExp,  UnaryOp::kLog, UnaryOp::kReciprocal};
  for (DType t : testing::kFastDtypes) {
    SCOPED_TRACE(testing::dtype_trace(t));
    for (int64_t n : {1, 15, 1003, 70001}) {
      for (UnaryOp op : ops) {
        SCOPED_TRACE(str_cat(unary_op_name(op), " n=", n));
        bool positive = op == UnaryOp::kSqrt || op == UnaryOp::kLog;
        Buffer x(t, positive ? random_floats(n, 21, 1e-3f, 50.0f) : random_floats(n, 21, -8.0f, 8.0f));
        Buffer want(t, n);
        testing::visit_fast(t, [&](auto tag) {
          using T = decltype(tag);
          ref::unary(op, x.as<T>(), want.as<T>(), n);
        });
        for_each_level([&](CpuLevel) {
          Buffer got(t, n);
          unary(op, t, x.data(), got.data(), n);
          EXPECT_TRUE(testing::all_close(got, want, tolerance_for(t)));
        });
      }
    }
  }
}

// exp and log at the edges of f32: overflow to inf, underflow through the subnormals to 0, inf, NaN, 0.
TEST(Unary, ExpAndLogEdgeCases) {
  const std::vector<float> xs = {0.0f,   -0.0f,  1.0f,   -1.0f,    88.0f,  88.7f, 88.8f,  100.0f, -87.0f,
                                 -88.5f, -95.0f, -103.0f, -104.5f, -200.0f, 1e-30f, 1e-40f, 3e38f,
                                 INFINITY, -INFINITY, NAN};
  for_each_level([&](CpuLevel) {
    const int64_t n = static_cast<int64_t>(xs.size());
    std::vector<float> e(xs.size()), l(xs.size());
    unary(UnaryOp::kExp, DType::kF32, xs.data(), e.data(), n);
    unary(UnaryOp::kLog, DType::kF32, xs.data(), l.data(), n);
    for (size_t i = 0; i < xs.size(); ++i) {
      SCOPED_TRACE(str_cat("x = ", xs[i]));
      float we = std::exp(xs[i]), wl = std::log(xs[i]);
      EXPECT_TRUE(tolerance_for(DType::kF32).close(e[i], we)) << e[i] << " vs " << we;
      EXPECT_TRUE(tolerance_for(DType::kF32).close(l[i], wl)) << l[i] << " vs " << wl;
    }
  });
}

TEST(Affine, ScaleAddScalarAxpyMatchReference) {
  for_each_level([](CpuLevel) {
    for (DType t : testing::kFastDtypes) {
      SCOPED_TRACE(testing::dtype_trace(t));
      for (int64_t n : {1, 31, 40000}) {
        Buffer x(t, random_floats(n, 31)), y0(t, random_floats(n, 32));
        Buffer got(t, n), want(t, n);
        testing::visit_fast(t, [&](auto tag) {
          using T = decltype(tag);
          affine(t, x.data(), 0.37, -1.25, got.data(), n);
          ref::affine(x.as<T>(), 0.37, -1.25, want.as<T>(), n);
          EXPECT_TRUE(testing::all_close(got, want, tolerance_for(t), "affine"));
          scale(t, x.data(), -3.0, got.data(), n);
          ref::affine(x.as<T>(), -3.0, 0.0, want.as<T>(), n);
          EXPECT_TRUE(testing::all_close(got, want, tolerance_for(t), "scale"));
          add_scalar(t, x.data(), 0.5, got.data(), n);
          ref::affine(x.as<T>(), 1.0, 0.5, want.as<T>(), n);
          EXPECT_TRUE(testing::all_close(got, want, tolerance_for(t), "add_scalar"));
          Buffer yg = y0, yw = y0;
          axpy(t, n, -0.75, x.data(), yg.data());
          ref::axpy(n, -0.75, x.as<T>(), yw.as<T>());
          EXPECT_TRUE(testing::all_close(yg, yw, tolerance_for(t), "axpy"));
        });
      }
    }
  });
}

// bf16 and f16 stores round exactly as the scalar types do.
TEST(Binary, LowPrecisionStoresAreBitIdenticalToScalarRounding) {
  for_each_level([](CpuLevel) {
    const int64_t n = 999;
    auto av = random_floats(n, 41, -70000.0f, 70000.0f), bv = random_floats(n, 42, -3.0f, 3.0f);
    for (DType t : {DType::kBF16, DType::kF16}) {
      Buffer a(t, av), b(t, bv), got(t, n);
      binary(BinaryOp::kMul, t, a.data(), Dims{n}, b.data(), Dims{n}, got.data());
      for (int64_t i = 0; i < n; ++i) {
        float prod = static_cast<float>(a.get(i)) * static_cast<float>(b.get(i));
        uint16_t want = t == DType::kBF16 ? BFloat16(prod).bits : Half(prod).bits;
        uint16_t bits = t == DType::kBF16 ? got.as<BFloat16>()[i].bits : got.as<Half>()[i].bits;
        ASSERT_EQ(bits, want) << "element " << i << " " << prod;
      }
    }
  });
}

}  // namespace
}  // namespace demi::kernels

namespace demi::kernels {
namespace {

// e^x on the vector levels is one algorithm (internal/vec_avx2.h, vec_avx512.h: Cephes' polynomial, then the
// scaling by 2^n: two multiplications on AVX2, vscalefps on AVX-512). The two scalings are exact wherever
// the result is not flushed to 0, so every vector level gives AVX2's bits: across the whole range, at the
// flush and overflow edges, and for the special values.
TEST(ElementwiseExp, EveryVectorLevelGivesTheSameBits) {
  std::vector<float> x;
  for (float v = -104.0f; v <= 104.0f; v += 0.0137f) x.push_back(v);
  for (float v : {-87.3f, -87.29f, -87.31f, -87.336f, -86.99f, 88.72f, 88.7228f, 88.73f, 89.0f, 0.0f, -0.0f,
                  1e-30f, -1e-30f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::lowest(), std::numeric_limits<float>::denorm_min()})
    x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint32_t> first;
  int levels = 0;
  for_each_level([&](CpuLevel level) {
    if (level < CpuLevel::kAvx2) return;
    std::vector<float> y(x.size());
    unary(UnaryOp::kExp, DType::kF32, x.data(), y.data(), n);
    std::vector<uint32_t> bits(x.size());
    std::memcpy(bits.data(), y.data(), y.size() * sizeof(float));
    ++levels;
    if (first.empty()) {
      first = bits;
      return;
    }
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(bits[i], first[i]) << "exp(" << x[i] << "): " << y[i] << " against the first vector level's";
  });
  if (levels < 2) GTEST_SKIP() << "this CPU has one vector level (" << levels << "): nothing to compare";
}

}  // namespace
}  // namespace demi::kernels
