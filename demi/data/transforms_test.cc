// Tests of the per-column transforms: values against hand-computed ones, the random ones against a
// replay of their draws, and the errors they raise.
#include "demi/data/transforms.h"

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <utility>

#include "demi/data/internal/test_util.h"

namespace demi::data {
namespace {

using test_util::expect_error;

// A (c, h, w) uint8 image whose pixel values are their flat index mod 251 (distinct in small images).
Tensor index_image(int64_t c, int64_t h, int64_t w) {
  Tensor t = empty({c, h, w}, DType::kU8);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(i % 251));
  return t;
}

TEST(Transforms, TypeCastRescaleNormalize) {
  Generator g(1);
  Tensor img = index_image(1, 2, 3);
  Tensor f = Transform(TypeCast(DType::kF32))(img, g);
  EXPECT_EQ(f.dtype(), DType::kF32);
  EXPECT_EQ(f.to_vector(), (std::vector<float>{0, 1, 2, 3, 4, 5}));

  Tensor r = Transform(Rescale(0.5, -1))(img, g);
  EXPECT_EQ(r.dtype(), DType::kF32);
  EXPECT_EQ(r.to_vector(), (std::vector<float>{-1, -0.5, 0, 0.5, 1, 1.5}));

  // Per channel: dimension 0 of a CHW image.
  Tensor rgb = index_image(3, 1, 2);  // channels {0,1}, {2,3}, {4,5}
  Tensor n = Transform(Normalize({0, 2, 4}, {1, 2, 0.5}))(rgb, g);
  EXPECT_EQ(n.to_vector(), (std::vector<float>{0, 1, 0, 0.5, 0, 2}));
  // One value for every channel.
  EXPECT_EQ(Transform(Normalize({1}, {2}))(rgb, g).to_vector(), (std::vector<float>{-0.5, 0, 0.5, 1, 1.5, 2}));
  // Dimension 1 of an NCHW batch.
  Tensor batch = index_image(2, 3, 1).reshape({1, 2, 3, 1});  // channels {0,1,2}, {3,4,5}
  EXPECT_EQ(Transform(Normalize({0, 3}, {1, 1}))(batch, g).to_vector(), (std::vector<float>{0, 1, 2, 0, 1, 2}));
  // The input is untouched.
  EXPECT_EQ(rgb.get(5), 5);

  expect_error([&] { Transform(Normalize({0, 0}, {1, 1}))(rgb, g); }, {"3 channel(s)", "2 means"});
  expect_error([] { Normalize({0}, {0}); }, {"stddev 0"});
  expect_error([] { Normalize({0, 1}, {1}); }, {"2 and 1"});
}

// Every byte value, in `c` channels of a (c, 16, 16) image (channel k holds the values rotated by k).
Tensor every_byte(int64_t c) {
  Tensor t = empty({c, 16, 16}, DType::kU8);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  for (int64_t k = 0; k < c; ++k)
    for (int64_t v = 0; v < 256; ++v) p[k * 256 + v] = static_cast<uint8_t>((v + 37 * k) % 256);
  return t;
}

std::vector<uint32_t> bits(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kF32);
  std::vector<uint32_t> b(static_cast<size_t>(t.numel()));
  std::memcpy(b.data(), t.raw_data(), b.size() * sizeof(uint32_t));
  return b;
}

// A uint8 input is a table lookup: the same bits as the formula on the same values given as float32 (where
// each element is computed), for every byte value and odd scales.
TEST(Transforms, RescaleOfBytesIsItsFormula) {
  Generator g(0);
  Tensor bytes = every_byte(1);
  for (auto [r, s] : {std::pair{1.0 / 255, 0.0}, std::pair{0.1, -3.7}, std::pair{-1e-3, 1e30}}) {
    Rescale op(r, s);
    EXPECT_EQ(bits(op.apply(bytes, g)), bits(op.apply(bytes.to(DType::kF32), g))) << op.name();
  }
  Tensor flags = full({2}, 1, DType::kBool);
  flags.set(0, 0);
  EXPECT_EQ(Rescale(2, 0.5).apply(flags, g).to_vector(), (std::vector<float>{0.5, 2.5}));
}

// Rescale then Normalize on bytes in one pass: bit for bit the two in turn, per channel or one value for
// all, on an image and an NCHW batch; not taken for other dtypes or a shape Normalize refuses.
TEST(Transforms, RescaleNormalizeOnBytesIsTheTwoInTurn) {
  Generator g(0);
  Rescale rescale(1.0 / 255, 0.0);
  Normalize rgb({0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616}), grey({0.2860}, {0.3530});
  Tensor image = every_byte(3);
  Tensor batch = empty({2, 3, 16, 16}, DType::kU8);  // two images, the second the first reversed
  for (int64_t i = 0; i < 768; ++i) {
    batch.set(i, image.get(i));
    batch.set(768 + i, image.get(767 - i));
  }
  for (const Normalize* n : {&rgb, &grey}) {
    internal::RescaleNormalize pair(rescale, *n);
    for (const Tensor& x : {image, batch}) {
      std::optional<Tensor> y = pair.apply(x);
      ASSERT_TRUE(y.has_value()) << n->name() << " " << x.describe();
      EXPECT_EQ(y->shape(), x.shape());
      EXPECT_EQ(bits(*y), bits(n->apply(rescale.apply(x, g), g))) << n->name() << " " << x.describe();
    }
  }
  EXPECT_FALSE(internal::RescaleNormalize(rescale, rgb).apply(image.to(DType::kF32)).has_value());
  EXPECT_FALSE(internal::RescaleNormalize(rescale, rgb).apply(every_byte(2)).has_value());  // 2 channels, 3 values
}

TEST(Transforms, RandomCropMatchesAReplayOfItsDraws) {
  Tensor img = index_image(3, 8, 8);
  RandomCrop crop(8, 8, {2}, /*fill_value=*/255);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Generator g(seed), replay(seed);
    Tensor out = crop.apply(img, g);
    ASSERT_EQ(out.shape(), Shape({3, 8, 8}));
    ASSERT_EQ(out.dtype(), DType::kU8);
    int64_t y0 = replay.next_int(12 - 8 + 1), x0 = replay.next_int(12 - 8 + 1);
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t i = 0; i < 8; ++i) {
        for (int64_t j = 0; j < 8; ++j) {
          int64_t r = y0 + i - 2, col = x0 + j - 2;
          double want = (r < 0 || r >= 8 || col < 0 || col >= 8) ? 255 : img.at({c, r, col});
          ASSERT_EQ(out.at({c, i, j}), want) << "seed " << seed << " at " << c << "," << i << "," << j;
        }
      }
    }
  }
  // No padding and the full size: the identity. Smaller crops keep the channels.
  Generator g(3);
  EXPECT_EQ(RandomCrop(8, 8).apply(img, g).to_vector(), img.to_vector());
  EXPECT_EQ(RandomCrop(5, 4, {1, 0, 0, 2}).apply(img, g).shape(), Shape({3, 5, 4}));
  expect_error([&] { RandomCrop(9, 9).apply(img, g); }, {"RandomCrop(9, 9", "8 x 8", "smaller than the crop"});
  expect_error([] { RandomCrop(4, 4, {1, 2}); }, {"four (left, top, right, bottom)"});
}

TEST(Transforms, RandomHorizontalFlip) {
  Tensor img = index_image(2, 2, 3);
  Generator g(5);
  Tensor f = RandomHorizontalFlip(1.0).apply(img, g);
  EXPECT_EQ(f.to_vector(), (std::vector<float>{2, 1, 0, 5, 4, 3, 8, 7, 6, 11, 10, 9}));
  Tensor same = RandomHorizontalFlip(0.0).apply(img, g);
  EXPECT_TRUE(same.is_same(img));
  // One draw per call, flipped or not; about half flipped at 0.5; any dtype.
  Tensor wide = from_vector<double>({1, 2}, {1, 2});
  Generator h(9);
  int flipped = 0;
  for (int i = 0; i < 1000; ++i) {
    uint64_t before = h.offset();
    Tensor o = RandomHorizontalFlip(0.5).apply(wide, h);
    EXPECT_EQ(h.offset(), before + 1);
    flipped += o.get(0) == 2;
  }
  EXPECT_GT(flipped, 430);
  EXPECT_LT(flipped, 570);
}

TEST(Transforms, OneHot) {
  Generator g(0);
  Tensor labels = from_vector<int32_t>({2, 0, 3}, {3});
  Tensor o = OneHot(4).apply(labels, g);
  EXPECT_EQ(o.shape(), Shape({3, 4}));
  EXPECT_EQ(o.dtype(), DType::kF32);
  EXPECT_EQ(o.to_vector(), (std::vector<float>{0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1}));
  Tensor scalar = OneHot(3, DType::kI32).apply(full(Shape(), 1, DType::kI64), g);
  EXPECT_EQ(scalar.shape(), Shape({3}));
  EXPECT_EQ(scalar.dtype(), DType::kI32);
  EXPECT_EQ(scalar.to_vector(), (std::vector<float>{0, 1, 0}));
  expect_error([&] { OneHot(3).apply(labels, g); }, {"OneHot(3", "class index 3", "position 2", "[0, 3)"});
  expect_error([&] { OneHot(3).apply(full(Shape(), 1.0), g); }, {"integer class indices", "float32"});
}

TEST(Transforms, LambdaAndNames) {
  Generator g(0);
  Transform t = Lambda([](const Tensor& x) { return x.reshape({-1}); }, "Flatten");
  EXPECT_EQ(t.name(), "Flatten");
  EXPECT_EQ(t(index_image(1, 2, 2), g).shape(), Shape({4}));
  expect_error([&] { Transform(Lambda([](const Tensor&) { return Tensor(); }))(index_image(1, 1, 1), g); },
               {"Lambda", "undefined"});
  EXPECT_EQ(Transform(Normalize({0.5}, {0.25})).name(), "Normalize(mean=[0.5], std=[0.25])");
}

}  // namespace
}  // namespace demi::data
