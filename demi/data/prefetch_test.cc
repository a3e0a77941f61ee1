// Tests of the Prefetcher: the same rows as the synchronous iterator across epochs and resets, errors
// carried to the consumer, clean shutdown mid-epoch, and the wait and busy times it measures.
#include "demi/data/prefetch.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "demi/data/internal/test_util.h"
#include "demi/data/sources.h"

namespace demi::data {
namespace {

using test_util::flat_values;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// 0, 1, ..., n-1 as int32 scalars from a generator that sleeps `delay` per row and throws at row
// `throw_at` (if >= 0).
std::shared_ptr<Dataset> slow_counter(int64_t n, std::chrono::microseconds delay = {}, int64_t throw_at = -1) {
  GeneratorSource src = [=]() -> RowGenerator {
    return [=, i = int64_t{0}]() mutable -> std::optional<Row> {
      if (i >= n) return std::nullopt;
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      if (i == throw_at) throw std::runtime_error("sensor unplugged");
      return Row{full(Shape(), static_cast<double>(i++), DType::kI32)};
    };
  };
  return std::make_shared<GeneratorDataset>(src, std::vector<std::string>{"v"}, GeneratorOptions{.num_rows = n});
}

// A pipeline with shuffling and random augmentation, so that epochs differ.
std::shared_ptr<Dataset> augmented() {
  Tensor x = empty({64, 1, 6, 6});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, static_cast<double>(i % 97));
  auto ds = std::make_shared<NumpySlicesDataset>(std::vector<Tensor>{x, arange(64, DType::kI32)},
                                                 std::vector<std::string>{"image", "label"});
  return ds->shuffle(64, 3)->map({RandomCrop(6, 6, {1}), RandomHorizontalFlip()}, {"image"}, {.seed = 5})->batch(10);
}

std::vector<std::vector<float>> epochs_of(Iterator& it, int n) {
  std::vector<std::vector<float>> out;
  for (int e = 0; e < n; ++e, it.reset()) {
    std::vector<Row> rows;
    while (auto r = it.next()) rows.push_back(*r);
    auto v = flat_values(rows, 0);
    auto l = flat_values(rows, 1);
    v.insert(v.end(), l.begin(), l.end());
    out.push_back(v);
  }
  return out;
}

TEST(Prefetcher, YieldsExactlyWhatTheSynchronousIteratorYields) {
  auto ds = augmented();
  auto sync = ds->create_iterator();
  auto expected = epochs_of(*sync, 3);
  EXPECT_NE(expected[0], expected[1]);
  for (int depth : {1, 2, 8}) {
    Prefetcher p(ds, depth);
    EXPECT_EQ(epochs_of(p, 3), expected) << "queue depth " << depth;
  }
  auto via_options = ds->create_iterator({.prefetch = 3});
  EXPECT_EQ(epochs_of(*via_options, 3), expected);
}

TEST(Prefetcher, ResetMidEpochMovesToTheNextEpoch) {
  auto ds = augmented();
  auto sync = ds->create_iterator({.epoch = 1});
  auto expected = epochs_of(*sync, 1)[0];
  Prefetcher p(ds, 2);
  ASSERT_TRUE(p.next().has_value());  // one batch of epoch 0, then abandon it
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  p.reset();
  EXPECT_EQ(p.epoch(), 1);
  EXPECT_EQ(p.position(), 0);
  EXPECT_EQ(epochs_of(p, 1)[0], expected);
}

TEST(Prefetcher, ErrorsReachTheConsumer) {
  Prefetcher p(slow_counter(10, {}, /*throw_at=*/5), 2);
  for (int i = 0; i < 5; ++i) {
    auto r = p.next();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ((*r)[0].item(), i);
  }
  test_util::expect_error([&] { p.next(); }, {"GeneratorDataset(v)", "row 5", "sensor unplugged"});
  test_util::expect_error([&] { p.next(); }, {"sensor unplugged"});  // sticky: no silent short epoch
}

TEST(Prefetcher, ErrorsWhenOpeningAnEpochReachTheConsumer) {
  GeneratorSource src = []() -> RowGenerator { throw Error("no such camera"); };
  auto ds = std::make_shared<GeneratorDataset>(src, std::vector<std::string>{"v"}, GeneratorOptions{.num_rows = 1});
  Prefetcher p(ds, 2);
  test_util::expect_error([&] { p.next(); }, {"no such camera"});
}

TEST(Prefetcher, DestructionMidEpochDoesNotHang) {
  auto t0 = Clock::now();
  {
    Prefetcher p(slow_counter(1000000)->repeat(), 2);  // endless; the producer fills the queue and blocks
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(p.next().has_value());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    Prefetcher idle(slow_counter(100), 4);  // destroyed before anything is consumed
  }
  {
    Prefetcher busy(slow_counter(100, std::chrono::microseconds(2000)), 4);  // destroyed while producing
    ASSERT_TRUE(busy.next().has_value());
  }
  EXPECT_LT(since(t0), 2.0);
}

TEST(Prefetcher, MeasuresTheConsumersWait) {
  // A slow producer (2 ms a row) and an eager consumer: the consumer waits for nearly every row.
  {
    Prefetcher p(slow_counter(20, std::chrono::microseconds(2000)), 4);
    while (p.next()) {
    }
    auto st = p.stats();
    EXPECT_EQ(st.rows, 20);
    EXPECT_GT(st.wait_seconds, 0.02);
    EXPECT_GT(st.producer_busy_seconds, 0.035);
    EXPECT_GT(st.idle_fraction(), 0.5);
  }
  // A fast producer and a consumer busy 2 ms a row: after the first row the data is always ready.
  {
    Prefetcher p(slow_counter(20), 4);
    ASSERT_TRUE(p.next().has_value());
    p.reset_stats();
    while (p.next()) std::this_thread::sleep_for(std::chrono::microseconds(2000));
    auto st = p.stats();
    EXPECT_EQ(st.rows, 19);
    EXPECT_LT(st.idle_fraction(), 0.2);
    EXPECT_GT(st.producer_blocked_seconds, 0.0);  // it ran ahead and waited for room
  }
}

TEST(Prefetcher, ResumesAtASavedEpochAndPosition) {
  // A run that stopped after 3 batches of epoch 2 resumes there and sees the rows it would have seen.
  auto ds = augmented();
  auto whole = ds->create_iterator({.epoch = 2});
  std::vector<Row> rows;
  while (auto r = whole->next()) rows.push_back(*r);
  std::vector<Row> rest(rows.begin() + 3, rows.end());
  for (int prefetch : {0, 2}) {
    auto it = ds->create_iterator({.prefetch = prefetch, .epoch = 2, .position = 3});
    EXPECT_EQ(it->epoch(), 2);
    std::vector<Row> got;
    while (auto r = it->next()) got.push_back(*r);
    EXPECT_EQ(it->position(), static_cast<int64_t>(rows.size())) << "prefetch " << prefetch;
    EXPECT_EQ(flat_values(got, 0), flat_values(rest, 0)) << "prefetch " << prefetch;
    EXPECT_EQ(flat_values(got, 1), flat_values(rest, 1)) << "prefetch " << prefetch;
    it->reset();  // the next epoch starts from its beginning
    EXPECT_EQ(epochs_of(*it, 1)[0], epochs_of(*ds->create_iterator({.epoch = 3}), 1)[0]);
  }
}

TEST(Prefetcher, StopsAfterItsEpochs) {
  Prefetcher p(slow_counter(3), 2, {.num_epochs = 2});
  for (int e = 0; e < 2; ++e, p.reset()) {
    int n = 0;
    while (p.next()) ++n;
    EXPECT_EQ(n, 3);
  }
  EXPECT_FALSE(p.next().has_value());  // past the last epoch: nothing more comes, no hang
}

}  // namespace
}  // namespace demi::data
