#include "reference/attention_core.h"

#include <cmath>
#include <limits>
#include <vector>

#include "reference/gradient_sum.h"
#include "reference/parallel.h"
#include "reference/tensor_access.h"

namespace fmha::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::size_t at(std::int64_t index) {
  return static_cast<std::size_t>(index);
}

double dot(const double* a, const double* b, std::int64_t n) {
  double sum = 0.0;
  for (std::int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// Rows of extra keys/values of sequence b: [B, R, Hkv, *] (SPEC §7).
TokenRows extra_rows(const TensorView* view, std::int64_t b) {
  TokenRows rows;
  rows.view = view;
  if (view == nullptr || !view->defined()) return rows;
  rows.base = b * view->stride[0];
  rows.extent[0] = view->shape[1];
  rows.stride[0] = view->stride[1];
  rows.head_stride = view->stride[2];
  rows.feature_stride = view->stride[3];
  return rows;
}

// Reads `count` features of a row into a double vector.
void load_row(const TokenRows& rows, std::int64_t token, std::int64_t head, std::int64_t count,
              double* dst) {
  for (std::int64_t d = 0; d < count; ++d) dst[d] = load(*rows.view, rows.offset(token, head, d));
}

// The keys and values one (sequence, kv head) offers, converted to double once per task: the Lk
// sequence keys, then the R extra keys as keys Lk .. Lk + R - 1 (SPEC §7 appends them).
class KeyValueRows {
 public:
  KeyValueRows(const AttentionProblem& problem, const SequenceView& seq, std::int64_t b,
               std::int64_t kv_head)
      : head_dim_(problem.head_dim), value_dim_(problem.value_dim) {
    const std::int64_t count = seq.len_k + problem.num_extra;
    keys_.resize(at(count * head_dim_));
    values_.resize(at(count * value_dim_));
    const TokenRows extra_k = extra_rows(problem.extra_k, b);
    const TokenRows extra_v = extra_rows(problem.extra_v, b);
    for (std::int64_t j = 0; j < count; ++j) {
      const bool extra = j >= seq.len_k;
      const std::int64_t token = extra ? j - seq.len_k : j;
      load_row(extra ? extra_k : seq.k, token, kv_head, head_dim_, &keys_[at(j * head_dim_)]);
      load_row(extra ? extra_v : seq.v, token, kv_head, value_dim_, &values_[at(j * value_dim_)]);
    }
  }
  const double* key(std::int64_t j) const { return &keys_[at(j * head_dim_)]; }
  const double* value(std::int64_t j) const { return &values_[at(j * value_dim_)]; }

 private:
  std::int64_t head_dim_, value_dim_;
  std::vector<double> keys_, values_;
};

// The softmax inputs of one query row (SPEC §2, §9, §10).
struct ScoreRow {
  std::vector<std::int64_t> keys;  // visible keys ascending, then every extra key as Lk + r
  std::vector<double> logit;       // s, per listed key
  std::vector<double> cap_slope;   // ds / d(scale q.k) through softcap: 1 - tanh^2, or 1 without
  double sink = kNegInf;           // the sink logit, -inf without sinks (exp gives 0)
  double lse = kNegInf;            // log Z; -inf when the row sees no key and no sink

  bool fully_masked() const { return lse == kNegInf; }
  double probability(std::size_t n) const { return std::exp(logit[n] - lse); }
  double sink_probability() const { return std::exp(sink - lse); }
};

// Scores the rows of one query head of one sequence.
class RowScorer {
 public:
  RowScorer(const AttentionProblem& problem, const SequenceView& seq, const KeyValueRows& kv,
            std::int64_t b, std::int64_t h)
      : problem_(problem), seq_(seq), kv_(kv), b_(b), h_(h) {}

  void score(std::int64_t i, const double* q, ScoreRow* row) const {
    const AttentionProblem& p = problem_;
    seq_.visibility.visible_keys(i, &row->keys);
    for (std::int64_t r = 0; r < p.num_extra; ++r) row->keys.push_back(seq_.len_k + r);
    row->logit.resize(row->keys.size());
    row->cap_slope.resize(row->keys.size());

    // Pass 1 (SPEC §2): s = softcap(scale * q.k) + bias + rel_h + rel_w; extra keys skip the terms.
    for (std::size_t n = 0; n < row->keys.size(); ++n) {
      const std::int64_t j = row->keys[n];
      double s = p.scale * dot(q, kv_.key(j), p.head_dim);
      row->cap_slope[n] = 1.0;
      if (p.softcap > 0.0) {
        const double t = std::tanh(s / p.softcap);
        s = p.softcap * t;
        row->cap_slope[n] = 1.0 - t * t;
      }
      if (j < seq_.len_k) s += positional_terms(i, j);
      row->logit[n] = s;
    }
    row->sink = p.sinks != nullptr ? load(*p.sinks, h_ * p.sinks->stride[0]) : kNegInf;

    // Pass 2 (SPEC §10): lse = log(sum exp(s) + exp(sink)), shifted by the row maximum. A row whose
    // maximum is -inf (nothing visible, or every logit -inf) keeps lse = -inf: out 0, gradients 0.
    double row_max = row->sink;
    for (const double s : row->logit) row_max = std::max(row_max, s);
    row->lse = kNegInf;
    if (row_max == kNegInf) return;
    double normaliser = std::exp(row->sink - row_max);
    for (const double s : row->logit) normaliser += std::exp(s - row_max);
    row->lse = row_max + std::log(normaliser);
  }

 private:
  // bias[b, h, i, j] + rel_h[b, h, i, j / Wk] + rel_w[b, h, i, j % Wk] (SPEC §4, §5).
  double positional_terms(std::int64_t i, std::int64_t j) const {
    const AttentionProblem& p = problem_;
    double sum = 0.0;
    if (p.bias.given()) sum += load(*p.bias.view, p.bias.offset(b_, h_, i, j));
    if (p.rel_h.given()) {
      sum += load(*p.rel_h.view, p.rel_h.offset(b_, h_, i, j / p.rel_w_size));
      sum += load(*p.rel_w.view, p.rel_w.offset(b_, h_, i, j % p.rel_w_size));
    }
    return sum;
  }

  const AttentionProblem& problem_;
  const SequenceView& seq_;
  const KeyValueRows& kv_;
  std::int64_t b_, h_;
};

std::int64_t heads_per_kv_head(const AttentionProblem& p) {
  return p.heads / p.kv_heads;
}

}  // namespace

void attention_forward(const AttentionProblem& p) {
  // One task per (sequence, query head): it owns those rows of out and lse.
  parallel_for(p.num_sequences * p.heads, [&](std::int64_t task) {
    const std::int64_t b = task / p.heads;
    const std::int64_t h = task % p.heads;
    const SequenceView seq = p.sequence(b);
    if (seq.len_q == 0) return;
    const KeyValueRows kv(p, seq, b, h / heads_per_kv_head(p));
    const RowScorer scorer(p, seq, kv, b, h);
    std::vector<double> q(at(p.head_dim)), out(at(p.value_dim));
    ScoreRow row;
    for (std::int64_t i = 0; i < seq.len_q; ++i) {
      load_row(seq.q, i, h, p.head_dim, q.data());
      scorer.score(i, q.data(), &row);
      // Pass 3 (SPEC §10): out = sum over listed keys of P * v.
      std::fill(out.begin(), out.end(), 0.0);
      if (!row.fully_masked()) {
        for (std::size_t n = 0; n < row.keys.size(); ++n) {
          const double prob = row.probability(n);
          const double* v = kv.value(row.keys[n]);
          for (std::int64_t d = 0; d < p.value_dim; ++d) out[at(d)] += prob * v[d];
        }
      }
      for (std::int64_t d = 0; d < p.value_dim; ++d)
        store(*seq.out.view, seq.out.offset(i, h, d), out[at(d)]);
      if (seq.lse.given()) store(*seq.lse.view, seq.lse.offset(i, h), row.lse);
    }
  });
}

namespace {

// Accumulates dS into one [B, H, Lq, X] gradient (dbias, drel_h, drel_w) for the rows of one task:
// sequence b, query heads first_head .. first_head + heads - 1. Dimensions the gradient broadcasts
// over are folded into a single slot here, so a broadcast bias costs no [H, Lq, Lk] buffer.
class OperandGradient {
 public:
  OperandGradient(const TensorView& grad, std::int64_t b, std::int64_t first_head,
                  std::int64_t heads, std::int64_t rows, std::int64_t cols)
      : grad_{&grad}, b_(b), first_head_(first_head) {
    if (!grad_.given()) return;
    extent_ = {grad_.broadcasts(1) ? 1 : heads, grad_.broadcasts(2) ? 1 : rows,
               grad_.broadcasts(3) ? 1 : cols};
    sum_.assign(at(extent_[0] * extent_[1] * extent_[2]), 0.0);
  }

  bool given() const { return grad_.given(); }
  void add(std::int64_t head, std::int64_t i, std::int64_t x, double value) {
    sum_[at(slot(head, 0) * extent_[1] * extent_[2] + slot(i, 1) * extent_[2] + slot(x, 2))] +=
        value;
  }
  void emit(GradientPartial* partial) const {
    if (!given()) return;
    std::size_t n = 0;
    for (std::int64_t head = 0; head < extent_[0]; ++head) {
      for (std::int64_t i = 0; i < extent_[1]; ++i) {
        for (std::int64_t x = 0; x < extent_[2]; ++x) {
          partial->add(grad_.offset(b_, first_head_ + head, i, x), sum_[n++]);
        }
      }
    }
  }

 private:
  std::int64_t slot(std::int64_t index, int dim) const { return extent_[at(dim)] == 1 ? 0 : index; }

  BroadcastOperand grad_;
  std::int64_t b_, first_head_;
  std::array<std::int64_t, 3> extent_{0, 0, 0};
  std::vector<double> sum_;
};

// The contributions of one backward task to every gradient (see gradient_sum.h).
struct TaskGradients {
  GradientPartial dq, dk, dv, dextra_k, dextra_v, dbias, drel_h, drel_w, dsinks;
};

// Backward of one (sequence b, kv head): its query heads, all their rows, and the keys they read.
// The task owns the dk / dv rows of its kv head, so it sums over the query heads of the group in a
// fixed order. P and the forward output are recomputed here in double from q, k, v (the out and lse
// the caller passes are not read): gradients are then exact functions of the inputs, which is what
// a finite-difference check and a float64 oracle need.
void backward_task(const AttentionProblem& p, const AttentionGradients& grads, std::int64_t b,
                   std::int64_t kv_head, TaskGradients* result) {
  const SequenceView seq = p.sequence(b);
  const std::int64_t group = heads_per_kv_head(p);
  const std::int64_t first_head = kv_head * group;
  const std::int64_t num_keys = seq.len_k + p.num_extra;
  const KeyValueRows kv(p, seq, b, kv_head);

  std::vector<double> dkeys(at(num_keys * p.head_dim), 0.0),
      dvalues(at(num_keys * p.value_dim), 0.0);
  OperandGradient dbias(grads.dbias, b, first_head, group, seq.len_q, seq.len_k);
  OperandGradient drel_h(grads.drel_h, b, first_head, group, seq.len_q, p.rel_h_size);
  OperandGradient drel_w(grads.drel_w, b, first_head, group, seq.len_q, p.rel_w_size);
  std::vector<double> dsinks(at(group), 0.0);

  std::vector<double> q(at(p.head_dim)), dq(at(p.head_dim));
  std::vector<double> dout(at(p.value_dim)), out(at(p.value_dim));
  ScoreRow row;
  for (std::int64_t g = 0; g < group; ++g) {
    const std::int64_t h = first_head + g;
    const RowScorer scorer(p, seq, kv, b, h);
    for (std::int64_t i = 0; i < seq.len_q; ++i) {
      load_row(seq.q, i, h, p.head_dim, q.data());
      scorer.score(i, q.data(), &row);
      // A fully masked row contributes nothing: its gradients stay 0 (write_gradient zero-fills).
      if (row.fully_masked()) continue;
      load_row(seq.dout, i, h, p.value_dim, dout.data());
      const double dlse = seq.dlse.given() ? load(*seq.dlse.view, seq.dlse.offset(i, h)) : 0.0;

      // Recompute the forward output, then Delta = dout . out - dlse (SPEC §11).
      std::fill(out.begin(), out.end(), 0.0);
      for (std::size_t n = 0; n < row.keys.size(); ++n) {
        const double prob = row.probability(n);
        const double* v = kv.value(row.keys[n]);
        for (std::int64_t d = 0; d < p.value_dim; ++d) out[at(d)] += prob * v[d];
      }
      const double delta = dot(dout.data(), out.data(), p.value_dim) - dlse;

      // Per key: dP = dout . v, dS = P (dP - Delta); dv += P dout; then through softcap and scale
      // to dq and dk; dS itself is the gradient of bias and rel-pos.
      std::fill(dq.begin(), dq.end(), 0.0);
      for (std::size_t n = 0; n < row.keys.size(); ++n) {
        const std::int64_t j = row.keys[n];
        const double prob = row.probability(n);
        const double dscore = prob * (dot(dout.data(), kv.value(j), p.value_dim) - delta);
        double* dv = &dvalues[at(j * p.value_dim)];
        for (std::int64_t d = 0; d < p.value_dim; ++d) dv[d] += prob * dout[at(d)];
        const double ddot = dscore * row.cap_slope[n] * p.scale;  // d loss / d (q . k)
        const double* k = kv.key(j);
        double* dk = &dkeys[at(j * p.head_dim)];
        for (std::int64_t d = 0; d < p.head_dim; ++d) {
          dq[at(d)] += ddot * k[d];
          dk[d] += ddot * q[at(d)];
        }
        if (j < seq.len_k) {
          if (dbias.given()) dbias.add(g, i, j, dscore);
          if (drel_h.given()) drel_h.add(g, i, j / p.rel_w_size, dscore);
          if (drel_w.given()) drel_w.add(g, i, j % p.rel_w_size, dscore);
        }
      }
      // The sink is a logit without a value: dP_sink = 0, so dS_sink = -P_sink * Delta (SPEC §11).
      dsinks[at(g)] -= row.sink_probability() * delta;
      for (std::int64_t d = 0; d < p.head_dim; ++d)
        result->dq.add(seq.dq.offset(i, h, d), dq[at(d)]);
    }
  }

  const TokenRows dextra_k = extra_rows(&grads.dextra_k, b);
  const TokenRows dextra_v = extra_rows(&grads.dextra_v, b);
  for (std::int64_t j = 0; j < num_keys; ++j) {
    const bool extra = j >= seq.len_k;
    const std::int64_t token = extra ? j - seq.len_k : j;
    const TokenRows& dk_rows = extra ? dextra_k : seq.dk;
    const TokenRows& dv_rows = extra ? dextra_v : seq.dv;
    GradientPartial& dk_partial = extra ? result->dextra_k : result->dk;
    GradientPartial& dv_partial = extra ? result->dextra_v : result->dv;
    if (dk_rows.given()) {
      for (std::int64_t d = 0; d < p.head_dim; ++d)
        dk_partial.add(dk_rows.offset(token, kv_head, d), dkeys[at(j * p.head_dim + d)]);
    }
    if (dv_rows.given()) {
      for (std::int64_t d = 0; d < p.value_dim; ++d)
        dv_partial.add(dv_rows.offset(token, kv_head, d), dvalues[at(j * p.value_dim + d)]);
    }
  }
  dbias.emit(&result->dbias);
  drel_h.emit(&result->drel_h);
  drel_w.emit(&result->drel_w);
  if (grads.dsinks.defined()) {
    for (std::int64_t g = 0; g < group; ++g)
      result->dsinks.add((first_head + g) * grads.dsinks.stride[0], dsinks[at(g)]);
  }
}

}  // namespace

void attention_backward(const AttentionProblem& p, const AttentionGradients& grads) {
  // One task per (sequence, kv head); tasks only record contributions, which are then summed in
  // task order, so broadcast gradients (dbias over batch, dsinks over sequences, ...) are
  // deterministic.
  std::vector<TaskGradients> tasks(at(p.num_sequences * p.kv_heads));
  parallel_for(p.num_sequences * p.kv_heads, [&](std::int64_t task) {
    backward_task(p, grads, task / p.kv_heads, task % p.kv_heads, &tasks[at(task)]);
  });
  const auto write = [&](const TensorView& grad, GradientPartial TaskGradients::*member) {
    std::vector<const GradientPartial*> partials;
    for (const TaskGradients& t : tasks) partials.push_back(&(t.*member));
    write_gradient(grad, partials);
  };
  write(grads.dq, &TaskGradients::dq);
  write(grads.dk, &TaskGradients::dk);
  write(grads.dv, &TaskGradients::dv);
  write(grads.dextra_k, &TaskGradients::dextra_k);
  write(grads.dextra_v, &TaskGradients::dextra_v);
  write(grads.dbias, &TaskGradients::dbias);
  write(grads.drel_h, &TaskGradients::drel_h);
  write(grads.drel_w, &TaskGradients::drel_w);
  write(grads.dsinks, &TaskGradients::dsinks);
}

}  // namespace fmha::reference
