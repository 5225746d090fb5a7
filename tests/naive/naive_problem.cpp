#include "naive/naive_problem.h"

namespace naive {
namespace {

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

HeadInputs gather(const Problem& p, const Segment& s, std::int64_t h) {
  const std::int64_t d = p.head_dim, dv = p.value_dim, r = p.num_extra;
  const std::int64_t hk = h / (p.heads / p.kv_heads);
  HeadInputs in;
  in.q = Matrix(s.q_len, d);
  for (std::int64_t i = 0; i < s.q_len; ++i)
    for (std::int64_t c = 0; c < d; ++c) in.q(i, c) = p.q[at(((s.q_begin + i) * p.heads + h) * d + c)];
  in.k = Matrix(s.k_len + r, d);
  in.v = Matrix(s.k_len + r, dv);
  for (std::int64_t j = 0; j < s.k_len; ++j) {
    for (std::int64_t c = 0; c < d; ++c) in.k(j, c) = p.k[at(((s.k_begin + j) * p.kv_heads + hk) * d + c)];
    for (std::int64_t c = 0; c < dv; ++c) in.v(j, c) = p.v[at(((s.k_begin + j) * p.kv_heads + hk) * dv + c)];
  }
  for (std::int64_t e = 0; e < r; ++e) {
    for (std::int64_t c = 0; c < d; ++c)
      in.k(s.k_len + e, c) = p.extra_k[at(((s.batch * r + e) * p.kv_heads + hk) * d + c)];
    for (std::int64_t c = 0; c < dv; ++c)
      in.v(s.k_len + e, c) = p.extra_v[at(((s.batch * r + e) * p.kv_heads + hk) * dv + c)];
  }
  in.num_keys = s.k_len;
  in.visible = p.mask(s);
  if (!p.bias.empty() || !p.rel_h.empty()) {
    in.bias = Matrix(s.q_len, s.k_len);
    for (std::int64_t i = 0; i < s.q_len; ++i)
      for (std::int64_t j = 0; j < s.k_len; ++j) {
        double b = 0;
        const std::int64_t row = (s.batch * p.heads + h) * p.bias_rows + i;
        if (!p.bias.empty()) b += p.bias[at(row * p.bias_cols + j)];
        if (!p.rel_h.empty())
          b += p.rel_h[at(row * p.rel_hk + j / p.rel_wk)] + p.rel_w[at(row * p.rel_wk + j % p.rel_wk)];
        in.bias(i, j) = b;
      }
  }
  in.scale = p.scale;
  in.softcap = p.softcap;
  in.has_sink = !p.sinks.empty();
  if (in.has_sink) in.sink = p.sinks[at(h)];
  return in;
}

}  // namespace

Forward forward(const Problem& p, Round round) {
  Forward f;
  f.out.assign(at(p.rows_q * p.heads * p.value_dim), 0.0);
  f.lse.assign(at(p.rows_q * p.heads), 0.0);
  for (const Segment& s : p.segments)
    for (std::int64_t h = 0; h < p.heads; ++h) {
      HeadForward hf = head_forward(gather(p, s, h), round);
      for (std::int64_t i = 0; i < s.q_len; ++i) {
        const std::int64_t row = (s.q_begin + i) * p.heads + h;
        for (std::int64_t c = 0; c < p.value_dim; ++c) f.out[at(row * p.value_dim + c)] = hf.out(i, c);
        f.lse[at(row)] = hf.lse[at(i)];
      }
      f.heads.push_back(std::move(hf));
    }
  return f;
}

Gradients backward(const Problem& p, const Forward& f, const std::vector<double>& dout,
                   const std::vector<double>& dlse, Round round) {
  const std::int64_t d = p.head_dim, dv = p.value_dim, r = p.num_extra;
  Gradients g;
  g.dq.assign(p.q.size(), 0.0);
  g.dk.assign(p.k.size(), 0.0);
  g.dv.assign(p.v.size(), 0.0);
  g.dextra_k.assign(p.extra_k.size(), 0.0);
  g.dextra_v.assign(p.extra_v.size(), 0.0);
  g.dbias.assign(p.bias.size(), 0.0);
  g.drel_h.assign(p.rel_h.size(), 0.0);
  g.drel_w.assign(p.rel_w.size(), 0.0);
  g.dsinks.assign(p.sinks.size(), 0.0);
  std::size_t head_index = 0;
  for (const Segment& s : p.segments)
    for (std::int64_t h = 0; h < p.heads; ++h) {
      const HeadInputs in = gather(p, s, h);
      const HeadForward& hf = f.heads[head_index++];
      Matrix dout_h(s.q_len, dv);
      std::vector<double> dlse_h;
      for (std::int64_t i = 0; i < s.q_len; ++i) {
        const std::int64_t row = (s.q_begin + i) * p.heads + h;
        for (std::int64_t c = 0; c < dv; ++c) dout_h(i, c) = dout[at(row * dv + c)];
        if (!dlse.empty()) dlse_h.push_back(dlse[at(row)]);
      }
      const HeadBackward hb = head_backward(in, hf, dout_h, dlse_h, round);
      const std::int64_t hk = h / (p.heads / p.kv_heads);
      for (std::int64_t i = 0; i < s.q_len; ++i)
        for (std::int64_t c = 0; c < d; ++c) g.dq[at(((s.q_begin + i) * p.heads + h) * d + c)] = hb.dq(i, c);
      for (std::int64_t j = 0; j < s.k_len; ++j) {
        for (std::int64_t c = 0; c < d; ++c) g.dk[at(((s.k_begin + j) * p.kv_heads + hk) * d + c)] += hb.dk(j, c);
        for (std::int64_t c = 0; c < dv; ++c) g.dv[at(((s.k_begin + j) * p.kv_heads + hk) * dv + c)] += hb.dv(j, c);
      }
      for (std::int64_t e = 0; e < r; ++e) {
        for (std::int64_t c = 0; c < d; ++c)
          g.dextra_k[at(((s.batch * r + e) * p.kv_heads + hk) * d + c)] += hb.dk(s.k_len + e, c);
        for (std::int64_t c = 0; c < dv; ++c)
          g.dextra_v[at(((s.batch * r + e) * p.kv_heads + hk) * dv + c)] += hb.dv(s.k_len + e, c);
      }
      for (std::int64_t i = 0; i < s.q_len; ++i)
        for (std::int64_t j = 0; j < s.k_len; ++j) {
          const std::int64_t row = (s.batch * p.heads + h) * p.bias_rows + i;
          if (!p.bias.empty()) g.dbias[at(row * p.bias_cols + j)] += hb.ds(i, j);
          if (!p.rel_h.empty()) {
            g.drel_h[at(row * p.rel_hk + j / p.rel_wk)] += hb.ds(i, j);
            g.drel_w[at(row * p.rel_wk + j % p.rel_wk)] += hb.ds(i, j);
          }
        }
      if (!p.sinks.empty()) g.dsinks[at(h)] += hb.dsink;
    }
  for (auto* grad : {&g.dq, &g.dk, &g.dv, &g.dextra_k, &g.dextra_v, &g.dbias, &g.drel_h, &g.drel_w})
    for (double& x : *grad) x = round(x);
  return g;
}

}  // namespace naive
