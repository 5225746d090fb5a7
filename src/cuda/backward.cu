// CUDA backend entry points of the backward: dense and varlen attention, and the dense backward
// that neighborhood attention runs on its flattened grid (backward_setup.h). Fills BackwardParams
// from the validated views, picks fused or split, takes its fp32 scratch memory where the params'
// Workspace says (O(L) memory: per-row statistics, the dQ accumulator in fused mode; plus, only
// when requested, fp32 accumulators of dbias's own compact size and, on the sm80 kernels, of
// drel_h / drel_w; the sm90 fp32 kernels' operand planes) and launches
//   preprocess (Delta, lse_log2, sink terms; zeroes the accumulators) -> dsinks (ordered
//   reduction)
//   -> fused on Hopper (sm90_fused, where it applies): the warp-specialized kernel adding dQ to
//      an fp32 accumulator by bulk reductions, then its conversion (sm90/mainloop_bwd_fused.cuh)
//      fused: dK/dV kernel with dQ atomics (and dbias / drel accumulation), dQ conversion
//      split: dK/dV kernel (and dbias / drel accumulation on sm80), dQ kernel (on sm90: drel
//      written in place, and the dQ kernel overlapping the dK/dV kernel's last wave)
//      fp32 on Hopper (sm90_fp32): the planes pass, dK/dV kernel and dQ kernel of
//      sm90/mainloop_bwd_fp32.cuh, on their planes
//   -> dbias / drel conversions (drel: sm80 only)
// with no device synchronisation.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/backend.h"
#include "cuda/backward_setup.h"
#include "cuda/call_workspace.h"
#include "cuda/common/backward_params.h"
#include "cuda/common/env_switch.h"
#include "cuda/common/kernel_attributes.h"
#include "cuda/common/online_softmax.cuh"
#include "cuda/device_guard.h"
#include "cuda/dispatch_bwd.h"
#include "cuda/forward_setup.h"
#include "cuda/sm90/fp32_plane_sizes.h"
#include "cuda/varlen_offsets.h"

namespace fmha::cuda {
namespace {

Status cuda_error(const char* what, cudaError_t e) {
  return Status::backend_error(std::string("fmha: ") + what + ": " + cudaGetErrorString(e));
}

Status refuse(const std::string& what) {
  return Status::not_supported("fmha: the CUDA backward does not support " + what +
                               " yet; run it on CPU tensors (the reference backend)");
}

Status check_supported(DType dtype) {
  if (dtype == DType::kFloat64) {
    return Status::not_supported(
        "fmha: the CUDA backend does not support float64 (the reference CPU backend does); got q "
        "of dtype float64");
  }
  if (dtype != DType::kFloat16 && dtype != DType::kBFloat16 && dtype != DType::kFloat32) {
    return Status::not_supported(std::string("fmha: the CUDA backward got q of dtype ") +
                                 to_string(dtype) + " (supported: float32, float16, bfloat16)");
  }
  return Status::ok_status();
}

Status check_device(int device, int* sms, int* arch) {
  cudaError_t e = compute_capability(device, arch);  // both asked once per device
  if (e == cudaSuccess) e = sm_count(device, sms);
  if (e != cudaSuccess) return cuda_error("cudaDeviceGetAttribute failed", e);
  if (*arch < 80) {
    return Status::not_supported(
        "fmha: the CUDA backward kernels need compute capability 8.0 or newer (fp16/bf16/tf32 "
        "mma.sync tensor cores); detected GPU: sm_" +
        std::to_string(*arch));
  }
  return Status::ok_status();
}

// Row strides of a [.., rows, heads, dim] tensor, dense ([B, L, H, *]) or packed ([T, H, *]).
struct RowStrides {
  std::int64_t batch, row, head;
};
RowStrides row_strides(const TensorView& t, bool varlen) {
  if (varlen) return {0, t.stride[0], t.stride[1]};
  return {t.stride[0], t.stride[1], t.stride[2]};
}
// Strides of a statistics tensor [B, H, Lq] (varlen [H, total_q]).
RowStrides stat_strides(const TensorView& t, bool varlen) {
  if (varlen) return {0, t.stride[1], t.stride[0]};
  return {t.stride[0], t.stride[2], t.stride[1]};
}

// The forward part of the parameters: the same sizes, scores, masks and extra keys the forward
// saw, filled by the forward's own setup (size-1 bias / rel-pos dimensions broadcast there).
void fill_forward(const AttentionOptions& o, const detail::ProblemShape& shape, ForwardParams* p) {
  fill_forward_sizes(shape, p);
  fill_forward_options(o, shape, p);
}

// The bias / rel-pos gradients of a call: fp32 accumulators of these compact sizes, converted
// into the gradients' own strides after the dK/dV kernel.
struct AdditiveGradients {
  const TensorView* dbias = nullptr;
  Extents4 dbias_sizes{{0, 0, 0, 0}};  // size 1 where dbias broadcasts
  bool dbias_atomic = false;
  const TensorView* drel_h = nullptr;
  const TensorView* drel_w = nullptr;
  Extents4 drel_h_sizes{{0, 0, 0, 0}}, drel_w_sizes{{0, 0, 0, 0}};

  static std::int64_t count(const Extents4& e) { return e.v[0] * e.v[1] * e.v[2] * e.v[3]; }
  // Accumulator floats; drel takes none when its kernel writes it in place.
  std::int64_t floats(bool drel_in_place) const {
    const std::int64_t drel =
        drel_in_place ? 0 : (drel_h ? count(drel_h_sizes) : 0) + (drel_w ? count(drel_w_sizes) : 0);
    return (dbias ? count(dbias_sizes) : 0) + drel;
  }
};

AdditiveGradients plan_additive(const AttentionGradients& g, const detail::ProblemShape& shape) {
  AdditiveGradients a;
  const std::int64_t problem[4] = {shape.batch, shape.heads, shape.seqlen_q, shape.seqlen_k};
  if (g.dbias.defined()) {
    a.dbias = &g.dbias;
    for (int d = 0; d < 4; ++d) {
      const auto u = static_cast<std::size_t>(d);
      // A stride-0 dimension of size 0 is empty, not broadcast: taking it as size 1 had the
      // conversion write a gradient into a tensor with no element (beside it: dsinks, zeroed).
      const bool broadcast =
          g.dbias.shape[u] == 1 || (g.dbias.stride[u] == 0 && g.dbias.shape[u] > 0);
      a.dbias_sizes.v[d] = broadcast ? 1 : g.dbias.shape[u];
      if (broadcast && problem[d] > 1) a.dbias_atomic = true;
    }
  }
  if (g.drel_h.defined()) {
    a.drel_h = &g.drel_h;
    a.drel_h_sizes = {{shape.batch, shape.heads, shape.seqlen_q, shape.rel_h_size}};
  }
  if (g.drel_w.defined()) {
    a.drel_w = &g.drel_w;
    a.drel_w_sizes = {{shape.batch, shape.heads, shape.seqlen_q, shape.rel_w_size}};
  }
  return a;
}

Extents4 strides_of(const TensorView& t) {
  return {{t.stride[0], t.stride[1], t.stride[2], t.stride[3]}};
}

// Everything but the workspace, from the tensors of either entry point.
template <typename Params>
BackwardParams make_params(const Params& a, const detail::ProblemShape& shape, bool varlen) {
  BackwardParams p;
  ForwardParams& f = p.fwd;
  fill_forward(a.options, shape, &f);
  p.scale = shape.scale;
  f.q = a.q.data;
  f.k = a.k.data;
  f.v = a.v.data;
  f.out = a.out.data;
  const RowStrides q = row_strides(a.q, varlen), k = row_strides(a.k, varlen);
  const RowStrides v = row_strides(a.v, varlen), out = row_strides(a.out, varlen);
  f.q_batch_stride = q.batch, f.q_row_stride = q.row, f.q_head_stride = q.head;
  f.k_batch_stride = k.batch, f.k_row_stride = k.row, f.k_head_stride = k.head;
  f.v_batch_stride = v.batch, f.v_row_stride = v.row, f.v_head_stride = v.head;
  f.out_batch_stride = out.batch, f.out_row_stride = out.row, f.out_head_stride = out.head;
  const RowStrides lse = stat_strides(a.lse, varlen);
  f.lse = static_cast<float*>(a.lse.data);  // read only: the forward's lse
  f.lse_batch_stride = lse.batch, f.lse_row_stride = lse.row, f.lse_head_stride = lse.head;

  p.dout = a.dout.data;
  const RowStrides dout = row_strides(a.dout, varlen);
  p.dout_batch_stride = dout.batch, p.dout_row_stride = dout.row, p.dout_head_stride = dout.head;
  if (a.dlse.defined()) {
    const RowStrides dlse = stat_strides(a.dlse, varlen);
    p.dlse = static_cast<const float*>(a.dlse.data);
    p.dlse_batch_stride = dlse.batch, p.dlse_row_stride = dlse.row;
    p.dlse_head_stride = dlse.head;
  }
  const AttentionGradients& g = a.grads;
  p.dq = g.dq.data;
  const RowStrides dq = row_strides(g.dq, varlen), dk = row_strides(g.dk, varlen);
  const RowStrides dv = row_strides(g.dv, varlen);
  p.dq_batch_stride = dq.batch, p.dq_row_stride = dq.row, p.dq_head_stride = dq.head;
  p.dk = g.dk.data;
  p.dk_batch_stride = dk.batch, p.dk_row_stride = dk.row, p.dk_head_stride = dk.head;
  p.dv = g.dv.data;
  p.dv_batch_stride = dv.batch, p.dv_row_stride = dv.row, p.dv_head_stride = dv.head;
  if (g.dextra_k.defined() && f.num_extra > 0) {
    p.dextra_k = g.dextra_k.data;
    p.dextra_k_batch_stride = g.dextra_k.stride[0];
    p.dextra_k_row_stride = g.dextra_k.stride[1];
    p.dextra_k_head_stride = g.dextra_k.stride[2];
  }
  if (g.dextra_v.defined() && f.num_extra > 0) {
    p.dextra_v = g.dextra_v.data;
    p.dextra_v_batch_stride = g.dextra_v.stride[0];
    p.dextra_v_row_stride = g.dextra_v.stride[1];
    p.dextra_v_head_stride = g.dextra_v.stride[2];
  }
  if (g.dsinks.defined()) {
    p.dsinks = static_cast<float*>(g.dsinks.data);
    p.dsinks_stride = g.dsinks.stride[0];
  }

  const std::int64_t chunk = chunk_elements(a.q.dtype);
  const bool whole_chunks = f.head_dim % chunk == 0 && f.value_dim % chunk == 0;
  bool loads = whole_chunks && rows_aligned16(a.q) && rows_aligned16(a.k) && rows_aligned16(a.v) &&
               rows_aligned16(a.dout);
  if (f.num_extra > 0) {
    loads = loads && rows_aligned16(a.options.extra_k) && rows_aligned16(a.options.extra_v);
  }
  f.vector_loads = loads;
  p.preprocess_chunks = f.value_dim % chunk == 0 && rows_aligned16(a.dout) && rows_aligned16(a.out);
  p.num_chunks = backward_num_chunks(p, a.q.dtype);
  return p;
}

// Whether the split sm90 backward's dQ kernel may overlap its dK/dV kernel (sm90/
// grid_dependency.cuh); FMHA_DQ_OVERLAP=0 in the environment launches them one after the other
// (read once; for measuring).
bool dq_overlap_enabled() {
  static const bool enabled = !switched_off_by_env("FMHA_DQ_OVERLAP");
  return enabled;
}

// Fused does each product once but adds dQ with atomics inside the dK/dV blocks; split moves dQ
// into its own kernel (one block per query tile and head, atomic-free) at the price of
// recomputing S and dP there (7 products instead of 5). The dK/dV grid (key tiles x kv heads x
// batch x chunks) is the same in both, so split pays off only when that grid is too small to
// carry the dQ work as well. Measured on an H100 (132 SMs), fp16, 2026-11-22/23: fused wins by
// 7-25% at 128-2048 dK/dV blocks; split wins by 7-13% at 16 blocks (MQA, 8 heads, L 1024) and by
// 4-5% at 256 blocks of a causal GQA group of 8 (L 4096), the one measured shape this rule gets
// wrong. Rule: split when the dK/dV grid fills less than half the SMs. deterministic forces split
// here, whose reductions all run in a fixed order (the warp-specialized kernel, chosen before
// this in run_backward, orders its own adds).
// On Hopper the warp-specialized fused kernel runs wherever it applies (run_backward:
// sm90_fused); elsewhere both structures run sm90 kernels where they apply (use_sm90_backward; the
// older fused one at D 64 / 128 / 256 without rel-pos or dbias, sm90_fused_backward_applies); fused asked
// for where only the split sm90 kernels apply runs the sm80 fused kernels. Auto there: split,
// measured on an H100 (bf16, 2026-11-24): the older fused sm90 kernel took 1.00-1.24x the split
// time in the dense cells (D 64 / 128, L 512-8192, causal or not; D 128 L 8192 level) and at SAM-B
// (1.13x; with a [1, H, L, L] bias 1.09x): its dQ reductions cost more than the dQ kernel's
// recomputed S and dP. (D 128 causal L 512 ran 0.64x there against a split run whose p10-p90
// spread 0.68-1.26 ms; an earlier run had that split cell at 0.54 ms, 0.87x.) At D 256 (the fused
// dK part with dQ atomics, then the split form's dV part; H200, bf16, 2026-11-28, 16k tokens) the
// two are level: fused 0.88-1.01x the split speed, L 512 and causal L <= 2048 the slowest. The
// warp-specialized D 256 kernel that replaced it there (mainloop_bwd_fused_d256.cuh, launched by
// the fused form's dK/dV launch) ran 0.99-1.19x the older split speed; the split form now takes dK
// and dV from that same kernel without its dQ part (launch_bwd.cuh) and runs 1.19-1.26x the fused
// one (H200, bf16, 16k tokens, L 512-16384, causal or not, 2026-11-28): the fused kernel's dQ
// adds cost more than the dQ kernel's recomputed S and dP. So auto runs split on Hopper.
bool use_fused(const BackwardParams& p, const AttentionOptions& o, BackwardImpl impl, int sm_count,
               bool sm90) {
  if (o.deterministic) return false;
  if (impl == BackwardImpl::kFused) return true;
  if (impl == BackwardImpl::kSplit) return false;
  if (sm90) return false;
  return 2 * backward_dkdv_blocks(p) >= sm_count;
}

// A gradient of an additive term with elements of its own, where the sums that make it run over
// no rows (a size-1 dimension over a problem dimension of size 0): zeros.
Status zero_sum_of_nothing(const TensorView* gradient, DType dtype, cudaStream_t stream) {
  if (gradient == nullptr) return Status::ok_status();
  Extents4 sizes{{0, 0, 0, 0}};
  for (int d = 0; d < 4; ++d) {
    const auto u = static_cast<std::size_t>(d);
    if (gradient->shape[u] <= 0) return Status::ok_status();  // no element
    sizes.v[d] = gradient->stride[u] == 0 ? 1 : gradient->shape[u];  // stride 0: one element
  }
  return launch_backward_convert_4d(nullptr, sizes, gradient->data, strides_of(*gradient), dtype,
                                    stream);
}

// A call without rows (batch or heads 0): every gradient is empty except those that sum over the
// empty dimension, dsinks, a bias and rel-pos broadcast over it, which are sums of nothing: zeros
// (dsinks keeps its values when the call adds to them).
Status zero_empty_sums(const BackwardParams& p, const AdditiveGradients& additive, DType dtype,
                       cudaStream_t stream) {
  const bool dsinks = p.dsinks != nullptr && !p.accumulate_dsinks && p.fwd.heads > 0;
  if (dsinks) {
    const std::size_t pitch = static_cast<std::size_t>(std::max<std::int64_t>(p.dsinks_stride, 1));
    const cudaError_t e = cudaMemset2DAsync(p.dsinks, pitch * sizeof(float), 0, sizeof(float),
                                            static_cast<std::size_t>(p.fwd.heads), stream);
    if (e != cudaSuccess) return cuda_error("cudaMemset2DAsync of dsinks failed", e);
  }
  for (const TensorView* gradient : {additive.dbias, additive.drel_h, additive.drel_w}) {
    FMHA_RETURN_IF_ERROR(zero_sum_of_nothing(gradient, dtype, stream));
  }
  return Status::ok_status();
}

// A backward call's decisions and its scratch memory, made before anything is queued (the same
// for run_backward and workspace_size). The scratch holds, in floats from its start: Delta and
// lse_log2 (and the sink terms) by row, then from accum_offset the accumulators that the
// preprocess zeroes (zeroed_vectors float4s: dQ, its turn counters, dbias, drel), then the sm90
// fp32 kernels' operand planes (plane_floats).
struct BackwardPlan {
  bool empty = false;  // no rows: zero_empty_sums' work only, without scratch
  bool sm90_fp32 = false, sm90_fused = false, fused = false, sm90 = false;
  bool drel_in_place = false;  // the sm90 dQ kernel writes drel itself
  FusedAccumulatorSize fused_size{0, 0, 0};
  std::int64_t stats = 0, stat_inner = 0, fused_accum = 0, turn_counters = 0, accum = 0;
  std::int64_t accum_offset = 0, zeroed_vectors = 0, floats = 0, plane_floats = 0;

  std::size_t bytes() const {
    const std::int64_t n = empty ? 0 : floats + plane_floats;
    return scratch_round_up(static_cast<std::size_t>(n) * sizeof(float));
  }
};

// The refusals, the kernels and the scratch layout of a backward call on `device` (made current
// by the caller); fills the parts of *p that the layout fixes but no address (the fused
// accumulator's strides, stat_rows).
Status plan_backward(BackwardParams* p, const AttentionOptions& o, BackwardImpl impl,
                     const AdditiveGradients& additive, DType dtype, int device,
                     std::int64_t outer, std::int64_t inner, bool varlen, BackwardPlan* plan) {
  if (p->fwd.heads > kMaxGridYZ || p->fwd.batch > kMaxGridYZ) {
    return Status::not_supported(
        "fmha: the CUDA backward kernels take at most 65535 heads and 65535 batches (one grid "
        "dimension each); got " +
        std::to_string(p->fwd.heads) + " heads and " + std::to_string(p->fwd.batch) + " batches");
  }
  // drel_h / drel_w accumulate at the full [B, H, Lq, Hk|Wk] size; a gradient that broadcasts
  // (size 1 where the problem is larger) would need the sum the dbias path does.
  for (const TensorView* drel : {additive.drel_h, additive.drel_w}) {
    if (drel == nullptr) continue;
    const std::int64_t problem[3] = {p->fwd.batch, p->fwd.heads, p->fwd.seqlen_q};
    for (int d = 0; d < 3; ++d) {
      if (drel->shape[static_cast<std::size_t>(d)] == 1 && problem[d] > 1) {
        return Status::not_supported(
            "fmha: the CUDA backward cannot yet sum grads.drel_h / grads.drel_w over a broadcast "
            "(size-1) dimension of rel_h / rel_w (dimension " +
            std::to_string(d) +
            "); pass "
            "rel_pos expanded to [B, H, Lq, *] and sum its gradient");
      }
    }
  }
  if (o.deterministic && additive.dbias_atomic) {
    return refuse(
        "deterministic=true with grads.dbias over a broadcast bias (that sum is accumulated with "
        "atomics; a full-size bias or deterministic=false works)");
  }
  if (p->fwd.batch == 0 || p->fwd.heads == 0) {
    plan->empty = true;
    return Status::ok_status();
  }
  int sm_count = 0, arch = 0;
  FMHA_RETURN_IF_ERROR(check_device(device, &sm_count, &arch));
  // fp32 on Hopper: the sm90 fp32 kernels (split, deterministic) unless fused is asked for.
  plan->sm90_fp32 = impl != BackwardImpl::kFused && use_sm90_fp32_backward(*p, dtype, arch);
  // The warp-specialized fused kernel wherever it applies, unless split is asked for (auto
  // included). Measured on an H100 (bf16, 2026-11-27, the kernels alone with
  // bench/cpp/sm90_fused_backward_check.cu): 1.16-1.83x the split kernels' speed at D 64 / 128,
  // L 512-16384, causal or not, since its dQ conversion stores whole lines (1.16x at D 128 causal
  // L 512, where its fixed cost weighs most). Deterministic too: its dQ adds then go in key-block
  // order.
  plan->sm90_fused = !plan->sm90_fp32 && impl != BackwardImpl::kSplit &&
                     use_sm90_fused_backward(*p, dtype, arch);
  const bool sm90_eligible =
      !plan->sm90_fused && use_sm90_backward(*p, additive.dbias != nullptr, dtype, arch);
  plan->fused = !plan->sm90_fp32 && !plan->sm90_fused &&
                use_fused(*p, o, impl, sm_count, sm90_eligible);
  plan->sm90 = sm90_eligible &&
               (!plan->fused || sm90_fused_backward_applies(*p, additive.dbias != nullptr));
  // The sm90 dQ kernel sums drel_h / drel_w per query row without atomics; the sm80 kernels add
  // them with atomics.
  if (o.deterministic && !plan->sm90 && (additive.drel_h || additive.drel_w)) {
    return refuse(
        "deterministic=true with grads.drel_h / grads.drel_w on this problem (the sm80 kernels "
        "accumulate those sums with atomics; Hopper runs SAM-style rel-pos alone on a "
        "power-of-two grid width without them; deterministic=false works everywhere)");
  }

  const std::int64_t heads = p->fwd.heads;
  plan->fused_size = plan->sm90_fused ? sm90_fused_backward_accumulator(p, inner, varlen)
                                      : FusedAccumulatorSize{0, 0, inner};
  // Statistics rows a head: the warp-specialized fused kernel copies whole query tiles of them
  // (stat_rows: padding rows the preprocess fills).
  plan->stat_inner = plan->fused_size.stat_rows;
  if (plan->sm90_fused && !varlen) p->stat_rows = plan->stat_inner;
  plan->stats = outer * heads * plan->stat_inner;
  // The sm90 fused kernel's accumulator is by column (fused_dq.cuh): rows of inner_pad queries,
  // 16-byte aligned, so that a tile's bulk reductions start aligned where its first query is a
  // multiple of 4.
  const std::int64_t inner_pad = plan->sm90 && plan->fused ? (inner + 3) / 4 * 4 : inner;
  plan->fused_accum = plan->fused_size.floats;
  // Deterministic: a turn counter a query tile after the accumulator, zeroed with it.
  plan->turn_counters = o.deterministic ? plan->fused_size.tiles : 0;
  plan->accum = plan->sm90_fused ? plan->fused_accum + plan->turn_counters
                : plan->fused    ? outer * heads * inner_pad * p->fwd.head_dim
                                 : 0;
  const std::int64_t stat_floats = 2 * plan->stats + (p->dsinks != nullptr ? plan->stats : 0);
  plan->accum_offset = (stat_floats + 3) / 4 * 4;  // 16-byte aligned
  // The sm90 backward runs rel-pos alone (PolicyRelPos): its dQ kernel writes drel in place.
  plan->drel_in_place = plan->sm90 && (additive.drel_h || additive.drel_w);
  const std::int64_t additive_floats = additive.floats(plan->drel_in_place);
  // The accumulators follow one another from accum_offset and are zeroed together by the
  // preprocess kernel in whole 16-byte vectors (the region rounded up to them).
  plan->zeroed_vectors = (plan->accum + additive_floats + 3) / 4;
  plan->floats = plan->accum_offset + plan->zeroed_vectors * 4;
  plan->plane_floats = plan->sm90_fp32 ? sm90::fp32_backward_planes_floats(p->fwd) : 0;
  return Status::ok_status();
}

// Statistics rows are [outer, H, inner]: dense B x Lq, varlen 1 x total_q.
Status run_backward(BackwardParams p, const AttentionOptions& o, BackwardImpl impl,
                    const AdditiveGradients& additive, DType dtype, int device, std::int64_t outer,
                    std::int64_t inner, bool varlen, const Workspace& workspace,
                    void* stream_ptr) {
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  DeviceGuard guard;
  FMHA_RETURN_IF_ERROR(guard.enter(device));
  BackwardPlan plan;
  FMHA_RETURN_IF_ERROR(
      plan_backward(&p, o, impl, additive, dtype, device, outer, inner, varlen, &plan));
  CallWorkspace scratch(workspace, device, stream);
  FMHA_RETURN_IF_ERROR(scratch.fits(plan.bytes()));
  if (plan.empty) {
    const Status s = zero_empty_sums(p, additive, dtype, stream);
    const Status released = scratch.release();
    return s.ok() ? released : s;
  }
  const std::int64_t heads = p.fwd.heads;
  void* base = nullptr;
  FMHA_RETURN_IF_ERROR(scratch.take(plan.bytes(), &base));
  float* const workspace_floats = static_cast<float*>(base);
  p.delta = workspace_floats;
  p.lse_log2 = workspace_floats + plan.stats;
  p.stat_batch_stride = varlen ? 0 : heads * plan.stat_inner;
  p.stat_head_stride = plan.stat_inner;
  if (p.dsinks != nullptr && p.fwd.sinks != nullptr) p.sink_term = workspace_floats + 2 * plan.stats;
  float* const next = workspace_floats + plan.accum_offset;
  if (plan.sm90_fused) {
    p.dq_accum = next;  // its strides: sm90_fused_backward_accumulator
    if (plan.turn_counters > 0) {
      p.dq_semaphore = reinterpret_cast<int*>(next + plan.fused_accum);
    }
  } else if (plan.fused && plan.sm90) {
    const std::int64_t inner_pad = (inner + 3) / 4 * 4;
    p.dq_accum = next;
    p.accum_row_stride = 1;
    p.accum_col_stride = inner_pad;
    p.accum_head_stride = p.fwd.head_dim * inner_pad;
    p.accum_batch_stride = varlen ? 0 : heads * p.fwd.head_dim * inner_pad;
  } else if (plan.fused) {
    p.dq_accum = next;
    p.accum_row_stride = p.fwd.head_dim;
    p.accum_head_stride = inner * p.fwd.head_dim;
    p.accum_batch_stride = varlen ? 0 : heads * inner * p.fwd.head_dim;
  }
  // The sm90 fp32 kernels' planes after the zeroed region (16-byte aligned: floats is a multiple
  // of 4).
  if (plan.plane_floats > 0) p.fwd.scratch = workspace_floats + plan.floats;

  float* const additive_base = next + plan.accum;
  if (additive.dbias) {
    p.dbias_accum = additive_base;
    p.dbias_atomic = additive.dbias_atomic;
    std::int64_t stride = 1;
    for (int d = 3; d >= 0; --d) {
      p.dbias_accum_stride[d] = additive.dbias_sizes.v[d] == 1 ? 0 : stride;
      stride *= additive.dbias_sizes.v[d];
    }
  }
  float* const drel_h_base =
      additive_base + (additive.dbias ? AdditiveGradients::count(additive.dbias_sizes) : 0);
  if (plan.drel_in_place) {
    if (additive.drel_h) {
      p.drel_h_out = additive.drel_h->data;
      for (int d = 0; d < 4; ++d) p.drel_h_stride[d] = additive.drel_h->stride_of(d);
    }
    if (additive.drel_w) {
      p.drel_w_out = additive.drel_w->data;
      for (int d = 0; d < 4; ++d) p.drel_w_stride[d] = additive.drel_w->stride_of(d);
    }
  } else {
    if (additive.drel_h) p.drel_h_accum = drel_h_base;
    if (additive.drel_w) {
      p.drel_w_accum =
          drel_h_base + (additive.drel_h ? AdditiveGradients::count(additive.drel_h_sizes) : 0);
    }
  }
  if (additive.drel_h || additive.drel_w) {
    p.rel_rows = p.fwd.seqlen_q;
    p.rel_h_size = additive.drel_h_sizes.v[3];
  }

  Status s = Status::ok_status();
  auto step = [&](Status next_status) {
    if (s.ok()) s = next_status;
  };
  const ZeroedWorkspace zeroed{reinterpret_cast<float4*>(next), plan.zeroed_vectors};
  step(launch_backward_preprocess(p, dtype, outer, inner, zeroed, stream));
  if (p.dsinks != nullptr) step(launch_backward_dsinks(p, outer, inner, stream));
  const bool sm90 = plan.sm90, fused = plan.fused;
  if (s.ok() && plan.sm90_fp32) {
    // No planes: neither queries nor keys, so dq, dk and dv are empty (dsinks is done above).
    if (plan.plane_floats > 0) step(dispatch_backward_sm90_fp32(p, stream));
  } else if (s.ok() && plan.sm90_fused) {
    step(dispatch_backward_sm90_fused(p, dtype, stream));  // dq converted there
  } else if (s.ok()) {
    step(sm90 ? dispatch_backward_sm90_dkdv(p, dtype, stream)
              : dispatch_backward_dkdv(p, dtype, stream));
  }
  // The split sm90 dQ kernel overlaps the dK/dV kernel launched just before it (none when there
  // are no keys: then the kernel before would be the preprocess, whose Delta the dQ kernel reads).
  p.dq_overlaps_dkdv = sm90 && !fused && p.fwd.seqlen_k > 0 && dq_overlap_enabled();
  // Conversions after the dQ kernel (the fused path's dQ, dbias, the sm80 kernels' drel).
  if (s.ok() && !plan.sm90_fp32 && !plan.sm90_fused) {
    step(fused  ? launch_backward_convert_dq(p, dtype, outer, inner, stream)
         : sm90 ? dispatch_backward_sm90_dq(p, dtype, stream)
                : dispatch_backward_dq(p, dtype, stream));
  }
  if (s.ok() && additive.dbias) {
    step(launch_backward_convert_4d(p.dbias_accum, additive.dbias_sizes, additive.dbias->data,
                                    strides_of(*additive.dbias), dtype, stream));
  }
  // No query rows (Lq 0): the rel-pos gradients' sums over the rows are of nothing.
  if (s.ok() && p.fwd.seqlen_q == 0) {
    for (const TensorView* drel : {additive.drel_h, additive.drel_w}) {
      step(zero_sum_of_nothing(drel, dtype, stream));
    }
  }
  if (s.ok() && p.drel_h_accum != nullptr) {
    step(launch_backward_convert_4d(p.drel_h_accum, additive.drel_h_sizes, additive.drel_h->data,
                                    strides_of(*additive.drel_h), dtype, stream));
  }
  if (s.ok() && p.drel_w_accum != nullptr) {
    step(launch_backward_convert_4d(p.drel_w_accum, additive.drel_w_sizes, additive.drel_w->data,
                                    strides_of(*additive.drel_w), dtype, stream));
  }
  step(scratch.release());
  return s;
}

// The scratch bytes run_backward takes for the same arguments.
Status backward_workspace_bytes(BackwardParams p, const AttentionOptions& o, BackwardImpl impl,
                                const AdditiveGradients& additive, DType dtype, int device,
                                std::int64_t outer, std::int64_t inner, bool varlen,
                                std::size_t* bytes) {
  DeviceGuard guard;
  FMHA_RETURN_IF_ERROR(guard.enter(device));
  BackwardPlan plan;
  FMHA_RETURN_IF_ERROR(
      plan_backward(&p, o, impl, additive, dtype, device, outer, inner, varlen, &plan));
  *bytes = plan.bytes();
  return Status::ok_status();
}

}  // namespace

Status run_dense_backward(const AttentionBackwardParams& a, const detail::ProblemShape& shape,
                          const NeighborhoodGrid& grid, void* stream, bool accumulate_dsinks) {
  FMHA_RETURN_IF_ERROR(check_supported(a.q.dtype));
  BackwardParams p = make_params(a, shape, /*varlen=*/false);
  p.accumulate_dsinks = accumulate_dsinks;
  set_neighborhood_mask(grid, &p.fwd);
  return run_backward(p, a.options, a.backward_impl, plan_additive(a.grads, shape), a.q.dtype,
                      a.q.device.index, shape.batch, shape.seqlen_q, /*varlen=*/false,
                      a.workspace, stream);
}

Status dense_backward_workspace_bytes(const AttentionBackwardParams& a,
                                      const detail::ProblemShape& shape,
                                      const NeighborhoodGrid& grid, std::size_t* bytes) {
  FMHA_RETURN_IF_ERROR(check_supported(a.q.dtype));
  BackwardParams p = make_params(a, shape, /*varlen=*/false);
  set_neighborhood_mask(grid, &p.fwd);
  return backward_workspace_bytes(p, a.options, a.backward_impl, plan_additive(a.grads, shape),
                                  a.q.dtype, a.q.device.index, shape.batch, shape.seqlen_q,
                                  /*varlen=*/false, bytes);
}

Status run(const AttentionBackwardParams& a, const detail::ProblemShape& shape, void* stream) {
  return run_dense_backward(a, shape, NeighborhoodGrid{}, stream);
}

Status workspace_size(const AttentionBackwardParams& a, const detail::ProblemShape& shape,
                      std::size_t* bytes) {
  return dense_backward_workspace_bytes(a, shape, NeighborhoodGrid{}, bytes);
}

Status run(const VarlenBackwardParams& a, const detail::ProblemShape& shape, void* stream) {
  FMHA_RETURN_IF_ERROR(check_supported(a.q.dtype));
  FMHA_RETURN_IF_ERROR(check_device_offsets(a, shape, stream));  // only when asked: a sync
  BackwardParams p = make_params(a, shape, /*varlen=*/true);
  p.fwd.cu_seqlens_q = static_cast<const std::int32_t*>(a.cu_seqlens_q.data);
  p.fwd.cu_seqlens_k = static_cast<const std::int32_t*>(a.cu_seqlens_k.data);
  return run_backward(p, a.options, a.backward_impl, plan_additive(a.grads, shape), a.q.dtype,
                      a.q.device.index, 1, shape.total_q, /*varlen=*/true, a.workspace, stream);
}

Status workspace_size(const VarlenBackwardParams& a, const detail::ProblemShape& shape,
                      std::size_t* bytes) {
  FMHA_RETURN_IF_ERROR(check_supported(a.q.dtype));
  BackwardParams p = make_params(a, shape, /*varlen=*/true);
  p.fwd.cu_seqlens_q = static_cast<const std::int32_t*>(a.cu_seqlens_q.data);
  p.fwd.cu_seqlens_k = static_cast<const std::int32_t*>(a.cu_seqlens_k.data);
  return backward_workspace_bytes(p, a.options, a.backward_impl, plan_additive(a.grads, shape),
                                  a.q.dtype, a.q.device.index, 1, shape.total_q, /*varlen=*/true,
                                  bytes);
}

}  // namespace fmha::cuda
