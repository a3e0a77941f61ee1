// Tests of MnistDataset and the IDX decoder: small hand-built files (plain and gzip) read back exactly,
// every malformed file refused with a message naming the file and the problem, and the real
// Fashion-MNIST files of Debian's dataset-fashion-mnist (skipped when the package is absent).
#include "demi/data/mnist.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "demi/data/internal/formats.h"
#include "demi/data/internal/test_util.h"
#include "demi/data/iterator.h"
#include "demi/data/prefetch.h"

namespace demi::data {
namespace {

using test_util::expect_error;
using test_util::gzip;
using test_util::idx_file;
using test_util::TempDir;
using test_util::write_bytes;
namespace fs = std::filesystem;

constexpr uint32_t kRows = 4, kCols = 3;

std::vector<uint8_t> pixels(uint32_t n, uint8_t base) {
  std::vector<uint8_t> v(n * kRows * kCols);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(base + i);
  return v;
}

std::vector<uint8_t> labels_of(uint32_t n) {
  std::vector<uint8_t> v(n);
  for (uint32_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 3) % 10);
  return v;
}

// Writes a split's two files (optionally gzipped) into dir.
void write_split(const fs::path& dir, const std::string& prefix, uint32_t n, bool gz, uint8_t base = 0) {
  auto img = idx_file({n, kRows, kCols}, pixels(n, base));
  auto lab = idx_file({n}, labels_of(n));
  write_bytes(dir / (prefix + "-images-idx3-ubyte" + (gz ? ".gz" : "")), gz ? gzip(img) : img);
  write_bytes(dir / (prefix + "-labels-idx1-ubyte" + (gz ? ".gz" : "")), gz ? gzip(lab) : lab);
}

TEST(MnistDataset, ReadsPlainAndGzipFiles) {
  for (bool gz : {false, true}) {
    TempDir dir;
    write_split(dir.path(), "train", 5, gz);
    write_split(dir.path(), "t10k", 2, gz, 100);
    auto ds = std::make_shared<MnistDataset>(dir.str(), "train");
    EXPECT_EQ(ds->get_dataset_size(), 5);
    EXPECT_EQ(ds->column_names(), (std::vector<std::string>{"image", "label"}));
    EXPECT_EQ(ds->images().category(), MemCategory::kData);
    auto it = ds->create_iterator();
    for (int64_t i = 0; i < 5; ++i) {
      auto row = it->next();
      ASSERT_TRUE(row.has_value());
      const Tensor& img = (*row)[0];
      EXPECT_EQ(img.shape(), Shape({1, kRows, kCols}));
      EXPECT_EQ(img.dtype(), DType::kU8);
      EXPECT_EQ(img.at({0, 1, 2}), static_cast<uint8_t>(i * 12 + 5));
      EXPECT_EQ((*row)[1].dtype(), DType::kI32);
      EXPECT_EQ((*row)[1].rank(), 0);
      EXPECT_EQ((*row)[1].item(), (i * 3) % 10);
      EXPECT_TRUE(img.same_storage(ds->images()));  // a view of the one buffer
    }
    EXPECT_FALSE(it->next().has_value());

    auto test = std::make_shared<MnistDataset>(dir.str(), "test");
    EXPECT_EQ(test->get_dataset_size(), 2);
    EXPECT_EQ(test->get_row(0, 0)[0].get(0), 100);
    auto all = std::make_shared<MnistDataset>(dir.str(), "all");
    EXPECT_EQ(all->get_dataset_size(), 7);
    EXPECT_EQ(all->get_row(5, 0)[0].get(0), 100);  // train, then test
    EXPECT_EQ(all->get_row(6, 0)[1].item(), 3);
  }
}

TEST(MnistDataset, HighlyCompressedFilesGrowTheirBuffer) {
  // 2000 28x28 images in long runs compress ~500x: more than the first buffer guess, so it grows.
  TempDir dir;
  std::vector<uint8_t> px(2000 * 784);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i / 4096);
  auto gz = gzip(idx_file({2000, 28, 28}, px));
  ASSERT_LT(8 * gz.size() + (1u << 20), px.size());
  write_bytes(dir.path() / "train-images-idx3-ubyte.gz", gz);
  std::vector<uint8_t> labels(2000, 1);
  write_bytes(dir.path() / "train-labels-idx1-ubyte", idx_file({2000}, labels));
  MnistDataset ds(dir.str());
  ASSERT_EQ(ds.images().numel(), static_cast<int64_t>(px.size()));
  EXPECT_EQ(0, std::memcmp(ds.images().raw_data(), px.data(), px.size()));
  // A header claiming far more than the stream holds fails when the data runs out.
  write_bytes(dir.path() / "train-images-idx3-ubyte.gz", gzip(idx_file({3000, 28, 28}, px)));
  expect_error([&] { MnistDataset bad(dir.str()); },
               {"train-images-idx3-ubyte.gz", "truncated", "ends after 1568000 of the 2352000"});
}

TEST(MnistDataset, AcceptsConcatenatedGzipMembers) {
  TempDir dir;
  auto img = idx_file({3, kRows, kCols}, pixels(3, 0));
  std::vector<uint8_t> half1(img.begin(), img.begin() + 20), half2(img.begin() + 20, img.end());
  auto gz = gzip(half1);
  auto gz2 = gzip(half2);
  gz.insert(gz.end(), gz2.begin(), gz2.end());
  write_bytes(dir.path() / "train-images-idx3-ubyte.gz", gz);
  write_bytes(dir.path() / "train-labels-idx1-ubyte", idx_file({3}, labels_of(3)));
  MnistDataset ds(dir.str());
  EXPECT_EQ(ds.images().get(35), 35);
}

TEST(MnistDataset, MissingDirectoryOrFileNamesWhatWasExpected) {
  expect_error([] { MnistDataset("/nonexistent/demi/mnist"); }, {"/nonexistent/demi/mnist", "does not exist"});
  TempDir dir;
  write_split(dir.path(), "train", 2, false);
  fs::remove(dir.path() / "train-labels-idx1-ubyte");
  expect_error([&] { MnistDataset ds(dir.str()); },
               {dir.str(), "no train labels file", "train-labels-idx1-ubyte, train-labels-idx1-ubyte.gz",
                "holds train-images-idx3-ubyte"});
  expect_error([&] { MnistDataset ds(dir.str(), "test"); }, {"no t10k images file"});
  expect_error([&] { MnistDataset ds(dir.str(), "validation"); }, {"usage", "\"validation\""});
}

// Writes a valid labels file beside `images` (a malformed images file) and expects the error.
void expect_images_error(const std::vector<uint8_t>& images, std::initializer_list<std::string> pieces,
                         bool gz_name = false) {
  TempDir dir;
  std::string name = std::string("train-images-idx3-ubyte") + (gz_name ? ".gz" : "");
  write_bytes(dir.path() / name, images);
  write_bytes(dir.path() / "train-labels-idx1-ubyte", idx_file({2}, labels_of(2)));
  std::string path = (dir.path() / name).string();
  std::string msg = test_util::error_message([&] { MnistDataset ds(dir.str()); });
  EXPECT_NE(msg.find(path), std::string::npos) << "the error does not name the file: " << msg;
  for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "missing \"" << p << "\" in: " << msg;
}

TEST(MnistDataset, MalformedImageFilesAreErrorsNamingTheFile) {
  auto good = idx_file({2, kRows, kCols}, pixels(2, 0));
  // A labels file where images were expected: wrong magic.
  expect_images_error(idx_file({2}, labels_of(2)), {"wrong magic number 0x00000801", "expected 0x00000803",
                                                     "labels file given as images"});
  expect_images_error({'P', 'K', 3, 4, 0, 0}, {"wrong magic number 0x504b0304", "not an IDX file"});
  expect_images_error({}, {"empty"});
  expect_images_error({0, 0, 8}, {"truncated", "magic"});
  expect_images_error({0, 0, 8, 3, 0, 0, 0, 2, 0, 0}, {"truncated", "IDX header"});
  // Data shorter or longer than the header says.
  std::vector<uint8_t> shorter(good.begin(), good.end() - 5);
  expect_images_error(shorter, {"truncated", "2 x 4 x 3", "need 24 data bytes", "only 19"});
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  expect_images_error(longer, {"1 unexpected bytes after the 24 data bytes"});
  // Absurd dimensions: an overflowing product, and a huge claim with a few bytes behind it.
  expect_images_error(idx_file({0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}), {"absurd", "overflow"});
  expect_images_error(idx_file({1000000000, 28, 28}, pixels(1, 0)), {"truncated", "784000000000 data bytes"});
  expect_images_error(idx_file({0, 28, 28}, {}), {"hold no data"});
  // The same in gzip: truncated stream, corrupt stream, a stream longer than the header, absurd sizes.
  auto gz = gzip(good);
  expect_images_error(std::vector<uint8_t>(gz.begin(), gz.begin() + static_cast<long>(gz.size() / 2)),
                      {"gzip stream is truncated"}, true);
  expect_images_error(std::vector<uint8_t>(gz.begin(), gz.end() - 3), {"truncated"}, true);
  auto corrupt = gz;
  corrupt[corrupt.size() - 6] ^= 0xFF;  // inside the CRC-32 trailer
  expect_images_error(corrupt, {"corrupt gzip stream", "incorrect data check"}, true);
  auto garbage = gz;
  for (size_t i = 12; i < garbage.size() - 8; ++i) garbage[i] = static_cast<uint8_t>(i * 37);
  expect_images_error(garbage, {"gzip"}, true);
  expect_images_error(gzip(longer), {"longer than the 24 bytes"}, true);
  expect_images_error(gzip(shorter), {"truncated", "decompressed data ends after 19 of the 24"}, true);
  auto trailing = gz;
  trailing.push_back(0);
  trailing.push_back(0);
  expect_images_error(trailing, {"2 bytes of trailing data"}, true);
  expect_images_error(gzip(idx_file({1000000000, 1000, 1000}, {})), {"absurd", "more than a gzip file of"}, true);
}

TEST(MnistDataset, LabelsMustMatchImagesInCountAndRange) {
  TempDir dir;
  write_bytes(dir.path() / "train-images-idx3-ubyte", idx_file({3, kRows, kCols}, pixels(3, 0)));
  write_bytes(dir.path() / "train-labels-idx1-ubyte.gz", gzip(idx_file({2}, labels_of(2))));
  expect_error([&] { MnistDataset ds(dir.str()); },
               {"train-images-idx3-ubyte has 3 images", "train-labels-idx1-ubyte.gz has 2 labels"});
  write_bytes(dir.path() / "train-labels-idx1-ubyte.gz", gzip(idx_file({3}, {1, 12, 2})));
  expect_error([&] { MnistDataset ds(dir.str()); },
               {"train-labels-idx1-ubyte.gz", "label 12 at index 1", "[0, 10)"});
  MnistDataset wide(dir.str(), "train", {.num_classes = 62});  // EMNIST-style label sets
  EXPECT_EQ(wide.labels().get(1), 12);
}

TEST(IdxDecoder, NeverReadsOutOfBoundsOnAnyPrefix) {
  // Every prefix of a valid file, plain and gzip, is refused cleanly (the fuzz targets go further).
  auto good = idx_file({2, kRows, kCols}, pixels(2, 0));
  auto gz = gzip(good);
  for (const auto* f : {&good, &gz}) {
    for (size_t n = 0; n < f->size(); ++n) {
      std::span<const uint8_t> prefix(f->data(), n);
      EXPECT_THROW(internal::decode_idx_u8(prefix, 3, "prefix"), Error) << "prefix of " << n << " bytes";
    }
    EXPECT_EQ(internal::decode_idx_u8(*f, 3, "whole").data.numel(), 24);
  }
}

// ---- The real Fashion-MNIST files (Debian's dataset-fashion-mnist). ----

constexpr const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

TEST(MnistDataset, FashionMnistFromDebian) {
  if (!fs::exists(fs::path(kFashionDir) / "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (" << kFashionDir << ")";
  }
  auto t0 = std::chrono::steady_clock::now();
  auto train = std::make_shared<MnistDataset>(kFashionDir, "train");
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto test = std::make_shared<MnistDataset>(kFashionDir, "test");
  EXPECT_EQ(train->get_dataset_size(), 60000);
  EXPECT_EQ(test->get_dataset_size(), 10000);
  EXPECT_EQ(train->images().shape(), Shape({60000, 1, 28, 28}));
  // Labels as the files give them (9 is "ankle boot").
  std::vector<int> first_train, first_test;
  for (int i = 0; i < 5; ++i) {
    first_train.push_back(static_cast<int>(train->labels().get(i)));
    first_test.push_back(static_cast<int>(test->labels().get(i)));
  }
  EXPECT_EQ(first_train, (std::vector<int>{9, 0, 0, 3, 0}));
  EXPECT_EQ(first_test, (std::vector<int>{9, 2, 1, 1, 6}));
  // The first image's pixel sum and the training set's mean pixel (the published 0.2860).
  const uint8_t* px = train->images().data<uint8_t>();
  int64_t first_sum = 0;
  for (int i = 0; i < 784; ++i) first_sum += px[i];
  EXPECT_EQ(first_sum, 76247);
  double sum = 0;
  for (int64_t i = 0; i < train->images().numel(); ++i) sum += px[i];
  EXPECT_NEAR(sum / static_cast<double>(train->images().numel()) / 255.0, 0.2860, 1e-4);

  // The training pipeline: normalize, shuffle, batch 128, prefetch; one epoch, timed.
  auto ds = train->map({Rescale(1.0 / 255, 0), Normalize({0.2860}, {0.3530})}, {"image"})
                ->shuffle(60000, 1)
                ->batch(128, true);
  EXPECT_EQ(ds->get_dataset_size(), 468);
  Prefetcher it(ds, 4);
  auto t1 = std::chrono::steady_clock::now();
  int64_t batches = 0;
  while (auto b = it.next()) {
    if (batches == 0) {
      EXPECT_EQ((*b)[0].shape(), Shape({128, 1, 28, 28}));
      EXPECT_EQ((*b)[0].dtype(), DType::kF32);
      EXPECT_EQ((*b)[1].shape(), Shape({128}));
    }
    ++batches;
  }
  double epoch_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  EXPECT_EQ(batches, 468);
  std::printf("[ measured ] Fashion-MNIST train load %.3f s; pipeline (rescale, normalize, shuffle, batch 128, "
              "prefetch 4) %.0f batches/s, %.0f images/s\n",
              load_s, static_cast<double>(batches) / epoch_s, static_cast<double>(batches * 128) / epoch_s);
}

}  // namespace
}  // namespace demi::data
