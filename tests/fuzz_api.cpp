// Fuzzing the C++ API on CPU tensors (the harness: fuzz_draws.h; the same draws on CUDA tensors:
// cuda/test_cuda_fuzz.cpp).
//   Fuzz.InvalidArguments    FMHA_FUZZ_INVALID draws (default 10000): one valid call of a random
//                            entry point on poisoned memory, corrupted in one way, must be refused
//                            by check() and run() alike with a message naming the argument, and
//                            leave every byte of memory as it was.
//   Fuzz.ValidAgainstOracle  FMHA_FUZZ_VALID draws (default 1000): small problems over every
//   option,
//                            dtype, layout and stride pattern, forward and backward, and merges,
//                            against the naive float64 oracle within SPEC §13.
// FMHA_FUZZ_SEED=<s> (default 1) is the first draw's seed; draw i uses s + i, and a failing draw
// prints the command that replays it alone. FMHA_FUZZ_MAX_FAILURES (default 3) invalid draws are
// reported before a run stops; FMHA_FUZZ_VERBOSE=1 prints every draw before it runs. A crash
// prints the draw it happened in.
#include <gtest/gtest.h>

#include "fuzz_draws.h"

namespace fmha_fuzz {
namespace {

constexpr std::uint64_t kDefaultSeed = 1;
constexpr const char* kBinary = "build-cpu/tests/fmha_tests";

TEST(Fuzz, InvalidArguments) {
  HostMemory memory(std::size_t{64} << 20);
  fuzz_invalid(memory, run_from_env("FMHA_FUZZ_INVALID", 10000, kDefaultSeed, kBinary));
}

TEST(Fuzz, ValidAgainstOracle) {
  fuzz_valid(nullptr, ValidLimits{}, run_from_env("FMHA_FUZZ_VALID", 1000, kDefaultSeed, kBinary));
}

}  // namespace
}  // namespace fmha_fuzz
