#include "naive/naive_attention.h"

#include <cmath>
#include <limits>

namespace naive {
namespace {

Matrix matmul_transposed(const Matrix& a, const Matrix& b) {  // a [m, k] x b[n, k]^T -> [m, n]
  Matrix c(a.rows, b.rows);
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t j = 0; j < b.rows; ++j) {
      double s = 0;
      for (std::int64_t t = 0; t < a.cols; ++t) s += a(i, t) * b(j, t);
      c(i, j) = s;
    }
  return c;
}

Matrix matmul(const Matrix& a, const Matrix& b) {  // a [m, k] x b [k, n]
  Matrix c(a.rows, b.cols);
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t t = 0; t < a.cols; ++t)
      for (std::int64_t j = 0; j < b.cols; ++j) c(i, j) += a(i, t) * b(t, j);
  return c;
}

Matrix transpose(const Matrix& a) {
  Matrix t(a.cols, a.rows);
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t j = 0; j < a.cols; ++j) t(j, i) = a(i, j);
  return t;
}

void round_all(Matrix& m, Round round) {
  for (double& x : m.a) x = round(x);
}

bool visible(const HeadInputs& in, std::int64_t i, std::int64_t j) {
  return j >= in.num_keys || in.visible[static_cast<std::size_t>(i * in.num_keys + j)];
}

}  // namespace

HeadForward head_forward(const HeadInputs& in, Round round) {
  const std::int64_t lq = in.q.rows, keys = in.k.rows;
  HeadForward f;
  f.raw = matmul_transposed(in.q, in.k);
  for (double& x : f.raw.a) x = round(in.scale * x);
  Matrix s = f.raw;
  if (in.softcap > 0)
    for (double& x : s.a) x = round(in.softcap * std::tanh(x / in.softcap));
  if (!in.bias.empty())
    for (std::int64_t i = 0; i < lq; ++i)
      for (std::int64_t j = 0; j < in.num_keys; ++j) s(i, j) = round(s(i, j) + in.bias(i, j));

  f.p = Matrix(lq, keys);
  f.p_sink.assign(static_cast<std::size_t>(lq), 0.0);
  f.lse.assign(static_cast<std::size_t>(lq), -std::numeric_limits<double>::infinity());
  for (std::int64_t i = 0; i < lq; ++i) {
    double m = in.has_sink ? in.sink : -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < keys; ++j)
      if (visible(in, i, j)) m = std::max(m, s(i, j));
    if (std::isinf(m)) continue;  // nothing visible, no sink: P = 0, lse = -inf
    double z = in.has_sink ? std::exp(in.sink - m) : 0.0;
    for (std::int64_t j = 0; j < keys; ++j)
      if (visible(in, i, j)) z += std::exp(s(i, j) - m);
    for (std::int64_t j = 0; j < keys; ++j)
      if (visible(in, i, j)) f.p(i, j) = round(std::exp(s(i, j) - m) / z);
    if (in.has_sink) f.p_sink[static_cast<std::size_t>(i)] = std::exp(in.sink - m) / z;
    f.lse[static_cast<std::size_t>(i)] = m + std::log(z);
  }
  f.out = matmul(f.p, in.v);
  round_all(f.out, round);
  return f;
}

HeadBackward head_backward(const HeadInputs& in, const HeadForward& f, const Matrix& dout,
                           const std::vector<double>& dlse, Round round) {
  const std::int64_t lq = in.q.rows, keys = in.k.rows;
  HeadBackward g;
  Matrix dp = matmul_transposed(dout, in.v);  // dP = dO V^T
  round_all(dp, round);
  std::vector<double> delta(static_cast<std::size_t>(lq), 0.0);  // rowsum(dO * O) - dlse
  for (std::int64_t i = 0; i < lq; ++i) {
    double d = 0;
    for (std::int64_t c = 0; c < dout.cols; ++c) d += dout(i, c) * f.out(i, c);
    if (!dlse.empty() && !std::isinf(f.lse[static_cast<std::size_t>(i)])) d -= dlse[static_cast<std::size_t>(i)];
    delta[static_cast<std::size_t>(i)] = d;
  }
  g.ds = Matrix(lq, keys);
  for (std::int64_t i = 0; i < lq; ++i)
    for (std::int64_t j = 0; j < keys; ++j)
      g.ds(i, j) = round(f.p(i, j) * (dp(i, j) - delta[static_cast<std::size_t>(i)]));
  for (std::int64_t i = 0; i < lq; ++i)
    g.dsink -= f.p_sink[static_cast<std::size_t>(i)] * delta[static_cast<std::size_t>(i)];

  // Back through softcap to the raw score scale * q.k: ds/draw = 1 - tanh^2(raw / softcap).
  Matrix draw = g.ds;
  if (in.softcap > 0)
    for (std::int64_t i = 0; i < lq; ++i)
      for (std::int64_t j = 0; j < keys; ++j) {
        const double t = std::tanh(f.raw(i, j) / in.softcap);
        draw(i, j) = round(draw(i, j) * (1 - t * t));
      }
  g.dq = matmul(draw, in.k);
  g.dk = matmul(transpose(draw), in.q);
  for (double& x : g.dq.a) x *= in.scale;
  for (double& x : g.dk.a) x *= in.scale;
  g.dv = matmul(transpose(f.p), dout);
  return g;
}

}  // namespace naive
