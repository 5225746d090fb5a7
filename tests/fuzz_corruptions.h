// The corruptions of the fuzzing harness's invalid draws (fuzz_draws.h): each kind turns a valid
// call (fuzz_calls.h) into one that fmha::check and fmha::run must refuse, and says what the
// refusal must name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_calls.h"

namespace fmha_fuzz {

// What a corrupted call must be refused with.
struct Expected {
  std::string what;                // the corruption, for the report
  std::vector<std::string> names;  // the message names one of these
  bool any_name = false;  // ... or any argument: a size that this tensor sets for the others
  StatusCode code = StatusCode::kInvalidArgument;
};

enum class Kind : std::uint8_t {
  kMissing,
  kRank,
  kRankOutOfRange,
  kDtype,
  kDtypeUnknown,
  kDevice,
  kCallDevice,
  kFloat64OnCuda,
  kShape,
  kNegativeSize,
  kHugeSize,
  kNegativeStride,
  kLastStride,
  kOverflowStride,
  kOutputBroadcast,
  kOutputOverlap,
  kBroadcastGradient,
  kNullData,
  kMisaligned,
  kOrphanGradient,
  kOption,
  kNeighborhood,
  kMaxSeqlen,
  kOffsets,
  kVarlenRelPos,
  kPartCount,
};
inline constexpr int kKinds = 26;

const char* kind_name(Kind k);

// The entry points a kind of corruption applies to, and the devices (cu_seqlens values are read
// on the CPU only).
bool fits(Kind k, Entry e);
bool fits(Kind k, const Device& device);

// Applies corruption `kind` to `call` and fills `x` with the refusal it must get; false (the call
// unchanged) when the kind does not fit the call, e.g. no tensor with a dimension of size > 1.
bool corrupt(Kind kind, Call& call, Dice& dice, Arena& arena, Expected* x);

}  // namespace fmha_fuzz
