// Tests of the seed's synthetic data set: shapes, batch count, label range, N(0, 1) statistics, and
// determinism per seed and epoch.
#include "demi/data/synthetic.h"

#include <gtest/gtest.h>

#include <cmath>

#include "demi/data/internal/test_util.h"
#include "demi/data/iterator.h"

namespace demi::data {
namespace {

using test_util::collect;
using test_util::flat_values;

TEST(SeedDataset, MatchesTheSeedsCreateDataset) {
  auto ds = make_seed_dataset(1000, 32, 42);
  EXPECT_EQ(ds->column_names(), (std::vector<std::string>{"image", "label"}));
  EXPECT_EQ(ds->get_dataset_size(), 32);
  auto batches = collect(ds);
  ASSERT_EQ(batches.size(), 32u);
  EXPECT_EQ(batches[0][0].shape(), Shape({32, 3, 32, 32}));
  EXPECT_EQ(batches[0][0].dtype(), DType::kF32);
  EXPECT_EQ(batches[0][1].shape(), Shape({32}));
  EXPECT_EQ(batches[0][1].dtype(), DType::kI32);
  EXPECT_EQ(batches[31][0].shape(), Shape({8, 3, 32, 32}));  // 1000 = 31 * 32 + 8
  double sum = 0, sq = 0;
  int64_t n = 0;
  std::vector<int> counts(10, 0);
  for (const auto& b : batches) {
    for (float v : b[0].to_vector()) {
      sum += v;
      sq += static_cast<double>(v) * v;
      ++n;
    }
    for (float l : b[1].to_vector()) {
      ASSERT_GE(l, 0);
      ASSERT_LE(l, 9);
      ++counts[static_cast<size_t>(l)];
    }
  }
  double mean = sum / static_cast<double>(n);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(n) - mean * mean), 1.0, 0.01);
  for (int c : counts) EXPECT_GT(c, 60);  // every class appears (100 expected each)
}

TEST(SeedDataset, DeterministicPerSeedAndEpoch) {
  auto a = make_seed_dataset(64, 32, 7);
  auto e0 = flat_values(collect(a, 0), 0);
  EXPECT_EQ(e0, flat_values(collect(make_seed_dataset(64, 32, 7), 0), 0));
  EXPECT_NE(e0, flat_values(collect(a, 1), 0));  // new data each epoch, as in the seed
  EXPECT_NE(e0, flat_values(collect(make_seed_dataset(64, 32, 8), 0), 0));
  auto same = make_seed_dataset(64, 32, 7, {.same_every_epoch = true});
  EXPECT_EQ(flat_values(collect(same, 0), 1), flat_values(collect(same, 3), 1));
}

}  // namespace
}  // namespace demi::data
