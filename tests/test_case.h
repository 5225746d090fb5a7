// One attention problem described by value (AttentionCase), turned into CPU tensors, run through
// fmha::run forward and backward, and checked against the naive float64 oracle of tests/naive/.
// Most tests are a few lines that fill an AttentionCase and call check_case().
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "fmha/fmha.h"
#include "naive/naive_problem.h"
#include "test_util.h"

namespace fmha_test {

enum class Kind { kDense, kVarlen, kNeighborhood };

// Memory layout of q / k / v (and of out / gradients where that makes sense).
enum class Storage {
  kContiguous,
  kPadded,          // rows padded: strides larger than the extents
  kHeadsOuter,      // stored [B, H, L, D] (varlen [H, T, D]) and viewed as [B, L, H, D]
  kBroadcastBatch,  // stride 0 on the batch dim (varlen: on the token dim)
  kBroadcastHeads,  // stride 0 on the head dim
};

struct BiasSpec {
  bool given = false;
  std::array<bool, 4> broadcast{false, false, false, false};  // over [B, H, Lq, Lk]
  bool zero_stride = false;  // broadcast by stride 0 over the full size (else by a size-1 dim)
};

struct AttentionCase {
  Kind kind = Kind::kDense;
  DType dtype = DType::kFloat32;
  std::int64_t batch = 1, heads = 2, kv_heads = 1, head_dim = 8, value_dim = 8;
  std::int64_t seqlen_q = 5, seqlen_k = 5;           // dense
  std::vector<std::int32_t> seqlens_q, seqlens_k;    // varlen, one entry per sequence
  fmha::NeighborhoodOptions neighborhood;            // NA (num_dims, kernel, dilation, causal)
  std::array<std::int64_t, 3> grid{1, 1, 1};         // NA grid sizes (past num_dims ignored)
  fmha::AttentionOptions options;  // scalar options; the harness fills in the tensor fields
  BiasSpec bias;
  std::int64_t rel_hk = 0;  // > 0: rel_h / rel_w over a key grid Hk = rel_hk, Wk = Lk / rel_hk
  std::array<bool, 3> rel_broadcast{false, false, false};  // rel_h / rel_w broadcast over [B, H, Lq]
  bool rel_zero_stride = false;                            // by stride 0 (else by size-1 dims)
  bool sinks = false;
  std::int64_t extra = 0;   // R extra keys
  bool dlse = false;        // backward also receives a gradient for lse
  bool fp32_stats = false;  // fp64 problems: lse / dlse / sinks / dsinks in fp32 (else fp64)
  bool backward = true;
  bool lse_output = true;   // the forward writes lse (false: out alone, and no backward)
  bool input_grads = true;  // false: the backward asks no gradient of bias / rel-pos / sinks /
                            // extra keys, although they are given (dq, dk, dv only)
  fmha::BackwardImpl backward_impl = fmha::BackwardImpl::kAuto;  // the CPU backend ignores it
  Storage q_storage = Storage::kContiguous;
  Storage kv_storage = Storage::kContiguous;

  std::string describe() const;
  // Per-batch query / key counts: Lq, max_seqlen_q, or the grid size.
  std::int64_t rows_per_batch_q() const;
  std::int64_t rows_per_batch_k() const;
  std::int64_t num_batches() const;
};

struct CaseTensors {
  HostTensor q, k, v, out, lse;
  HostTensor bias, rel_h, rel_w, sinks, extra_k, extra_v;
  HostTensor cu_seqlens_q, cu_seqlens_k;
  HostTensor dout, dlse;
  HostTensor dq, dk, dv, dbias, drel_h, drel_w, dsinks, dextra_k, dextra_v;
};

// A device that fmha::run runs a case on instead of the CPU tensors themselves: every tensor the
// call takes is copied there with its strides (padding and broadcast layouts included), and the
// outputs are copied back into their host tensors afterwards, padding included, so that every
// check of a CPU run applies unchanged. The CUDA tests implement it (tests/cuda/).
class CaseDevice {
 public:
  virtual ~CaseDevice() = default;
  // The device copy of h's storage as a view with h's shape and strides (rank 0 when h is not
  // given); the copy lives until release().
  virtual fmha::TensorView upload(HostTensor& h) = 0;
  // Copies the storage behind `view` (an upload of h) back into h.
  virtual void download(HostTensor& h, const fmha::TensorView& view) = 0;
  // The stream fmha::run gets.
  virtual void* stream() { return nullptr; }
  // Waits for the work queued by fmha::run; a non-ok status carries the runtime's error.
  virtual fmha::Status synchronize() = 0;
  // Frees every copy made since the last release().
  virtual void release() = 0;
};

// Allocates and fills every input with seeded random values; outputs stay unwritten.
CaseTensors make_tensors(const AttentionCase& c, std::uint64_t seed);
// Poison the outputs (resp. gradients) with NaN, then call fmha::run: on the CPU tensors, or on
// their copies on `device` (the outputs are copied back whether the call succeeds or not).
fmha::Status run_forward(const AttentionCase& c, CaseTensors& t, CaseDevice* device = nullptr);
fmha::Status run_backward(const AttentionCase& c, CaseTensors& t, CaseDevice* device = nullptr);

naive::Problem naive_problem(const AttentionCase& c, const CaseTensors& t);
// The rounding of the naive same-dtype baseline (SPEC §13): fp16 / bf16, or exact for fp32 / fp64.
naive::Round naive_rounding(DType dtype);

// Maps the naive lse [rows, H] to the library's lse layout and back.
std::vector<double> lse_to_library(const AttentionCase& c, const std::vector<double>& naive_lse);
std::vector<double> lse_from_library(const AttentionCase& c, const std::vector<double>& lib_lse);

// Forward (and backward unless c.backward is false) against the naive oracle, with SPEC §13
// tolerances; failures are reported through gtest with the case description and seed.
// With a device, fmha::run runs there (run_forward / run_backward above). When `not_supported` is
// given, a call the backend refuses as not supported (StatusCode::kNotSupported, a valid input it
// cannot run) is no failure: its message goes there, after checking that it starts with "fmha: "
// and that the refused call left its outputs unwritten, and the case ends.
void check_case(const AttentionCase& c, std::uint64_t seed = 1, CaseDevice* device = nullptr,
                std::string* not_supported = nullptr);

}  // namespace fmha_test
