// A small persistent thread pool for the CPU backend's kernels.
//
//   ThreadPool pool(4);                        // 3 workers + the calling thread
//   pool.parallel_for(n_rows, 16, [&](int64_t begin, int64_t end) { ... rows [begin, end) ... });
//
// Contracts:
// - parallel_for hands out blocks of `grain` indices from a shared counter (dynamic scheduling, so
//   uneven items such as packed sequences of different lengths balance) and returns when every block
//   has run. The calling thread works too.
// - When n <= grain, or the pool has one thread, or the call comes from inside a pool task, the
//   function runs inline on the calling thread (nested parallelism never deadlocks or oversubscribes).
// - Calls from different threads are serialised; a pool runs one job at a time.
// - An exception thrown by a task is captured and rethrown to the caller of parallel_for after all
//   blocks have finished (the CPU backend turns it into a Status).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kev::cpu {

class ThreadPool {
 public:
  using RangeFn = std::function<void(int64_t begin, int64_t end)>;

  explicit ThreadPool(int threads);  // threads >= 1 (values below are treated as 1)
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  void parallel_for(int64_t n, int64_t grain, const RangeFn& fn);

 private:
  void worker_loop();
  void run_blocks();

  std::vector<std::thread> workers_;
  std::mutex submit_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // bumped per job; workers wake on change
  bool stop_ = false;
  int busy_workers_ = 0;

  // The current job.
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
  std::mutex error_mutex_;
};

}  // namespace kev::cpu
