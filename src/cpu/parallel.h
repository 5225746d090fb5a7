// Threads of the fast CPU backend. As in the reference (reference/parallel.h), work is a fixed
// list of tasks that does not depend on the thread count, each output element is written by one
// task, and threads only decide who runs which task: results are bitwise identical whatever the
// number of threads. Here each worker also gets an index, so that it can reuse one scratch area
// for all the tasks it runs.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

namespace fmha::cpu {

// FMHA_CPU_THREADS when set to a positive number, otherwise every hardware thread.
inline int thread_count() {
  if (const char* env = std::getenv("FMHA_CPU_THREADS")) {
    const long requested = std::atol(env);
    if (requested > 0) return static_cast<int>(std::min<long>(requested, 1024));
  }
  return std::max(static_cast<int>(std::thread::hardware_concurrency()), 1);
}

inline int worker_count(std::int64_t tasks) {
  return static_cast<int>(std::max<std::int64_t>(std::min<std::int64_t>(thread_count(), tasks), 1));
}

// Runs task(t, worker) for every t in [0, count), worker in [0, worker_count(count)). Tasks are
// handed out in increasing order of t; tasks must not write to the same memory.
template <typename Task>
void parallel_for(std::int64_t count, const Task& task) {
  const int workers = worker_count(count);
  if (workers <= 1) {
    for (std::int64_t t = 0; t < count; ++t) task(t, 0);
    return;
  }
  std::atomic<std::int64_t> next{0};
  const auto work = [&](int worker) {
    for (std::int64_t t = next.fetch_add(1); t < count; t = next.fetch_add(1)) task(t, worker);
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < workers; ++w) threads.emplace_back(work, w);
  work(0);
  for (std::thread& thread : threads) thread.join();
}

}  // namespace fmha::cpu
