// The fast CPU backend (src/cpu/) against the naive float64 oracle at SPEC §13 tolerances, on the
// shapes its tiling makes awkward (1 row, tile edges, Lq != Lk, head dims that are no multiple of
// the vector width), strided layouts and every feature it covers, forward and backward, on every
// instruction-set variant this machine runs and with both backward structures (split, fused); its
// results independent of the thread count, bit for bit; and the explicit choice of the reference.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cpu/backend.h"
#include "fmha/fmha.h"
#include "cpu/kernels.h"
#include "test_case.h"

namespace fmha_test {
namespace {

// Sets an environment variable for the scope of one check, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// The instruction-set variants this CPU runs, best first. avx512bf16 is not the default on every
// CPU that has it (backend.cpp: bf16_dot_pays), so it is asked for, unless FMHA_CPU_ISA already
// limits the variants.
std::vector<std::string> runnable_isas() {
  fmha::cpu::Isa best = fmha::cpu::Isa::kPortable;
  if (std::getenv("FMHA_CPU_ISA") != nullptr) {
    best = fmha::cpu::selected_isa();
  } else {
    ScopedEnv ask("FMHA_CPU_ISA", "avx512bf16");
    best = fmha::cpu::selected_isa();
  }
  std::vector<std::string> isas;
  switch (best) {
    case fmha::cpu::Isa::kAvx512Bf16:
      isas.push_back("avx512bf16");
      [[fallthrough]];
    case fmha::cpu::Isa::kAvx512:
      isas.push_back("avx512");
      [[fallthrough]];
    case fmha::cpu::Isa::kAvx2:
      isas.push_back("avx2");
      [[fallthrough]];
    case fmha::cpu::Isa::kPortable:
      isas.push_back("portable");
  }
  return isas;
}

// The case runs on the fast backend (not silently on the reference), and passes the oracle's
// checks on every ISA variant, with the split and the fused backward.
void check_fast(AttentionCase c, std::uint64_t seed) {
  SCOPED_TRACE(c.describe());
  ASSERT_TRUE(fmha::cpu::supports(c.options, c.dtype))
      << "the fast backend does not take this case";
  ASSERT_EQ(c.options.cpu_backend, fmha::CpuBackend::kAuto);
  for (const std::string& isa : runnable_isas()) {
    SCOPED_TRACE("FMHA_CPU_ISA=" + isa);
    ScopedEnv env("FMHA_CPU_ISA", isa);
    for (auto impl : {fmha::BackwardImpl::kSplit, fmha::BackwardImpl::kFused}) {
      c.backward_impl = impl;
      check_case(c, seed);
    }
  }
}

AttentionCase dense_case(std::int64_t lq, std::int64_t lk, std::int64_t d, std::int64_t dv) {
  AttentionCase c;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = d;
  c.value_dim = dv;
  c.seqlen_q = lq;
  c.seqlen_k = lk;
  c.dlse = true;
  return c;
}

// fmha::cpu_isa names the kernels' instruction set, which FMHA_CPU_ISA lowers.
TEST(CpuBackend, CpuIsaNamesTheSelectedInstructionSet) {
  EXPECT_EQ(std::string(fmha::cpu_isa()), fmha::cpu::to_string(fmha::cpu::selected_isa()));
  for (const std::string& isa : runnable_isas()) {
    ScopedEnv env("FMHA_CPU_ISA", isa);
    EXPECT_EQ(std::string(fmha::cpu_isa()), isa);
  }
  ScopedEnv env("FMHA_CPU_ISA", "portable");
  EXPECT_EQ(std::string(fmha::cpu_isa()), "portable");
}

TEST(CpuBackend, OddShapesEveryDtype) {
  struct Shape {
    std::int64_t lq, lk, d, dv;
  };
  const Shape shapes[] = {{1, 1, 40, 40},     {7, 7, 72, 72},    {129, 129, 8, 8}, {7, 129, 40, 24},
                          {129, 65, 200, 72}, {1, 130, 16, 200}, {64, 64, 64, 64}, {3, 0, 8, 8},
                          {0, 5, 8, 8},       {300, 270, 40, 24}};
  std::uint64_t seed = 10;
  for (const Shape& s : shapes) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      AttentionCase c = dense_case(s.lq, s.lk, s.d, s.dv);
      c.dtype = dtype;
      check_fast(c, ++seed);
    }
  }
}

TEST(CpuBackend, MasksBothAlignments) {
  std::uint64_t seed = 40;
  for (auto align : {fmha::CausalAlignment::kTopLeft, fmha::CausalAlignment::kBottomRight}) {
    for (auto [lq, lk] :
         {std::pair<std::int64_t, std::int64_t>{129, 129}, {70, 150}, {150, 70}, {290, 270}}) {
      AttentionCase c = dense_case(lq, lk, 40, 24);
      c.options.causal_alignment = align;
      c.options.causal = true;
      check_fast(c, ++seed);
      c.options.window_left = 37;  // causal and a window: their intersection
      check_fast(c, ++seed);
      c.options.causal = false;
      c.options.window_left = 5;
      c.options.window_right = 70;
      c.dtype = DType::kBFloat16;
      check_fast(c, ++seed);
    }
  }
}

TEST(CpuBackend, GqaMqaSoftcapSinksScale) {
  std::uint64_t seed = 60;
  for (std::int64_t kv_heads : {1, 2, 6}) {
    AttentionCase c = dense_case(77, 140, 72, 40);
    c.heads = 6;
    c.kv_heads = kv_heads;
    c.sinks = true;
    c.options.softcap = 3.0f;
    c.options.scale = 0.3f;
    c.options.causal = kv_heads == 2;
    check_fast(c, ++seed);
    c.dtype = DType::kFloat16;
    check_fast(c, ++seed);
  }
}

// A key and a sink: a row's probability sits on the one key, so dP - Delta is a small difference
// that the rounding of an fp16 / bf16 out would dominate (Delta is taken from the tile instead).
TEST(CpuBackend, OneKeyAndSink) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (std::uint64_t seed = 200; seed < 230; ++seed) {
      AttentionCase c = dense_case(5, 1, 8, 8);
      c.batch = 2;
      c.heads = 2;
      c.kv_heads = 1;
      c.dtype = dtype;
      c.sinks = true;
      c.options.causal = true;
      c.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
      check_case(c, seed);
    }
  }
}

TEST(CpuBackend, StridedLayoutsAndOptionalOutputs) {
  std::uint64_t seed = 80;
  for (Storage q : {Storage::kPadded, Storage::kHeadsOuter, Storage::kBroadcastBatch}) {
    for (Storage kv : {Storage::kPadded, Storage::kHeadsOuter, Storage::kBroadcastHeads}) {
      AttentionCase c = dense_case(70, 90, 40, 24);
      c.batch = 2;
      c.q_storage = q;
      c.kv_storage = kv;
      c.options.causal = true;
      check_fast(c, ++seed);
    }
  }
  AttentionCase no_lse = dense_case(65, 65, 16, 16);
  no_lse.lse_output = false;
  check_fast(no_lse, ++seed);
  AttentionCase no_dlse = dense_case(65, 65, 16, 16);
  no_dlse.dlse = false;
  no_dlse.sinks = true;
  check_fast(no_dlse, ++seed);
}

// The dense calls with an additive bias (full, broadcast by size-1 dimensions or by stride 0) and
// SAM's decomposed rel-pos, on the fast backend: the forward, and the backward with dbias / drel
// (dbias full-size or summed over any of its broadcast dimensions, drel without a broadcast
// dimension), or without the gradients (each case runs both ways; a broadcast drel runs on the
// reference).
TEST(CpuBackend, DenseBiasAndRelPos) {
  std::uint64_t seed = 240;
  auto check_forward = [&](AttentionCase c) {
    SCOPED_TRACE(c.describe());
    for (bool input_grads : {true, false}) {
      c.input_grads = input_grads;
      for (const std::string& isa : runnable_isas()) {
        SCOPED_TRACE("FMHA_CPU_ISA=" + isa + (input_grads ? "" : ", no bias / rel-pos gradients"));
        ScopedEnv env("FMHA_CPU_ISA", isa);
        for (auto impl : {fmha::BackwardImpl::kSplit, fmha::BackwardImpl::kFused}) {
          c.backward_impl = impl;
          check_case(c, ++seed);
        }
      }
    }
  };
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    AttentionCase c = dense_case(77, 130, 40, 24);
    c.batch = 2;
    c.dtype = dtype;
    c.bias.given = true;
    check_forward(c);
    c.options.causal = true;  // whole key tiles masked: their dbias entries are zeros
    c.options.softcap = 4.0f;
    c.batch = 1;
    check_forward(c);
    c.batch = 2;
    c.bias.broadcast = {true, false, false, false};  // [1, H, Lq, Lk]: dbias sums over the batch
    check_forward(c);
    c.bias.zero_stride = true;  // the same by a stride of 0
    c.options.causal = false;
    c.batch = 3;
    check_forward(c);
    c.bias.zero_stride = false;
    c.options.causal = true;
    c.batch = 2;
    c.bias.broadcast = {true, false, true, false};  // [1, H, 1, Lk]
    c.options.causal = true;
    c.options.softcap = 4.0f;
    check_forward(c);
    c.bias.zero_stride = true;  // the same broadcast by stride 0
    c.bias.broadcast = {true, true, false, false};  // dbias sums over the batch and the heads
    c.sinks = true;
    check_forward(c);
    c.bias.zero_stride = false;
    c.bias.broadcast = {false, true, false, false};  // [B, 1, Lq, Lk]: over the heads
    c.options.causal = false;
    check_forward(c);
    c.bias.broadcast = {false, false, false, true};  // [B, H, Lq, 1]: over the keys
    check_forward(c);
    c.bias.broadcast = {true, true, true, false};  // [1, 1, 1, Lk]: a learned key bias
    c.options.causal = true;
    check_forward(c);
  }
  // SAM-style: keys on an Hk x Wk grid, rel_h / rel_w per query row, with and without a bias.
  AttentionCase sam = dense_case(60, 60, 32, 32);
  sam.rel_hk = 6;  // Wk = 10
  check_forward(sam);
  sam.rel_broadcast = {true, false, false};
  sam.bias.given = true;
  sam.dtype = DType::kBFloat16;
  check_forward(sam);
  // Its gradients under softcap and a causal mask (rows and whole key tiles masked), GQA.
  AttentionCase sam2 = dense_case(100, 100, 24, 24);
  sam2.rel_hk = 10;
  sam2.batch = 2;
  sam2.options.causal = true;
  sam2.options.softcap = 5.0f;
  sam2.dtype = DType::kFloat16;
  check_forward(sam2);
}

AttentionCase na_case(int dims, std::array<std::int64_t, 3> grid,
                      std::array<std::int64_t, 3> kernel, std::array<std::int64_t, 3> dilation,
                      std::array<bool, 3> causal);

// Extra keys (SPEC §7): keys every query sees after its sequence's, unmasked, without bias or
// rel-pos, softcap applied; one key or a few, more than a key tile, with no sequence key at all;
// with masks, sinks, GQA, bias, rel-pos and their gradients; without dextra_k / dextra_v.
TEST(CpuBackend, ExtraKeys) {
  std::uint64_t seed = 300;
  AttentionCase c = dense_case(77, 130, 40, 24);
  c.batch = 2;
  c.extra = 3;
  check_fast(c, ++seed);
  c.extra = 70;  // two tiles of extra keys
  c.options.causal = true;
  c.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
  c.sinks = true;
  c.dtype = DType::kBFloat16;
  check_fast(c, ++seed);
  c.extra = 1;
  c.options.causal = false;
  c.options.window_left = 9;
  c.options.window_right = 3;
  c.options.softcap = 3.0f;
  c.heads = 6;
  c.kv_heads = 1;
  c.dtype = DType::kFloat16;
  check_fast(c, ++seed);
  c.input_grads = false;  // dq, dk, dv only
  check_fast(c, ++seed);
  AttentionCase one_row = dense_case(1, 1, 72, 200);  // a single key tile of one key, all keys
  one_row.extra = 5;
  check_fast(one_row, ++seed);
  one_row.seqlen_k = 0;  // only extra keys
  one_row.seqlen_q = 130;
  check_fast(one_row, ++seed);
  // A bias and rel-pos (with their gradients) on the sequence's keys only.
  AttentionCase biased = dense_case(60, 60, 32, 32);
  biased.extra = 20;
  biased.bias.given = true;
  biased.options.causal = true;
  check_fast(biased, ++seed);
  biased.bias.broadcast = {true, false, true, false};  // a summed dbias
  check_fast(biased, ++seed);
  biased.bias.given = false;
  biased.rel_hk = 6;
  biased.options.softcap = 4.0f;
  check_fast(biased, ++seed);
  // Varlen: sequence b's extra keys are extra_k[b], empty sequences too.
  AttentionCase varlen = dense_case(1, 1, 40, 24);
  varlen.kind = Kind::kVarlen;
  varlen.seqlens_q = {1, 0, 129, 70, 7};
  varlen.seqlens_k = {5, 3, 129, 0, 150};
  varlen.extra = 17;
  varlen.sinks = true;
  check_fast(varlen, ++seed);
  varlen.options.causal = true;
  varlen.dtype = DType::kBFloat16;
  check_fast(varlen, ++seed);
  // Neighborhood attention 2-D with extra keys.
  AttentionCase na = na_case(2, {23, 19, 1}, {7, 5, 1}, {2, 1, 1}, {false, true, false});
  na.extra = 4;
  na.sinks = true;
  check_fast(na, ++seed);
  // The fp32 results are not the reference's bits: the calls did run on the fast backend.
  for (AttentionCase each : {c, varlen, na}) {
    each.dtype = DType::kFloat32;
    CaseTensors fast = make_tensors(each, seed);
    ASSERT_TRUE(run_forward(each, fast).ok());
    ASSERT_TRUE(run_backward(each, fast).ok());
    each.options.cpu_backend = fmha::CpuBackend::kReference;
    CaseTensors reference = make_tensors(each, seed);
    ASSERT_TRUE(run_forward(each, reference).ok());
    ASSERT_TRUE(run_backward(each, reference).ok());
    EXPECT_FALSE(reference.out.bitwise_equal(fast.out)) << each.describe();
    EXPECT_FALSE(reference.dq.bitwise_equal(fast.dq)) << each.describe();
  }
}

TEST(CpuBackend, Varlen) {
  AttentionCase c;
  c.kind = Kind::kVarlen;
  c.heads = 4;
  c.kv_heads = 1;
  c.head_dim = 40;
  c.value_dim = 72;
  c.seqlens_q = {1, 0, 129, 70, 7};
  c.seqlens_k = {5, 3, 129, 0, 150};
  c.dlse = true;
  c.sinks = true;
  std::uint64_t seed = 100;
  check_fast(c, ++seed);
  for (auto align : {fmha::CausalAlignment::kTopLeft, fmha::CausalAlignment::kBottomRight}) {
    c.options.causal = true;
    c.options.causal_alignment = align;
    c.dtype = DType::kBFloat16;
    c.q_storage = Storage::kHeadsOuter;
    c.kv_storage = Storage::kPadded;
    check_fast(c, ++seed);
    c.options.window_left = 20;
    c.options.softcap = 5.0f;
    c.dtype = DType::kFloat32;
    check_fast(c, ++seed);
  }
  // A bias [B, H, max Lq, max Lk] read at each sequence's own positions; the backward without dbias
  // on the fast backend, with it on the reference.
  c.bias.given = true;
  for (bool input_grads : {false, true}) {
    c.input_grads = input_grads;
    for (const std::string& isa : runnable_isas()) {
      SCOPED_TRACE("FMHA_CPU_ISA=" + isa);
      ScopedEnv env("FMHA_CPU_ISA", isa);
      check_case(c, ++seed);
    }
  }
}

AttentionCase na_case(int dims, std::array<std::int64_t, 3> grid,
                      std::array<std::int64_t, 3> kernel, std::array<std::int64_t, 3> dilation,
                      std::array<bool, 3> causal) {
  AttentionCase c = dense_case(1, 1, 40, 24);  // H 4, Hkv 2, dlse
  c.kind = Kind::kNeighborhood;
  c.batch = 2;
  c.grid = grid;
  c.neighborhood = {.num_dims = dims, .kernel_size = kernel, .dilation = dilation, .causal = causal};
  return c;
}

// Neighborhood attention 1-D / 2-D / 3-D (SPEC §6) on the fast backend: grids of several query and
// key boxes with partial boxes at the borders, odd and even kernels, dilations that do not divide
// the axis (holes in the group-major boxes), causal axes, kernels as wide as their axis; with GQA,
// sinks, softcap and dlse, every dtype. The fp32 results are not the reference's bits, so the case
// did run on the fast backend.
TEST(CpuBackend, Neighborhood) {
  struct Shape {
    int dims;
    std::array<std::int64_t, 3> grid, kernel, dilation;
    std::array<bool, 3> causal;
  };
  const Shape shapes[] = {
      {1, {200, 1, 1}, {63, 1, 1}, {1, 1, 1}, {false, false, false}},
      {1, {201, 1, 1}, {20, 1, 1}, {3, 1, 1}, {false, false, false}},
      {1, {130, 1, 1}, {17, 1, 1}, {2, 1, 1}, {true, false, false}},
      {1, {77, 1, 1}, {77, 1, 1}, {1, 1, 1}, {false, false, false}},
      {2, {23, 19, 1}, {7, 5, 1}, {1, 1, 1}, {false, false, false}},
      {2, {23, 19, 1}, {4, 5, 1}, {2, 3, 1}, {false, true, false}},
      {2, {17, 33, 1}, {3, 6, 1}, {5, 2, 1}, {true, true, false}},
      {2, {9, 40, 1}, {9, 13, 1}, {1, 1, 1}, {false, false, false}},
      {3, {6, 9, 11}, {3, 5, 3}, {1, 1, 2}, {false, false, false}},
      {3, {5, 12, 7}, {2, 3, 3}, {2, 2, 1}, {true, false, true}},
  };
  std::uint64_t seed = 200;
  for (const Shape& s : shapes) {
    AttentionCase c = na_case(s.dims, s.grid, s.kernel, s.dilation, s.causal);
    check_fast(c, ++seed);
    c.sinks = true;
    c.options.softcap = 2.0f;
    c.dtype = seed % 2 == 0 ? DType::kBFloat16 : DType::kFloat16;
    check_fast(c, ++seed);
  }
  AttentionCase c = na_case(2, {23, 19, 1}, {7, 5, 1}, {2, 1, 1}, {false, false, false});
  c.head_dim = 72;
  c.value_dim = 200;
  c.heads = 3;
  c.kv_heads = 1;
  check_fast(c, ++seed);
  CaseTensors fast = make_tensors(c, seed);
  ASSERT_TRUE(run_forward(c, fast).ok());
  c.options.cpu_backend = fmha::CpuBackend::kReference;
  CaseTensors reference = make_tensors(c, seed);
  ASSERT_TRUE(run_forward(c, reference).ok());
  EXPECT_FALSE(reference.out.bitwise_equal(fast.out));
}

// Every output and gradient of one case with 1, 2 and 8 threads, asked through FMHA_CPU_THREADS
// and through options.cpu_threads: the same bits.
// A host's thread team for fmha::set_cpu_parallel_runtime, run as an OpenMP runtime runs one: the
// caller as thread 0 and fresh threads as the others run fn(data), each knowing its number; the
// pair form gives at most two threads whatever is asked (a team smaller than the workers).
thread_local int t_team_number = 0;
void run_team(void (*fn)(void*), void* data, unsigned threads) {
  std::vector<std::thread> others;
  for (unsigned i = 1; i < threads; ++i) {
    others.emplace_back([=] {
      t_team_number = static_cast<int>(i);
      fn(data);
    });
  }
  t_team_number = 0;
  fn(data);
  for (std::thread& t : others) t.join();
}
void team_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned) {
  run_team(fn, data, threads);
}
void pair_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned) {
  run_team(fn, data, threads < 2 ? threads : 2);
}
int team_thread_num() {
  return t_team_number;
}

// Hands the CPU backend's workers to a host team for its scope (fmha's own threads after it).
struct ScopedTeam {
  explicit ScopedTeam(void (*parallel)(void (*)(void*), void*, unsigned, unsigned)) {
    fmha::CpuParallelRuntime team;
    team.parallel = parallel;
    team.thread_num = &team_thread_num;
    fmha::set_cpu_parallel_runtime(team);
  }
  ~ScopedTeam() { fmha::set_cpu_parallel_runtime(fmha::CpuParallelRuntime{}); }
};

void expect_thread_count_independent(const AttentionCase& c) {
  SCOPED_TRACE(c.describe());
  ASSERT_TRUE(fmha::cpu::supports(c.options, c.dtype));
  std::vector<CaseTensors> runs;
  for (const char* threads : {"1", "2", "8"}) {
    ScopedEnv env("FMHA_CPU_THREADS", threads);
    runs.push_back(make_tensors(c, 7));
    ASSERT_TRUE(run_forward(c, runs.back()).ok());
    ASSERT_TRUE(run_backward(c, runs.back()).ok());
  }
  for (int threads : {8, 1}) {
    AttentionCase with_option = c;
    with_option.options.cpu_threads = threads;
    runs.push_back(make_tensors(with_option, 7));
    ASSERT_TRUE(run_forward(with_option, runs.back()).ok());
    ASSERT_TRUE(run_backward(with_option, runs.back()).ok());
  }
  for (auto parallel : {&team_parallel, &pair_parallel}) {  // 8 workers on a host team
    const ScopedTeam team(parallel);
    AttentionCase with_team = c;
    with_team.options.cpu_threads = 8;
    runs.push_back(make_tensors(with_team, 7));
    ASSERT_TRUE(run_forward(with_team, runs.back()).ok());
    ASSERT_TRUE(run_backward(with_team, runs.back()).ok());
  }
  const std::pair<const char*, HostTensor CaseTensors::*> outputs[] = {
      {"out", &CaseTensors::out}, {"lse", &CaseTensors::lse}, {"dq", &CaseTensors::dq},
      {"dk", &CaseTensors::dk},   {"dv", &CaseTensors::dv},   {"dsinks", &CaseTensors::dsinks},
      {"dbias", &CaseTensors::dbias}, {"drel_h", &CaseTensors::drel_h},
      {"drel_w", &CaseTensors::drel_w}, {"dextra_k", &CaseTensors::dextra_k},
      {"dextra_v", &CaseTensors::dextra_v}};
  for (std::size_t r = 1; r < runs.size(); ++r) {
    for (auto [name, member] : outputs) {
      EXPECT_TRUE((runs[0].*member).bitwise_equal(runs[r].*member))
          << name << " differs between run 0 (1 thread) and run " << r
          << " (threads 2, 8 from the environment; 8, 1 from the options; 8 on a host team of 8,"
             " then of 2)";
    }
  }
}

// A fork()ed child does not use the team its parent handed over (its threads are the parent's):
// the child's call runs on fmha's own threads, with the same bits.
std::atomic<int> g_team_calls_in_child{0};
pid_t g_parent = 0;
void counting_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned flags) {
  if (getpid() != g_parent) g_team_calls_in_child.fetch_add(1);
  team_parallel(fn, data, threads, flags);
}

TEST(CpuBackend, ForkedChildLeavesTheParentsTeam) {
  AttentionCase c = dense_case(150, 200, 40, 24);
  c.options.cpu_threads = 4;
  g_parent = getpid();
  const ScopedTeam team(&counting_parallel);
  CaseTensors parent = make_tensors(c, 5);
  ASSERT_TRUE(run_forward(c, parent).ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    CaseTensors again = make_tensors(c, 5);
    const bool ok = run_forward(c, again).ok() && again.out.bitwise_equal(parent.out) &&
                    g_team_calls_in_child.load() == 0;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child's call used the parent's team or gave other bits";
}

TEST(CpuBackend, BitwiseIndependentOfThreadCount) {
  for (auto impl :
       {fmha::BackwardImpl::kAuto, fmha::BackwardImpl::kSplit, fmha::BackwardImpl::kFused}) {
    AttentionCase dense = dense_case(150, 200, 40, 24);
    dense.backward_impl = impl;
    dense.batch = 2;
    dense.heads = 6;
    dense.kv_heads = 2;
    dense.sinks = true;
    dense.options.causal = true;
    dense.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
    expect_thread_count_independent(dense);
    dense.dtype = DType::kBFloat16;
    dense.options.causal = false;
    dense.options.window_left = 30;
    dense.options.softcap = 2.0f;
    expect_thread_count_independent(dense);

    AttentionCase biased = dense;  // a full-size bias and its gradient
    biased.bias.given = true;
    biased.dtype = DType::kFloat32;
    expect_thread_count_independent(biased);
    biased.bias.broadcast = {true, false, false, false};  // dbias summed over the batch
    expect_thread_count_independent(biased);
    biased.bias.broadcast = {false, true, false, false};  // over the heads
    expect_thread_count_independent(biased);
    biased.bias.broadcast = {true, true, false, false};  // over both
    expect_thread_count_independent(biased);
    biased.bias.broadcast = {false, false, true, false};  // over query rows
    expect_thread_count_independent(biased);
    biased.bias.broadcast = {false, true, false, true};  // over the heads and the keys
    expect_thread_count_independent(biased);
    biased.bias.broadcast = {false, false, false, false};
    biased.bias.given = false;  // rel-pos and its gradients over a 10 x 20 key grid
    biased.rel_hk = 10;
    expect_thread_count_independent(biased);

    biased.rel_hk = 0;
    biased.extra = 70;  // extra keys and their gradients
    expect_thread_count_independent(biased);

    AttentionCase na = na_case(2, {23, 19, 1}, {7, 4, 1}, {2, 1, 1}, {false, true, false});
    na.backward_impl = impl;
    na.sinks = true;
    expect_thread_count_independent(na);

    AttentionCase varlen = dense;
    varlen.kind = Kind::kVarlen;
    varlen.dtype = DType::kFloat16;
    varlen.seqlens_q = {70, 0, 129, 3};
    varlen.seqlens_k = {150, 9, 65, 0};
    expect_thread_count_independent(varlen);
    varlen.extra = 5;
    expect_thread_count_independent(varlen);
  }
}

// Calls from several threads at once share the kept workers (one call at a time; the others run
// on their own thread): every call still gets the same bits as a call alone.
TEST(CpuBackend, ConcurrentCallsFromSeveralThreads) {
  AttentionCase c = dense_case(150, 130, 40, 24);
  c.heads = 6;
  c.kv_heads = 2;
  c.options.causal = true;
  CaseTensors alone = make_tensors(c, 9);
  ASSERT_TRUE(run_forward(c, alone).ok());
  ASSERT_TRUE(run_backward(c, alone).ok());
  constexpr int kCallers = 4, kRounds = 5;
  std::vector<CaseTensors> runs;
  for (int i = 0; i < kCallers; ++i) runs.push_back(make_tensors(c, 9));
  std::vector<int> failures(kCallers, 0);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      for (int round = 0; round < kRounds; ++round) {
        if (!run_forward(c, runs[static_cast<std::size_t>(i)]).ok() ||
            !run_backward(c, runs[static_cast<std::size_t>(i)]).ok()) {
          ++failures[static_cast<std::size_t>(i)];
        }
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  for (int i = 0; i < kCallers; ++i) {
    const CaseTensors& t = runs[static_cast<std::size_t>(i)];
    EXPECT_EQ(failures[static_cast<std::size_t>(i)], 0);
    EXPECT_TRUE(t.out.bitwise_equal(alone.out)) << "caller " << i;
    EXPECT_TRUE(t.lse.bitwise_equal(alone.lse)) << "caller " << i;
    EXPECT_TRUE(t.dq.bitwise_equal(alone.dq)) << "caller " << i;
    EXPECT_TRUE(t.dk.bitwise_equal(alone.dk)) << "caller " << i;
    EXPECT_TRUE(t.dv.bitwise_equal(alone.dv)) << "caller " << i;
  }
}

TEST(CpuBackend, ReferenceSelectedExplicitly) {
  // The same case on the reference and on the fast backend: both pass the oracle, and the
  // reference (float64 inside) is not the fast backend's fp32 arithmetic.
  AttentionCase c = dense_case(33, 47, 40, 24);
  c.options.causal = true;
  c.sinks = true;
  c.options.cpu_backend = fmha::CpuBackend::kReference;
  check_case(c, 5);
  CaseTensors reference = make_tensors(c, 5);
  ASSERT_TRUE(run_forward(c, reference).ok());
  c.options.cpu_backend = fmha::CpuBackend::kAuto;
  check_case(c, 5);
  CaseTensors fast = make_tensors(c, 5);
  ASSERT_TRUE(run_forward(c, fast).ok());
  EXPECT_FALSE(reference.out.bitwise_equal(fast.out));
}

TEST(CpuBackend, CoverageRule) {
  fmha::AttentionOptions o;
  EXPECT_TRUE(fmha::cpu::supports(o, DType::kFloat32));
  EXPECT_TRUE(fmha::cpu::supports(o, DType::kBFloat16));
  EXPECT_TRUE(fmha::cpu::supports(o, DType::kFloat16));
  EXPECT_FALSE(fmha::cpu::supports(o, DType::kFloat64));
  float placeholder = 0.0f;
  fmha::AttentionOptions biased;
  biased.bias = fmha::TensorView::contiguous(&placeholder, DType::kFloat32, {1, 1, 1, 1});
  EXPECT_TRUE(fmha::cpu::supports(biased, DType::kFloat32));  // bias and rel-pos: taken
  fmha::AttentionOptions extra;
  extra.extra_k = fmha::TensorView::contiguous(&placeholder, DType::kFloat32, {1, 1, 1, 1});
  EXPECT_TRUE(fmha::cpu::supports(extra, DType::kFloat32));  // extra keys: taken

  // The backward's gradients: dbias full-size or summed over any broadcast dimensions; none in the
  // varlen backward.
  fmha::detail::ProblemShape shape;
  shape.batch = 2, shape.heads = 3, shape.seqlen_q = 4, shape.seqlen_k = 5;
  fmha::AttentionBackwardParams dense;
  dense.q = fmha::TensorView::contiguous(&placeholder, DType::kFloat32, {2, 4, 3, 8});
  const std::array<std::int64_t, 4> dbias_shapes[] = {
      {2, 3, 4, 5}, {1, 3, 4, 5}, {2, 1, 4, 5}, {1, 1, 4, 5}, {2, 3, 1, 5}, {1, 1, 4, 1}};
  for (const auto& s : dbias_shapes) {
    dense.grads.dbias = fmha::TensorView::contiguous(&placeholder, DType::kFloat32, 4, s.data());
    EXPECT_TRUE(fmha::cpu::supports(dense, shape))
        << s[0] << " " << s[1] << " " << s[2] << " " << s[3];
  }
  fmha::VarlenBackwardParams varlen;
  varlen.q = dense.q;
  EXPECT_TRUE(fmha::cpu::supports(varlen, shape));
  varlen.grads.dbias = dense.grads.dbias;
  EXPECT_FALSE(fmha::cpu::supports(varlen, shape));

  // Neighborhood calls: a grid that one token stride flattens, no bias or rel-pos.
  fmha::detail::ProblemShape grid = shape;
  grid.layout = fmha::detail::Layout::kNeighborhood;
  grid.grid_rank = 2;
  fmha::NeighborhoodForwardParams na;
  na.q = fmha::TensorView::contiguous(&placeholder, DType::kFloat32, {2, 4, 5, 3, 8});
  na.k = na.v = na.out = na.q;
  EXPECT_TRUE(fmha::cpu::supports(na, grid));
  na.k.stride[1] *= 2;  // rows of the grid padded: no single token stride
  EXPECT_FALSE(fmha::cpu::supports(na, grid));
  na.k = na.q;
  na.options.bias = dense.grads.dbias;
  EXPECT_FALSE(fmha::cpu::supports(na, grid));
}

TEST(CpuBackend, InvalidBackendRefused) {
  AttentionCase c = dense_case(4, 4, 8, 8);
  c.options.cpu_backend = static_cast<fmha::CpuBackend>(7);
  CaseTensors t = make_tensors(c, 1);
  const fmha::Status s = run_forward(c, t);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("options.cpu_backend = 7"), std::string::npos) << s.message();
  c.options.cpu_backend = fmha::CpuBackend::kAuto;
  c.options.cpu_threads = -2;
  const fmha::Status threads = run_forward(c, t);
  EXPECT_FALSE(threads.ok());
  EXPECT_NE(threads.message().find("options.cpu_threads = -2"), std::string::npos)
      << threads.message();
}

}  // namespace
}  // namespace fmha_test
