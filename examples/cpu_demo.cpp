// The smallest complete use of fmha: causal grouped-query attention on CPU tensors, checked against
// scores materialised by hand, then its backward pass. Build: see README.md.
#include <fmha/fmha.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

namespace {

constexpr std::int64_t B = 2, L = 257, H = 8, Hkv = 2, D = 64;

// out[b, i, h, :] computed the obvious way: every score materialised, softmax, weighted sum.
double materialised_max_error(const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, const std::vector<float>& out) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  double max_error = 0.0;
  std::vector<double> p(L);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < L; ++i) {
        const std::int64_t hk = h / (H / Hkv);
        double m = -std::numeric_limits<double>::infinity(), z = 0.0;
        for (std::int64_t j = 0; j <= i; ++j) {  // causal: key j visible iff j <= i
          double s = 0.0;
          for (std::int64_t d = 0; d < D; ++d)
            s += double(q[((b * L + i) * H + h) * D + d]) * k[((b * L + j) * Hkv + hk) * D + d];
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        for (std::int64_t j = 0; j <= i; ++j) z += (p[j] = std::exp(p[j] - m));
        for (std::int64_t d = 0; d < D; ++d) {
          double o = 0.0;
          for (std::int64_t j = 0; j <= i; ++j) o += p[j] / z * v[((b * L + j) * Hkv + hk) * D + d];
          max_error = std::max(max_error, std::fabs(o - out[((b * L + i) * H + h) * D + d]));
        }
      }
  return max_error;
}

}  // namespace

int main() {
  std::mt19937 rng(2026);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](std::int64_t n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (auto& e : x) e = normal(rng);
    return x;
  };
  std::vector<float> q = random(B * L * H * D), k = random(B * L * Hkv * D), v = random(B * L * Hkv * D);
  std::vector<float> out(q.size(), std::nanf("")), lse(static_cast<std::size_t>(B * H * L));

  using fmha::DType;
  using fmha::TensorView;
  fmha::AttentionForwardParams forward{
      .q = TensorView::contiguous(q.data(), DType::kFloat32, {B, L, H, D}),
      .k = TensorView::contiguous(k.data(), DType::kFloat32, {B, L, Hkv, D}),
      .v = TensorView::contiguous(v.data(), DType::kFloat32, {B, L, Hkv, D}),
      .out = TensorView::contiguous(out.data(), DType::kFloat32, {B, L, H, D}),
      .lse = TensorView::contiguous(lse.data(), DType::kFloat32, {B, H, L}),
      .options = {.causal = true},
  };
  const auto start = std::chrono::steady_clock::now();
  if (fmha::Status s = fmha::run(forward); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const double error = materialised_max_error(q, k, v, out);
  std::printf("fmha %s: causal GQA attention, B=%lld L=%lld H=%lld Hkv=%lld D=%lld on the CPU in %.1f ms\n",
              fmha::version(), (long long)B, (long long)L, (long long)H, (long long)Hkv, (long long)D, ms);
  std::printf("out[0, 0, 0, :4] = %+.5f %+.5f %+.5f %+.5f   lse[0, 0, :3] = %.5f %.5f %.5f\n", out[0],
              out[1], out[2], out[3], lse[0], lse[1], lse[2]);
  std::printf("max |out - materialised| = %.3g\n", error);

  // Backward: gradients of sum(out * dout) with respect to q, k and v.
  std::vector<float> dout = random(static_cast<std::int64_t>(out.size()));
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  fmha::AttentionBackwardParams backward{
      .q = forward.q, .k = forward.k, .v = forward.v, .out = forward.out, .lse = forward.lse,
      .dout = TensorView::contiguous(dout.data(), DType::kFloat32, {B, L, H, D}),
      .options = forward.options,
      .grads = {.dq = TensorView::contiguous(dq.data(), DType::kFloat32, {B, L, H, D}),
                .dk = TensorView::contiguous(dk.data(), DType::kFloat32, {B, L, Hkv, D}),
                .dv = TensorView::contiguous(dv.data(), DType::kFloat32, {B, L, Hkv, D})},
  };
  if (fmha::Status s = fmha::run(backward); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  std::printf("backward: dq[0] = %+.5f  dk[0] = %+.5f  dv[0] = %+.5f\n", dq[0], dk[0], dv[0]);

  // A refused call: 6 kv heads do not divide 8 query heads; nothing is written.
  fmha::AttentionForwardParams bad = forward;
  bad.k = TensorView::contiguous(k.data(), DType::kFloat32, {B, L / 2, 6, D});
  std::printf("refused as expected: %s\n", fmha::check(bad).message().c_str());

  const bool ok = error < 1e-5;
  std::printf("%s\n", ok ? "OK: matches the materialised computation" : "MISMATCH");
  return ok ? 0 : 1;
}
