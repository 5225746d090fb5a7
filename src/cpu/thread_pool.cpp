// The fast CPU backend's worker threads, started on first use and kept for the life of the process;
// or, once a host has handed over its OpenMP team (fmha::set_cpu_parallel_runtime: fmha's Python
// package gives PyTorch's), that team.
//
// Why a host's team: PyTorch's OpenMP threads spin for a while after each of its parallel
// operations, and on a 2-core machine (AMD EPYC guest, 2026-11-28) fmha's helper then got too little
// of a core to help: a causal D 32 L 256 forward right after SDPA calls took 160 us for about 10 ms,
// 91 us otherwise (and with OMP_WAIT_POLICY=PASSIVE). On the team those spinning threads are the
// workers.
//
// fmha's own threads: a helper first spins for kSpin on the call counter before sleeping on a
// condition variable. In a virtual machine an idle virtual CPU sleeps in the host, and waking a
// sleeping helper takes longer than a small call's whole work (same guest: after 1 ms idle a
// helper joined a 300 us call in 21 of 200 calls). The spin pauses between reads and yields the
// core every few reads; only helpers the hardware has cores for spin (a call asking for more
// threads than cores does not leave them all spinning).
//
// A call never waits for a helper to wake. Helpers join a call (admission_) before they touch its
// tasks; once the caller has run out of tasks it closes the call to joiners and waits only for the
// helpers that joined, which are running tasks. A helper that wakes after the close finds nothing
// to do and goes back to waiting. So a tiny call whose helpers sleep runs on the calling thread at
// its one-thread speed instead of paying the wake-up, and one whose helpers spin (calls tens of
// microseconds apart) gets them at once; either way each task runs once and the results do not
// depend on who ran it (parallel.h).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu/parallel.h"
#include "fmha/fmha.h"

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
      admission_.store(0);
      finished_.store(0);
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    // Closes the call to helpers not yet in it and waits for those in it, which read `body` until
    // they are done (also when worker 0 throws).
    const auto close_and_wait = [&] {
      const int joined = admission_.fetch_or(kClosed) & ~kClosed;
      spin_until([&] { return finished_.load() == joined; });
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return finished_.load() == joined; });
      body_ = nullptr;
    };
    try {
      body(0);
    } catch (...) {
      close_and_wait();
      throw;
    }
    close_and_wait();
  }

 private:
  static constexpr int kClosed = 1 << 30;  // admission_: the call takes no more helpers

  // Called with mutex_ held. Helper i runs as worker i of every call with more than i workers that
  // it joins before the caller closes it.
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
        if (index >= workers_ || !join()) continue;  // mutex_ held: the call cannot be reset
        const std::function<void(int)>* body = body_;
        lock.unlock();
        (*body)(index);
        lock.lock();
        finished_.fetch_add(1);
        done_.notify_one();
      }
    }).detach();
  }

  // Enters the current call unless the caller has closed it.
  bool join() {
    int admitted = admission_.load();
    while ((admitted & kClosed) == 0) {
      if (admission_.compare_exchange_weak(admitted, admitted + 1)) return true;
    }
    return false;
  }

  const pid_t pid_ = getpid();
  std::mutex call_mutex_;  // one call at a time uses the helpers
  std::mutex mutex_;       // guards everything below
  std::condition_variable wake_, done_;
  std::size_t helpers_ = 0;
  const std::function<void(int)>* body_ = nullptr;
  int workers_ = 0;
  // Reset under mutex_ when a call starts; atomic so that spinning threads may read them without it.
  std::atomic<int> admission_{0};  // helpers that joined the call, | kClosed once it takes no more
  std::atomic<int> finished_{0};   // helpers that joined and are done with its tasks
  std::atomic<std::uint64_t> generation_{0};
};

// The host's OpenMP team, when one was handed over (fmha::set_cpu_parallel_runtime), and the process
// that handed it over: a fork()ed child uses fmha's own threads instead (libgomp may hang in a child
// whose parent had a team running, as the pool's own fork rule avoids for its threads).
struct TeamRuntime {
  CpuParallelRuntime runtime;
  pid_t pid;
};
std::atomic<const TeamRuntime*> g_team_runtime{nullptr};

// Runs body(worker) on the host's team: each team thread is the worker of its thread number (a
// team smaller than asked runs fewer workers, which parallel_for's shared task counter allows); an
// exception leaves the region through a copy, rethrown once every thread is done.
void run_on_team(const CpuParallelRuntime& team, int workers,
                 const std::function<void(int)>& body) {
  struct Region {
    const std::function<void(int)>* body;
    int (*thread_num)();
    std::mutex mutex;
    std::exception_ptr error;
  } region{&body, team.thread_num, {}, nullptr};
  team.parallel(
      [](void* data) {
        auto* r = static_cast<Region*>(data);
        try {
          (*r->body)(r->thread_num());
        } catch (...) {
          std::lock_guard<std::mutex> lock(r->mutex);
          if (!r->error) r->error = std::current_exception();
        }
      },
      &region, static_cast<unsigned>(workers), 0u);
  if (region.error) std::rethrow_exception(region.error);
}

}  // namespace

void run_workers(int workers, const std::function<void(int)>& body) {
  if (workers <= 1) {
    body(0);
    return;
  }
  const TeamRuntime* team = g_team_runtime.load(std::memory_order_acquire);
  if (team != nullptr && team->pid == getpid()) {
    run_on_team(team->runtime, workers, body);
    return;
  }
  ThreadPool::instance().run(workers, body);
}

}  // namespace fmha::cpu

namespace fmha {

void set_cpu_parallel_runtime(const CpuParallelRuntime& runtime) {
  // Kept for the process's life: a call on another thread may still be using the previous one.
  const cpu::TeamRuntime* kept = nullptr;
  if (runtime.parallel != nullptr && runtime.thread_num != nullptr) {
    kept = new cpu::TeamRuntime{runtime, getpid()};
  }
  cpu::g_team_runtime.store(kept, std::memory_order_release);
}

}  // namespace fmha
