// parallel_chunks / parallel_find_first: host loops over a large array split across threads, for the
// one-off passes over whole weight tensors at load (widening BF16 files, checking values, converting to
// FP16 / BF16), which are single-threaded otherwise (a 4B model is ~4·10⁹ elements).
//
//   kev::parallel_chunks(n, 1 << 20, [&](int64_t begin, int64_t end) { convert(src + begin, end - begin); });
//
// f(begin, end) runs on contiguous, disjoint ranges covering [0, n), at least `grain` elements each,
// on up to std::thread::hardware_concurrency() threads (the calling thread runs one range); n below
// 2·grain runs inline. Returns when every range is done. f must not throw.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>

namespace kev {

void parallel_chunks(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& f);

// The smallest i in [0, n) with pred(i), or n; pred runs on parallel_chunks' threads. Blocks of 4,096
// are scanned without an early exit (so the loop vectorises) and only a block holding a match is
// searched; ranges past a match already found stop early.
template <class Pred>
int64_t parallel_find_first(int64_t n, int64_t grain, Pred pred) {
  constexpr int64_t kBlock = 4096;
  std::atomic<int64_t> first{n};
  parallel_chunks(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end && b < first.load(std::memory_order_relaxed); b += kBlock) {
      const int64_t e = std::min(end, b + kBlock);
      bool any = false;
      for (int64_t i = b; i < e; ++i) any |= static_cast<bool>(pred(i));
      if (!any) continue;
      int64_t i = b;
      while (!pred(i)) ++i;
      int64_t seen = first.load();
      while (i < seen && !first.compare_exchange_weak(seen, i)) {
      }
      return;
    }
  });
  return first.load();
}

}  // namespace kev
