// The fast CPU backend's worker threads, started on first use and kept for the life of the process.
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu/parallel.h"

namespace fmha::cpu {
namespace {

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
      pending_ = workers - 1;
      ++generation_;
    }
    wake_.notify_all();
    // The helpers read `body` until they are done: wait for them even when worker 0 throws.
    const auto wait_for_helpers = [&] {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return pending_ == 0; });
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
    const std::uint64_t started = generation_;
    std::thread([this, index, started] {
      std::uint64_t seen = started;
      std::unique_lock<std::mutex> lock(mutex_);
      while (true) {
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (index >= workers_) continue;
        const std::function<void(int)>* body = body_;
        lock.unlock();
        (*body)(index);
        lock.lock();
        if (--pending_ == 0) done_.notify_one();
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
  int pending_ = 0;
  std::uint64_t generation_ = 0;
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
