// The fuzzing harness's plumbing (fuzz_draws.h): integers and runs from the environment, the host
// memory block of the invalid draws, the crash notes that print a dying draw's replay command, and
// the seeded dice every draw is made with.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fuzz_draws.h"

namespace fmha_fuzz {

std::int64_t env_int(const char* name, std::int64_t fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::strtoll(value, nullptr, 10) : fallback;
}

FuzzRun run_from_env(const char* count_variable, std::int64_t default_count,
                     std::uint64_t default_seed, const std::string& binary) {
  FuzzRun run;
  run.count = env_int(count_variable, default_count);
  run.seed = static_cast<std::uint64_t>(
      env_int("FMHA_FUZZ_SEED", static_cast<std::int64_t>(default_seed)));
  run.max_failures = std::max<std::int64_t>(1, env_int("FMHA_FUZZ_MAX_FAILURES", 3));
  run.verbose = env_int("FMHA_FUZZ_VERBOSE", 0) != 0;
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = test ? std::string(test->test_suite_name()) + "." + test->name() : "*";
  run.replay_prefix = std::string(count_variable) + "=1 FMHA_FUZZ_SEED=";
  run.replay_suffix = binary + " --gtest_filter=" + filter;
  return run;
}

HostMemory::HostMemory(std::size_t bytes)
    : bytes_(bytes), storage_(bytes / sizeof(std::uint64_t) + 1) {}
unsigned char* HostMemory::base() {
  return reinterpret_cast<unsigned char*>(storage_.data());
}
void HostMemory::fill(unsigned char* dst, unsigned char byte, std::size_t bytes) {
  std::memset(dst, byte, bytes);
}
void HostMemory::write(unsigned char* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void HostMemory::read(void* dst, const unsigned char* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}

namespace {

// The note a fatal signal prints before the process dies (CrashNote).

char g_crash_note[1024] = "";

extern "C" void on_fatal_signal(int sig) {
  const char head[] = "\n[ fuzz ] fatal signal during ";
  (void)!::write(2, head, sizeof(head) - 1);
  (void)!::write(2, g_crash_note, std::strlen(g_crash_note));
  (void)!::write(2, "\n", 1);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

CrashNote::CrashNote() {
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT})
    previous_.push_back(std::signal(sig, on_fatal_signal));
}
CrashNote::~CrashNote() {
  int i = 0;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT})
    std::signal(sig, previous_[static_cast<std::size_t>(i++)]);
  g_crash_note[0] = '\0';
}
void CrashNote::set(const std::string& note) {
  std::snprintf(g_crash_note, sizeof(g_crash_note), "%s", note.c_str());
}

Dice::Dice(std::uint64_t seed) : rng_(seed) {}
std::int64_t Dice::uniform(std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_);
}
bool Dice::chance(double p) {
  return std::uniform_real_distribution<double>(0, 1)(rng_) < p;
}
double Dice::real(double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng_);
}

void draw_key_extras(Dice& dice, std::int64_t lk, fmha_test::AttentionCase* c) {
  if (c->kind != fmha_test::Kind::kVarlen && lk > 0 && dice.chance(0.25)) {
    std::vector<std::int64_t> divisors;
    for (std::int64_t d = 1; d <= lk; ++d)
      if (lk % d == 0) divisors.push_back(d);
    c->rel_hk = divisors[static_cast<std::size_t>(
        dice.uniform(0, static_cast<std::int64_t>(divisors.size()) - 1))];
    for (bool& b : c->rel_broadcast) b = dice.chance(0.25);
    c->rel_zero_stride = dice.chance(0.5);
  }
  c->sinks = dice.chance(0.3);
  if (dice.chance(0.3)) c->extra = dice.uniform(1, 3);
  c->dlse = dice.chance(0.5);
  c->fp32_stats = c->dtype == fmha::DType::kFloat64 && dice.chance(0.3);
}

}  // namespace fmha_fuzz
