// The fuzzing harness of the C++ API: random argument sets for every entry point (dense, varlen and
// neighborhood attention forward and backward, merge forward and backward), drawn from a seed so
// that any draw replays alone. The device is a parameter: tests/fuzz_api.cpp runs the draws on CPU
// memory, tests/cuda/test_cuda_fuzz.cpp on CUDA memory.
//
// Invalid draws: a valid call on poisoned memory, checked to pass fmha::check, then corrupted in
// one way (a wrong shape, rank, dtype, stride, device or data pointer; a missing tensor, half of a
// pair, a gradient without its input; an output that broadcasts or overlaps itself; an option out
// of range; bad cu_seqlens values; ...). fmha::check and fmha::run must both refuse it with the
// same status, a message that starts with "fmha: " and names the argument, and every byte of
// memory (inputs, outputs and the padding between them) must be as it was.
//
// Valid draws: small problems (sequences up to 32 tokens, head dims up to 40, up to 6 heads) over
// every option, dtype, layout and stride pattern of AttentionCase, run forward and backward and
// compared with the naive float64 oracle within SPEC §13 (check_case); merges of 1 to 4 parts,
// compared with a float64 merge.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "fmha/fmha.h"
#include "test_case.h"

namespace fmha_fuzz {

// An integer from the environment, or `fallback` when unset or empty.
std::int64_t env_int(const char* name, std::int64_t fallback);

// Seeded random choices: a draw is a function of its seed alone.
class Dice {
 public:
  explicit Dice(std::uint64_t seed);
  std::int64_t uniform(std::int64_t lo, std::int64_t hi);  // inclusive
  bool chance(double p);
  double real(double lo, double hi);
  template <typename T>
  T pick(std::initializer_list<T> values) {
    return values.begin()[uniform(0, static_cast<std::int64_t>(values.size()) - 1)];
  }

 private:
  std::mt19937_64 rng_;
};

// The draws the sweep (test_sweep.cpp) and the valid fuzz draws share, in this order: rel-pos over
// a key grid Hk x (lk / Hk) (not varlen, lk > 0; a quarter of the draws), sinks, extra keys, a
// gradient for lse, fp32 statistics of fp64 problems.
void draw_key_extras(Dice& dice, std::int64_t lk, fmha_test::AttentionCase* c);

// While alive, a fatal signal (a crash inside the library) first prints the note of the draw that
// was running, with its replay command; then the process dies as it would have.
class CrashNote {
 public:
  CrashNote();
  ~CrashNote();
  CrashNote(const CrashNote&) = delete;
  CrashNote& operator=(const CrashNote&) = delete;
  void set(const std::string& note);

 private:
  std::vector<void (*)(int)> previous_;
};

// One run of draws: `count` draws with seeds seed, seed + 1, ...
struct FuzzRun {
  std::int64_t count = 0;
  std::uint64_t seed = 0;
  // Printed with a failing draw's seed: how to run that draw alone, e.g.
  // "FMHA_FUZZ_INVALID=1 FMHA_FUZZ_SEED=<seed> build-cpu/tests/fmha_tests
  // --gtest_filter=Fuzz.InvalidArguments" is replay_prefix + "<seed> " + replay_suffix.
  std::string replay_prefix, replay_suffix;
  std::int64_t max_failures = 3;  // invalid draws: failures reported before the run stops
  bool verbose = false;           // print every draw before it runs
};

// The run a test makes from the environment: FMHA_FUZZ_SEED (default `default_seed`), the count
// from `count_variable` (default `default_count`), FMHA_FUZZ_MAX_FAILURES, FMHA_FUZZ_VERBOSE.
FuzzRun run_from_env(const char* count_variable, std::int64_t default_count,
                     std::uint64_t default_seed, const std::string& binary);

// Memory of one device that the invalid draws place their tensors in: one block, reused by every
// draw. Its contents are compared byte for byte before and after each refused call.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual fmha::Device device() const = 0;
  virtual unsigned char* base() = 0;  // device address of the block
  virtual std::size_t capacity() const = 0;
  virtual void fill(unsigned char* dst, unsigned char byte, std::size_t bytes) = 0;
  virtual void write(unsigned char* dst, const void* src, std::size_t bytes) = 0;  // host -> block
  virtual void read(void* dst, const unsigned char* src, std::size_t bytes) = 0;   // block -> host
};

class HostMemory final : public Memory {
 public:
  explicit HostMemory(std::size_t bytes);
  fmha::Device device() const override { return fmha::Device::cpu(); }
  unsigned char* base() override;
  std::size_t capacity() const override { return bytes_; }
  void fill(unsigned char* dst, unsigned char byte, std::size_t bytes) override;
  void write(unsigned char* dst, const void* src, std::size_t bytes) override;
  void read(void* dst, const unsigned char* src, std::size_t bytes) override;

 private:
  std::size_t bytes_;
  std::vector<std::uint64_t> storage_;
};

// Runs the invalid draws of `run` on `memory`; failures are gtest failures that print the draw,
// the corruption, the message and the replay command.
void fuzz_invalid(Memory& memory, const FuzzRun& run);

// What a device's valid draws leave out.
struct ValidLimits {
  bool float64 = true;  // the CUDA backend refuses float64 (a valid input it does not run)
};

// Valid draws: an attention problem (dense, varlen or neighborhood) or, one draw in ten, a merge.
fmha_test::AttentionCase random_attention_case(std::uint64_t seed, const ValidLimits& limits);

// Runs the valid draws of `run`: on the CPU tensors themselves when `device` is null, else on their
// copies on `device`, where calls refused as not supported are counted (and printed at the end)
// rather than failed. Stops at the first failing draw.
void fuzz_valid(fmha_test::CaseDevice* device, const ValidLimits& limits, const FuzzRun& run);

}  // namespace fmha_fuzz
