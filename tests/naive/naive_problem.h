// The whole problem for the naive oracle: loops over sequences and heads, gathers each head's
// matrices from logical row-major double arrays, and scatters outputs and gradients back
// (dk / dv summed over the query heads sharing a kv head, dbias / drel read off dS).
// Dense and neighborhood batches are sequences of equal length; varlen sequences differ.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "naive/naive_attention.h"

namespace naive {

struct Segment {
  std::int64_t batch = 0;          // b: selects bias / rel-pos / extra keys
  std::int64_t q_begin = 0, q_len = 0;
  std::int64_t k_begin = 0, k_len = 0;
};

struct Problem {
  std::int64_t heads = 1, kv_heads = 1, head_dim = 1, value_dim = 1;
  std::int64_t rows_q = 0, rows_k = 0;  // rows of q / k (all sequences)
  std::int64_t batch = 1;
  std::vector<Segment> segments;
  std::vector<double> q;                // [rows_q, H, D]
  std::vector<double> k, v;             // [rows_k, Hkv, D], [rows_k, Hkv, Dv]
  std::int64_t num_extra = 0;           // R
  std::vector<double> extra_k, extra_v; // [B, R, Hkv, D], [B, R, Hkv, Dv]
  std::vector<double> bias;             // [B, H, bias_rows, bias_cols] (expanded) or empty
  std::int64_t bias_rows = 0, bias_cols = 0;
  std::vector<double> rel_h, rel_w;     // [B, H, bias_rows, Hk], [B, H, bias_rows, Wk] or empty
  std::int64_t rel_hk = 0, rel_wk = 0;
  std::vector<double> sinks;            // [H] or empty
  double scale = 1, softcap = 0;
  std::function<std::vector<char>(const Segment&)> mask;  // [q_len, k_len]
};

struct Forward {
  std::vector<double> out;  // [rows_q, H, Dv]
  std::vector<double> lse;  // [rows_q, H]
  std::vector<HeadForward> heads;  // per (segment, head), kept for the backward
};

struct Gradients {
  std::vector<double> dq, dk, dv, dextra_k, dextra_v;
  std::vector<double> dbias;          // expanded [B, H, bias_rows, bias_cols]
  std::vector<double> drel_h, drel_w;
  std::vector<double> dsinks;         // [H]
};

Forward forward(const Problem& p, Round round);
// dout [rows_q, H, Dv]; dlse [rows_q, H] or empty. Gradients are rounded by `round` at the end, as a
// same-dtype implementation would store them.
Gradients backward(const Problem& p, const Forward& f, const std::vector<double>& dout,
                   const std::vector<double>& dlse, Round round);

}  // namespace naive
