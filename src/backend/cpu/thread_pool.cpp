// Persistent worker threads woken per job by a condition variable; blocks are claimed from an atomic
// counter. Workers sleep between jobs (no spinning), which matters on small machines where the
// kernels, OpenBLAS and other processes share few cores.
#include "backend/cpu/thread_pool.h"

namespace kev::cpu {

namespace {
thread_local bool t_in_pool_task = false;
}

ThreadPool::ThreadPool(int threads) {
  const int n_workers = threads > 1 ? threads - 1 : 0;
  workers_.reserve(n_workers);
  for (int i = 0; i < n_workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run_blocks() {
  const bool was_in_task = t_in_pool_task;
  t_in_pool_task = true;
  for (;;) {
    const int64_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (begin >= n_) break;
    const int64_t end = begin + grain_ < n_ ? begin + grain_ : n_;
    try {
      (*fn_)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
  t_in_pool_task = was_in_task;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_blocks();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_workers_;
    }
    done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const RangeFn& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (workers_.empty() || n <= grain || t_in_pool_task) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    n_ = n;
    grain_ = grain;
    next_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    busy_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  run_blocks();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return busy_workers_ == 0; });
    fn_ = nullptr;
  }
  if (error_) std::rethrow_exception(error_);
}

}  // namespace kev::cpu
