// The checks dense, varlen and neighborhood attention share, forward and backward. They run after
// the layout-specific step in validate.cpp has resolved q, k and v into a ProblemShape.
#pragma once

#include "api/problem.h"
#include "api/validate_tensor.h"
#include "fmha/params.h"
#include "fmha/status.h"

namespace fmha::detail {

// Expected shapes of q, k, v, out and lse for the resolved sizes (SPEC §1, §6, §8).
Shape q_shape(const ProblemShape& s);
Shape k_shape(const ProblemShape& s);
Shape v_shape(const ProblemShape& s);
Shape out_shape(const ProblemShape& s);
Shape lse_shape(const ProblemShape& s);

// H and Hkv >= 1 with H % Hkv == 0 (SPEC §1), D and Dv in 1..256.
Status check_head_sizes(const ProblemShape& s);

// Every check of q, k and v against the resolved shape (dtype, device, strides, data).
Status check_qkv(const Anchor& anchor, const TensorView& q, const TensorView& k,
                 const TensorView& v, const ProblemShape& s);

// The ranks of the options' tensor views, before any is read (expect_valid_ranks).
Status check_option_ranks(const AttentionOptions& options);

// Masks, score modifiers and extra inputs (SPEC §2-§5, §7, §9). Resolves the scale, the rel-pos
// grid and the number of extra keys into *s.
Status check_options(const Anchor& anchor, const AttentionOptions& options, ProblemShape* s);

// out (required) and lse (optional), both written.
Status check_forward_outputs(const Anchor& anchor, const TensorView& out, const TensorView& lse,
                             const ProblemShape& s);

// The forward's out and lse (required), dout (required) and dlse (optional), all read.
Status check_backward_inputs(const Anchor& anchor, const TensorView& out, const TensorView& lse,
                             const TensorView& dout, const TensorView& dlse, const ProblemShape& s);

// dq, dk, dv (required) and the optional gradients, each allowed only when its input is given.
Status check_gradients(const Anchor& anchor, const AttentionGradients& grads,
                       const AttentionOptions& options, const ProblemShape& s);

Status check_backward_impl(BackwardImpl impl);

}  // namespace fmha::detail
