// 64-bit indexing (SPEC §1): q, out, dout and dq whose batch stride puts batch 1 more than 2^31
// elements past batch 0. The buffers are reserved with mmap(MAP_NORESERVE): only the pages that
// are touched take memory, so the test is cheap. Results must match a compact run of the same
// problem.
#include <sys/mman.h>
#include <sys/resource.h>

#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "common/numeric.h"
#include "fmha/fmha.h"
#include "test_util.h"

namespace fmha_test {
namespace {

class SparseBuffer {
 public:
  explicit SparseBuffer(std::size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : p;
  }
  ~SparseBuffer() {
    if (data_) munmap(data_, bytes_);
  }
  SparseBuffer(const SparseBuffer&) = delete;
  SparseBuffer& operator=(const SparseBuffer&) = delete;
  std::uint16_t* data() const { return static_cast<std::uint16_t*>(data_); }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

constexpr std::int64_t kB = 2, kL = 5, kH = 2, kD = 8;
constexpr std::int64_t kBatchStride = (std::int64_t{1} << 31) + 64;  // elements
constexpr std::int64_t kBatchElements = kL * kH * kD;

// A [B, L, H, D] fp16 view into `buffer` with the huge batch stride.
fmha::TensorView far_view(const SparseBuffer& buffer) {
  return fmha::TensorView::strided(buffer.data(), DType::kFloat16, {kB, kL, kH, kD},
                                   {kBatchStride, kH * kD, kD, 1});
}

std::int64_t far_offset(std::int64_t compact_index) {
  return compact_index / kBatchElements * kBatchStride + compact_index % kBatchElements;
}

void copy_to_far(const HostTensor& compact, const SparseBuffer& far) {
  for (std::int64_t i = 0; i < compact.numel(); ++i)
    far.data()[far_offset(i)] = fmha::numeric::float_to_fp16(static_cast<float>(compact.at(i)));
}

std::vector<double> read_far(const SparseBuffer& far) {
  std::vector<double> values;
  for (std::int64_t i = 0; i < kB * kBatchElements; ++i)
    values.push_back(fmha::numeric::fp16_to_float(far.data()[far_offset(i)]));
  return values;
}

struct Problem {
  std::vector<std::int64_t> shape{kB, kL, kH, kD};
  HostTensor q{DType::kFloat16, shape}, k{DType::kFloat16, shape}, v{DType::kFloat16, shape};
  HostTensor dout{DType::kFloat16, shape}, out{DType::kFloat16, shape};
  HostTensor lse{DType::kFloat32, {kB, kH, kL}};
  HostTensor dq{DType::kFloat16, shape}, dk{DType::kFloat16, shape}, dv{DType::kFloat16, shape};
  fmha::AttentionOptions options;

  explicit Problem(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_uniform(rng, -1, 1);
    options.causal = true;
  }
  // The compact run every far run is compared with.
  void run_compact() {
    ASSERT_TRUE(fmha::run(fmha::AttentionForwardParams{.q = q.view(), .k = k.view(), .v = v.view(),
                                                       .out = out.view(), .lse = lse.view(), .options = options})
                    .ok());
    fmha::AttentionGradients grads;
    grads.dq = dq.view();
    grads.dk = dk.view();
    grads.dv = dv.view();
    ASSERT_TRUE(fmha::run(fmha::AttentionBackwardParams{
                              .q = q.view(), .k = k.view(), .v = v.view(), .out = out.view(), .lse = lse.view(),
                              .dout = dout.view(), .dlse = {}, .options = options, .grads = grads})
                    .ok());
  }
};

std::size_t far_bytes() {
  return static_cast<std::size_t>(kBatchStride + kBatchElements) * sizeof(std::uint16_t);
}

// Inputs and the forward output far apart; gradients compact.
TEST(Indexing, FarInputsAndOutput) {
  SparseBuffer q_far(far_bytes()), out_far(far_bytes()), dout_far(far_bytes());
  if (!q_far.data() || !out_far.data() || !dout_far.data())
    GTEST_SKIP() << "cannot reserve 3 x " << far_bytes() << " bytes of address space";
  Problem p(3);
  p.run_compact();
  copy_to_far(p.q, q_far);
  copy_to_far(p.dout, dout_far);
  HostTensor lse(DType::kFloat32, p.lse.shape());
  const fmha::Status fs = fmha::run(fmha::AttentionForwardParams{
      .q = far_view(q_far), .k = p.k.view(), .v = p.v.view(), .out = far_view(out_far), .lse = lse.view(),
      .options = p.options});
  ASSERT_TRUE(fs.ok()) << fs.message();
  EXPECT_TRUE(close("out", read_far(out_far), p.out.to_double(), p.shape, 1e-6));
  EXPECT_TRUE(close("lse", lse.to_double(), p.lse.to_double(), lse.shape(), 1e-6));

  HostTensor dq(DType::kFloat16, p.shape), dk(DType::kFloat16, p.shape), dv(DType::kFloat16, p.shape);
  fmha::AttentionGradients grads;
  grads.dq = dq.view();
  grads.dk = dk.view();
  grads.dv = dv.view();
  const fmha::Status bs = fmha::run(fmha::AttentionBackwardParams{
      .q = far_view(q_far), .k = p.k.view(), .v = p.v.view(), .out = far_view(out_far), .lse = lse.view(),
      .dout = far_view(dout_far), .dlse = {}, .options = p.options, .grads = grads});
  ASSERT_TRUE(bs.ok()) << bs.message();
  EXPECT_TRUE(close("dq", dq.to_double(), p.dq.to_double(), p.shape, 1e-6));
  EXPECT_TRUE(close("dk", dk.to_double(), p.dk.to_double(), p.shape, 1e-6));
  EXPECT_TRUE(close("dv", dv.to_double(), p.dv.to_double(), p.shape, 1e-6));
}

// Private writable memory of this process (VmData), in bytes.
std::int64_t data_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmData:", 0) == 0) return std::stoll(line.substr(7)) * 1024;
  return -1;
}

// Caps new private memory at `headroom` bytes for the scope (RLIMIT_DATA), so that a library that
// allocates by the span of a tensor's strides fails fast with bad_alloc instead of taking the host.
class MemoryCap {
 public:
  explicit MemoryCap(std::int64_t headroom) {
    getrlimit(RLIMIT_DATA, &saved_);
    const std::int64_t used = data_bytes();
    if (used < 0) return;
    rlimit capped = saved_;
    capped.rlim_cur = static_cast<rlim_t>(used + headroom);
    active_ = setrlimit(RLIMIT_DATA, &capped) == 0;
  }
  ~MemoryCap() {
    if (active_) setrlimit(RLIMIT_DATA, &saved_);
  }
  MemoryCap(const MemoryCap&) = delete;
  MemoryCap& operator=(const MemoryCap&) = delete;

 private:
  rlimit saved_{};
  bool active_ = false;
};

// A gradient whose batch stride exceeds 2^31 elements: it has 160 elements, and computing it must
// cost memory and time by its elements, not by the span of its strides.
TEST(Indexing, FarGradient) {
  SparseBuffer dq_far(far_bytes());
  if (!dq_far.data()) GTEST_SKIP() << "cannot reserve " << far_bytes() << " bytes of address space";
  Problem p(4);
  p.run_compact();
  fmha::AttentionGradients grads;
  grads.dq = far_view(dq_far);
  grads.dk = p.dk.view();
  grads.dv = p.dv.view();
  fmha::Status bs;
  try {
    const MemoryCap cap(std::int64_t{256} << 20);
    bs = fmha::run(fmha::AttentionBackwardParams{
        .q = p.q.view(), .k = p.k.view(), .v = p.v.view(), .out = p.out.view(), .lse = p.lse.view(),
        .dout = p.dout.view(), .dlse = {}, .options = p.options, .grads = grads});
  } catch (const std::bad_alloc&) {
    FAIL() << "backward needed more than 256 MiB for a 160-element gradient: it allocates by the span of "
              "dq's strides (2^31 elements), not by its elements";
  }
  ASSERT_TRUE(bs.ok()) << bs.message();
  EXPECT_TRUE(close("dq", read_far(dq_far), p.dq.to_double(), p.shape, 1e-6));
}

}  // namespace
}  // namespace fmha_test
