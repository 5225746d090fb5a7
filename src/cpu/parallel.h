// Threads of the fast CPU backend. As in the reference (reference/parallel.h), work is a fixed
// list of tasks that does not depend on the thread count, each output element is written by one
// task, and threads only decide who runs which task: results are bitwise identical whatever the
// number of threads. Here each worker also gets an index, so that it can reuse one scratch area
// for all the tasks it runs, and the workers are kept between calls (thread_pool.cpp): starting
// threads at every call cost more than a small problem's whole computation.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <thread>

namespace fmha::cpu {

// The threads of a call: `requested` (AttentionOptions::cpu_threads) when positive, else
// FMHA_CPU_THREADS when set to a positive number, else every hardware thread.
inline int thread_count(int requested) {
  constexpr long kMaxThreads = 1024;
  if (requested > 0) return static_cast<int>(std::min<long>(requested, kMaxThreads));
  if (const char* env = std::getenv("FMHA_CPU_THREADS")) {
    const long from_env = std::atol(env);
    if (from_env > 0) return static_cast<int>(std::min(from_env, kMaxThreads));
  }
  return std::max(static_cast<int>(std::thread::hardware_concurrency()), 1);
}

inline int worker_count(std::int64_t tasks, int threads) {
  return static_cast<int>(std::max<std::int64_t>(std::min<std::int64_t>(threads, tasks), 1));
}

// Runs body(worker) for worker in [0, workers): the calling thread is worker 0, threads kept by the
// process the others. When another call is using those threads (calls from several user threads
// at once), the caller runs body(0) alone, which the task loop below turns into every task.
void run_workers(int workers, const std::function<void(int)>& body);

// Runs task(t, worker) for every t in [0, count), worker in [0, worker_count(count, threads)).
// Tasks are handed out in increasing order of t; tasks must not write to the same memory.
template <typename Task>
void parallel_for(std::int64_t count, int threads, const Task& task) {
  const int workers = worker_count(count, threads);
  if (workers <= 1) {
    for (std::int64_t t = 0; t < count; ++t) task(t, 0);
    return;
  }
  std::atomic<std::int64_t> next{0};
  run_workers(workers, [&](int worker) {
    for (std::int64_t t = next.fetch_add(1); t < count; t = next.fetch_add(1)) task(t, worker);
  });
}

}  // namespace fmha::cpu
