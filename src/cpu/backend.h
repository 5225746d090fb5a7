// The fast CPU backend: tiled, vectorised, multi-threaded attention with fp32 accumulation for
// dense, varlen and neighborhood calls in fp32 / fp16 / bf16, forward and backward, with causal
// masks (both alignments), windows, neighborhood masks (1-D / 2-D / 3-D, dilation, per-axis
// causality; key tiles no query of a box sees are never visited), GQA / MQA, Dv != D, softcap,
// sinks, extra keys with their gradients, lse / dlse, an additive bias and SAM's decomposed rel-pos
// (dense calls; varlen calls a bias), with dbias of any broadcast shape and drel without a
// broadcast dimension in the dense backward. What it does not take (a broadcast drel, a varlen
// dbias, float64, a neighborhood call with bias or rel-pos or a grid whose axes one token stride
// does not flatten, merge) runs on the float64 reference.
#pragma once

#include "api/problem.h"
#include "cpu/problem.h"
#include "fmha/params.h"

namespace fmha::cpu {

// The options and dtype every entry point takes: fp32 / fp16 / bf16 inputs (extra keys too).
bool supports(const AttentionOptions& options, DType dtype);
// Whether the fast backend computes a validated call (dispatch runs the rest on the reference):
// the options above; in the dense backward drel_h / drel_w without a broadcast dimension (dbias of
// any shape); in the varlen backward no dbias; neighborhood calls without
// bias and rel-pos, each tensor's grid flattened by one token stride.
bool supports(const AttentionForwardParams& p, const detail::ProblemShape& shape);
bool supports(const AttentionBackwardParams& p, const detail::ProblemShape& shape);
bool supports(const VarlenForwardParams& p, const detail::ProblemShape& shape);
bool supports(const VarlenBackwardParams& p, const detail::ProblemShape& shape);
bool supports(const NeighborhoodForwardParams& p, const detail::ProblemShape& shape);
bool supports(const NeighborhoodBackwardParams& p, const detail::ProblemShape& shape);

// Validated calls that supports() accepts.
void run(const AttentionForwardParams& p, const detail::ProblemShape& shape);
void run(const AttentionBackwardParams& p, const detail::ProblemShape& shape);
void run(const VarlenForwardParams& p, const detail::ProblemShape& shape);
void run(const VarlenBackwardParams& p, const detail::ProblemShape& shape);
void run(const NeighborhoodForwardParams& p, const detail::ProblemShape& shape);
void run(const NeighborhoodBackwardParams& p, const detail::ProblemShape& shape);

// The kernels (forward.cpp, backward.cpp).
void forward(const Call& call);
void backward(const Call& call);

}  // namespace fmha::cpu
