// Checks of single tensor views: the vocabulary validate*.cpp is written in. Every function returns
// a non-ok Status whose message starts with "fmha: ", names the argument, says what it received and
// what is accepted (SPEC §14).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "fmha/status.h"
#include "fmha/tensor.h"

namespace fmha::detail {

// One size of an expected shape with the symbol messages print for it, e.g. {"Lq", 128}.
struct Dim {
  const char* name;
  std::int64_t size;
};
using Shape = std::vector<Dim>;

// What a backend does with a tensor decides which strides it may have (never negative).
enum class Access : std::uint8_t {
  kInput,           // read; stride 0 broadcasts any dimension except a last one of size > 1
  kBroadcastInput,  // read; bias and rel-pos: a dimension of stride 0 or size 1 broadcasts, so
                    // the shape check also accepts 1 for any expected size
  kOutput,          // written; no two elements may share memory
};

// The tensor whose dtype and device every other tensor of a call must share: q (merge: out).
struct Anchor {
  const char* name;
  DType dtype;
  Device device;
};

// A tensor argument and its name in messages.
struct NamedView {
  const TensorView* view;
  std::string_view name;
};

// Every view has rank 0 ("not given") or 1..kMaxRank. Run first on every view of a call, given or
// not: an optional view with a negative rank would otherwise pass for "not given", and a rank past
// kMaxRank would make the other checks read past the shape and stride arrays.
Status expect_valid_ranks(std::initializer_list<NamedView> views);
Status expect_valid_rank(const TensorView& t, std::string_view name);

// Present (rank > 0), else "<name> is required ...; <purpose>".
Status expect_given(const TensorView& t, std::string_view name, std::string_view purpose);

// Given, of rank `rank`, with sizes >= 0 whose product fits in int64. `layout` names the dims, e.g.
// "[B, Lq, H, D]". Run before reading sizes from a tensor.
Status expect_rank(const TensorView& t, std::string_view name, int rank, std::string_view layout);

// The anchor: expect_rank, a floating dtype, a device that exists (cpu, or cuda with an index
// >= 0), and float64 only on the CPU.
Status expect_anchor(const TensorView& t, std::string_view name, int rank, std::string_view layout);

// Full checks, in this order: rank, dtype, device, shape, strides (by access), data pointer.
// data: the anchor's dtype. stat (lse, dlse, sinks and their gradients): float32, or float64 when
// the anchor is float64 (so finite differences work). index: int32.
Status expect_data_tensor(const Anchor& anchor, const TensorView& t, std::string_view name,
                          const Shape& shape, Access access);
Status expect_stat_tensor(const Anchor& anchor, const TensorView& t, std::string_view name,
                          const Shape& shape, Access access);
Status expect_index_tensor(const Anchor& anchor, const TensorView& t, std::string_view name,
                           const Shape& shape);

// The gradient of a broadcastable input (dbias): exactly `shape`, the input's own (see shape_of),
// and an output that must have stride 0 exactly on the dimensions of size > 1 where `input` has
// stride 0. Those dimensions, like the input's size-1 ones, receive the sum over them (SPEC §4).
Status expect_broadcast_gradient(const Anchor& anchor, const TensorView& grad,
                                 std::string_view name, const TensorView& input,
                                 std::string_view input_name, const Shape& shape);

// `names` with the sizes of `t` (which has been checked against them): the exact shape the
// gradient of a broadcastable input must have, e.g. dbias [1, H, 1, Lk] for such a bias.
Shape shape_of(const TensorView& t, const Shape& names);

// Multiplies two sizes >= 0; false on int64 overflow.
bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t* product);

}  // namespace fmha::detail
