#include "common/parallel.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace kev {

void parallel_chunks(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& f) {
  const int64_t cores = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  const int64_t parts = std::clamp<int64_t>(n / std::max<int64_t>(grain, 1), 1, cores);
  if (parts == 1) {
    if (n > 0) f(0, n);
    return;
  }
  const int64_t per = (n + parts - 1) / parts;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(parts - 1));
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t begin = p * per, end = std::min(n, begin + per);
    if (begin < end) threads.emplace_back(f, begin, end);
  }
  f(0, std::min(n, per));
  for (std::thread& t : threads) t.join();
}

}  // namespace kev
