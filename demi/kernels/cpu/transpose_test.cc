// The fast permutation and strided copies against their reference twins: every permutation of a rank-4
// shape (with size-1 axes, odd sizes), attention's head split and merge, every element size.
#include "demi/kernels/cpu/transpose.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "demi/core/error.h"
#include "demi/core/parallel.h"

namespace demi::kernels {
namespace {

// Distinct bytes everywhere, so a misplaced element cannot go unnoticed.
std::vector<unsigned char> pattern(size_t bytes) {
  std::vector<unsigned char> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>((i * 131 + i / 251) & 0xff);
  return v;
}

void check(const std::vector<int64_t>& shape, const std::vector<int>& perm, size_t elem) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<unsigned char> x = pattern(static_cast<size_t>(n) * elem), want(x.size()), got(x.size(), 0xab);
  ref::permute(x.data(), elem, shape, perm, want.data());
  permute(x.data(), elem, shape, perm, got.data());
  std::string p;
  for (int a : perm) p += std::to_string(a);
  EXPECT_EQ(got, want) << "perm " << p << " elem " << elem;
}

TEST(Transpose, EveryPermutationOfRank4MatchesReference) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{3, 5, 2, 7}, std::vector<int64_t>{2, 1, 4, 3}, std::vector<int64_t>{1, 6, 1, 5}}) {
    std::vector<int> perm(4);
    std::iota(perm.begin(), perm.end(), 0);
    do {
      for (size_t elem : {1, 2, 4, 8}) check(shape, perm, elem);
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
}

TEST(Transpose, AttentionHeadSplitAndMergeMatchReference) {
  check({4, 128, 4, 64}, {0, 2, 1, 3}, 2);             // (B, S, H, Dh) -> (B, H, S, Dh), parallel runs
  check({4, 4, 128, 64}, {0, 2, 1, 3}, 4);             // and back
  check({2, 33, 3, 4, 16}, {2, 0, 3, 1, 4}, 2);        // packed qkv (B, S, 3, H, Dh) -> (3, B, H, S, Dh)
  check({300, 257}, {1, 0}, 4);                        // a plain matrix transpose (no contiguous runs)
  check({5}, {0}, 8);
}

TEST(Transpose, CopyStridedMatchesReference) {
  for (size_t elem : {2, 4}) {
    std::vector<unsigned char> src = pattern(7 * 40 * elem), want(7 * 25 * elem, 0), got(want.size(), 0);
    ref::copy_strided(src.data() + 3 * elem, 40, want.data() + 2 * elem, 25, 7, 13, elem);
    copy_strided(src.data() + 3 * elem, 40, got.data() + 2 * elem, 25, 7, 13, elem);
    EXPECT_EQ(got, want);
  }
}

// Fewer rows than threads, each longer than a parallel chunk (attention's q, k, v gradients joined): the
// rows' bytes are split across the threads.
TEST(Transpose, CopyStridedSplitsLongRowsAcrossThreads) {
  const int saved = num_threads();
  set_num_threads(2);
  for (int64_t rows : {1, 2}) {
    const int64_t run = 150001, stride = run + 37;  // 300 KB of 2-byte elements per row: three chunks
    std::vector<unsigned char> src = pattern(static_cast<size_t>(rows * stride * 2)), want(src.size(), 0),
                               got(src.size(), 0);
    ref::copy_strided(src.data(), stride, want.data() + 6, stride, rows, run, 2);
    copy_strided(src.data(), stride, got.data() + 6, stride, rows, run, 2);
    EXPECT_EQ(got, want) << rows << " rows";
  }
  set_num_threads(saved);
}

TEST(Transpose, RejectsABadPermutation) {
  std::vector<float> x(6), y(6);
  std::vector<int64_t> shape = {2, 3};
  std::vector<int> twice = {0, 0}, short_perm = {0};
  EXPECT_THROW(permute(x.data(), 4, shape, twice, y.data()), Error);
  EXPECT_THROW(permute(x.data(), 4, shape, short_perm, y.data()), Error);
}

}  // namespace
}  // namespace demi::kernels
