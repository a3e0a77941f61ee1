// Tests of demi's one thread pool: parallel_for's coverage, chunking, grain, inline cases and exception
// propagation, and that demi's loops and oneDNN's primitives share one set of OpenMP threads.
#include "demi/core/parallel.h"

#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "demi/core/error.h"

namespace demi {
namespace {

using Chunks = std::vector<std::pair<int64_t, int64_t>>;

// Restores the thread count a test changed.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ScopedThreads() { set_num_threads(saved_); }

 private:
  int saved_;
};

// The thread counts these tests run with. They never exceed the cores: an OpenMP pool does not shrink,
// and a larger team would linger for the rest of the process.
std::vector<int> thread_counts() {
  std::vector<int> counts{1};
  if (hardware_threads() > 1) counts.push_back(2);
  if (hardware_threads() > 2) counts.push_back(hardware_threads());
  return counts;
}

Chunks record_chunks(int64_t begin, int64_t end, int64_t grain) {
  Chunks chunks;
  std::mutex m;
  parallel_for(begin, end, grain, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(m);
    chunks.emplace_back(b, e);
  });
  std::sort(chunks.begin(), chunks.end());
  return chunks;
}

TEST(ParallelFor, CoversTheRangeExactlyOnce) {
  for (int threads : thread_counts()) {
    ScopedThreads scope(threads);
    for (int64_t grain : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1} << 20}) {
      const int64_t begin = 17, end = 100003;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(end));
      parallel_for(begin, end, grain, [&](int64_t b, int64_t e) {
        ASSERT_LE(begin, b);
        ASSERT_LE(e, end);
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < end; ++i)
        ASSERT_EQ(hits[static_cast<size_t>(i)].load(), i < begin ? 0 : 1)
            << "index " << i << ", threads " << threads << ", grain " << grain;
    }
  }
}

TEST(ParallelFor, ChunksAreContiguousAndTheirBoundariesDeterministic) {
  for (int threads : thread_counts()) {
    ScopedThreads scope(threads);
    const int64_t begin = 5, end = 12345, grain = 16;
    Chunks first = record_chunks(begin, end, grain);
    ASSERT_FALSE(first.empty());
    EXPECT_LE(first.size(), static_cast<size_t>(threads));
    EXPECT_EQ(first.front().first, begin);
    EXPECT_EQ(first.back().second, end);
    for (size_t i = 1; i < first.size(); ++i) EXPECT_EQ(first[i - 1].second, first[i].first);
    // Equal chunks (the last one may be shorter), so the split depends on nothing but n and threads.
    int64_t n = end - begin, expected = (n + threads - 1) / threads;
    for (size_t i = 0; i + 1 < first.size(); ++i) EXPECT_EQ(first[i].second - first[i].first, expected);
    for (int rep = 0; rep < 20; ++rep) ASSERT_EQ(record_chunks(begin, end, grain), first) << "rep " << rep;
  }
}

TEST(ParallelFor, GrainBoundsTheNumberOfChunks) {
  if (hardware_threads() < 2) GTEST_SKIP() << "needs two cores";
  ScopedThreads scope(2);
  // 3 elements with grain 2: at most ceil(3 / 2) = 2 chunks, even with more threads.
  EXPECT_LE(record_chunks(0, 3, 2).size(), 2u);
  // A range of exactly one grain is not split.
  EXPECT_EQ(record_chunks(0, 64, 64).size(), 1u);
  // Enough work for both threads is split.
  EXPECT_EQ(record_chunks(0, 1000, 10).size(), 2u);
}

TEST(ParallelFor, SmallRangesRunInlineOnTheCallingThread) {
  const auto caller = std::this_thread::get_id();
  int calls = 0;
  parallel_for(10, 50, 40, [&](int64_t b, int64_t e) {
    ++calls;  // inline, so no race
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_FALSE(in_parallel_region());
    EXPECT_EQ(b, 10);
    EXPECT_EQ(e, 50);
  });
  EXPECT_EQ(calls, 1);
}

TEST(ParallelFor, EmptyAndReversedRangesCallNothing) {
  int calls = 0;
  parallel_for(5, 5, 1, [&](int64_t, int64_t) { ++calls; });
  parallel_for(9, 3, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ParallelFor, OneThreadRunsInline) {
  ScopedThreads scope(1);
  const auto caller = std::this_thread::get_id();
  Chunks chunks;
  parallel_for(0, 1 << 20, 1, [&](int64_t b, int64_t e) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    chunks.emplace_back(b, e);
  });
  EXPECT_EQ(chunks, (Chunks{{0, 1 << 20}}));
}

TEST(ParallelFor, NestedLoopsRunInline) {
  if (hardware_threads() < 2) GTEST_SKIP() << "needs two cores";
  ScopedThreads scope(2);
  std::atomic<int> inner_calls{0}, outer_calls{0};
  std::atomic<bool> inner_on_other_thread{false};
  parallel_for(0, 1000, 1, [&](int64_t, int64_t) {
    outer_calls.fetch_add(1);
    EXPECT_TRUE(in_parallel_region());
    const auto outer_thread = std::this_thread::get_id();
    parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) {
      inner_calls.fetch_add(1);
      if (std::this_thread::get_id() != outer_thread) inner_on_other_thread = true;
      EXPECT_EQ(b, 0);
      EXPECT_EQ(e, 1000);
    });
  });
  EXPECT_EQ(outer_calls.load(), 2);
  EXPECT_EQ(inner_calls.load(), outer_calls.load());  // each inner loop is one inline call
  EXPECT_FALSE(inner_on_other_thread.load());
}

struct CustomError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TEST(ParallelFor, ExceptionsReachTheCallerWithTheirType) {
  for (int threads : thread_counts()) {
    ScopedThreads scope(threads);
    // Thrown by the chunk that holds the last index: a worker's chunk whenever threads > 1.
    try {
      parallel_for(0, 1000, 1, [](int64_t, int64_t e) {
        if (e == 1000) throw CustomError("chunk ending at 1000");
      });
      ADD_FAILURE() << "no exception, threads " << threads;
    } catch (const CustomError& e) {
      EXPECT_STREQ(e.what(), "chunk ending at 1000");
    }
    // demi's own errors keep their type (and message) too.
    try {
      parallel_for(0, 1000, 1, [](int64_t b, int64_t) { DEMI_CHECK(b < 0, "bad chunk at ", b); });
      ADD_FAILURE() << "no exception, threads " << threads;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("bad chunk at ", 0), 0u) << e.what();
    }
    // The pool still works afterwards.
    std::atomic<int64_t> sum{0};
    parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
    EXPECT_EQ(sum.load(), 999 * 1000 / 2);
  }
}

int process_threads() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// Runs demi loops and oneDNN sgemms alternately and checks the process's thread count. Exits 0 when the
// count stays within the bound, 1 (with the numbers on stderr) otherwise.
[[noreturn]] void check_demi_and_onednn_share_threads() {
  const int threads = hardware_threads();
  set_num_threads(threads);
  const int64_t n = 256;  // large enough that oneDNN runs the sgemm on every thread
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
  std::vector<float> buf(1 << 20, 1.0f);
  auto demi_loop = [&] {
    parallel_for(0, static_cast<int64_t>(buf.size()), 1024, [&](int64_t lo, int64_t hi) {
      float* p = buf.data();
      for (int64_t i = lo; i < hi; ++i) p[i] = p[i] * 0.5f + 1.0f;
    });
  };
  demi_loop();
  const int after_demi = process_threads();
  for (int rep = 0; rep < 20; ++rep) {
    demi_loop();
    dnnl_status_t st = dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (st != dnnl_success) {
      std::fprintf(stderr, "dnnl_sgemm failed: %d\n", static_cast<int>(st));
      std::exit(1);
    }
  }
  const int after_both = process_threads();
  // The main thread is OpenMP's master, so one team of `threads` is `threads` threads in all, and
  // oneDNN (built on the same libgomp) reuses that team. Nothing else in this process starts a thread,
  // so no allowance is made: a second pool would add threads - 1 or more, and any extra thread is news.
  constexpr int kExtra = 0;
  bool ok = after_both <= threads + kExtra && after_both == after_demi && c[0] == 0.5f * n;
  std::fprintf(stderr, "threads=%d after_demi=%d after_both=%d limit=%d\n", threads, after_demi, after_both,
               threads + kExtra);
  std::exit(ok ? 0 : 1);
}

TEST(ParallelFor, DemiAndOneDnnShareOneThreadPool) {
  // In a fresh process (a "threadsafe" death test re-executes the binary and runs only this test), so
  // that no other test's threads are counted.
  const std::string saved_style = GTEST_FLAG_GET(death_test_style);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(check_demi_and_onednn_share_threads(), ::testing::ExitedWithCode(0), "threads=");
  GTEST_FLAG_SET(death_test_style, saved_style);
}

}  // namespace
}  // namespace demi
