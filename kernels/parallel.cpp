// The process-wide worker pool behind parallel_for (see parallel.hpp). Workers sleep on a
// condition variable between jobs; chunks are handed out by an atomic counter, which changes
// only which thread computes an index, never how it is computed.
#include "kernels/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace cedar {

namespace {

thread_local bool inside_chunk = false;

int configured_threads() {
  if (const char* env = std::getenv("CEDAR_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

class thread_pool {
 public:
  explicit thread_pool(int num_threads) {
    for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  int size() const { return int(workers_.size()) + 1; }

  void run(int64_t begin, int64_t end, int64_t grain, void (*call)(void*, int64_t, int64_t),
           void* ctx) {
    std::lock_guard<std::mutex> one_job(run_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = {begin, end, grain, call, ctx};
      next_.store(begin, std::memory_order_relaxed);
      busy_workers_ = int(workers_.size());
      ++generation_;
    }
    start_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return busy_workers_ == 0; });
  }

 private:
  struct job {
    int64_t begin = 0, end = 0, grain = 1;
    void (*call)(void*, int64_t, int64_t) = nullptr;
    void* ctx = nullptr;
  };

  void work() {
    inside_chunk = true;
    for (;;) {
      const int64_t lo = next_.fetch_add(job_.grain, std::memory_order_relaxed);
      if (lo >= job_.end) break;
      job_.call(job_.ctx, lo, std::min(job_.end, lo + job_.grain));
    }
    inside_chunk = false;
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        start_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
      }
      work();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_workers_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;      // guards job_, generation_, busy_workers_
  std::condition_variable start_, done_;
  job job_;
  std::atomic<int64_t> next_{0};
  uint64_t generation_ = 0;
  int busy_workers_ = 0;
};

thread_pool& pool() {
  // Never destroyed: workers may still sleep on it while static destructors run at exit.
  static thread_pool* p = new thread_pool(configured_threads());
  return *p;
}

}  // namespace

int num_threads() { return pool().size(); }

void parallel_run(int64_t begin, int64_t end, int64_t grain,
                  void (*call)(void* ctx, int64_t lo, int64_t hi), void* ctx) {
  if (end <= begin) return;
  const int64_t n = end - begin;
  thread_pool& p = pool();
  if (grain <= 0) grain = std::max<int64_t>(1, (n + 4 * p.size() - 1) / (4 * p.size()));
  if (inside_chunk || p.size() == 1 || n <= grain) {
    for (int64_t lo = begin; lo < end; lo += grain) call(ctx, lo, std::min(end, lo + grain));
    return;
  }
  p.run(begin, end, grain, call, ctx);
}

}  // namespace cedar
