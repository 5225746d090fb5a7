// The fast CPU backend's worker threads, started on first use and kept for the life of the process.
//
// A helper that has run a call's tasks, and a caller waiting for its helpers, first spin for kSpin
// on the counter they wait for before sleeping on a condition variable: in a virtual machine an idle
// virtual CPU sleeps in the host, and waking a sleeping helper took longer than a small call's
// whole work, so the caller ran every task itself (2-core AMD EPYC guest, 2026-11-28, B1 H2 L256
// D32 causal fp32 forward from C++: 150 us on one thread, 155 on two; calls from Python come tens of
// microseconds apart). The spin pauses between reads and yields the core every few reads; only
// helpers the hardware has cores for spin (a call asking for more threads than cores does not
// leave them all spinning).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu/parallel.h"

namespace fmha::cpu {
namespace {

constexpr std::chrono::microseconds kSpin{200};

// Returns as soon as ready() holds, or once kSpin has passed.
template <typename Ready>
void spin_until(const Ready& ready) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    if (ready()) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() > deadline) return;
      std::this_thread::yield();
    }
  }
}

class ThreadPool {
 public:
  // The process's pool. A child of fork() has none of its parent's threads: it gets a pool of its
  // own (the parent's object is left alone, its mutexes may have been held at the fork).
  static ThreadPool& instance() {
    static std::atomic<ThreadPool*> pool{nullptr};
    ThreadPool* current = pool.load();
    if (current == nullptr || current->pid_ != getpid()) {
      auto* fresh = new ThreadPool;  // never deleted: helpers may still wait on it at exit
      if (pool.compare_exchange_strong(current, fresh)) return *fresh;
      delete fresh;
      return *current;  // another thread installed one first (compare_exchange loaded it)
    }
    return *current;
  }

  void run(int workers, const std::function<void(int)>& body) {
    std::unique_lock<std::mutex> call(call_mutex_, std::try_to_lock);
    if (!call.owns_lock()) {
      body(0);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int>(helpers_) < workers - 1) start_helper();
      body_ = &body;
      workers_ = workers;
      pending_.store(workers - 1);
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    // The helpers read `body` until they are done: wait for them even when worker 0 throws.
    const auto wait_for_helpers = [&] {
      spin_until([&] { return pending_.load() == 0; });
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return pending_.load() == 0; });
      body_ = nullptr;
    };
    try {
      body(0);
    } catch (...) {
      wait_for_helpers();
      throw;
    }
    wait_for_helpers();
  }

 private:
  // Called with mutex_ held. Helper i runs as worker i of every call with more than i workers.
  void start_helper() {
    const int index = static_cast<int>(++helpers_);
    const std::uint64_t started = generation_.load();
    const bool spins = index < static_cast<int>(std::thread::hardware_concurrency());
    std::thread([this, index, started, spins] {
      std::uint64_t seen = started;
      std::unique_lock<std::mutex> lock(mutex_);
      while (true) {
        if (spins && generation_.load() == seen) {
          lock.unlock();
          spin_until([&] { return generation_.load() != seen; });
          lock.lock();
        }
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        seen = generation_.load();
        if (index >= workers_) continue;
        const std::function<void(int)>* body = body_;
        lock.unlock();
        (*body)(index);
        lock.lock();
        if (pending_.fetch_sub(1) == 1) done_.notify_one();
      }
    }).detach();
  }

  const pid_t pid_ = getpid();
  std::mutex call_mutex_;  // one call at a time uses the helpers
  std::mutex mutex_;       // guards everything below
  std::condition_variable wake_, done_;
  std::size_t helpers_ = 0;
  const std::function<void(int)>* body_ = nullptr;
  int workers_ = 0;
  // Written under mutex_; atomic so that a spinning thread may read them without it.
  std::atomic<int> pending_{0};
  std::atomic<std::uint64_t> generation_{0};
};

}  // namespace

void run_workers(int workers, const std::function<void(int)>& body) {
  if (workers <= 1) {
    body(0);
    return;
  }
  ThreadPool::instance().run(workers, body);
}

}  // namespace fmha::cpu
