// Naive attention of one (sequence, head) in double, written from SPEC §2-§11 with every matrix
// materialised: scores [Lq, Lk + R], the explicit mask, P, and the backward by matrix formulas.
// Written independently of src/reference/ so that the two can check each other.
#pragma once

#include <cstdint>
#include <vector>

namespace naive {

// Applied to every intermediate a same-dtype implementation would store (scores, P, out, dP, dS):
// the identity gives the exact oracle; rounding to fp16/bf16 gives SPEC §13's naive low-precision
// baseline.
using Round = double (*)(double);
inline double exact(double x) { return x; }

struct Matrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> a;

  Matrix() = default;
  Matrix(std::int64_t r, std::int64_t c) : rows(r), cols(c), a(static_cast<std::size_t>(r * c), 0.0) {}
  double& operator()(std::int64_t r, std::int64_t c) { return a[static_cast<std::size_t>(r * cols + c)]; }
  double operator()(std::int64_t r, std::int64_t c) const {
    return a[static_cast<std::size_t>(r * cols + c)];
  }
  bool empty() const { return a.empty(); }
};

struct HeadInputs {
  Matrix q;                    // [Lq, D]
  Matrix k, v;                 // [Lk + R, D], [Lk + R, Dv]: the Lk ordinary keys, then the R extra keys
  std::int64_t num_keys = 0;   // Lk
  std::vector<char> visible;   // [Lq, Lk]
  Matrix bias;                 // [Lq, Lk] additive (bias + rel-pos), or empty
  double scale = 1, softcap = 0;
  bool has_sink = false;
  double sink = 0;
};

struct HeadForward {
  Matrix raw;                  // scale * q k^T, [Lq, Lk + R]
  Matrix p;                    // softmax probabilities, 0 where hidden
  std::vector<double> p_sink;  // [Lq]
  Matrix out;                  // [Lq, Dv]
  std::vector<double> lse;     // [Lq], -inf for a row with nothing visible
};

struct HeadBackward {
  Matrix dq, dk, dv;  // dk, dv: [Lk + R, *], extra keys last
  Matrix ds;          // gradient wrt the final score s, [Lq, Lk + R]
  double dsink = 0;
};

HeadForward head_forward(const HeadInputs& in, Round round);
// dlse may be empty (no gradient flows into lse).
HeadBackward head_backward(const HeadInputs& in, const HeadForward& fwd, const Matrix& dout,
                           const std::vector<double>& dlse, Round round);

}  // namespace naive
