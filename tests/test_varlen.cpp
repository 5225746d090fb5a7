// Variable-length packed batches (SPEC §8) against the naive oracle, which runs each sequence on
// its own.
#include "test_case.h"

namespace fmha_test {
namespace {

AttentionCase varlen_case(std::vector<std::int32_t> lq, std::vector<std::int32_t> lk) {
  AttentionCase c;
  c.kind = Kind::kVarlen;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.value_dim = 8;
  c.seqlens_q = std::move(lq);
  c.seqlens_k = std::move(lk);
  return c;
}

TEST(Varlen, MixedLengthsIncludingEmpty) {
  check_case(varlen_case({5, 0, 17, 1, 9}, {7, 3, 0, 1, 20}), 1);
  check_case(varlen_case({0, 0}, {0, 4}), 2);
  check_case(varlen_case({113}, {17}), 3);
}

TEST(Varlen, CausalAndWindows) {
  for (auto align : {fmha::CausalAlignment::kTopLeft, fmha::CausalAlignment::kBottomRight}) {
    AttentionCase c = varlen_case({5, 0, 17, 1, 12}, {7, 3, 0, 4, 12});
    c.options.causal = true;
    c.options.causal_alignment = align;
    c.dlse = true;
    check_case(c, 4);
    c.options.window_left = 3;
    c.options.window_right = 1;
    check_case(c, 5);
  }
}

TEST(Varlen, BiasSinksExtraSoftcap) {
  AttentionCase c = varlen_case({6, 11, 0, 3}, {9, 4, 5, 0});
  c.bias.given = true;
  c.sinks = true;
  c.extra = 2;
  c.options.softcap = 4.0f;
  c.options.scale = 0.4f;
  c.dlse = true;
  check_case(c, 6);
  c.bias = {.given = true, .broadcast = {false, true, true, false}, .zero_stride = true};
  check_case(c, 7);
  c.bias = {.given = true, .broadcast = {true, false, false, false}, .zero_stride = true};
  check_case(c, 8);
}

TEST(Varlen, Layouts) {
  for (Storage qs : {Storage::kPadded, Storage::kHeadsOuter, Storage::kBroadcastHeads})
    for (Storage kvs : {Storage::kContiguous, Storage::kHeadsOuter, Storage::kBroadcastHeads}) {
      AttentionCase c = varlen_case({4, 10, 1}, {6, 10, 2});
      c.q_storage = qs;
      c.kv_storage = kvs;
      c.options.causal = true;
      check_case(c, 9);
    }
}

class VarlenDtype : public ::testing::TestWithParam<DType> {};

TEST_P(VarlenDtype, Features) {
  AttentionCase c = varlen_case({7, 0, 30, 2}, {13, 5, 30, 0});
  c.dtype = GetParam();
  c.heads = 4;
  c.kv_heads = 1;
  c.head_dim = 40;
  c.value_dim = 72;
  c.options.causal = true;
  c.options.causal_alignment = fmha::CausalAlignment::kBottomRight;
  c.bias.given = true;
  c.sinks = true;
  c.extra = 2;
  c.dlse = true;
  check_case(c, 10);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, VarlenDtype,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64),
                         [](const auto& info) { return dtype_name(info.param); });

}  // namespace
}  // namespace fmha_test
