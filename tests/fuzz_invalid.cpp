// Invalid draws of the fuzzing harness (fuzz_draws.h): a valid call of one entry point on poisoned
// memory, corrupted in one way, must be refused by fmha::check and fmha::run with a message naming
// the argument, without a byte of memory changing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
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

constexpr std::int64_t kHuge = std::int64_t{1} << 62;
constexpr int kMaxRank = fmha::kMaxRank;

// ---- Crash notes: a fatal signal during a draw prints how to replay it
// ---------------------------

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

namespace {

// "name[i]", as the messages index lists and axes.
std::string indexed(const std::string& name, std::int64_t i) {
  std::ostringstream s;
  s << name << '[' << i << ']';
  return s.str();
}

// ---- Tensors on the arena
// ------------------------------------------------------------------------

// How a tensor's logical dimensions are laid out (as fmha_test::Layout, with any order).
struct Placement {
  std::vector<int> order;  // outermost to innermost; empty = row-major
  std::int64_t pad = 0;    // extra elements after every innermost row
  std::vector<bool> zero;  // dimensions stored once (stride 0)
};

std::vector<std::int64_t> strides_for(const std::vector<std::int64_t>& shape, const Placement& p) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int> order = p.order;
  if (order.empty())
    for (int d = 0; d < rank; ++d) order.push_back(d);
  std::vector<std::int64_t> stride(shape.size(), 0);
  std::int64_t running = 1;
  for (int pos = rank - 1; pos >= 0; --pos) {
    const auto d = static_cast<std::size_t>(order[static_cast<std::size_t>(pos)]);
    if (d < p.zero.size() && p.zero[d]) continue;
    stride[d] = running;
    running *= std::max<std::int64_t>(shape[d], 1);
    if (pos == rank - 1) running += p.pad;
  }
  return stride;
}

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

TensorView place(Arena& arena, Device device, DType dtype, const std::vector<std::int64_t>& shape,
                 const Placement& placement) {
  const std::vector<std::int64_t> stride = strides_for(shape, placement);
  std::int64_t elements = 1;
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 0) elements += (shape[d] - 1) * stride[d];
  unsigned char* data = arena.take(static_cast<std::size_t>(elements) * fmha::element_size(dtype));
  return TensorView::strided(data, dtype, static_cast<int>(shape.size()), shape.data(),
                             stride.data(), device);
}

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
constexpr int kEntries = 8;

const char* entry_name(Entry e) {
  static constexpr const char* kNames[kEntries] = {
      "dense-forward", "dense-backward", "varlen-forward", "varlen-backward",
      "na-forward",    "na-backward",    "merge-forward",  "merge-backward"};
  return kNames[static_cast<int>(e)];
}

bool is_backward(Entry e) {
  return e == Entry::kDenseBackward || e == Entry::kVarlenBackward ||
         e == Entry::kNeighborhoodBackward || e == Entry::kMergeBackward;
}
bool is_varlen(Entry e) {
  return e == Entry::kVarlenForward || e == Entry::kVarlenBackward;
}
bool is_neighborhood(Entry e) {
  return e == Entry::kNeighborhoodForward || e == Entry::kNeighborhoodBackward;
}
bool is_merge(Entry e) {
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

bool is_output(Role r) {
  return r == Role::kOutput || r == Role::kStatOutput || r == Role::kBroadcastGradient;
}
bool is_stat(Role r) {
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

std::string view_string(const TensorView& t) {
  std::ostringstream s;
  if (t.rank == 0) return "-";
  s << fmha::to_string(t.dtype) << '[';
  for (int d = 0; d < t.rank && d < kMaxRank; ++d)
    s << (d ? "," : "") << t.shape[static_cast<std::size_t>(d)];
  s << "]/[";
  for (int d = 0; d < t.rank && d < kMaxRank; ++d)
    s << (d ? "," : "") << t.stride[static_cast<std::size_t>(d)];
  s << ']';
  if (t.device.type != DeviceType::kCPU) s << '@' << fmha::to_string(t.device);
  return s.str();
}

std::string options_string(const fmha::AttentionOptions& o) {
  std::ostringstream s;
  if (o.scale) s << " scale=" << *o.scale;
  if (o.softcap != 0) s << " softcap=" << o.softcap;
  if (o.causal) s << " causal";
  if (o.causal_alignment != fmha::CausalAlignment::kTopLeft) s << " bottom_right";
  if (o.window_left != -1 || o.window_right != -1)
    s << " window=(" << o.window_left << ',' << o.window_right << ')';
  if (o.deterministic) s << " deterministic";
  if (o.allow_tf32) s << " allow_tf32";
  return s.str();
}

// The draw as text: entry, every given tensor with shape and strides, the scalars.
std::string describe(Call& call) {
  std::ostringstream s;
  s << entry_name(call.entry);
  for (const Slot& slot : call.slots)
    if (slot.view->rank != 0) s << ' ' << slot.name << '=' << view_string(*slot.view);
  std::visit(
      [&](auto& p) {
        if constexpr (requires { p.max_seqlen_q; })
          s << " max_seqlen_q=" << p.max_seqlen_q << " max_seqlen_k=" << p.max_seqlen_k;
        if constexpr (requires { p.neighborhood; }) {
          const auto& n = p.neighborhood;
          s << " num_dims=" << n.num_dims;
          for (int r = 0; r < 3; ++r) {
            const auto a = static_cast<std::size_t>(r);
            s << " axis" << r << "(K=" << n.kernel_size[a] << ",d=" << n.dilation[a]
              << (n.causal[a] ? ",causal" : "") << ')';
          }
        }
        if constexpr (requires { p.options; }) s << options_string(p.options);
        if constexpr (requires { p.backward_impl; })
          if (p.backward_impl != fmha::BackwardImpl::kAuto)
            s << " backward_impl=" << static_cast<int>(p.backward_impl);
      },
      call.params);
  if (!call.offsets_q.empty()) {
    s << " cu_seqlens_q={";
    for (auto o : call.offsets_q) s << o << ',';
    s << "} cu_seqlens_k={";
    for (auto o : call.offsets_k) s << o << ',';
    s << '}';
  }
  return s.str();
}

// ---- Drawing a valid call
// ------------------------------------------------------------------------

class Builder {
 public:
  Builder(Call& call, Dice& dice, Arena& arena) : call_(call), dice_(dice), arena_(arena) {}

  // A tensor in the slot `view` with a random layout allowed for its role: contiguous, padded rows,
  // heads stored outside the tokens (token tensors: `heads_dim` >= 0), or (inputs) a broadcast
  // dimension.
  void tensor(TensorView* view, std::string name, Role role, DType dtype,
              std::vector<std::int64_t> shape, bool required,
              std::initializer_list<int> defines = {}, int heads_dim = -1) {
    Placement p;
    const int rank = static_cast<int>(shape.size());
    const std::int64_t pick = dice_.uniform(0, 9);
    if (pick <= 1) p.pad = dice_.uniform(1, 3);
    if (pick == 2 && heads_dim > 0) {
      p.order = {heads_dim};
      if (heads_dim > 1)
        p.order.insert(p.order.begin(), 0);  // [B, H, tokens..., D]; varlen [H, T, D]
      for (int d = heads_dim > 1 ? 1 : 0; d < rank - 1; ++d)
        if (d != heads_dim) p.order.push_back(d);
      p.order.push_back(rank - 1);
    }
    if (pick == 3 && (role == Role::kInput || role == Role::kStatInput) && rank >= 2) {
      p.zero.assign(shape.size(), false);
      p.zero[static_cast<std::size_t>(dice_.uniform(0, rank - 2))] =
          true;  // broadcast, never the last
    }
    *view = place(arena_, call_.device, dtype, shape, p);
    add(view, std::move(name), role, required, defines);
  }

  // bias / rel-pos: broadcast dimensions by size 1 or by stride 0.
  void broadcast_input(TensorView* view, std::string name, std::vector<std::int64_t> shape,
                       int broadcastable, std::initializer_list<int> defines = {}) {
    const std::vector<std::int64_t> full = shape;
    Placement p;
    p.zero.assign(shape.size(), false);
    for (int d = 0; d < broadcastable; ++d) {
      if (!dice_.chance(0.3)) continue;
      if (dice_.chance(0.5))
        shape[static_cast<std::size_t>(d)] = 1;
      else
        p.zero[static_cast<std::size_t>(d)] = true;
    }
    if (dice_.chance(0.2)) p.pad = dice_.uniform(1, 2);
    *view = place(arena_, call_.device, call_.dtype, shape, p);
    add(view, std::move(name), Role::kBroadcastInput, false, defines);
    std::copy(full.begin(), full.end(), call_.slots.back().full.begin());
  }

  // dbias: the bias's shape, stride 0 exactly where the bias has it on a dimension of size > 1.
  void broadcast_gradient(TensorView* view, const TensorView& bias) {
    Placement p;
    std::vector<std::int64_t> shape(bias.shape.begin(), bias.shape.begin() + bias.rank);
    p.zero.assign(shape.size(), false);
    for (int d = 0; d < bias.rank; ++d)
      p.zero[static_cast<std::size_t>(d)] = bias.shape[static_cast<std::size_t>(d)] > 1 &&
                                            bias.stride[static_cast<std::size_t>(d)] == 0;
    if (dice_.chance(0.2)) p.pad = dice_.uniform(1, 2);
    *view = place(arena_, call_.device, call_.dtype, shape, p);
    add(view, "grads.dbias", Role::kBroadcastGradient, false, {});
  }

  // A plain output with the shape of `like` (rel-pos gradients: the input's own shape).
  void output_like(TensorView* view, std::string name, const TensorView& like) {
    std::vector<std::int64_t> shape(like.shape.begin(), like.shape.begin() + like.rank);
    tensor(view, std::move(name), Role::kOutput, call_.dtype, shape, false);
  }

  void add(TensorView* view, std::string name, Role role, bool required,
           std::initializer_list<int> defines) {
    Slot s;
    s.name = std::move(name);
    s.view = view;
    s.role = role;
    s.required = required;
    for (int d : defines) s.defines[static_cast<std::size_t>(d)] = true;
    for (int d = 0; d < view->rank; ++d)
      s.full[static_cast<std::size_t>(d)] = view->shape[static_cast<std::size_t>(d)];
    call_.slots.push_back(std::move(s));
  }
  // An optional tensor left out: still a slot, so that a malformed "not given" view is tried.
  void absent(TensorView* view, std::string name, Role role) {
    *view = {};
    add(view, std::move(name), role, false, {});
  }

 private:
  Call& call_;
  Dice& dice_;
  Arena& arena_;
};

DType draw_dtype(Dice& dice, const Device& device) {
  const bool cpu = device.type == DeviceType::kCPU;
  switch (dice.uniform(0, cpu ? 4 : 3)) {
    case 0:
      return DType::kFloat16;
    case 1:
      return DType::kBFloat16;
    case 4:
      return DType::kFloat64;
    default:
      return DType::kFloat32;
  }
}

std::int64_t draw_head_dim(Dice& dice, bool may_be_wide) {
  if (may_be_wide && dice.chance(0.08)) return dice.chance(0.5) ? 256 : dice.uniform(33, 256);
  return dice.chance(0.5) ? dice.pick<std::int64_t>({1, 8, 16, 32}) : dice.uniform(1, 24);
}

void draw_options(Dice& dice, fmha::AttentionOptions* o, bool neighborhood) {
  if (dice.chance(0.3)) o->scale = static_cast<float>(dice.real(-2, 2));
  if (dice.chance(0.3)) o->softcap = static_cast<float>(dice.real(0.1, 50));
  if (!neighborhood) {
    o->causal = dice.chance(0.3);
    if (dice.chance(0.5)) o->causal_alignment = fmha::CausalAlignment::kBottomRight;
    if (dice.chance(0.3)) {
      o->window_left = dice.chance(0.1) ? kHuge : dice.uniform(-1, 12);
      o->window_right = dice.chance(0.1) ? kHuge : dice.uniform(-1, 12);
    }
  }
  o->deterministic = dice.chance(0.2);
  o->allow_tf32 = dice.chance(0.1);
}

// The attention entry points share everything but the token dimensions (dense [B, L],
// varlen [total], neighborhood [B, X1, (X2, (X3))]) and the layout arguments.
template <typename P>
void build_attention(Call& call, P& p, Dice& dice, Arena& arena) {
  Builder b(call, dice, arena);
  const Entry e = call.entry;
  const bool backward = is_backward(e);
  const DType dt = call.dtype;
  const std::int64_t hkv = dice.uniform(1, 3), heads = hkv * dice.uniform(1, 3);
  const bool narrow = is_neighborhood(e);
  const std::int64_t d = draw_head_dim(dice, !narrow),
                     dv = dice.chance(0.5) ? d : draw_head_dim(dice, !narrow);
  std::vector<std::int64_t> tokens_q, tokens_k;    // the dimensions before [H, D]
  std::vector<int> defines_q, defines_k;           // which of them q (resp. k) sets
  std::int64_t batch = 0, rows_q = 0, rows_k = 0;  // rows: Lq / max_seqlen_q / grid size
  if constexpr (requires { p.cu_seqlens_q; }) {
    batch = dice.chance(0.05) ? 0 : dice.uniform(1, 3);
    call.offsets_q.assign(1, 0);
    call.offsets_k.assign(1, 0);
    std::int64_t longest_q = 0, longest_k = 0;
    for (std::int64_t i = 0; i < batch; ++i) {
      const std::int64_t lq = dice.chance(0.15) ? 0 : dice.uniform(1, 8),
                         lk = dice.chance(0.15) ? 0 : dice.uniform(1, 8);
      call.offsets_q.push_back(static_cast<std::int32_t>(call.offsets_q.back() + lq));
      call.offsets_k.push_back(static_cast<std::int32_t>(call.offsets_k.back() + lk));
      longest_q = std::max(longest_q, lq);
      longest_k = std::max(longest_k, lk);
    }
    p.max_seqlen_q = rows_q = longest_q + (dice.chance(0.3) ? dice.uniform(1, 3) : 0);
    p.max_seqlen_k = rows_k = longest_k + (dice.chance(0.3) ? dice.uniform(1, 3) : 0);
    tokens_q = {call.offsets_q.back()};
    tokens_k = {call.offsets_k.back()};
    defines_q = {0};
    defines_k = {0};
    call.scalar_names = {"max_seqlen_q", "max_seqlen_k"};
  } else if constexpr (requires { p.neighborhood; }) {
    batch = dice.chance(0.05) ? 0 : dice.uniform(1, 3);
    auto& na = p.neighborhood;
    na.num_dims = static_cast<int>(dice.uniform(1, 3));
    tokens_q = {batch};
    defines_q = {0};
    rows_q = 1;
    for (int r = 0; r < 3; ++r) {
      const auto a = static_cast<std::size_t>(r);
      if (r >= na.num_dims) {  // ignored past num_dims: any value
        if (dice.chance(0.5)) na.kernel_size[a] = dice.pick<std::int64_t>({0, -1, 7, kHuge});
        if (dice.chance(0.5)) na.dilation[a] = dice.pick<std::int64_t>({0, -3, 5, kHuge});
        continue;
      }
      const std::int64_t x = dice.uniform(1, na.num_dims == 1 ? 8 : na.num_dims == 2 ? 5 : 3);
      call.grid[a] = x;
      na.kernel_size[a] = dice.uniform(1, x);
      na.dilation[a] = dice.uniform(1, x / na.kernel_size[a]);
      na.causal[a] = dice.chance(0.3);
      tokens_q.push_back(x);
      defines_q.push_back(r + 1);
      rows_q *= x;
      call.scalar_names.push_back(indexed("kernel_size", r));
      call.scalar_names.push_back(indexed("dilation", r));
    }
    call.scalar_names.push_back("neighborhood.num_dims");
    tokens_k = tokens_q;
    rows_k = rows_q;
  } else {
    batch = dice.chance(0.05) ? 0 : dice.uniform(1, 3);
    rows_q = dice.chance(0.08) ? 0 : dice.uniform(1, 9);
    rows_k = dice.chance(0.08) ? 0 : dice.uniform(1, 9);
    tokens_q = {batch, rows_q};
    tokens_k = {batch, rows_k};
    defines_q = {0, 1};
    defines_k = {1};
  }
  call.batch = is_varlen(e) ? static_cast<std::int64_t>(call.offsets_q.size()) - 1 : batch;
  call.heads = heads;
  call.rows_q = rows_q;
  call.rows_k = rows_k;
  const int token_rank = static_cast<int>(tokens_q.size());
  auto with = [](std::vector<std::int64_t> dims, std::int64_t h, std::int64_t w) {
    dims.push_back(h);
    dims.push_back(w);
    return dims;
  };
  auto dims_plus = [&](std::vector<int> dims, std::initializer_list<int> more) {
    dims.insert(dims.end(), more);
    return dims;
  };
  const int hd = token_rank;  // the head dimension's index
  // Token tensors ([tokens..., H, width]) may store their heads outside the tokens.
  auto make = [&](TensorView* v, const char* name, Role role, DType dtype,
                  std::vector<std::int64_t> shape, bool required, const std::vector<int>& defines) {
    const bool tokens = static_cast<int>(shape.size()) == hd + 2;
    b.tensor(v, name, role, dtype, std::move(shape), required, {}, tokens ? hd : -1);
    for (int x : defines) call.slots.back().defines[static_cast<std::size_t>(x)] = true;
  };
  make(&p.q, "q", Role::kInput, dt, with(tokens_q, heads, d), true,
       dims_plus(defines_q, {hd, hd + 1}));
  call.slots.back().anchor = true;
  make(&p.k, "k", Role::kInput, dt, with(tokens_k, hkv, d), true, dims_plus(defines_k, {hd}));
  make(&p.v, "v", Role::kInput, dt, with(tokens_k, hkv, dv), true, {hd + 1});
  if constexpr (requires { p.cu_seqlens_q; }) {
    const auto n = static_cast<std::int64_t>(call.offsets_q.size());
    p.cu_seqlens_q = place(arena, call.device, DType::kInt32, {n}, {});
    b.add(&p.cu_seqlens_q, "cu_seqlens_q", Role::kIndex, true, {0});
    p.cu_seqlens_k = place(arena, call.device, DType::kInt32, {n}, {});
    b.add(&p.cu_seqlens_k, "cu_seqlens_k", Role::kIndex, true, {});
    call.offsets_q_at = static_cast<unsigned char*>(p.cu_seqlens_q.data);
    call.offsets_k_at = static_cast<unsigned char*>(p.cu_seqlens_k.data);
  }
  const std::vector<std::int64_t> out_shape = with(tokens_q, heads, dv);
  std::vector<std::int64_t> lse_shape;
  if (is_varlen(e)) {
    lse_shape = {heads, tokens_q[0]};
  } else {
    lse_shape = tokens_q;
    lse_shape.insert(lse_shape.begin() + 1, heads);
  }
  make(&p.out, "out", backward ? Role::kInput : Role::kOutput, dt, out_shape, true, {});
  if (backward || dice.chance(0.7)) {
    make(&p.lse, "lse", backward ? Role::kStatInput : Role::kStatOutput, call.stat, lse_shape,
         backward, {});
  } else {
    b.absent(&p.lse, "lse", Role::kStatOutput);
  }
  // Options and their tensors.
  fmha::AttentionOptions& o = p.options;
  draw_options(dice, &o, is_neighborhood(e));
  const std::int64_t nb = call.batch;
  if (call.force_bias_gradient || dice.chance(0.35)) {
    b.broadcast_input(&o.bias, "options.bias", {nb, heads, rows_q, rows_k}, 4);
  } else {
    b.absent(&o.bias, "options.bias", Role::kBroadcastInput);
  }
  if (!is_varlen(e) && rows_k > 0 && dice.chance(0.3)) {
    std::vector<std::int64_t> divisors;
    for (std::int64_t x = 1; x <= rows_k; ++x)
      if (rows_k % x == 0) divisors.push_back(x);
    const std::int64_t hk = divisors[static_cast<std::size_t>(
        dice.uniform(0, static_cast<std::int64_t>(divisors.size()) - 1))];
    b.broadcast_input(&o.rel_h, "options.rel_h", {nb, heads, rows_q, hk}, 3, {3});
    call.slots.back().partners = {"options.rel_w"};
    b.broadcast_input(&o.rel_w, "options.rel_w", {nb, heads, rows_q, rows_k / hk}, 3, {3});
    call.slots.back().partners = {"options.rel_h"};
  } else {
    b.absent(&o.rel_h, "options.rel_h", Role::kBroadcastInput);
    b.absent(&o.rel_w, "options.rel_w", Role::kBroadcastInput);
  }
  if (dice.chance(0.3)) {
    make(&o.sinks, "options.sinks", Role::kStatInput, call.stat, {heads}, false, {});
  } else {
    b.absent(&o.sinks, "options.sinks", Role::kStatInput);
  }
  if (dice.chance(0.3)) {
    const std::int64_t r = dice.uniform(0, 3);
    b.tensor(&o.extra_k, "options.extra_k", Role::kInput, dt, {nb, r, hkv, d}, false, {1});
    call.slots.back().partners = {"options.extra_v"};
    b.tensor(&o.extra_v, "options.extra_v", Role::kInput, dt, {nb, r, hkv, dv}, false);
    call.slots.back().partners = {"options.extra_k"};
  } else {
    b.absent(&o.extra_k, "options.extra_k", Role::kInput);
    b.absent(&o.extra_v, "options.extra_v", Role::kInput);
  }
  if constexpr (requires { p.grads; }) {
    make(&p.dout, "dout", Role::kInput, dt, out_shape, true, {});
    if (dice.chance(0.5)) {
      make(&p.dlse, "dlse", Role::kStatInput, call.stat, lse_shape, false, {});
    } else {
      b.absent(&p.dlse, "dlse", Role::kStatInput);
    }
    p.backward_impl = dice.pick(
        {fmha::BackwardImpl::kAuto, fmha::BackwardImpl::kFused, fmha::BackwardImpl::kSplit});
    auto& g = p.grads;
    make(&g.dq, "grads.dq", Role::kOutput, dt, with(tokens_q, heads, d), true, {});
    make(&g.dk, "grads.dk", Role::kOutput, dt, with(tokens_k, hkv, d), true, {});
    make(&g.dv, "grads.dv", Role::kOutput, dt, with(tokens_k, hkv, dv), true, {});
    // Each optional gradient, when its input is given, half of the time; its input then names it.
    auto needs = [&](const char* input, const char* grad) {
      call.slot(input)->partners.push_back(grad);
    };
    if (o.bias.rank != 0 && (call.force_bias_gradient || dice.chance(0.5))) {
      b.broadcast_gradient(&g.dbias, o.bias);
      needs("options.bias", "grads.dbias");
    } else {
      b.absent(&g.dbias, "grads.dbias", Role::kBroadcastGradient);
    }
    if (o.rel_h.rank != 0 && dice.chance(0.5)) {
      b.output_like(&g.drel_h, "grads.drel_h", o.rel_h);
      b.output_like(&g.drel_w, "grads.drel_w", o.rel_w);
      needs("options.rel_h", "grads.drel_h");
      needs("options.rel_w", "grads.drel_w");
    } else {
      b.absent(&g.drel_h, "grads.drel_h", Role::kOutput);
      b.absent(&g.drel_w, "grads.drel_w", Role::kOutput);
    }
    if (o.sinks.rank != 0 && dice.chance(0.5)) {
      make(&g.dsinks, "grads.dsinks", Role::kStatOutput, call.stat, {heads}, false, {});
      needs("options.sinks", "grads.dsinks");
    } else {
      b.absent(&g.dsinks, "grads.dsinks", Role::kStatOutput);
    }
    if (o.extra_k.rank != 0 && dice.chance(0.5)) {
      b.output_like(&g.dextra_k, "grads.dextra_k", o.extra_k);
      b.output_like(&g.dextra_v, "grads.dextra_v", o.extra_v);
      needs("options.extra_k", "grads.dextra_k");
      needs("options.extra_v", "grads.dextra_v");
    } else {
      b.absent(&g.dextra_k, "grads.dextra_k", Role::kOutput);
      b.absent(&g.dextra_v, "grads.dextra_v", Role::kOutput);
    }
  }
}

template <typename P>
void build_merge(Call& call, P& p, Dice& dice, Arena& arena) {
  Builder b(call, dice, arena);
  const std::int64_t batch = dice.chance(0.05) ? 0 : dice.uniform(1, 3),
                     rows = dice.chance(0.05) ? 0 : dice.uniform(1, 9);
  const std::int64_t heads = dice.uniform(1, 6), dv = draw_head_dim(dice, true);
  const std::int64_t parts = dice.uniform(1, 4);
  const DType dt = call.dtype;
  const std::vector<std::int64_t> out_shape{batch, rows, heads, dv}, lse_shape{batch, heads, rows};
  const bool backward = is_backward(call.entry);
  // The vectors keep room for the parts a corruption adds, so that the slots stay valid.
  for (auto* list : {&p.outs, &p.lses}) list->reserve(static_cast<std::size_t>(parts) + 2);
  p.outs.resize(static_cast<std::size_t>(parts));
  p.lses.resize(static_cast<std::size_t>(parts));
  b.tensor(&p.out, "out", backward ? Role::kInput : Role::kOutput, dt, out_shape, true,
           {0, 1, 2, 3}, 2);
  call.slots.back().anchor = true;
  b.tensor(&p.lse, "lse", backward ? Role::kStatInput : Role::kStatOutput, call.stat, lse_shape,
           true);
  for (std::int64_t i = 0; i < parts; ++i) {
    const auto at = static_cast<std::size_t>(i);
    b.tensor(&p.outs[at], indexed("outs", i), Role::kInput, dt, out_shape, true, {}, 2);
    b.tensor(&p.lses[at], indexed("lses", i), Role::kStatInput, call.stat, lse_shape, true);
  }
  if constexpr (requires { p.douts; }) {
    b.tensor(&p.dout, "dout", Role::kInput, dt, out_shape, true, {}, 2);
    if (dice.chance(0.5)) {
      b.tensor(&p.dlse, "dlse", Role::kStatInput, call.stat, lse_shape, false);
    } else {
      b.absent(&p.dlse, "dlse", Role::kStatInput);
    }
    for (auto* list : {&p.douts, &p.dlses}) list->reserve(static_cast<std::size_t>(parts) + 2);
    p.douts.resize(static_cast<std::size_t>(parts));
    p.dlses.resize(static_cast<std::size_t>(parts));
    for (std::int64_t i = 0; i < parts; ++i) {
      const auto at = static_cast<std::size_t>(i);
      b.tensor(&p.douts[at], indexed("douts", i), Role::kOutput, dt, out_shape, true, {}, 2);
      b.tensor(&p.dlses[at], indexed("dlses", i), Role::kStatOutput, call.stat, lse_shape, true);
    }
  }
  call.scalar_names = {"outs", "lses", "douts", "dlses"};
}

void build(Call& call, Entry entry, Dice& dice, Arena& arena, Device device) {
  call.entry = entry;
  call.device = device;
  call.reads_offsets = device.type == DeviceType::kCPU;
  call.dtype = draw_dtype(dice, device);
  call.stat = call.dtype == DType::kFloat64 && dice.chance(0.5) ? DType::kFloat64 : DType::kFloat32;
  switch (entry) {
    case Entry::kDenseForward:
      build_attention(call, call.params.emplace<fmha::AttentionForwardParams>(), dice, arena);
      break;
    case Entry::kDenseBackward:
      build_attention(call, call.params.emplace<fmha::AttentionBackwardParams>(), dice, arena);
      break;
    case Entry::kVarlenForward:
      build_attention(call, call.params.emplace<fmha::VarlenForwardParams>(), dice, arena);
      break;
    case Entry::kVarlenBackward:
      build_attention(call, call.params.emplace<fmha::VarlenBackwardParams>(), dice, arena);
      break;
    case Entry::kNeighborhoodForward:
      build_attention(call, call.params.emplace<fmha::NeighborhoodForwardParams>(), dice, arena);
      break;
    case Entry::kNeighborhoodBackward:
      build_attention(call, call.params.emplace<fmha::NeighborhoodBackwardParams>(), dice, arena);
      break;
    case Entry::kMergeForward:
      build_merge(call, call.params.emplace<fmha::MergeForwardParams>(), dice, arena);
      break;
    case Entry::kMergeBackward:
      build_merge(call, call.params.emplace<fmha::MergeBackwardParams>(), dice, arena);
      break;
  }
}

// ---- Corruptions
// ---------------------------------------------------------------------------------

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
constexpr int kKinds = 26;

const char* kind_name(Kind k) {
  static constexpr const char* kNames[kKinds] = {"missing",
                                                 "rank",
                                                 "rank-out-of-range",
                                                 "dtype",
                                                 "dtype-unknown",
                                                 "device",
                                                 "call-device",
                                                 "float64-on-cuda",
                                                 "shape",
                                                 "negative-size",
                                                 "huge-size",
                                                 "negative-stride",
                                                 "last-stride",
                                                 "overflow-stride",
                                                 "output-broadcast",
                                                 "output-overlap",
                                                 "dbias-broadcast",
                                                 "null-data",
                                                 "misaligned",
                                                 "orphan-gradient",
                                                 "option",
                                                 "neighborhood",
                                                 "max-seqlen",
                                                 "offsets",
                                                 "varlen-rel-pos",
                                                 "part-count"};
  return kNames[static_cast<int>(k)];
}

// The entry points a kind of corruption applies to, and the devices (cu_seqlens values are read
// on the CPU only).
bool fits(Kind k, Entry e) {
  switch (k) {
    case Kind::kOffsets:
    case Kind::kMaxSeqlen:
    case Kind::kVarlenRelPos:
      return is_varlen(e);
    case Kind::kNeighborhood:
      return is_neighborhood(e);
    case Kind::kPartCount:
      return is_merge(e);
    case Kind::kBroadcastGradient:
    case Kind::kOrphanGradient:
      return is_backward(e) && !is_merge(e);
    case Kind::kOption:
      return !is_merge(e);
    default:
      return true;
  }
}
bool fits(Kind k, const Device& device) {
  return k != Kind::kOffsets || device.type == DeviceType::kCPU;
}

std::int64_t numel(const TensorView& t) {
  std::int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) n *= t.shape[static_cast<std::size_t>(d)];
  return n;
}

class Corruptor {
 public:
  Corruptor(Call& call, Dice& dice, Arena& arena) : call_(call), dice_(dice), arena_(arena) {}

  // Applies corruption `kind` when it fits the call; false when it does not.
  bool apply(Kind kind, Expected* x) {
    switch (kind) {
      case Kind::kMissing:
        return missing(x);
      case Kind::kRank:
        return rank(x);
      case Kind::kRankOutOfRange:
        return rank_out_of_range(x);
      case Kind::kDtype:
        return dtype(x);
      case Kind::kDtypeUnknown:
        return dtype_unknown(x);
      case Kind::kDevice:
        return device(x);
      case Kind::kCallDevice:
        return call_device(x);
      case Kind::kFloat64OnCuda:
        return float64_on_cuda(x);
      case Kind::kShape:
        return shape(x);
      case Kind::kNegativeSize:
        return negative_size(x);
      case Kind::kHugeSize:
        return huge_size(x);
      case Kind::kNegativeStride:
        return negative_stride(x);
      case Kind::kLastStride:
        return last_stride(x);
      case Kind::kOverflowStride:
        return overflow_stride(x);
      case Kind::kOutputBroadcast:
        return output_broadcast(x);
      case Kind::kOutputOverlap:
        return output_overlap(x);
      case Kind::kBroadcastGradient:
        return broadcast_gradient(x);
      case Kind::kNullData:
        return null_data(x);
      case Kind::kMisaligned:
        return misaligned(x);
      case Kind::kOrphanGradient:
        return orphan_gradient(x);
      case Kind::kOption:
        return option(x);
      case Kind::kNeighborhood:
        return neighborhood(x);
      case Kind::kMaxSeqlen:
        return max_seqlen(x);
      case Kind::kOffsets:
        return offsets(x);
      case Kind::kVarlenRelPos:
        return varlen_rel_pos(x);
      case Kind::kPartCount:
        return part_count(x);
    }
    return false;
  }

 private:
  Slot* pick(const std::function<bool(const Slot&)>& fits) {
    std::vector<Slot*> candidates;
    for (Slot& s : call_.slots)
      if (fits(s)) candidates.push_back(&s);
    if (candidates.empty()) return nullptr;
    return candidates[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(candidates.size()) - 1))];
  }
  static bool given(const Slot& s) { return s.view->rank != 0; }
  static bool has_elements(const Slot& s) { return given(s) && numel(*s.view) > 0; }
  Slot* anchor() {
    for (Slot& s : call_.slots)
      if (s.anchor) return &s;
    return nullptr;
  }
  // A dimension of `s` for which `fits(d)` holds, or -1.
  int pick_dim(const Slot& s, const std::function<bool(int)>& fits) {
    std::vector<int> dims;
    for (int d = 0; d < s.view->rank; ++d)
      if (fits(d)) dims.push_back(d);
    if (dims.empty()) return -1;
    return dims[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(dims.size()) - 1))];
  }
  static std::int64_t& size(Slot& s, int d) { return s.view->shape[static_cast<std::size_t>(d)]; }
  static std::int64_t& stride(Slot& s, int d) {
    return s.view->stride[static_cast<std::size_t>(d)];
  }
  void named(Expected* x, const Slot& s, const std::string& what) {
    x->names.push_back(s.name);
    x->what = s.name + ": " + what;
  }

  bool missing(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s) && (s.required || !s.partners.empty()); });
    if (!s) return false;
    *s->view = {};
    named(x, *s, "not given");
    for (const auto& p : s->partners) x->names.push_back(p);
    return true;
  }

  bool rank(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    TensorView& t = *s->view;
    const bool grow = t.rank == 1 || (t.rank < kMaxRank && dice_.chance(0.5));
    if (grow) {
      t.shape[static_cast<std::size_t>(t.rank)] = 1;
      t.stride[static_cast<std::size_t>(t.rank)] = 1;
      ++t.rank;
    } else {
      --t.rank;
    }
    named(x, *s, "rank " + std::to_string(t.rank));
    return true;
  }

  bool rank_out_of_range(Expected* x) {
    Slot* s = pick([](const Slot&) { return true; });
    if (!s) return false;
    const int r = dice_.pick<int>({-1, -2, -100, std::numeric_limits<int>::min(), kMaxRank + 1,
                                   kMaxRank + 2, 64, 1000, std::numeric_limits<int>::max()});
    s->view->rank = r;
    named(x, *s, "rank " + std::to_string(r) + (given(*s) ? "" : " on a view that was not given"));
    return true;
  }

  // A dtype the slot's role refuses.
  bool dtype(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    std::vector<DType> refused;
    for (DType d :
         {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32}) {
      bool accepted = false;
      if (s->role == Role::kIndex)
        accepted = d == DType::kInt32;
      else if (is_stat(s->role))
        accepted = d == DType::kFloat32 || (d == DType::kFloat64 && call_.dtype == DType::kFloat64);
      else
        accepted = d == s->view->dtype;  // data tensors: the anchor's dtype (the anchor: its own)
      if (!accepted) refused.push_back(d);
    }
    const DType d = refused[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(refused.size()) - 1))];
    s->view->dtype = d;
    named(x, *s, std::string("dtype ") + fmha::to_string(d));
    if (s->anchor && d == DType::kFloat64 && call_.device.type != DeviceType::kCPU)
      x->code = StatusCode::kNotSupported;
    return true;
  }

  bool dtype_unknown(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    const int value = static_cast<int>(dice_.uniform(5, 255));
    s->view->dtype = static_cast<DType>(value);
    named(x, *s, "dtype value " + std::to_string(value));
    return true;
  }

  Device other_device(const Device& now) {
    std::vector<Device> choices{Device::cuda(0),
                                Device::cuda(1),
                                Device::cpu(),
                                {DeviceType::kCPU, 1},
                                {static_cast<DeviceType>(dice_.uniform(2, 255)), 0},
                                {DeviceType::kCUDA, -1}};
    std::vector<Device> others;
    for (const Device& d : choices)
      if (d != now) others.push_back(d);
    return others[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(others.size()) - 1))];
  }
  static std::string device_string(const Device& d) {
    return "device type " + std::to_string(static_cast<int>(d.type)) + " index " +
           std::to_string(d.index);
  }

  bool device(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    const Device d = other_device(s->view->device);
    s->view->device = d;
    named(x, *s, "on " + device_string(d));
    if (s->anchor && call_.dtype == DType::kFloat64 && d.type == DeviceType::kCUDA && d.index >= 0)
      x->code = StatusCode::kNotSupported;
    return true;
  }

  // Every tensor on a device that does not exist.
  bool call_device(Expected* x) {
    const Device d = dice_.chance(0.5)
                         ? Device{static_cast<DeviceType>(dice_.uniform(2, 255)), 0}
                         : Device{DeviceType::kCUDA, static_cast<int>(dice_.uniform(-1000, -1))};
    for (Slot& s : call_.slots)
      if (given(s)) s.view->device = d;
    named(x, *anchor(), "every tensor on " + device_string(d));
    return true;
  }

  // Every data tensor float64 (statistics float32) on a CUDA device: refused as not supported.
  bool float64_on_cuda(Expected* x) {
    const Device cuda = call_.device.type == DeviceType::kCUDA ? call_.device : Device::cuda(0);
    for (Slot& s : call_.slots) {
      if (!given(s)) continue;
      s.view->device = cuda;
      if (s.role == Role::kIndex) continue;
      s.view->dtype = is_stat(s.role) ? DType::kFloat32 : DType::kFloat64;
    }
    named(x, *anchor(), "float64 on " + fmha::to_string(cuda));
    x->code = StatusCode::kNotSupported;
    return true;
  }

  bool shape(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    const int d = static_cast<int>(dice_.uniform(0, s->view->rank - 1));
    const std::int64_t old = size(*s, d);
    std::vector<std::int64_t> sizes;
    for (std::int64_t n : {old + 1, old + 2, old - 1, std::int64_t{0}, 2 * old + 3}) {
      if (n < 0 || n == old || std::find(sizes.begin(), sizes.end(), n) != sizes.end()) continue;
      // A broadcast input passes with the full size or 1.
      if (s->role == Role::kBroadcastInput && (n == 1 || n == s->full[static_cast<std::size_t>(d)]))
        continue;
      sizes.push_back(n);
    }
    const std::int64_t n = sizes[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(sizes.size()) - 1))];
    size(*s, d) = n;
    named(x, *s,
          "size " + std::to_string(n) + " instead of " + std::to_string(old) + " on dimension " +
              std::to_string(d));
    x->any_name = s->defines[static_cast<std::size_t>(d)];
    return true;
  }

  bool negative_size(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    const int d = static_cast<int>(dice_.uniform(0, s->view->rank - 1));
    size(*s, d) = -dice_.uniform(1, 9);
    named(x, *s, "size " + std::to_string(size(*s, d)) + " on dimension " + std::to_string(d));
    return true;
  }

  // A size whose element count overflows int64.
  bool huge_size(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s) && s.view->rank >= 2; });
    if (!s) return false;
    const int d = static_cast<int>(dice_.uniform(0, s->view->rank - 1));
    const int other = (d + 1) % s->view->rank;
    size(*s, d) = kHuge + dice_.uniform(0, 5);
    if (size(*s, other) < 2) size(*s, other) = 2;
    named(x, *s, "size " + std::to_string(size(*s, d)) + " on dimension " + std::to_string(d));
    // With a zero size elsewhere the count does not overflow: then it is a size q or k sets for
    // others.
    x->any_name = s->defines[static_cast<std::size_t>(d)];
    return true;
  }

  bool negative_stride(Expected* x) {
    Slot* s = pick([](const Slot& s) { return given(s); });
    if (!s) return false;
    const int d = static_cast<int>(dice_.uniform(0, s->view->rank - 1));
    stride(*s, d) = -dice_.uniform(1, 100);
    named(x, *s, "stride " + std::to_string(stride(*s, d)) + " on dimension " + std::to_string(d));
    return true;
  }

  // The last dimension (size > 1) not contiguous.
  bool last_stride(Expected* x) {
    Slot* s = pick([](const Slot& s) { return has_elements(s) && s.view->size(-1) > 1; });
    if (!s) return false;
    const int last = s->view->rank - 1;
    std::vector<std::int64_t> strides{2, 3, s->view->size(-1) + 1};
    const bool zero_is_valid = s->role == Role::kBroadcastInput ||
                               (s->role == Role::kBroadcastGradient && stride(*s, last) == 0);
    if (!zero_is_valid) strides.push_back(0);
    if (s->role == Role::kBroadcastGradient && stride(*s, last) == 0) strides.push_back(1);
    const std::int64_t n = strides[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(strides.size()) - 1))];
    stride(*s, last) = n;
    named(x, *s, "stride " + std::to_string(n) + " on the last dimension");
    return true;
  }

  bool overflow_stride(Expected* x) {
    Slot* s = pick([](const Slot& s) {
      if (!has_elements(s)) return false;
      for (int d = 0; d < s.view->rank; ++d)
        if (s.view->shape[static_cast<std::size_t>(d)] >= 3) return true;
      return false;
    });
    if (!s) return false;
    const int d = pick_dim(*s, [&](int d) { return size(*s, d) >= 3; });
    stride(*s, d) = kHuge + dice_.uniform(0, 99);
    named(x, *s, "stride " + std::to_string(stride(*s, d)) + " on dimension " + std::to_string(d));
    return true;
  }

  // An output broadcast over a dimension: its elements share memory.
  bool output_broadcast(Expected* x) {
    auto fits = [](const Slot& s) {
      if (!has_elements(s) || !(s.role == Role::kOutput || s.role == Role::kStatOutput))
        return false;
      for (int d = 0; d + 1 < s.view->rank; ++d)
        if (s.view->shape[static_cast<std::size_t>(d)] > 1) return true;
      return false;
    };
    Slot* s = pick(fits);
    if (!s) return false;
    const int d = pick_dim(*s, [&](int d) { return d + 1 < s->view->rank && size(*s, d) > 1; });
    stride(*s, d) = 0;
    named(x, *s, "stride 0 on dimension " + std::to_string(d) + " of an output");
    return true;
  }

  // An output whose strides send two elements to one address.
  bool output_overlap(Expected* x) {
    auto spans = [](const Slot& s, int d) {
      return s.view->shape[static_cast<std::size_t>(d)] > 1 &&
             s.view->stride[static_cast<std::size_t>(d)] != 0;
    };
    auto fits = [&](const Slot& s) {
      if (!has_elements(s) || !is_output(s.role)) return false;
      int n = 0;
      for (int d = 0; d < s.view->rank; ++d) n += spans(s, d);
      return n >= 2;
    };
    Slot* s = pick(fits);
    if (!s) return false;
    const int d1 = pick_dim(*s, [&](int d) { return spans(*s, d) && d + 1 < s->view->rank; });
    if (d1 < 0) return false;
    const int d2 = pick_dim(*s, [&](int d) { return spans(*s, d) && d != d1; });
    stride(*s, d1) = stride(*s, d2);
    named(x, *s,
          "stride of dimension " + std::to_string(d1) + " = that of dimension " +
              std::to_string(d2) + " (elements share memory)");
    return true;
  }

  // dbias zero-strided where bias is not, or the reverse.
  bool broadcast_gradient(Expected* x) {
    Slot* db = call_.slot("grads.dbias");
    Slot* bias = call_.slot("options.bias");
    if (!db || !bias || !has_elements(*db)) return false;
    const int d =
        pick_dim(*bias, [&](int d) { return size(*bias, d) > 1 && stride(*bias, d) != 0; });
    if (d < 0) return false;
    if (dice_.chance(0.5)) {
      stride(*db, d) = 0;
      named(x, *db, "stride 0 on dimension " + std::to_string(d) + " where options.bias has none");
    } else {
      stride(*bias, d) = 0;
      named(x, *db,
            "dense on dimension " + std::to_string(d) + " where options.bias is made stride 0");
    }
    return true;
  }

  bool null_data(Expected* x) {
    Slot* s = pick(has_elements);
    if (!s) return false;
    s->view->data = nullptr;
    named(x, *s, "null data");
    return true;
  }

  bool misaligned(Expected* x) {
    Slot* s = pick(
        [](const Slot& s) { return has_elements(s) && fmha::element_size(s.view->dtype) > 1; });
    if (!s) return false;
    const auto offset =
        dice_.uniform(1, static_cast<std::int64_t>(fmha::element_size(s->view->dtype)) - 1);
    s->view->data = static_cast<unsigned char*>(s->view->data) + offset;
    named(x, *s, "data misaligned by " + std::to_string(offset) + " bytes");
    return true;
  }

  // A gradient given without its input (rel-pos and extra keys: without either half of the pair).
  bool orphan_gradient(Expected* x) {
    std::vector<std::vector<std::string>> groups;
    for (const auto& g : std::vector<std::vector<std::string>>{
             {"options.bias", "grads.dbias"},
             {"options.rel_h", "options.rel_w", "grads.drel_h"},
             {"options.sinks", "grads.dsinks"},
             {"options.extra_k", "options.extra_v", "grads.dextra_k"}}) {
      Slot* grad = call_.slot(g.back());
      if (grad && given(*grad)) groups.push_back(g);
    }
    if (groups.empty()) return false;
    const auto& g = groups[static_cast<std::size_t>(
        dice_.uniform(0, static_cast<std::int64_t>(groups.size()) - 1))];
    for (std::size_t i = 0; i + 1 < g.size(); ++i) *call_.slot(g[i])->view = {};
    x->names = g;
    if (g.size() == 3)
      x->names.push_back(g[2] == "grads.drel_h" ? "grads.drel_w" : "grads.dextra_v");
    x->what = g.back() + " given without its input";
    return true;
  }

  // An attention option out of range.
  bool option(Expected* x) {
    fmha::AttentionOptions* o = call_.options();
    if (!o) return false;
    const float nan = std::numeric_limits<float>::quiet_NaN(),
                inf = std::numeric_limits<float>::infinity();
    const bool backward = is_backward(call_.entry);
    switch (dice_.uniform(0, backward ? 5 : 4)) {
      case 0:
      case 1: {
        const bool left = dice_.chance(0.5);
        std::int64_t& w = left ? o->window_left : o->window_right;
        w = dice_.pick<std::int64_t>({-2, -3, -100, std::numeric_limits<std::int64_t>::min()});
        x->names = {left ? "options.window_left" : "options.window_right"};
        x->what = x->names[0] + " = " + std::to_string(w);
        break;
      }
      case 2:
        o->softcap = dice_.pick<float>({-1.0f, -1e-30f, nan, inf, -inf});
        x->names = {"options.softcap"};
        x->what = "options.softcap = " + std::to_string(o->softcap);
        break;
      case 3:
        o->scale = dice_.pick<float>({nan, inf, -inf});
        x->names = {"options.scale"};
        x->what = "options.scale = " + std::to_string(*o->scale);
        break;
      case 4: {
        const int v = static_cast<int>(dice_.uniform(2, 255));
        o->causal_alignment = static_cast<fmha::CausalAlignment>(v);
        x->names = {"options.causal_alignment"};
        x->what = "options.causal_alignment = " + std::to_string(v);
        break;
      }
      default: {
        const int v = static_cast<int>(dice_.uniform(3, 255));
        std::visit(
            [&](auto& p) {
              if constexpr (requires { p.backward_impl; })
                p.backward_impl = static_cast<fmha::BackwardImpl>(v);
            },
            call_.params);
        x->names = {"backward_impl"};
        x->what = "backward_impl = " + std::to_string(v);
        break;
      }
    }
    return true;
  }

  // Neighborhood arguments: num_dims, kernel_size, dilation, and the sequence masks it refuses.
  bool neighborhood(Expected* x) {
    if (!is_neighborhood(call_.entry)) return false;
    fmha::NeighborhoodOptions* na = nullptr;
    std::visit(
        [&](auto& p) {
          if constexpr (requires { p.neighborhood; }) na = &p.neighborhood;
        },
        call_.params);
    fmha::AttentionOptions* o = call_.options();
    const int r = static_cast<int>(dice_.uniform(0, na->num_dims - 1));
    const auto a = static_cast<std::size_t>(r);
    const std::string kernel = indexed("kernel_size", r), dilation = indexed("dilation", r);
    switch (dice_.uniform(0, 6)) {
      case 0: {  // out of range, or another valid count that disagrees with q's rank
        const int n = dice_.chance(0.5) ? dice_.pick<int>({0, -1, 4, 100}) : (na->num_dims % 3) + 1;
        na->num_dims = n;
        x->names = {"neighborhood.num_dims", "q"};
        x->what = "neighborhood.num_dims = " + std::to_string(n);
        break;
      }
      case 1:
        na->kernel_size[a] = -dice_.uniform(0, 3);
        x->names = {kernel};
        x->what = kernel + " = " + std::to_string(na->kernel_size[a]);
        break;
      case 2:
        na->dilation[a] = -dice_.uniform(0, 3);
        x->names = {dilation};
        x->what = dilation + " = " + std::to_string(na->dilation[a]);
        break;
      case 3:  // the window wider than the grid
        if (dice_.chance(0.5))
          na->kernel_size[a] = call_.grid[a] / na->dilation[a] + 1;
        else
          na->dilation[a] = call_.grid[a] / na->kernel_size[a] + 1;
        x->names = {kernel, dilation};
        x->what = kernel + " * " + dilation + " = " + std::to_string(na->kernel_size[a]) + " * " +
                  std::to_string(na->dilation[a]) + " > grid " + std::to_string(call_.grid[a]);
        break;
      case 4:
        na->dilation[a] = kHuge;
        x->names = {kernel, dilation};
        x->what = dilation + " = 2^62";
        break;
      case 5:
        o->causal = true;
        x->names = {"options.causal"};
        x->what = "options.causal = true in neighborhood attention";
        break;
      default: {
        const bool left = dice_.chance(0.5);
        (left ? o->window_left : o->window_right) = dice_.uniform(0, 5);
        x->names = {left ? "options.window_left" : "options.window_right"};
        x->what = x->names[0] + " set in neighborhood attention";
        break;
      }
    }
    return true;
  }

  // max_seqlen negative, or (CPU, where the offsets are read) shorter than a sequence.
  bool max_seqlen(Expected* x) {
    if (!is_varlen(call_.entry)) return false;
    const bool q = dice_.chance(0.5);
    const std::vector<std::int32_t>& offsets = q ? call_.offsets_q : call_.offsets_k;
    std::int64_t longest = 0;
    for (std::size_t i = 1; i < offsets.size(); ++i)
      longest = std::max<std::int64_t>(longest, offsets[i] - offsets[i - 1]);
    std::int64_t value = -dice_.uniform(1, 5);
    if (call_.reads_offsets && longest > 0 && dice_.chance(0.5))
      value = dice_.uniform(0, longest - 1);
    std::visit(
        [&](auto& p) {
          if constexpr (requires { p.max_seqlen_q; }) (q ? p.max_seqlen_q : p.max_seqlen_k) = value;
        },
        call_.params);
    const std::string name = q ? "max_seqlen_q" : "max_seqlen_k";
    x->names = {name, q ? "cu_seqlens_q" : "cu_seqlens_k"};
    x->what = name + " = " + std::to_string(value) + " (longest sequence " +
              std::to_string(longest) + ")";
    return true;
  }

  // cu_seqlens values that are not offsets of the rows (read on the CPU only).
  bool offsets(Expected* x) {
    if (!is_varlen(call_.entry) || !call_.reads_offsets) return false;
    const bool q = dice_.chance(0.5);
    std::vector<std::int32_t>& o = q ? call_.offsets_q : call_.offsets_k;
    const auto n = static_cast<std::int64_t>(o.size());
    const std::string name = q ? "cu_seqlens_q" : "cu_seqlens_k";
    std::string what;
    switch (n == 1 ? dice_.uniform(0, 1) : dice_.uniform(0, 3)) {
      case 0:
        o[0] = static_cast<std::int32_t>(
            dice_.pick<std::int64_t>({1, 2, -1, std::numeric_limits<std::int32_t>::max()}));
        what = "[0] = " + std::to_string(o[0]);
        break;
      case 1: {  // the last offset is not the row count
        std::int32_t& last = o.back();
        last = static_cast<std::int32_t>(last + dice_.pick<std::int64_t>({1, 2, -1, -2}));
        if (last < 0) last = static_cast<std::int32_t>(o.size() > 1 ? o[o.size() - 2] + 7 : 1);
        what = "[last] = " + std::to_string(last);
        break;
      }
      case 2: {  // an offset below the previous one
        const auto i = static_cast<std::size_t>(dice_.uniform(1, n - 1));
        o[i] = static_cast<std::int32_t>(o[i - 1] - dice_.uniform(1, 3));
        what = indexed("", static_cast<std::int64_t>(i)) + " below its predecessor";
        break;
      }
      default: {  // an offset above the next one (or the row count)
        const auto i = static_cast<std::size_t>(dice_.uniform(0, n - 2));
        o[i] = static_cast<std::int32_t>(o[i + 1] + dice_.uniform(1, 3));
        what = indexed("", static_cast<std::int64_t>(i)) + " above its successor";
        break;
      }
    }
    x->names = {name};
    x->what = name + what;
    return true;
  }

  // rel-pos on a packed batch, which has no common key grid.
  bool varlen_rel_pos(Expected* x) {
    if (!is_varlen(call_.entry)) return false;
    fmha::AttentionOptions* o = call_.options();
    const std::int64_t hk = std::max<std::int64_t>(call_.rows_k, 1);
    o->rel_h =
        place(arena_, call_.device, call_.dtype, {call_.batch, call_.heads, call_.rows_q, hk}, {});
    o->rel_w =
        place(arena_, call_.device, call_.dtype, {call_.batch, call_.heads, call_.rows_q, 1}, {});
    x->names = {"options.rel_h", "options.rel_w"};
    x->what = "rel_h / rel_w given to varlen attention";
    return true;
  }

  // Merge: as many lses as outs (and backward: douts, dlses), at least one part.
  bool part_count(Expected* x) {
    if (!is_merge(call_.entry)) return false;
    auto change = [&](std::vector<TensorView>& list, const char* name) {
      if (list.size() > 1 && dice_.chance(0.5))
        list.pop_back();
      else
        list.push_back(list.front());
      x->names = {name};
      x->what = std::string(name) + " count " + std::to_string(list.size());
    };
    std::visit(
        [&](auto& p) {
          if constexpr (requires { p.outs; }) {
            const std::int64_t pick = dice_.uniform(
                0, requires { p.douts; } ? 4 : 2);
            if (pick == 0) {
              p.outs.clear();
              p.lses.clear();
              x->names = {"outs"};
              x->what = "no parts";
            } else if (pick == 1) {
              change(p.lses, "lses");
              x->names.push_back("outs");
            } else if (pick == 2) {
              change(p.outs, "outs");
              x->names.push_back("lses");
            } else {
              if constexpr (requires { p.douts; })
                change(pick == 3 ? p.douts : p.dlses, pick == 3 ? "douts" : "dlses");
            }
          }
        },
        call_.params);
    return true;
  }

  Call& call_;
  Dice& dice_;
  Arena& arena_;
};

// True when `message` names `name` as a word: not inside a longer identifier ("q" is not named by
// "Lq" or "cu_seqlens_q"; "dout" not by "douts").
bool names_argument(const std::string& message, const std::string& name) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (std::size_t at = message.find(name); at != std::string::npos;
       at = message.find(name, at + 1)) {
    const bool starts = at == 0 || !(word(message[at - 1]) || message[at - 1] == '.');
    const std::size_t end = at + name.size();
    const bool ends = end >= message.size() || !word(message[end]);
    if (starts && ends) return true;
  }
  return false;
}

// Every argument name a message about this call may use.
std::vector<std::string> all_names(const Call& call) {
  std::vector<std::string> names = call.scalar_names;
  for (const Slot& s : call.slots) names.push_back(s.name);
  return names;
}

// Poisons the used part of the block, writes the varlen offsets, and returns its bytes.
std::vector<unsigned char> prepare_memory(Arena& arena, const Call& call) {
  Memory& m = arena.memory();
  m.fill(m.base(), 0xA5, arena.used());
  if (call.offsets_q_at)
    m.write(call.offsets_q_at, call.offsets_q.data(), call.offsets_q.size() * sizeof(std::int32_t));
  if (call.offsets_k_at)
    m.write(call.offsets_k_at, call.offsets_k.data(), call.offsets_k.size() * sizeof(std::int32_t));
  std::vector<unsigned char> bytes(arena.used());
  m.read(bytes.data(), m.base(), bytes.size());
  return bytes;
}

bool memory_unchanged(Arena& arena, const std::vector<unsigned char>& before,
                      std::size_t* first_changed) {
  std::vector<unsigned char> after(before.size());
  arena.memory().read(after.data(), arena.memory().base(), after.size());
  if (after == before) return true;
  *first_changed = static_cast<std::size_t>(
      std::mismatch(after.begin(), after.end(), before.begin()).first - after.begin());
  return false;
}

std::string status_string(const Status& s) {
  static constexpr const char* kCodes[] = {"ok", "invalid_argument", "not_supported",
                                           "backend_error"};
  return std::string(kCodes[static_cast<int>(s.code())]) +
         (s.message().empty() ? "" : " \"" + s.message() + "\"");
}

}  // namespace

void fuzz_invalid(Memory& memory, const FuzzRun& run) {
  Arena arena(memory);
  CrashNote crash_note;
  std::int64_t failures = 0;
  std::array<std::int64_t, kEntries> per_entry{};
  std::array<std::int64_t, kKinds> per_kind{};
  for (std::int64_t i = 0; i < run.count && failures < run.max_failures; ++i) {
    const std::uint64_t seed = run.seed + static_cast<std::uint64_t>(i);
    const std::string replay = run.replay_prefix + std::to_string(seed) + " " + run.replay_suffix;
    crash_note.set("invalid draw seed " + std::to_string(seed) + "; replay: " + replay);
    Dice dice(seed);
    arena.reset();
    Call call;
    // The corruption first, then an entry point it applies to: every kind gets its share.
    Kind kind = static_cast<Kind>(dice.uniform(0, kKinds - 1));
    while (!fits(kind, memory.device())) kind = static_cast<Kind>(dice.uniform(0, kKinds - 1));
    std::vector<Entry> entries;
    for (int e = 0; e < kEntries; ++e)
      if (fits(kind, static_cast<Entry>(e))) entries.push_back(static_cast<Entry>(e));
    const Entry entry = entries[static_cast<std::size_t>(
        dice.uniform(0, static_cast<std::int64_t>(entries.size()) - 1))];
    call.force_bias_gradient = kind == Kind::kBroadcastGradient || kind == Kind::kOrphanGradient;
    build(call, entry, dice, arena, memory.device());
    const std::string base = describe(call);
    auto fail = [&](const std::string& what) {
      ++failures;
      ADD_FAILURE() << "invalid draw seed " << seed << ": " << what << "\n  draw: " << base
                    << "\n  replay: " << replay;
    };
    if (arena.overflowed()) {
      fail("the draw does not fit the harness's memory block (" +
           std::to_string(memory.capacity()) + " bytes)");
      continue;
    }
    prepare_memory(arena, call);
    const Status valid = call.check();
    if (!valid.ok()) {
      fail("the valid call is refused: " + status_string(valid));
      continue;
    }
    Expected x;
    Corruptor corruptor(call, dice, arena);
    // A kind that does not fit this draw after all (e.g. no dimension of size > 1): another one.
    for (int attempt = 0; attempt < 100 && !corruptor.apply(kind, &x); ++attempt) {
      x = {};
      kind = static_cast<Kind>(dice.uniform(0, kKinds - 1));
    }
    if (arena.overflowed()) {
      fail("the corruption does not fit the harness's memory block");
      continue;
    }
    ++per_entry[static_cast<std::size_t>(entry)];
    ++per_kind[static_cast<std::size_t>(kind)];
    const std::string corrupted = std::string(kind_name(kind)) + ": " + x.what;
    if (run.verbose)
      std::cout << "invalid draw seed " << seed << ": " << base << "\n  corrupted " << corrupted
                << std::endl;
    const std::vector<unsigned char> before = prepare_memory(arena, call);
    const Status checked = call.check();
    std::size_t changed = 0;
    if (!memory_unchanged(arena, before, &changed)) {
      fail("check() wrote memory (byte " + std::to_string(changed) + ") after " + corrupted);
      continue;
    }
    if (checked.ok()) {
      fail("accepted by check() after " + corrupted);
      continue;
    }
    std::vector<std::string> problems;
    if (checked.code() != x.code)
      problems.push_back("status " + status_string(checked) + ", expected code " +
                         std::to_string(static_cast<int>(x.code)));
    if (checked.message().rfind("fmha: ", 0) != 0)
      problems.push_back("the message does not start with \"fmha: \"");
    bool named = false;
    for (const std::string& n : x.names) named = named || names_argument(checked.message(), n);
    if (!named && x.any_name)
      for (const std::string& n : all_names(call))
        named = named || names_argument(checked.message(), n);
    if (!named) {
      std::string expected;
      for (const std::string& n : x.names) expected += (expected.empty() ? "" : ", ") + n;
      problems.push_back("the message names none of: " + expected +
                         (x.any_name ? " (or any argument)" : ""));
    }
    const Status ran = call.run();
    if (ran.code() != checked.code() || ran.message() != checked.message())
      problems.push_back("run() returned " + status_string(ran) + " but check() " +
                         status_string(checked));
    if (!memory_unchanged(arena, before, &changed))
      problems.push_back("run() wrote memory (byte " + std::to_string(changed) +
                         ") although it refused the call");
    if (!problems.empty()) {
      std::string text = corrupted + "\n  message: " + checked.message();
      for (const std::string& p : problems) text += "\n  problem: " + p;
      fail(text);
    }
  }
  std::cout << "[ fuzz ] invalid draws from seed " << run.seed << ":";
  std::int64_t total = 0;
  for (int e = 0; e < kEntries; ++e) {
    std::cout << ' ' << entry_name(static_cast<Entry>(e)) << '='
              << per_entry[static_cast<std::size_t>(e)];
    total += per_entry[static_cast<std::size_t>(e)];
  }
  std::cout << " (" << total << " in all)\n[ fuzz ] corruptions:";
  for (int k = 0; k < kKinds; ++k)
    std::cout << ' ' << kind_name(static_cast<Kind>(k)) << '='
              << per_kind[static_cast<std::size_t>(k)];
  std::cout << std::endl;
}

}  // namespace fmha_fuzz
