// Task parallelism for the CPU reference. Work is cut into a fixed list of independent tasks that
// does not depend on the number of threads; threads only decide who runs which task, so every
// result is bitwise identical whatever the thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

namespace fmha::reference {

// Threads to use: FMHA_REFERENCE_THREADS when set to a positive number (lets tests check that the
// thread count changes nothing), otherwise every hardware thread.
inline std::int64_t reference_thread_count() {
  if (const char* env = std::getenv("FMHA_REFERENCE_THREADS")) {
    const long long requested = std::atoll(env);
    if (requested > 0) return requested;
  }
  return std::max<std::int64_t>(std::thread::hardware_concurrency(), 1);
}

// Runs task(t) for every t in [0, count); tasks must not write to the same memory.
template <typename Task>
void parallel_for(std::int64_t count, const Task& task) {
  const std::int64_t workers = std::min(reference_thread_count(), count);
  if (workers <= 1) {
    for (std::int64_t t = 0; t < count; ++t) task(t);
    return;
  }
  std::atomic<std::int64_t> next{0};
  const auto work = [&] {
    for (std::int64_t t = next.fetch_add(1); t < count; t = next.fetch_add(1)) task(t);
  };
  std::vector<std::thread> threads;
  for (std::int64_t w = 1; w < workers; ++w) threads.emplace_back(work);
  work();
  for (std::thread& thread : threads) thread.join();
}

}  // namespace fmha::reference
