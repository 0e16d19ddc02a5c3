#pragma once
// The one thread pool of moesim: a parallel loop over an index range with dynamic hand-out,
// exceptions carried back to the caller, cooperative cancellation and a progress tick.
//
//   std::vector<Result> out(n);
//   parallel_for(n, {.threads = 4, .grain = 64, .cancel = &flag},
//                [&](int worker, std::size_t i) { out[i] = work(i); });
//
// Items are handed out in index order from a shared counter, `grain` at a time; a worker
// finishes the chunk it holds. The exception of the lowest item index that threw is rethrown
// once every worker has stopped (so the error reported does not depend on the thread count);
// a raised CancelFlag stops the hand-out and ends in `Cancelled`. With a `tick`, the calling
// thread does not take items: it calls tick(items done) about every `tick_ms` until the
// workers are done (progress bars, signal polling), then once more at the end.
// Threads are started per call; the loops it runs are long (screening tens of thousands of
// plans, event-simulating whole steps), so their start-up cost does not show.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "moesim/sim/cancel.hpp"

namespace moesim {

struct ParallelOptions {
  int threads = 1;                ///< workers (>= 1)
  std::size_t grain = 1;          ///< items handed out at a time
  const CancelFlag* cancel = nullptr;
  std::function<void(std::size_t done)> tick;  ///< on the calling thread while workers run
  int tick_ms = 100;
};

/// Number of hardware threads, at least 1.
inline int hardware_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

template <class Work>
void parallel_for(std::size_t n, const ParallelOptions& opt, Work&& work) {
  if (n == 0) {
    throw_if_cancelled(opt.cancel);
    if (opt.tick) opt.tick(0);
    return;
  }
  const std::size_t grain = std::max<std::size_t>(1, opt.grain);
  const std::size_t chunks = (n + grain - 1) / grain;
  const int workers = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(std::max(1, opt.threads)), chunks));
  std::atomic<std::size_t> next{0}, done{0};
  std::atomic<bool> stop{false}, cancelled{false};
  std::mutex mu;
  std::condition_variable cv;
  int running = workers;
  std::size_t error_index = n;
  std::exception_ptr error;
  auto body = [&](int worker) {
    while (!stop.load(std::memory_order_relaxed)) {
      if (opt.cancel != nullptr && opt.cancel->requested()) {
        cancelled = true;
        stop = true;
        break;
      }
      const std::size_t begin = next.fetch_add(grain);
      if (begin >= n) break;
      const std::size_t end = std::min(n, begin + grain);
      for (std::size_t i = begin; i < end; ++i) {
        try {
          work(worker, i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (i < error_index) {
            error_index = i;
            error = std::current_exception();
          }
          stop = true;
          break;
        }
      }
      done.fetch_add(end - begin, std::memory_order_relaxed);
    }
    std::lock_guard<std::mutex> lock(mu);
    if (--running == 0) cv.notify_all();
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(workers));
  const int first_spawned = opt.tick ? 0 : 1;  // without a tick the caller is worker 0
  for (int w = first_spawned; w < workers; ++w) pool.emplace_back(body, w);
  if (opt.tick) {
    std::unique_lock<std::mutex> lock(mu);
    while (running > 0) {
      lock.unlock();
      opt.tick(std::min(done.load(), n));
      lock.lock();
      cv.wait_for(lock, std::chrono::milliseconds(opt.tick_ms), [&] { return running == 0; });
    }
  } else {
    body(0);
  }
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  if (cancelled) throw Cancelled();
  if (opt.tick) opt.tick(std::min(done.load(), n));
}

}  // namespace moesim
