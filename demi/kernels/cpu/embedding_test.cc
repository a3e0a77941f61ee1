// The fast embedding kernels against their reference twins (every dtype pair, every CPU level, repeated
// ids, odd widths), the range check on ids, and thread-count independence of the scatter-add.
#include "demi/kernels/cpu/embedding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/test_util.h"

namespace demi::kernels {
namespace {

using testing::Buffer;
using testing::for_each_level;
using testing::random_floats;

template <typename Id>
std::vector<Id> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<Id> ids(static_cast<size_t>(n));
  std::vector<float> u = random_floats(n, seed, 0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(u[static_cast<size_t>(i)] * static_cast<float>(vocab));
    ids[static_cast<size_t>(i)] = static_cast<Id>(std::min<int64_t>(vocab - 1, id));
  }
  ids[0] = static_cast<Id>(vocab - 1);  // the last row, and a repeat: accumulation must add both
  if (n > 2) ids[2] = ids[0];
  return ids;
}

template <typename Id>
void check_all(DType id_dtype) {
  struct Shape3 { int64_t n, v, d; };
  for (Shape3 s : {Shape3{37, 11, 19}, Shape3{1, 1, 1}, Shape3{300, 1000, 64}, Shape3{5, 3, 256}}) {
    SCOPED_TRACE(str_cat("n ", s.n, " vocab ", s.v, " dim ", s.d));
    std::vector<Id> ids = random_ids<Id>(s.n, s.v, 7);
    for (DType table_t : testing::kFastDtypes) {
      std::vector<DType> outs = {table_t};
      if (table_t == DType::kF32) outs = {DType::kF32, DType::kBF16, DType::kF16};
      Buffer table(table_t, random_floats(s.v * s.d, 8));
      for (DType out_t : outs) {
        SCOPED_TRACE(str_cat("table ", dtype_name(table_t), " -> ", dtype_name(out_t)));
        Buffer want(out_t, s.n * s.d);
        testing::visit_fast(table_t, [&](auto ttag) {
          using T = decltype(ttag);
          testing::visit_fast(out_t, [&](auto otag) {
            using O = decltype(otag);
            ref::embedding_forward(ids.data(), s.n, table.as<T>(), s.d, want.as<O>());
          });
        });
        for_each_level([&](CpuLevel) {
          Buffer got(out_t, s.n * s.d);
          embedding_forward(ids.data(), id_dtype, s.n, table.data(), table_t, s.v, s.d, got.data(), out_t);
          EXPECT_EQ(got.values(), want.values()) << "a gather is exact (one rounding, as the reference)";
        });
      }
    }
    for (DType g_t : testing::kFastDtypes) {
      SCOPED_TRACE(str_cat("dy ", dtype_name(g_t)));
      Buffer dy(g_t, random_floats(s.n * s.d, 9));
      std::vector<float> want(static_cast<size_t>(s.v * s.d));
      testing::visit_fast(g_t, [&](auto tag) {
        using G = decltype(tag);
        ref::embedding_backward(ids.data(), s.n, dy.as<G>(), s.v, s.d, want.data());
      });
      for_each_level([&](CpuLevel) {
        std::vector<float> got(want.size(), 123.0f);  // overwritten, not added to
        embedding_backward(ids.data(), id_dtype, s.n, dy.data(), g_t, s.v, s.d, got.data(), DType::kF32);
        EXPECT_EQ(got, want) << "each row sums in id order, as the reference";
      });
    }
  }
}

TEST(Embedding, MatchesReferenceInt32) { check_all<int32_t>(DType::kI32); }
TEST(Embedding, MatchesReferenceInt64) { check_all<int64_t>(DType::kI64); }

TEST(Embedding, ScatterAddIsIndependentOfThreadCount) {
  const int64_t n = 4096, v = 1000, d = 256;
  std::vector<int64_t> ids = random_ids<int64_t>(n, v, 3);
  Buffer dy(DType::kBF16, random_floats(n * d, 4));
  std::vector<float> one(static_cast<size_t>(v * d)), many(one.size());
  const int saved = num_threads();
  set_num_threads(1);
  embedding_backward(ids.data(), DType::kI64, n, dy.data(), DType::kBF16, v, d, one.data(), DType::kF32);
  set_num_threads(std::max(2, saved));
  embedding_backward(ids.data(), DType::kI64, n, dy.data(), DType::kBF16, v, d, many.data(), DType::kF32);
  set_num_threads(saved);
  EXPECT_EQ(one, many);
}

TEST(Embedding, RejectsIdsOutsideTheVocabularyAndBadDtypes) {
  std::vector<float> table(12), y(8);
  std::vector<int32_t> ids = {0, 3};
  EXPECT_THROW(embedding_forward(ids.data(), DType::kI32, 2, table.data(), DType::kF32, 3, 4, y.data(), DType::kF32),
               Error);
  ids = {0, -1};
  EXPECT_THROW(embedding_forward(ids.data(), DType::kI32, 2, table.data(), DType::kF32, 3, 4, y.data(), DType::kF32),
               Error);
  ids = {0, 1};
  EXPECT_THROW(embedding_forward(ids.data(), DType::kF32, 2, table.data(), DType::kF32, 3, 4, y.data(), DType::kF32),
               Error);
  EXPECT_THROW(embedding_forward(ids.data(), DType::kI32, 2, table.data(), DType::kBF16, 3, 4, y.data(), DType::kF16),
               Error);
  try {
    ids = {1, 7};
    embedding_forward(ids.data(), DType::kI32, 2, table.data(), DType::kF32, 3, 4, y.data(), DType::kF32);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 7 at position 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace demi::kernels
