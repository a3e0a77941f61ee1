// Tests of the sources (GeneratorDataset, NumpySlicesDataset) and the pipeline operations: values,
// sizes, determinism across seeds, epochs and worker counts, and the errors that name rows and columns.
#include "demi/data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <set>
#include <stdexcept>

#include "demi/data/internal/test_util.h"
#include "demi/data/iterator.h"
#include "demi/data/sources.h"

namespace demi::data {
namespace {

using test_util::collect;
using test_util::column_values;
using test_util::error_message;
using test_util::expect_error;
using test_util::flat_values;

// n rows: "x" = i (int32 scalar), "y" = (2) float {i, -i}.
std::shared_ptr<Dataset> numbered(int64_t n) {
  Tensor x = arange(n, DType::kI32);
  Tensor y = empty({n, 2});
  for (int64_t i = 0; i < n; ++i) {
    y.set(2 * i, static_cast<double>(i));
    y.set(2 * i + 1, -static_cast<double>(i));
  }
  return std::make_shared<NumpySlicesDataset>(std::vector<Tensor>{x, y}, std::vector<std::string>{"x", "y"});
}

// The same rows from a plain (sequential, unknown-size) generator.
std::shared_ptr<Dataset> numbered_generator(int64_t n, GeneratorOptions opts = {}) {
  GeneratorSource src = [n]() -> RowGenerator {
    return [n, i = int64_t{0}]() mutable -> std::optional<Row> {
      if (i >= n) return std::nullopt;
      Row r{full(Shape(), static_cast<double>(i), DType::kI32),
            from_vector<float>({static_cast<float>(i), -static_cast<float>(i)}, {2})};
      ++i;
      return r;
    };
  };
  return std::make_shared<GeneratorDataset>(src, std::vector<std::string>{"x", "y"}, opts);
}

std::vector<int64_t> iota(int64_t n, int64_t start = 0) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

// ---- Sources ----

TEST(NumpySlicesDataset, RowsAreViewsOfTheColumns) {
  auto ds = numbered(5);
  EXPECT_EQ(ds->get_dataset_size(), 5);
  EXPECT_EQ(ds->column_names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(ds->column_index("y"), 1);
  auto rows = collect(ds);
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(column_values(rows), iota(5));
  EXPECT_EQ(rows[3][0].rank(), 0);
  EXPECT_EQ(rows[3][1].shape(), Shape({2}));
  EXPECT_FLOAT_EQ(rows[3][1].get(1), -3.0f);
  EXPECT_TRUE(rows[3][1].same_storage(rows[4][1]));  // no copy per row
}

TEST(NumpySlicesDataset, MismatchedColumnsAreErrors) {
  expect_error([] { NumpySlicesDataset({arange(4), arange(5)}, {"a", "b"}); },
               {"column 'b'", "5 rows", "column 'a' has 4"});
  expect_error([] { NumpySlicesDataset({arange(4)}, {"a", "b"}); }, {"1 column tensor", "2 column name"});
  expect_error([] { NumpySlicesDataset({full(Shape(), 1.0)}, {"a"}); }, {"column 'a'", "rank >= 1"});
  expect_error([] { NumpySlicesDataset({arange(4), arange(4)}, {"a", "a"}); }, {"'a' appears twice"});
}

TEST(Dataset, UnknownColumnListsTheColumns) {
  auto ds = numbered(3);
  expect_error([&] { ds->column_index("label"); }, {"'label'", "x, y"});
  expect_error([&] { ds->map({TypeCast(DType::kF32)}, {"label"}); }, {"'label'", "x, y"});
}

TEST(GeneratorDataset, FactoryIsCalledEachEpochAndSizeIsCounted) {
  int calls = 0;
  GeneratorSource src = [&calls]() -> RowGenerator {
    ++calls;
    return [i = 0]() mutable -> std::optional<Row> {
      if (i >= 7) return std::nullopt;
      return Row{full(Shape(), i++, DType::kI32)};
    };
  };
  auto ds = std::make_shared<GeneratorDataset>(src, std::vector<std::string>{"v"});
  EXPECT_EQ(ds->get_dataset_size(), 7);  // one counting pass
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ds->get_dataset_size(), 7);  // remembered
  EXPECT_EQ(calls, 1);
  auto it = ds->create_iterator();
  int64_t n = 0;
  while (it->next()) ++n;
  EXPECT_EQ(n, 7);
  EXPECT_FALSE(it->next().has_value());  // stays at the end until reset()
  it->reset();
  EXPECT_EQ(it->epoch(), 1);
  EXPECT_TRUE(it->next().has_value());
  EXPECT_EQ(it->position(), 1);
  EXPECT_EQ(calls, 3);
}

// A foreign language's exception (the Python package's, from a source or a map function) reaches the consumer
// as itself: neither the source nor map wraps it with context the way they wrap demi's errors.
TEST(GeneratorDataset, ForeignErrorsFromSourcesAndMapsPassUnchanged) {
  struct Original : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  auto foreign = [](const char* what) { return ForeignError(what, std::make_exception_ptr(Original(what))); };
  auto expect_original = [](const std::function<void()>& run, const std::string& what) {
    try {
      run();
      FAIL() << "no exception";
    } catch (const ForeignError& e) {
      EXPECT_EQ(std::string(e.what()), what);
      EXPECT_THROW(std::rethrow_exception(e.original()), Original);
    }
  };
  GeneratorSource throwing = [&]() -> RowGenerator {
    return [&]() -> std::optional<Row> { throw foreign("source says no"); };
  };
  auto from_source = std::make_shared<GeneratorDataset>(throwing, std::vector<std::string>{"v"});
  expect_original([&] { from_source->create_iterator()->next(); }, "source says no");

  GeneratorSource rows = []() -> RowGenerator {
    return [i = 0]() mutable -> std::optional<Row> {
      if (i >= 2) return std::nullopt;
      return Row{full(Shape(), i++, DType::kF32)};
    };
  };
  auto mapped = std::make_shared<GeneratorDataset>(rows, std::vector<std::string>{"v"})
                    ->map({Lambda([&](const Tensor&) -> Tensor { throw foreign("map says no"); })}, {"v"});
  expect_original([&] { mapped->create_iterator()->next(); }, "map says no");
}

TEST(GeneratorDataset, DeclaredSizeNeedsNoPassAndIsEnforced) {
  auto ds = numbered_generator(10, {.num_rows = 10});
  EXPECT_EQ(ds->get_dataset_size(), 10);
  EXPECT_EQ(column_values(collect(ds)), iota(10));
  expect_error([] { collect(numbered_generator(8, {.num_rows = 10})); },
               {"ended after 8 rows", "num_rows declares 10"});
  expect_error([] { collect(numbered_generator(12, {.num_rows = 10})); }, {"more than the 10 rows"});
}

TEST(GeneratorDataset, EpochSourceSeesTheEpoch) {
  EpochGeneratorSource src = [](int64_t epoch) -> RowGenerator {
    return [epoch, i = 0]() mutable -> std::optional<Row> {
      if (i++ >= 2) return std::nullopt;
      return Row{full(Shape(), static_cast<double>(epoch), DType::kI64)};
    };
  };
  auto ds = std::make_shared<GeneratorDataset>(src, std::vector<std::string>{"e"});
  EXPECT_EQ(column_values(collect(ds, 0)), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(column_values(collect(ds, 3)), (std::vector<int64_t>{3, 3}));
}

TEST(GeneratorDataset, RandomAccessSource) {
  RandomAccessSource src{5, [](int64_t i) { return Row{full(Shape(), static_cast<double>(i * i), DType::kI32)}; }};
  auto ds = std::make_shared<GeneratorDataset>(src, std::vector<std::string>{"sq"});
  EXPECT_TRUE(ds->is_random_access());
  EXPECT_EQ(ds->get_dataset_size(), 5);
  EXPECT_EQ(column_values(collect(ds)), (std::vector<int64_t>{0, 1, 4, 9, 16}));
  EXPECT_EQ(column_values(collect(ds->skip(3))), (std::vector<int64_t>{9, 16}));
}

// A generator whose row `bad` is replaced by `make_bad()`.
std::shared_ptr<Dataset> generator_with_bad_row(int64_t bad, std::function<Row()> make_bad) {
  GeneratorSource src = [bad, make_bad]() -> RowGenerator {
    return [bad, make_bad, i = int64_t{0}]() mutable -> std::optional<Row> {
      if (i >= 10) return std::nullopt;
      if (i++ == bad) return make_bad();
      return Row{zeros({3, 32, 32}), full(Shape(), 1, DType::kI32)};
    };
  };
  return std::make_shared<GeneratorDataset>(src, std::vector<std::string>{"image", "label"});
}

TEST(GeneratorDataset, BadRowsAreErrorsNamingRowAndColumn) {
  expect_error([] { collect(generator_with_bad_row(4, [] { return Row{zeros({3, 32, 32})}; })); },
               {"GeneratorDataset(image, label)", "row 4", "1 column(s)", "2 are named"});
  expect_error([] { collect(generator_with_bad_row(5, [] { return Row{zeros({3, 30, 32}), full(Shape(), 1, DType::kI32)}; })); },
               {"row 5", "column 'image'", "expected float32 (3, 32, 32)", "like row 0", "got float32 (3, 30, 32)"});
  expect_error([] { collect(generator_with_bad_row(6, [] { return Row{zeros({3, 32, 32}), full(Shape(), 1, DType::kI64)}; })); },
               {"row 6", "column 'label'", "expected int32 ()", "got int64 ()"});
  expect_error([] { collect(generator_with_bad_row(2, [] { return Row{Tensor(), full(Shape(), 1, DType::kI32)}; })); },
               {"row 2", "column 'image'", "undefined"});
  expect_error([] { collect(generator_with_bad_row(3, []() -> Row { throw std::runtime_error("disk on fire"); })); },
               {"row 3", "disk on fire"});
  // Shape checks can be turned off for variable-length rows.
  GeneratorSource src = []() -> RowGenerator {
    return [i = 1]() mutable -> std::optional<Row> {
      if (i > 3) return std::nullopt;
      return Row{zeros({i++})};
    };
  };
  auto ds = std::make_shared<GeneratorDataset>(src, std::vector<std::string>{"seq"}, GeneratorOptions{.check_shapes = false});
  EXPECT_EQ(collect(ds).size(), 3u);
}

// ---- batch ----

TEST(Batch, StacksRowsAndKeepsOrDropsTheRemainder) {
  auto ds = numbered(10);
  auto b = ds->batch(3);
  EXPECT_EQ(b->get_dataset_size(), 4);
  auto rows = collect(b);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0][0].shape(), Shape({3}));
  EXPECT_EQ(rows[0][1].shape(), Shape({3, 2}));
  EXPECT_EQ(rows[0][0].dtype(), DType::kI32);
  EXPECT_EQ(rows[3][0].shape(), Shape({1}));
  EXPECT_EQ(rows[3][0].get(0), 9);
  EXPECT_EQ(rows[1][1].to_vector(), (std::vector<float>{3, -3, 4, -4, 5, -5}));
  EXPECT_EQ(rows[2][0].category(), MemCategory::kData);

  auto d = ds->batch(3, /*drop_remainder=*/true);
  EXPECT_EQ(d->get_dataset_size(), 3);
  EXPECT_EQ(collect(d).size(), 3u);
  EXPECT_EQ(numbered(9)->batch(3, true)->get_dataset_size(), 3);
  EXPECT_EQ(numbered(2)->batch(3, true)->get_dataset_size(), 0);
  EXPECT_EQ(collect(numbered(2)->batch(3, true)).size(), 0u);
}

std::vector<int64_t> batch_values(const Row& batch) {
  std::vector<int64_t> v;
  for (float x : flat_values({batch}, 0)) v.push_back(static_cast<int64_t>(x));
  return v;
}

// The rows of every shard, in order, batch by batch (each batch's x values).
std::vector<std::vector<std::vector<int64_t>>> shard_batches(const std::shared_ptr<Dataset>& ds, int64_t shards,
                                                             int64_t start_epoch = 0, int64_t start_offset = 0,
                                                             int64_t epoch = 0) {
  std::vector<std::vector<std::vector<int64_t>>> out;
  for (int64_t r = 0; r < shards; ++r) {
    auto sh = ds->shard({.num_shards = shards, .shard_id = r, .start_epoch = start_epoch, .start_offset = start_offset});
    auto& batches = out.emplace_back();
    for (const Row& row : collect(sh, epoch)) batches.push_back(batch_values(row));
    if (epoch != start_epoch || start_offset == 0) {
      EXPECT_EQ(static_cast<int64_t>(batches.size()), sh->get_dataset_size()) << sh->describe();
    }
  }
  return out;
}

TEST(Shard, EachBatchGoesToExactlyOneShardInRoundRobinOrder) {
  for (bool drop : {false, true}) {
    // Batched random-access rows (sharded in row groups) and a generator's (sharded batch by batch).
    for (auto ds : {numbered(23)->shuffle(100, 7)->batch(3, drop), numbered_generator(23)->batch(3, drop)}) {
      std::vector<std::vector<int64_t>> all;
      for (const Row& row : collect(ds)) all.push_back(batch_values(row));
      for (int64_t shards : {1, 2, 3, 5, 9}) {
        auto got = shard_batches(ds, shards);
        for (size_t k = 0; k < all.size(); ++k)
          EXPECT_EQ(got[k % static_cast<size_t>(shards)][k / static_cast<size_t>(shards)], all[k])
              << ds->describe() << " shards " << shards << " batch " << k;
        size_t total = 0;
        for (auto& b : got) total += b.size();
        EXPECT_EQ(total, all.size());
      }
    }
  }
}

TEST(Shard, ARunResumedWithAnotherShardCountContinuesTheSameStream) {
  auto ds = numbered(40)->shuffle(100, 3)->batch(4);  // 10 batches per epoch
  std::vector<std::vector<int64_t>> all;
  for (const Row& row : collect(ds, 1)) all.push_back(batch_values(row));
  // Two shards ran 2 steps of epoch 1 (batches 0..3); three shards take over at batch 4.
  auto got = shard_batches(ds, 3, /*start_epoch=*/1, /*start_offset=*/4, /*epoch=*/1);
  for (size_t k = 4; k < all.size(); ++k) EXPECT_EQ(got[(k - 4) % 3][(k - 4) / 3], all[k]) << "batch " << k;
  // Later epochs start at their first batch.
  auto later = shard_batches(ds, 3, 1, 4, /*epoch=*/2);
  EXPECT_EQ(later[0].size() + later[1].size() + later[2].size(), 10u);
}

TEST(Shard, BadShardsAreErrors) {
  auto ds = numbered(4);
  expect_error([&] { ds->shard({.num_shards = 2, .shard_id = 2}); }, {"0 <= shard_id < num_shards"});
  expect_error([&] { ds->shard({.num_shards = 0}); }, {"shard 0 of 0"});
  expect_error([&] { ds->shard({.num_shards = 2, .start_offset = -1}); }, {"must not be negative"});
}

TEST(Batch, MismatchedRowsNameTheRowAndColumn) {
  GeneratorSource src = []() -> RowGenerator {
    return [i = 0]() mutable -> std::optional<Row> {
      if (i >= 8) return std::nullopt;
      return Row{zeros({i++ == 6 ? 3 : 2})};
    };
  };
  auto ds = std::make_shared<GeneratorDataset>(src, std::vector<std::string>{"seq"}, GeneratorOptions{.check_shapes = false});
  expect_error([&] { collect(ds->batch(4)); },
               {"batch(4)", "column 'seq'", "row 6", "float32 (3)", "row 4, the first of its batch", "float32 (2)"});
}

// ---- repeat, take, skip, project ----

TEST(RepeatTakeSkip, CountsAndValues) {
  auto ds = numbered(5);
  EXPECT_EQ(ds->repeat(3)->get_dataset_size(), 15);
  auto r = column_values(collect(ds->repeat(3)));
  EXPECT_EQ(r.size(), 15u);
  EXPECT_EQ(r[5], 0);
  EXPECT_EQ(r[14], 4);
  EXPECT_EQ(ds->repeat()->get_dataset_size(), kInfiniteSize);
  EXPECT_EQ(ds->repeat()->take(12)->get_dataset_size(), 12);
  EXPECT_EQ(collect(ds->repeat()->take(12)).size(), 12u);
  EXPECT_EQ(ds->take(3)->get_dataset_size(), 3);
  EXPECT_EQ(ds->take(30)->get_dataset_size(), 5);
  EXPECT_EQ(column_values(collect(ds->take(3))), iota(3));
  EXPECT_EQ(ds->skip(2)->get_dataset_size(), 3);
  EXPECT_EQ(ds->skip(9)->get_dataset_size(), 0);
  EXPECT_EQ(column_values(collect(ds->skip(2))), iota(3, 2));
  // The same on a sequential source.
  auto g = numbered_generator(5);
  EXPECT_EQ(column_values(collect(g->skip(2)->take(2))), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(g->skip(1)->repeat(2)->get_dataset_size(), 8);
  auto one = collect(g->repeat(2)->batch(4, true)->project({"x"})->take(1));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0][0].to_vector(), (std::vector<float>{0, 1, 2, 3}));
  expect_error([&] { ds->repeat(0); }, {"repeat's count", "got 0"});
  expect_error([&] { ds->batch(0); }, {"batch_size", "got 0"});
  expect_error([&] { collect(ds->take(0)->repeat(-1)); }, {"no rows", "forever"});
}

TEST(Project, KeepsAndReordersColumns) {
  auto p = numbered(4)->project({"y", "x"});
  EXPECT_EQ(p->column_names(), (std::vector<std::string>{"y", "x"}));
  auto rows = collect(p);
  EXPECT_EQ(rows[2][0].shape(), Shape({2}));
  EXPECT_EQ(rows[2][1].item(), 2);
  EXPECT_EQ(column_values(collect(numbered_generator(4)->project({"x"}))), iota(4));
}

// ---- shuffle ----

TEST(Shuffle, FullShuffleIsAPermutationDeterministicPerSeedAndEpoch) {
  auto ds = numbered(100);
  auto s = ds->shuffle(1000, 7);
  EXPECT_EQ(s->get_dataset_size(), 100);
  auto e0 = column_values(collect(s, 0));
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota(100));
  EXPECT_NE(e0, iota(100));
  EXPECT_EQ(e0, column_values(collect(ds->shuffle(1000, 7), 0)));  // same seed, same order
  EXPECT_NE(e0, column_values(collect(s, 1)));                      // a new epoch re-shuffles
  EXPECT_EQ(column_values(collect(s, 1)), column_values(collect(s, 1)));
  EXPECT_NE(e0, column_values(collect(ds->shuffle(1000, 8), 0)));  // another seed, another order
  // The iterator's reset() moves to the next epoch's order.
  auto it = s->create_iterator();
  std::vector<Row> rows;
  while (it->next()) {
  }
  it->reset();
  while (auto r = it->next()) rows.push_back(*r);
  EXPECT_EQ(column_values(rows), column_values(collect(s, 1)));
}

TEST(Shuffle, BufferBoundsHowFarARowMoves) {
  auto ds = numbered(200);
  EXPECT_EQ(column_values(collect(ds->shuffle(1, 3))), iota(200));  // a buffer of one cannot reorder
  auto v = column_values(collect(ds->shuffle(10, 3)));
  auto sorted = v;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota(200));
  EXPECT_NE(v, iota(200));
  // Output k is drawn from a buffer holding inputs up to k + 9 only.
  for (size_t k = 0; k < v.size(); ++k) EXPECT_LE(v[k], static_cast<int64_t>(k) + 9) << "position " << k;
}

TEST(Shuffle, IndexAndRowBuffersDrawTheSameOrder) {
  // A random-access input is shuffled through indices, a generator through buffered rows: same order.
  for (int64_t buffer : {1, 7, 64, 1000}) {
    auto a = column_values(collect(numbered(50)->shuffle(buffer, 11), 2));
    auto b = column_values(collect(numbered_generator(50)->shuffle(buffer, 11), 2));
    EXPECT_EQ(a, b) << "buffer " << buffer;
  }
}

TEST(Shuffle, RepeatRepetitionsShuffleDifferently) {
  auto v = column_values(collect(numbered(20)->shuffle(20, 5)->repeat(2)));
  std::vector<int64_t> first(v.begin(), v.begin() + 20), second(v.begin() + 20, v.end());
  EXPECT_NE(first, second);
  std::sort(second.begin(), second.end());
  EXPECT_EQ(second, iota(20));
}

TEST(Shuffle, UsesTheGlobalSeedByDefault) {
  set_seed(123);
  auto a = column_values(collect(numbered(30)->shuffle(30)));
  set_seed(123);
  auto b = column_values(collect(numbered(30)->shuffle(30)));
  set_seed(124);
  auto c = column_values(collect(numbered(30)->shuffle(30)));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// ---- map ----

TEST(Map, TransformsTheNamedColumnsOnly) {
  auto m = numbered(6)->map({TypeCast(DType::kF32), Lambda([](const Tensor& x) {
                              Tensor y = x.clone();
                              y.set(0, x.get(0) * 10);
                              return y;
                            })},
                            {"x"});
  EXPECT_EQ(m->get_dataset_size(), 6);
  EXPECT_TRUE(m->is_random_access());
  auto rows = collect(m);
  EXPECT_EQ(rows[4][0].dtype(), DType::kF32);
  EXPECT_EQ(rows[4][0].item(), 40);
  EXPECT_EQ(rows[4][1].dtype(), DType::kF32);
  EXPECT_EQ(rows[4][1].get(1), -4);
  // The default input column is the first.
  EXPECT_EQ(collect(numbered(2)->map({TypeCast(DType::kF64)}))[1][0].dtype(), DType::kF64);
}

// map runs a Rescale followed by a Normalize on bytes in one pass: the same bits as the two in separate
// maps (which run each in turn), and a channel mismatch still names the Normalize.
TEST(Map, RescaleThenNormalizeOnBytesInOnePass) {
  Tensor images = empty({5, 1, 4, 4}, DType::kU8);
  for (int64_t i = 0; i < images.numel(); ++i) images.set(i, static_cast<double>((i * 53) % 256));
  auto ds = std::make_shared<NumpySlicesDataset>(std::vector<Tensor>{images, arange(5)},
                                                 std::vector<std::string>{"image", "label"});
  const Rescale rescale(1.0 / 255, 0.0);
  const Normalize normalize({0.2860}, {0.3530});
  auto fused = collect(ds->map({rescale, normalize}, {"image"})->batch(5));
  auto apart = collect(ds->map({rescale}, {"image"})->map({normalize}, {"image"})->batch(5));
  ASSERT_EQ(fused.size(), 1u);
  ASSERT_EQ(fused[0][0].dtype(), DType::kF32);
  EXPECT_EQ(fused[0][0].shape(), Shape({5, 1, 4, 4}));
  EXPECT_EQ(std::memcmp(fused[0][0].raw_data(), apart[0][0].raw_data(), 80 * sizeof(float)), 0);
  EXPECT_FLOAT_EQ(fused[0][0].get(17), static_cast<float>((((17 * 53) % 256) / 255.0 - 0.2860) / 0.3530));
  expect_error([&] { collect(ds->map({rescale, Normalize({0, 0}, {1, 1})}, {"image"})); },
               {"Normalize(mean=[0, 0]", "1 channel(s)", "column 'image'"});
}

// demi train normalizes a batch of bytes at a time (tools/demi/job.cc): the same values as each image
// normalized before `batch`, one value for every channel (Fashion-MNIST's) or one per channel (CIFAR-10's,
// an NCHW batch's channels on its axis 1 as a CHW image's on axis 0), a last partial batch included.
TEST(Map, NormalizingABatchOfBytesIsEachImageNormalized) {
  for (const int64_t channels : {1, 3}) {
    Tensor images = empty({7, channels, 3, 5}, DType::kU8);
    for (int64_t i = 0; i < images.numel(); ++i) images.set(i, static_cast<double>((i * 97 + 11) % 256));
    auto ds = std::make_shared<NumpySlicesDataset>(std::vector<Tensor>{images, arange(7)},
                                                   std::vector<std::string>{"image", "label"});
    const Normalize normalize = channels == 1 ? Normalize({0.2860}, {0.3530})
                                              : Normalize({0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616});
    const std::vector<Transform> norm = {Rescale(1.0 / 255, 0.0), normalize};
    auto per_image = collect(ds->map(norm, {"image"})->batch(4));
    auto per_batch = collect(ds->batch(4)->map(norm, {"image"}));
    ASSERT_EQ(per_batch.size(), 2u);
    for (size_t b = 0; b < 2; ++b) {
      ASSERT_EQ(per_batch[b][0].dtype(), DType::kF32);
      ASSERT_EQ(per_batch[b][0].shape(), per_image[b][0].shape());
      EXPECT_EQ(std::memcmp(per_batch[b][0].raw_data(), per_image[b][0].raw_data(),
                            static_cast<size_t>(per_batch[b][0].numel()) * sizeof(float)),
                0)
          << channels << " channel(s), batch " << b;
    }
  }
}

// A random transform: adds a uniform draw in [0, 1000) to every element.
Transform noise() {
  return RandomLambda(
      [](const Tensor& x, Generator& g) {
        Tensor y = x.to(DType::kF32, true);
        for (int64_t i = 0; i < y.numel(); ++i) y.set(i, y.get(i) + static_cast<double>(g.next_int(1000)));
        return y;
      },
      "noise");
}

TEST(Map, RandomTransformsAreKeyedBySeedEpochAndRow) {
  auto make = [](uint64_t seed, int workers) {
    return numbered_generator(40)->map({noise()}, {"y"}, {.num_parallel_workers = workers, .seed = seed});
  };
  auto e0 = flat_values(collect(make(1, 1), 0), 1);
  EXPECT_EQ(e0, flat_values(collect(make(1, 1), 0), 1));
  EXPECT_EQ(e0, flat_values(collect(make(1, 2), 0), 1));  // whatever the worker count
  EXPECT_EQ(e0, flat_values(collect(make(1, 3), 0), 1));
  EXPECT_NE(e0, flat_values(collect(make(1, 1), 1), 1));  // epochs differ
  EXPECT_NE(e0, flat_values(collect(make(2, 1), 0), 1));  // seeds differ
  // The random-access path (get_row by index) draws the same as the sequential one.
  auto ra = numbered(40)->map({noise()}, {"y"}, {.seed = 1});
  EXPECT_EQ(e0, flat_values(collect(ra, 0), 1));
}

TEST(Map, ColumnsOfOneRowShareTheirRandomDecisions) {
  auto m = numbered(10)->map({TypeCast(DType::kF32), noise()}, {"x", "y"}, {.seed = 4});
  for (const auto& r : collect(m)) {
    // x = i + u and y[0] = i + u': equal when both columns drew the same u.
    EXPECT_EQ(r[1].get(0), r[0].item());
  }
}

TEST(Map, ErrorsNameTheTransformColumnAndRow) {
  auto m = numbered(10)->map({OneHot(5)}, {"x"});
  expect_error([&] { collect(m); }, {"map: OneHot(5, float32)", "column 'x'", "row 5", "class index 5"});
  auto w = numbered(40)->map({OneHot(30)}, {"x"}, {.num_parallel_workers = 2});
  expect_error([&] { collect(w); }, {"row 30"});  // the first failing row, whichever worker hit it
}

// ---- pipeline size, iterator ----

TEST(Pipeline, SizeIsComputedWithoutIterating) {
  int calls = 0;
  GeneratorSource src = [&calls]() -> RowGenerator {
    ++calls;
    return []() -> std::optional<Row> { return std::nullopt; };
  };
  auto g = std::make_shared<GeneratorDataset>(src, std::vector<std::string>{"v"}, GeneratorOptions{.num_rows = 100});
  auto p = g->map({TypeCast(DType::kF32)})->shuffle(50)->batch(32)->repeat(2);
  EXPECT_EQ(p->get_dataset_size(), 8);
  EXPECT_EQ(g->batch(32, true)->get_dataset_size(), 3);
  EXPECT_EQ(calls, 0);
}

TEST(Iterator, NextDictAndStats) {
  auto it = numbered(3)->batch(2)->create_iterator();
  auto d = it->next_dict();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->at("x").shape(), Shape({2}));
  EXPECT_EQ(d->at("y").shape(), Shape({2, 2}));
  it->next();
  EXPECT_FALSE(it->next_dict().has_value());
  auto st = it->stats();
  EXPECT_EQ(st.rows, 2);
  EXPECT_GT(st.wait_seconds, 0);
  EXPECT_EQ(st.wait_seconds, st.producer_busy_seconds);  // synchronous: every pipeline second is waited
  EXPECT_GE(st.elapsed_seconds, st.wait_seconds);
  it->reset_stats();
  EXPECT_EQ(it->stats().rows, 0);
}

TEST(Iterator, AnErrorIsRethrownUntilReset) {
  auto it = generator_with_bad_row(3, [] { return Row{zeros({1})}; })->create_iterator();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(it->next().has_value());
  expect_error([&] { it->next(); }, {"row 3"});
  expect_error([&] { it->next(); }, {"row 3"});  // not a silently short epoch
  it->reset();
  EXPECT_TRUE(it->next().has_value());
}

TEST(Iterator, StartsAtAGivenEpoch) {
  auto s = numbered(30)->shuffle(30, 9);
  auto it = s->create_iterator({.epoch = 4});
  EXPECT_EQ(it->epoch(), 4);
  std::vector<Row> rows;
  while (auto r = it->next()) rows.push_back(*r);
  EXPECT_EQ(column_values(rows), column_values(collect(s, 4)));
}

}  // namespace
}  // namespace demi::data
