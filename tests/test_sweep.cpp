// A seeded random sweep over option combinations: layout kind (dense / varlen / NA), dtype, shapes,
// GQA, masks, bias broadcasts, rel-pos, softcap, sinks, extra keys, memory layouts. Each case runs
// forward and backward against the naive oracle.
//   FMHA_TEST_SWEEP=<n>       number of cases (default 40)
//   FMHA_TEST_SWEEP_SEED=<s>  seed of the first case (default 1000); case i uses seed s + i, so a
//                             failing case reruns alone with FMHA_TEST_SWEEP=1 FMHA_TEST_SWEEP_SEED=<its seed>.
//   FMHA_TEST_VERBOSE=1       print each case before it runs (for a case that crashes)
#include <iostream>

#include "fuzz_draws.h"
#include "test_case.h"

namespace fmha_test {
namespace {

// Seeded dice and integers from the environment: the fuzzing harness's (fuzz_draws.h).
using fmha_fuzz::Dice;
using fmha_fuzz::draw_key_extras;
using fmha_fuzz::env_int;

AttentionCase random_case(std::uint64_t seed) {
  Dice dice(seed);
  AttentionCase c;
  const std::int64_t kind = dice.uniform(0, 3);
  c.kind = kind <= 1 ? Kind::kDense : kind == 2 ? Kind::kVarlen : Kind::kNeighborhood;
  c.dtype = dice.pick({DType::kFloat32, DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64});
  c.kv_heads = dice.uniform(1, 3);
  c.heads = c.kv_heads * dice.pick<std::int64_t>({1, 2, 4});
  c.head_dim = dice.pick<std::int64_t>({1, 4, 8, 16, 24, 40, 64, 72});
  c.value_dim = dice.chance(0.5) ? c.head_dim : dice.pick<std::int64_t>({1, 8, 16, 40});
  c.batch = dice.uniform(1, 3);

  switch (c.kind) {
    case Kind::kDense:
      c.seqlen_q = dice.chance(0.1) ? 0 : dice.uniform(1, 40);
      c.seqlen_k = dice.chance(0.1) ? 0 : dice.uniform(1, 40);
      break;
    case Kind::kVarlen:
      for (std::int64_t b = 0; b < c.batch; ++b) {
        c.seqlens_q.push_back(static_cast<std::int32_t>(dice.chance(0.15) ? 0 : dice.uniform(1, 24)));
        c.seqlens_k.push_back(static_cast<std::int32_t>(dice.chance(0.15) ? 0 : dice.uniform(1, 24)));
      }
      break;
    case Kind::kNeighborhood: {
      c.neighborhood.num_dims = static_cast<int>(dice.uniform(1, 3));
      const std::int64_t max_extent = c.neighborhood.num_dims == 1 ? 20 : c.neighborhood.num_dims == 2 ? 8 : 5;
      for (int r = 0; r < c.neighborhood.num_dims; ++r) {
        c.grid[r] = dice.uniform(1, max_extent);
        c.neighborhood.kernel_size[r] = dice.uniform(1, c.grid[r]);
        c.neighborhood.dilation[r] = dice.uniform(1, c.grid[r] / c.neighborhood.kernel_size[r]);
        c.neighborhood.causal[r] = dice.chance(0.3);
      }
      break;
    }
  }

  auto& o = c.options;
  if (dice.chance(0.3)) o.scale = static_cast<float>(dice.uniform(1, 30)) / 20.0f;
  if (dice.chance(0.3)) o.softcap = static_cast<float>(dice.uniform(1, 40)) / 4.0f;
  if (c.kind != Kind::kNeighborhood) {
    o.causal = dice.chance(0.35);
    o.causal_alignment = dice.chance(0.5) ? fmha::CausalAlignment::kTopLeft : fmha::CausalAlignment::kBottomRight;
    if (dice.chance(0.3)) {
      o.window_left = dice.uniform(-1, 8);
      o.window_right = dice.uniform(-1, 8);
    }
  }
  if (dice.chance(0.35)) {
    c.bias.given = true;
    for (bool& b : c.bias.broadcast) b = dice.chance(0.3);
    // Size-1 broadcasting is covered by Options.BiasBroadcasts; here bias is broadcast by stride 0.
    c.bias.zero_stride = true;
  }
  const std::int64_t lk = c.rows_per_batch_k();
  draw_key_extras(dice, lk, &c);
  // A bias broadcast over keys, or a rel-pos factor of size 1, gets the sum of dS over a whole row:
  // that is exactly zero unless lse has a gradient, and a relative check would compare noise.
  if ((c.bias.given && c.bias.broadcast[3]) || (c.rel_hk > 0 && (c.rel_hk == 1 || c.rel_hk == lk))) c.dlse = true;
  // Broadcast storage makes batches or heads identical, which hides mix-ups between them: it gets a
  // smaller share than the layouts that keep every element distinct.
  const bool varlen = c.kind == Kind::kVarlen;
  auto storage = [&]() {
    const Storage s = dice.pick({Storage::kContiguous, Storage::kContiguous, Storage::kPadded, Storage::kPadded,
                                 Storage::kHeadsOuter, Storage::kHeadsOuter, Storage::kBroadcastBatch,
                                 Storage::kBroadcastHeads});
    // varlen has no batch dim: stride 0 on its token dim would make every token identical
    return varlen && s == Storage::kBroadcastBatch ? Storage::kBroadcastHeads : s;
  };
  c.q_storage = storage();
  c.kv_storage = storage();
  o.deterministic = dice.chance(0.2);
  return c;
}

TEST(Sweep, RandomOptionCombinations) {
  const std::int64_t count = env_int("FMHA_TEST_SWEEP", 40);
  const std::int64_t first_seed = env_int("FMHA_TEST_SWEEP_SEED", 1000);
  const bool verbose = env_int("FMHA_TEST_VERBOSE", 0) != 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const auto seed = static_cast<std::uint64_t>(first_seed + i);
    const AttentionCase c = random_case(seed);
    if (verbose) std::cout << "sweep seed " << seed << ": " << c.describe() << std::endl;
    check_case(c, seed);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "rerun with FMHA_TEST_SWEEP=1 FMHA_TEST_SWEEP_SEED=" << seed;
      break;  // one failing case at a time keeps the report readable
    }
  }
}

}  // namespace
}  // namespace fmha_test
