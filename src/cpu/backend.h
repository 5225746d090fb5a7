// The fast CPU backend: tiled, vectorised, multi-threaded attention with fp32 accumulation for
// dense and varlen calls in fp32 / fp16 / bf16, forward and backward, with causal masks (both
// alignments), windows, GQA / MQA, Dv != D, softcap, sinks, lse / dlse, an additive bias and SAM's
// decomposed rel-pos (dense calls; varlen calls a bias), with dbias and drel in the dense backward
// when they have no broadcast dimension (dbias also summed over the batch alone). What it does not
// take (other broadcast gradients, a varlen dbias, extra keys, float64, neighborhood, merge) runs
// on the float64 reference.
#pragma once

#include "api/problem.h"
#include "cpu/problem.h"
#include "fmha/params.h"

namespace fmha::cpu {

// True when the fast backend computes a call with these options and dtype.
bool supports(const AttentionOptions& options, DType dtype);
// Forward calls (dense and varlen) take more: an additive bias and rel_h / rel_w too (varlen calls
// have no rel-pos); the dense backward those too, with dbias / drel_h / drel_w when they have no
// broadcast dimension (dbias also when it sums over the batch alone); the varlen backward a bias
// without dbias.
bool supports_with_score_terms(const AttentionOptions& options, DType dtype);
bool supports_dense_backward(const AttentionOptions& options, const AttentionGradients& grads,
                             DType dtype, const detail::ProblemShape& shape);

// Validated calls that supports() accepts.
void run(const AttentionForwardParams& p, const detail::ProblemShape& shape);
void run(const AttentionBackwardParams& p, const detail::ProblemShape& shape);
void run(const VarlenForwardParams& p, const detail::ProblemShape& shape);
void run(const VarlenBackwardParams& p, const detail::ProblemShape& shape);

// The kernels (forward.cpp, backward.cpp).
void forward(const Call& call);
void backward(const Call& call);

}  // namespace fmha::cpu
