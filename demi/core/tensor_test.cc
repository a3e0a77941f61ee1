// Tests of Tensor: creation, views sharing storage, dtype conversion, deep clones, element access,
// descriptions and errors, memory-tracker accounting of a tensor's bytes, and seeded random fills that
// do not depend on the thread count.
#include "demi/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "demi/core/parallel.h"
#include "demi/core/rng.h"

namespace demi {
namespace {

std::string error_of(const auto& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Tensor, EmptyHasShapeDtypeAndCategory) {
  Tensor t = empty({2, 3}, DType::kF16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), Shape({2, 3}));
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t.dim(-1), 3);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.dtype(), DType::kF16);
  EXPECT_EQ(t.element_size(), 2u);
  EXPECT_EQ(t.nbytes(), 12u);
  EXPECT_EQ(t.category(), MemCategory::kOther);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % kAlignment, 0u);
  {
    MemCategoryScope scope(MemCategory::kActivation);
    EXPECT_EQ(empty({4}).category(), MemCategory::kActivation);
    EXPECT_EQ(empty({4}, DType::kF32, MemCategory::kParameter).category(), MemCategory::kParameter);
  }
  EXPECT_FALSE(Tensor().defined());
  EXPECT_THROW(Tensor().shape(), Error);
  EXPECT_TRUE(contains(error_of([] { empty({2, -3}); }), "(2, -3)"));
}

TEST(Tensor, ZeroElementTensorsWork) {
  Tensor t = zeros({0, 5});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.clone().numel(), 0);
  EXPECT_EQ(t.to(DType::kBF16).shape(), Shape({0, 5}));
  EXPECT_TRUE(t.to_vector().empty());
}

TEST(Tensor, CreationFunctions) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI32, DType::kI64, DType::kU8}) {
    Tensor z = zeros({3, 5}, d);
    Tensor o = ones({3, 5}, d);
    Tensor f = full({3, 5}, 7, d);
    Tensor a = arange(15, d);
    for (int64_t i = 0; i < 15; ++i) {
      ASSERT_EQ(z.get(i), 0.0) << d;
      ASSERT_EQ(o.get(i), 1.0) << d;
      ASSERT_EQ(f.get(i), 7.0) << d;
      ASSERT_EQ(a.get(i), static_cast<double>(i)) << d;
    }
  }
  Tensor b = full({4}, 0.5, DType::kBool);
  EXPECT_EQ(b.get(3), 1.0);
  EXPECT_EQ(zeros({2}, DType::kBool).get(1), 0.0);
  // A large fill runs on the pool: every element must be written.
  Tensor big = full({1 << 20}, -2.5);
  auto v = big.to_vector();
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == -2.5f; }));
}

TEST(Tensor, ReshapeAndViewShareStorageAndSeeWrites) {
  Tensor t = arange(24);
  Tensor v = t.reshape({2, 3, 4});
  EXPECT_TRUE(v.same_storage(t));
  EXPECT_FALSE(v.is_same(t));
  EXPECT_EQ(v.raw_data(), t.raw_data());
  v.set(5, 100);
  EXPECT_EQ(t.get(5), 100.0);
  t.set(23, -1);
  EXPECT_EQ(v.at({1, 2, 3}), -1.0);
  EXPECT_EQ(t.view({-1, 6}).shape(), Shape({4, 6}));
  EXPECT_EQ(t.reshape({2, -1, 3}).shape(), Shape({2, 4, 3}));
  EXPECT_EQ(arange(1).reshape({}).shape(), Shape());
}

TEST(Tensor, ViewOfAViewKeepsTheOffset) {
  Tensor base = arange(10);
  // A view that starts at element 4 (as a future slice op would make one).
  auto impl = std::make_shared<TensorImpl>(base.impl());
  impl->offset = 4;
  impl->shape = Shape{6};
  Tensor tail(impl);
  EXPECT_EQ(tail.get(0), 4.0);
  Tensor v = tail.reshape({2, 3}).flatten(0).view({3, 2});
  EXPECT_EQ(v.raw_data(), tail.raw_data());
  EXPECT_EQ(v.at({0, 0}), 4.0);
  EXPECT_EQ(v.at({2, 1}), 9.0);
}

TEST(Tensor, BadReshapeNamesBothShapes) {
  Tensor t = zeros({2, 3});
  std::string m = error_of([&] { t.reshape({4, 2}); });
  EXPECT_TRUE(contains(m, "(2, 3)")) << m;
  EXPECT_TRUE(contains(m, "(4, 2)")) << m;
  EXPECT_TRUE(contains(error_of([&] { t.reshape({-1, -1}); }), "-1"));
  m = error_of([&] { t.reshape({4, -1}); });
  EXPECT_TRUE(contains(m, "(4, -1)")) << m;
  EXPECT_THROW(t.reshape({-2, -3}), Error);
}

TEST(Tensor, Flatten) {
  Tensor t = zeros({2, 3, 4, 5});
  EXPECT_EQ(t.flatten().shape(), Shape({2, 60}));
  EXPECT_EQ(t.flatten(0).shape(), Shape({120}));
  EXPECT_EQ(t.flatten(2).shape(), Shape({2, 3, 20}));
  EXPECT_EQ(t.flatten(-1).shape(), Shape({2, 3, 4, 5}));
  EXPECT_TRUE(t.flatten().same_storage(t));
  EXPECT_THROW(t.flatten(4), Error);
}

TEST(Tensor, ToConvertsAndRoundTrips) {
  std::vector<float> exact{0.5f, -2.0f, 1024.0f, 3.140625f, 0.0f, -0.0078125f};
  Tensor t = from_vector(exact, {2, 3});
  for (DType d : {DType::kF16, DType::kBF16, DType::kF64}) {
    Tensor back = t.to(d).to(DType::kF32);
    EXPECT_EQ(back.to_vector(), exact) << d;
    EXPECT_EQ(t.to(d).dtype(), d);
    EXPECT_EQ(t.to(d).shape(), t.shape());
  }
  // Round to nearest even: 1 + 2^-11 is halfway between two f16 values and goes to the even one (1.0);
  // 1 + 3 * 2^-11 goes up to 1 + 2^-9.
  Tensor ties = from_vector(std::vector<float>{1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f}, {2});
  Tensor h = ties.to(DType::kF16);
  EXPECT_EQ(h.get(0), 1.0);
  EXPECT_EQ(h.get(1), 1.0 + 0x1p-9);
  // Integer targets truncate toward zero.
  Tensor i = from_vector(std::vector<float>{2.7f, -2.7f, 0.2f}, {3}).to(DType::kI32);
  EXPECT_EQ(i.to_vector(), (std::vector<float>{2, -2, 0}));
  // Same dtype: shared unless a copy is asked for.
  EXPECT_TRUE(t.to(DType::kF32).is_same(t));
  EXPECT_FALSE(t.to(DType::kF32, true).same_storage(t));
  EXPECT_EQ(t.to(DType::kF32, true).to_vector(), exact);
}

TEST(Tensor, CloneIsDeep) {
  Tensor t = arange(6).reshape({2, 3});
  t.set_name("w");
  Tensor c = t.clone();
  EXPECT_FALSE(c.same_storage(t));
  EXPECT_EQ(c.shape(), t.shape());
  EXPECT_EQ(c.dtype(), t.dtype());
  c.set(0, 42);
  EXPECT_EQ(t.get(0), 0.0);
  EXPECT_EQ(c.get(1), 1.0);
}

TEST(Tensor, CopyFillZero) {
  Tensor dst = zeros({2, 3}, DType::kBF16);
  dst.copy_(arange(6));
  EXPECT_EQ(dst.to_vector(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  dst.copy_(dst.flatten(0));  // the same memory: a no-op
  EXPECT_EQ(dst.get(5), 5.0);
  EXPECT_TRUE(contains(error_of([&] { dst.copy_(zeros({7})); }), "bfloat16(2, 3)"));
  dst.fill_(-3);
  EXPECT_EQ(dst.to_vector(), std::vector<float>(6, -3.0f));
  dst.zero_();
  EXPECT_EQ(dst.to_vector(), std::vector<float>(6, 0.0f));
}

TEST(Tensor, ElementAccess) {
  Tensor t = arange(12).reshape({3, 4});
  EXPECT_EQ(t.at({1, 2}), 6.0);
  EXPECT_EQ(t.get(11), 11.0);
  EXPECT_EQ(full({1, 1}, 2.5).item(), 2.5);
  EXPECT_THROW(t.item(), Error);
  EXPECT_THROW(t.get(12), Error);
  EXPECT_THROW(t.get(-1), Error);
  EXPECT_THROW(t.at({3, 0}), Error);
  EXPECT_THROW(t.at({1}), Error);
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI32, DType::kI64, DType::kU8}) {
    Tensor x = zeros({2}, d);
    x.set(1, 3.0);
    EXPECT_EQ(x.get(1), 3.0) << d;
  }
  Tensor b = zeros({1}, DType::kBool);
  b.set(0, 2.5);
  EXPECT_EQ(b.item(), 1.0);
  EXPECT_EQ(t.data<float>()[7], 7.0f);
  EXPECT_EQ(t.span<float>().size(), 12u);
  std::string m = error_of([&] { t.data<Half>(); });
  EXPECT_TRUE(contains(m, "float16") && contains(m, "float32")) << m;
}

TEST(Tensor, FromVectorEveryType) {
  EXPECT_EQ(from_vector(std::vector<float>{1.5f, 2}, {2}).dtype(), DType::kF32);
  EXPECT_EQ(from_vector(std::vector<double>{1.5, 2}, {2}).get(0), 1.5);
  EXPECT_EQ(from_vector(std::vector<int32_t>{-7, 2}, {2}).get(0), -7.0);
  EXPECT_EQ(from_vector(std::vector<int64_t>{int64_t{1} << 40}, {1}).dtype(), DType::kI64);
  EXPECT_EQ(from_vector(std::vector<uint8_t>{255}, {1}).item(), 255.0);
  EXPECT_EQ(from_vector(std::vector<Half>{Half(0.25f)}, {1}).item(), 0.25);
  EXPECT_EQ(from_vector(std::vector<BFloat16>{BFloat16(-4.0f)}, {1}).item(), -4.0);
  Tensor b = from_vector(std::vector<bool>{true, false, true}, {3});
  EXPECT_EQ(b.dtype(), DType::kBool);
  EXPECT_EQ(b.to_vector(), (std::vector<float>{1, 0, 1}));
  Tensor h = from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2}, DType::kF16);
  EXPECT_EQ(h.dtype(), DType::kF16);
  EXPECT_EQ(h.at({1, 1}), 4.0);
  std::string m = error_of([] { from_vector(std::vector<float>{1, 2, 3}, {2, 2}); });
  EXPECT_TRUE(contains(m, "(2, 2)") && contains(m, "3 values")) << m;
}

TEST(Tensor, DescribeAndToString) {
  Tensor t = zeros({32, 3, 32, 32});
  EXPECT_EQ(t.describe(), "float32(32, 3, 32, 32)");
  t.set_name("net.conv.weight");
  EXPECT_EQ(t.describe(), "float32(32, 3, 32, 32) 'net.conv.weight'");
  EXPECT_EQ(Tensor().describe(), "undefined tensor");
  EXPECT_EQ(arange(3, DType::kI64).to_string(), "int64(3) [0, 1, 2]");
  std::string s = arange(100).to_string(4);
  EXPECT_TRUE(contains(s, "[0, 1, 2, 3, ... (96 more)]")) << s;
}

TEST(Tensor, AutogradMetadata) {
  Tensor w = zeros({3});
  EXPECT_FALSE(w.requires_grad());
  EXPECT_FALSE(w.has_autograd_meta());
  EXPECT_FALSE(w.grad().defined());
  w.set_requires_grad(true);
  EXPECT_TRUE(w.requires_grad());
  Tensor g = ones({3});
  w.set_grad(g);
  EXPECT_TRUE(w.grad().is_same(g));
  EXPECT_THROW(w.set_grad(ones({4})), Error);
  w.set_grad(Tensor());
  EXPECT_FALSE(w.grad().defined());
  EXPECT_THROW(zeros({2}, DType::kI32).set_requires_grad(true), Error);
  // Views are new tensors: they do not inherit autograd metadata (the ops layer links them).
  EXPECT_FALSE(w.reshape({3, 1}).requires_grad());
}

TEST(Tensor, TrackerCountsBytesUnderTheCategoryUntilTheLastViewDies) {
  constexpr auto kAct = MemCategory::kActivation;
  int64_t base = mem_stats().cur(kAct);
  Tensor v;
  {
    MemCategoryScope scope(kAct);
    Tensor t = empty({10, 100}, DType::kF32);
    EXPECT_EQ(mem_stats().cur(kAct) - base, 4000);
    v = t.flatten(0);
    Tensor h = t.to(DType::kBF16);  // a new tensor, in the category current when it is made
    EXPECT_EQ(mem_stats().cur(kAct) - base, 6000);
  }
  EXPECT_EQ(mem_stats().cur(kAct) - base, 4000);  // the view keeps the storage alive
  v = Tensor();
  EXPECT_EQ(mem_stats().cur(kAct) - base, 0);
  int64_t params = mem_stats().cur(MemCategory::kParameter);
  {
    Tensor p = empty({8}, DType::kF64, MemCategory::kParameter);
    EXPECT_EQ(mem_stats().cur(MemCategory::kParameter) - params, 64);
  }
  EXPECT_EQ(mem_stats().cur(MemCategory::kParameter), params);
}

TEST(Tensor, UniformIsSeededInRangeAndAdvancesTheGenerator) {
  Generator g1(42), g2(42), g3(43);
  Tensor a = uniform({1001}, -2, 3, g1);
  Tensor b = uniform({1001}, -2, 3, g2);
  Tensor c = uniform({1001}, -2, 3, g3);
  EXPECT_EQ(a.to_vector(), b.to_vector());
  EXPECT_NE(a.to_vector(), c.to_vector());
  EXPECT_EQ(g1.offset(), 251u);  // ceil(1001 / 4) counter blocks
  Tensor next = uniform({1001}, -2, 3, g1);
  EXPECT_NE(next.to_vector(), a.to_vector());
  auto v = a.to_vector();
  for (float x : v) {
    ASSERT_GE(x, -2.0f);
    ASSERT_LT(x, 3.0f);
  }
  double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  EXPECT_NEAR(mean, 0.5, 0.15);
  // Other dtypes draw the same values, rounded.
  Generator g4(42);
  Tensor ab = uniform({1001}, -2, 3, g4, DType::kBF16);
  EXPECT_EQ(ab.to_vector(), a.to(DType::kBF16).to_vector());
}

TEST(Tensor, NormalMomentsOnAMillionSamples) {
  Generator gen(7);
  Tensor t = normal({1000, 1000}, 3.0, 2.0, gen, DType::kF64);
  const double* p = t.data<double>();
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < t.numel(); ++i) sum += p[i];
  double mean = sum / 1e6;
  for (int64_t i = 0; i < t.numel(); ++i) sq += (p[i] - mean) * (p[i] - mean);
  double sd = std::sqrt(sq / 1e6);
  EXPECT_NEAR(mean, 3.0, 0.01);  // standard error 0.002
  EXPECT_NEAR(sd, 2.0, 0.01);    // standard error 0.0014
  for (int64_t i = 0; i < t.numel(); ++i) ASSERT_TRUE(std::isfinite(p[i]));
}

TEST(Tensor, RandomFillsDoNotDependOnTheThreadCount) {
  int saved = num_threads();
  const Shape shape{3, 100003};  // not a multiple of 4, larger than the parallel grain
  set_num_threads(1);
  Generator g1(2024);
  auto u1 = uniform(shape, 0, 1, g1).to_vector();
  auto n1 = normal(shape, 0, 1, g1, DType::kF16).to_vector();
  set_num_threads(2);
  Generator g2(2024);
  auto u2 = uniform(shape, 0, 1, g2).to_vector();
  auto n2 = normal(shape, 0, 1, g2, DType::kF16).to_vector();
  set_num_threads(saved);
  EXPECT_EQ(u1, u2);
  EXPECT_EQ(n1, n2);
  EXPECT_EQ(g1.offset(), g2.offset());
}

TEST(Tensor, RandomArgumentsAreChecked) {
  Generator g;
  EXPECT_THROW(uniform({2}, 1, 0, g), Error);
  EXPECT_THROW(normal({2}, 0, -1, g), Error);
}

// A pending value (graph mode's rewrites hand them out): its shape, dtype and name are there without
// computing it; any other access computes it once, into the same implementation, for every handle on it.
class CountingValue : public PendingValue {
 public:
  CountingValue(Tensor value, int* computed, bool fail = false)
      : value_(std::move(value)), computed_(computed), fail_(fail) {}
  Tensor compute() override {
    ++*computed_;
    if (fail_) {
      fail_ = false;
      throw Error("not yet");
    }
    return value_;
  }

 private:
  Tensor value_;
  int* computed_;
  bool fail_;
};

Tensor pending_tensor(const Tensor& value, Shape shape, DType dtype, int* computed, bool fail = false) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = std::move(shape);
  impl->dtype = dtype;
  impl->pending = std::make_shared<CountingValue>(value, computed, fail);
  return Tensor(std::move(impl));
}

TEST(Tensor, APendingValueIsComputedOnceWhenRead) {
  int computed = 0;
  const Tensor value = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor p = pending_tensor(value, {2, 3}, DType::kF32, &computed);
  Tensor other = p;  // a second handle on the same value
  EXPECT_TRUE(p.is_pending());
  EXPECT_EQ(p.shape(), (Shape{2, 3}));
  EXPECT_EQ(p.dtype(), DType::kF32);
  EXPECT_EQ(p.numel(), 6);
  EXPECT_EQ(p.describe(), "float32(2, 3)");
  EXPECT_EQ(computed, 0) << "shape, dtype and description do not compute it";
  EXPECT_EQ(p.get(4), 5.0);
  EXPECT_EQ(computed, 1);
  EXPECT_FALSE(other.is_pending());
  EXPECT_EQ(other.to_vector(), value.to_vector());
  EXPECT_TRUE(other.same_storage(value));
  EXPECT_EQ(computed, 1) << "computed once, for every handle";
}

TEST(Tensor, APendingValueThatFailsStaysPendingAndAWrongOneIsABug) {
  int computed = 0;
  Tensor p = pending_tensor(zeros({4}), {4}, DType::kF32, &computed, /*fail=*/true);
  EXPECT_THROW((void)p.raw_data(), Error);
  EXPECT_TRUE(p.is_pending()) << "computed again at the next read";
  EXPECT_EQ(p.to_vector(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(computed, 2);
  Tensor wrong = pending_tensor(zeros({4}), {2, 2}, DType::kF32, &computed);
  EXPECT_THROW((void)wrong.raw_data(), InternalError);
}

}  // namespace
}  // namespace demi
