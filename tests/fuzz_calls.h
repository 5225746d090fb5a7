// The calls of the fuzzing harness's invalid draws (fuzz_draws.h): tensors placed in the memory
// block, one call of an entry point with its named tensor slots (fuzz_calls.cpp draws a valid one
// and describes it), for the corruptions (fuzz_corruptions.h) and the draws (fuzz_invalid.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "fuzz_draws.h"

namespace fmha_fuzz {

using fmha::Device;
using fmha::DeviceType;
using fmha::DType;
using fmha::Status;
using fmha::StatusCode;
using fmha::TensorView;

inline constexpr std::int64_t kHuge = std::int64_t{1} << 62;
inline constexpr int kMaxRank = fmha::kMaxRank;

// "name[i]", as the messages index lists and axes.
std::string indexed(const std::string& name, std::int64_t i);

// ---- Tensors on the arena ---------------------------------------------------------------------

// How a tensor's logical dimensions are laid out (as fmha_test::Layout, with any order).
struct Placement {
  std::vector<int> order;  // outermost to innermost; empty = row-major
  std::int64_t pad = 0;    // extra elements after every innermost row
  std::vector<bool> zero;  // dimensions stored once (stride 0)
};

// Bump allocation in the memory block, 256-byte aligned (what any backend would want).
class Arena {
 public:
  explicit Arena(Memory& memory) : memory_(memory) {}
  void reset() { used_ = 0; }
  unsigned char* take(std::size_t bytes) {
    const std::size_t at = (used_ + 255) / 256 * 256;
    if (at + bytes > memory_.capacity()) {
      overflow_ = true;
      return memory_.base();
    }
    used_ = at + bytes;
    return memory_.base() + at;
  }
  std::size_t used() const { return used_; }
  bool overflowed() const { return overflow_; }
  Memory& memory() { return memory_; }

 private:
  Memory& memory_;
  std::size_t used_ = 0;
  bool overflow_ = false;
};

// A tensor of `shape` laid out as `placement` says, taken from the arena.
TensorView place(Arena& arena, Device device, DType dtype, const std::vector<std::int64_t>& shape,
                 const Placement& placement);

// ---- Calls -----------------------------------------------------------------------------------

enum class Entry : std::uint8_t {
  kDenseForward,
  kDenseBackward,
  kVarlenForward,
  kVarlenBackward,
  kNeighborhoodForward,
  kNeighborhoodBackward,
  kMergeForward,
  kMergeBackward,
};
inline constexpr int kEntries = 8;

const char* entry_name(Entry e);

inline bool is_backward(Entry e) {
  return e == Entry::kDenseBackward || e == Entry::kVarlenBackward ||
         e == Entry::kNeighborhoodBackward || e == Entry::kMergeBackward;
}
inline bool is_varlen(Entry e) {
  return e == Entry::kVarlenForward || e == Entry::kVarlenBackward;
}
inline bool is_neighborhood(Entry e) {
  return e == Entry::kNeighborhoodForward || e == Entry::kNeighborhoodBackward;
}
inline bool is_merge(Entry e) {
  return e == Entry::kMergeForward || e == Entry::kMergeBackward;
}

// What the validation does with a tensor, which decides what makes it invalid.
enum class Role : std::uint8_t {
  kInput,              // read, the anchor's dtype
  kBroadcastInput,     // bias, rel-pos: a size-1 dimension broadcasts too
  kOutput,             // written, the anchor's dtype
  kBroadcastGradient,  // dbias: stride 0 exactly where bias has it
  kStatInput,          // lse, dlse, sinks: float32 (or float64 with a float64 anchor)
  kStatOutput,
  kIndex,  // cu_seqlens: int32
};

inline bool is_output(Role r) {
  return r == Role::kOutput || r == Role::kStatOutput || r == Role::kBroadcastGradient;
}
inline bool is_stat(Role r) {
  return r == Role::kStatInput || r == Role::kStatOutput;
}

// One tensor argument of a call, as the messages name it.
struct Slot {
  std::string name;
  TensorView* view = nullptr;
  Role role = Role::kInput;
  bool required = false;
  bool anchor = false;
  std::array<bool, kMaxRank> defines{};  // dimensions whose size this tensor sets for the others
  std::array<std::int64_t, kMaxRank> full{};  // the sizes validation expects (broadcast inputs: 1
                                              // also passes)
  std::vector<std::string> partners;          // refused naming these too when this one is left out
};

using Params = std::variant<fmha::AttentionForwardParams, fmha::AttentionBackwardParams,
                            fmha::VarlenForwardParams, fmha::VarlenBackwardParams,
                            fmha::NeighborhoodForwardParams, fmha::NeighborhoodBackwardParams,
                            fmha::MergeForwardParams, fmha::MergeBackwardParams>;

// One call: its parameters, the named tensor slots pointing into them, and what the corruptions
// need to know about the draw. Built in place; the slots point into `params`.
struct Call {
  Entry entry = Entry::kDenseForward;
  Params params;
  std::vector<Slot> slots;
  std::vector<std::string> scalar_names;  // options and sizes the messages may name
  DType dtype = DType::kFloat32;          // the anchor's
  DType stat = DType::kFloat32;
  Device device;
  bool reads_offsets = false;  // CPU: the validation reads cu_seqlens values
  // varlen: the offsets, written to memory before each call (the validation reads CPU ones)
  std::vector<std::int32_t> offsets_q, offsets_k;
  unsigned char* offsets_q_at = nullptr;
  unsigned char* offsets_k_at = nullptr;
  std::array<std::int64_t, 3> grid{1, 1, 1};                  // neighborhood
  std::int64_t batch = 0, heads = 0, rows_q = 0, rows_k = 0;  // for the tensors a corruption adds
  bool force_bias_gradient = false;  // a backward draw with bias and dbias (for the corruptions
                                     // that need them, which a free draw rarely has)

  Call() = default;
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  Status check() const {
    return std::visit([](const auto& p) { return fmha::check(p); }, params);
  }
  Status run() const {
    return std::visit([](const auto& p) { return fmha::run(p); }, params);
  }
  Slot* slot(const std::string& name) {
    for (Slot& s : slots)
      if (s.name == name) return &s;
    return nullptr;
  }
  fmha::AttentionOptions* options() {
    return std::visit(
        [](auto& p) -> fmha::AttentionOptions* {
          if constexpr (requires { p.options; }) {
            return &p.options;
          } else {
            return nullptr;
          }
        },
        params);
  }
};

// The draw as text: entry, every given tensor with shape and strides, the scalars.
std::string describe(Call& call);

// Draws a valid call of `entry` on `device`, its tensors in the arena.
void build(Call& call, Entry entry, Dice& dice, Arena& arena, Device device);

}  // namespace fmha_fuzz
