#include "cuda/cuda_case_util.h"

#include <algorithm>

namespace fmha_cuda_test {

std::int64_t total(const std::vector<std::int32_t>& lengths) {
  std::int64_t n = 0;
  for (std::int32_t l : lengths) n += l;
  return n;
}

std::int64_t longest(const std::vector<std::int32_t>& lengths) {
  std::int64_t n = 0;
  for (std::int32_t l : lengths) n = std::max<std::int64_t>(n, l);
  return n;
}

fmha_test::HostTensor cu_seqlens(const std::vector<std::int32_t>& lengths) {
  fmha_test::HostTensor t(fmha::DType::kInt32, {static_cast<std::int64_t>(lengths.size()) + 1});
  std::int64_t sum = 0;
  t.set(0, 0);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    sum += lengths[b];
    t.set(static_cast<std::int64_t>(b) + 1, static_cast<double>(sum));
  }
  return t;
}

void describe_problem(std::ostream& s, fmha::DType dtype, const std::vector<std::int32_t>& varlen_q,
                      const std::vector<std::int32_t>& varlen_k, std::int64_t batch,
                      std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t heads,
                      std::int64_t kv_heads, std::int64_t head_dim, std::int64_t value_dim,
                      const fmha::AttentionOptions& options) {
  s << fmha::to_string(dtype) << ' ';
  if (!varlen_q.empty()) {
    s << "varlen q[";
    for (auto l : varlen_q) s << l << ',';
    s << "] k[";
    for (auto l : varlen_k) s << l << ',';
    s << ']';
  } else {
    s << 'B' << batch << " Lq" << seqlen_q << " Lk" << seqlen_k;
  }
  s << " H" << heads << '/' << kv_heads << " D" << head_dim << " Dv" << value_dim;
  if (options.scale) s << " scale" << *options.scale;
  if (options.causal) s << " causal";
  if (options.causal_alignment == fmha::CausalAlignment::kBottomRight) s << "(br)";
  if (options.window_left >= 0 || options.window_right >= 0)
    s << " window(" << options.window_left << ',' << options.window_right << ')';
  if (options.softcap > 0) s << " softcap" << options.softcap;
  if (options.deterministic) s << " deterministic";
  if (options.allow_tf32) s << " allow_tf32";
}

}  // namespace fmha_cuda_test
