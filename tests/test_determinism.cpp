// deterministic = true: two runs on the same inputs give bitwise-identical outputs and gradients
// (SPEC §11), for every layout and with every option that adds a reduction (GQA, broadcast bias,
// rel-pos, sinks, extra keys).
#include "test_case.h"

namespace fmha_test {
namespace {

void expect_bitwise_repeatable(AttentionCase c) {
  c.options.deterministic = true;
  SCOPED_TRACE(c.describe());
  CaseTensors first = make_tensors(c, 5);
  CaseTensors second = make_tensors(c, 5);
  for (CaseTensors* t : {&first, &second}) {
    ASSERT_TRUE(run_forward(c, *t).ok());
    ASSERT_TRUE(run_backward(c, *t).ok());
  }
  const std::pair<const char*, HostTensor CaseTensors::*> outputs[] = {
      {"out", &CaseTensors::out},       {"lse", &CaseTensors::lse},         {"dq", &CaseTensors::dq},
      {"dk", &CaseTensors::dk},         {"dv", &CaseTensors::dv},           {"dbias", &CaseTensors::dbias},
      {"drel_h", &CaseTensors::drel_h}, {"drel_w", &CaseTensors::drel_w},   {"dsinks", &CaseTensors::dsinks},
      {"dextra_k", &CaseTensors::dextra_k}, {"dextra_v", &CaseTensors::dextra_v}};
  for (auto [name, member] : outputs)
    EXPECT_TRUE((first.*member).bitwise_equal(second.*member)) << name << " differs between two runs";
  check_case(c, 5);  // and deterministic mode is still exact
}

AttentionCase loaded_case(Kind kind, DType dtype) {
  AttentionCase c;
  c.kind = kind;
  c.dtype = dtype;
  c.batch = 2;
  c.heads = 4;
  c.kv_heads = 1;
  c.head_dim = 24;
  c.value_dim = 16;
  c.seqlen_q = 21;
  c.seqlen_k = 30;
  c.seqlens_q = {9, 0, 21};
  c.seqlens_k = {14, 6, 21};
  c.grid = {5, 6, 1};
  c.neighborhood = {.num_dims = 2, .kernel_size = {3, 4, 1}, .dilation = {1, 1, 1}, .causal = {false, true, false}};
  c.bias = {.given = true, .broadcast = {true, false, true, false}, .zero_stride = true};
  c.rel_hk = kind == Kind::kVarlen ? 0 : 5;
  c.sinks = true;
  c.extra = 2;
  c.dlse = true;
  c.options.softcap = 4.0f;
  if (kind != Kind::kNeighborhood) c.options.causal = true;
  return c;
}

TEST(Determinism, Dense) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64})
    expect_bitwise_repeatable(loaded_case(Kind::kDense, dtype));
}

TEST(Determinism, Varlen) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) expect_bitwise_repeatable(loaded_case(Kind::kVarlen, dtype));
}

TEST(Determinism, Neighborhood) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16})
    expect_bitwise_repeatable(loaded_case(Kind::kNeighborhood, dtype));
}

}  // namespace
}  // namespace fmha_test
