// fmha::workspace_size and params.workspace on the CPU: validation first (the same refusal as
// check()), no scratch on the CPU (0 bytes), and a workspace given to a CPU call is never touched
// (its allocator is never called). The CUDA side: tests/cuda/test_cuda_workspace.cpp.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "fmha/fmha.h"
#include "validation_fixtures.h"

namespace fmha_validation {
namespace {

// Workspace::allocate that counts its calls and returns nothing.
void* counting_allocator(void* context, std::size_t) {
  ++*static_cast<int*>(context);
  return nullptr;
}

template <typename Params>
void expect_cpu_workspace(Params p) {
  std::size_t bytes = 12345;
  fmha::Status s = fmha::workspace_size(p, &bytes);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(bytes, 0u) << "the CPU backend takes no scratch memory";
  EXPECT_EQ(fmha::workspace_size(p, nullptr).code(), fmha::StatusCode::kInvalidArgument);

  int calls = 0;
  p.workspace.allocate = &counting_allocator;
  p.workspace.context = &calls;
  s = fmha::run(p);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(calls, 0) << "a CPU call asked the workspace allocator for memory";
  char byte = 0;
  p.workspace = {.data = &byte + 1, .bytes = 0};  // misaligned and too small: ignored on the CPU
  s = fmha::run(p);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(Workspace, DenseCallsOnTheCpuTakeNone) {
  Store s;
  // The fixtures' poison bytes read as small finite floats: valid inputs.
  expect_cpu_workspace(dense_forward(s));
  fmha::AttentionBackwardParams bwd = dense_backward(s);
  ASSERT_TRUE(fmha::run(fmha::AttentionForwardParams{
                            .q = bwd.q, .k = bwd.k, .v = bwd.v, .out = bwd.out, .lse = bwd.lse})
                  .ok());
  expect_cpu_workspace(bwd);
}

TEST(Workspace, SizeOfAnInvalidCallIsItsRefusal) {
  Store s;
  fmha::AttentionForwardParams p = dense_forward(s);
  p.out = s.make(DType::kFloat32, {2, 5, 4, 7});  // Dv 6 expected
  const fmha::Status checked = fmha::check(p);
  ASSERT_FALSE(checked.ok());
  std::size_t bytes = 99;
  const fmha::Status sized = fmha::workspace_size(p, &bytes);
  EXPECT_EQ(sized.code(), checked.code());
  EXPECT_EQ(sized.message(), checked.message());
  EXPECT_EQ(bytes, 0u);
}

}  // namespace
}  // namespace fmha_validation
