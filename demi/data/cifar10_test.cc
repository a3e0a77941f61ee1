// Tests of Cifar10Dataset on small hand-built binary files: values, splits, the cifar-10-batches-bin
// subfolder, and the errors for missing files, partial records and out-of-range labels.
#include "demi/data/cifar10.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "demi/data/internal/test_util.h"

namespace demi::data {
namespace {

using test_util::expect_error;
using test_util::TempDir;
using test_util::write_bytes;
namespace fs = std::filesystem;

// `n` records; record r has label (r + file) % 10 and pixel p = (r * 7 + file + p) % 256.
std::vector<uint8_t> records(int n, int file) {
  std::vector<uint8_t> v;
  for (int r = 0; r < n; ++r) {
    v.push_back(static_cast<uint8_t>((r + file) % 10));
    for (int p = 0; p < 3072; ++p) v.push_back(static_cast<uint8_t>((r * 7 + file + p) % 256));
  }
  return v;
}

void write_cifar(const fs::path& dir, int per_file = 2) {
  fs::create_directories(dir);
  for (int f = 1; f <= 5; ++f) write_bytes(dir / ("data_batch_" + std::to_string(f) + ".bin"), records(per_file, f));
  write_bytes(dir / "test_batch.bin", records(per_file + 1, 0));
}

TEST(Cifar10Dataset, ReadsTheSplits) {
  TempDir dir;
  write_cifar(dir.path());
  auto train = std::make_shared<Cifar10Dataset>(dir.str(), "train");
  EXPECT_EQ(train->get_dataset_size(), 10);
  Row r = train->get_row(3, 0);  // file 2, record 1
  EXPECT_EQ(r[0].shape(), Shape({3, 32, 32}));
  EXPECT_EQ(r[0].dtype(), DType::kU8);
  EXPECT_EQ(r[1].dtype(), DType::kI32);
  EXPECT_EQ(r[1].item(), 3);
  EXPECT_EQ(r[0].at({0, 0, 0}), 9);          // 1*7 + 2 + 0
  EXPECT_EQ(r[0].at({2, 31, 31}), (7 + 2 + 3071) % 256);  // the blue plane's last pixel
  EXPECT_EQ(r[0].category(), MemCategory::kData);
  auto test = std::make_shared<Cifar10Dataset>(dir.str(), "test");
  EXPECT_EQ(test->get_dataset_size(), 3);
  EXPECT_EQ(std::make_shared<Cifar10Dataset>(dir.str(), "all")->get_dataset_size(), 13);
  // The archive's own folder name is found from its parent.
  TempDir parent;
  write_cifar(parent.path() / "cifar-10-batches-bin", 1);
  EXPECT_EQ(std::make_shared<Cifar10Dataset>(parent.str())->get_dataset_size(), 5);
}

TEST(Cifar10Dataset, MalformedFilesAreErrorsNamingTheFile) {
  TempDir dir;
  write_cifar(dir.path());
  fs::remove(dir.path() / "data_batch_4.bin");
  expect_error([&] { Cifar10Dataset ds(dir.str()); },
               {(dir.path() / "data_batch_4.bin").string(), "not found", "data_batch_1.bin ... data_batch_5.bin",
                "holds data_batch_1.bin"});
  EXPECT_EQ(Cifar10Dataset(dir.str(), "test").get_dataset_size(), 3);  // the test split needs no train file

  write_cifar(dir.path());
  auto partial = records(2, 3);
  partial.resize(partial.size() - 100);
  write_bytes(dir.path() / "data_batch_3.bin", partial);
  expect_error([&] { Cifar10Dataset ds(dir.str()); },
               {"data_batch_3.bin", "truncated", "1 records and 2973 bytes left over"});

  write_cifar(dir.path());
  auto bad = records(3, 0);
  bad[2 * 3073] = 10;
  write_bytes(dir.path() / "test_batch.bin", bad);
  expect_error([&] { Cifar10Dataset ds(dir.str(), "test"); },
               {"test_batch.bin", "record 2", "label 10", "0..9"});

  write_bytes(dir.path() / "test_batch.bin", {});
  expect_error([&] { Cifar10Dataset ds(dir.str(), "all"); }, {"test_batch.bin", "0 bytes"});
  expect_error([] { Cifar10Dataset ds("/nonexistent/cifar"); }, {"/nonexistent/cifar", "does not exist"});
}

}  // namespace
}  // namespace demi::data
