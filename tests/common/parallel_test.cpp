// parallel_chunks covers [0, n) exactly once in ranges of at least `grain`, and parallel_find_first
// returns the smallest match whichever thread finds one first.
#include "common/parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

namespace kev {
namespace {

TEST(ParallelChunks, CoversEveryIndexOnceInRangesOfAtLeastTheGrain) {
  for (const auto& [n, grain] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 16}, {1, 16}, {31, 16}, {32, 16}, {1000, 16}, {1 << 20, 1 << 10}, {12345, 1}}) {
    std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
    std::mutex mu;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    parallel_chunks(n, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
      const std::lock_guard<std::mutex> lock(mu);
      ranges.emplace_back(begin, end);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << "n " << n << " index " << i;
    for (const auto& [begin, end] : ranges) {
      EXPECT_LT(begin, end) << "n " << n;
      // Only the last range may be shorter (the remainder).
      if (end != n) {
        EXPECT_GE(end - begin, grain) << "n " << n;
      }
    }
    if (n < 2 * grain) {
      EXPECT_LE(ranges.size(), 1u) << "n " << n << ": ran inline";
    }
  }
}

TEST(ParallelFindFirst, ReturnsTheSmallestMatchOrN) {
  const int64_t n = 3 << 20, grain = 1 << 16;  // 48 ranges' worth: every core gets work
  std::vector<float> v(static_cast<size_t>(n), 1.0f);
  auto big = [&](int64_t i) { return v[static_cast<size_t>(i)] > 2.0f; };
  EXPECT_EQ(parallel_find_first(n, grain, big), n);
  // Matches late in several ranges and in the middle of a 4,096 block: the earliest wins.
  for (int64_t i : {n - 1, int64_t{2'500'001}, int64_t{1'048'577}}) v[static_cast<size_t>(i)] = 5.0f;
  EXPECT_EQ(parallel_find_first(n, grain, big), 1'048'577);
  v[0] = 5.0f;
  EXPECT_EQ(parallel_find_first(n, grain, big), 0);
  EXPECT_EQ(parallel_find_first(0, grain, big), 0);
}

}  // namespace
}  // namespace kev
