// Merging partial attentions (SPEC §12): every part has the merged out's shape [B, Lq, H, Dv] and
// dtype, and an lse [B, H, Lq]. The merged out is the anchor: its dtype and device are everyone's.
#include <cstddef>
#include <string>
#include <vector>

#include "api/validate.h"
#include "api/validate_message.h"
#include "api/validate_tensor.h"

namespace fmha::detail {
namespace {

struct MergeShapes {
  Shape out;  // [B, Lq, H, Dv]
  Shape lse;  // [B, H, Lq]
};

// The merged out fixes every size; the anchor check makes it safe to read.
Status resolve_merge(const TensorView& out, MergeShapes* shapes) {
  FMHA_RETURN_IF_ERROR(expect_anchor(out, "out", 4, "[B, Lq, H, Dv]"));
  const std::int64_t batch = out.size(0), rows = out.size(1), heads = out.size(2);
  shapes->out = {{"B", batch}, {"Lq", rows}, {"H", heads}, {"Dv", out.size(3)}};
  shapes->lse = {{"B", batch}, {"H", heads}, {"Lq", rows}};
  return Status::ok_status();
}

std::string indexed(const char* name, std::size_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

Status expect_parts(const std::vector<TensorView>& outs, const std::vector<TensorView>& lses) {
  if (outs.empty()) {
    return invalid("merge needs at least one part; got 0 outs");
  }
  if (outs.size() != lses.size()) {
    return invalid("merge got ", outs.size(), " outs but ", lses.size(),
                   " lses; expected one lse per part");
  }
  return Status::ok_status();
}

// One tensor per part, all of one kind (douts or dlses), `count` of them.
Status expect_per_part(const std::vector<TensorView>& list, const char* name, std::size_t count) {
  if (list.size() == count) return Status::ok_status();
  return invalid("merge backward got ", list.size(), " ", name, " for ", count,
                 " parts; expected one per part");
}

Status check_parts(const Anchor& a, const std::vector<TensorView>& outs,
                   const std::vector<TensorView>& lses, const MergeShapes& shapes) {
  for (std::size_t i = 0; i < outs.size(); ++i) {
    FMHA_RETURN_IF_ERROR(
        expect_data_tensor(a, outs[i], indexed("outs", i), shapes.out, Access::kInput));
    FMHA_RETURN_IF_ERROR(
        expect_stat_tensor(a, lses[i], indexed("lses", i), shapes.lse, Access::kInput));
  }
  return Status::ok_status();
}

Anchor anchor_of(const TensorView& out) {
  return {"out", out.dtype, out.device};
}

// Every view of the call, given or not, before any is read (expect_valid_ranks).
Status check_list_ranks(const std::vector<TensorView>& list, const char* name) {
  for (std::size_t i = 0; i < list.size(); ++i)
    FMHA_RETURN_IF_ERROR(expect_valid_rank(list[i], indexed(name, i)));
  return Status::ok_status();
}

Status check_view_ranks(const MergeForwardParams& p) {
  FMHA_RETURN_IF_ERROR(expect_valid_ranks({{&p.out, "out"}, {&p.lse, "lse"}}));
  FMHA_RETURN_IF_ERROR(check_list_ranks(p.outs, "outs"));
  return check_list_ranks(p.lses, "lses");
}

Status check_view_ranks(const MergeBackwardParams& p) {
  FMHA_RETURN_IF_ERROR(
      expect_valid_ranks({{&p.out, "out"}, {&p.lse, "lse"}, {&p.dout, "dout"}, {&p.dlse, "dlse"}}));
  for (const auto& [list, name] :
       {std::pair{&p.outs, "outs"}, {&p.lses, "lses"}, {&p.douts, "douts"}, {&p.dlses, "dlses"}})
    FMHA_RETURN_IF_ERROR(check_list_ranks(*list, name));
  return Status::ok_status();
}

}  // namespace

Status validate(const MergeForwardParams& p) {
  FMHA_RETURN_IF_ERROR(check_view_ranks(p));
  MergeShapes shapes;
  FMHA_RETURN_IF_ERROR(resolve_merge(p.out, &shapes));
  const Anchor a = anchor_of(p.out);
  FMHA_RETURN_IF_ERROR(expect_parts(p.outs, p.lses));
  FMHA_RETURN_IF_ERROR(check_parts(a, p.outs, p.lses, shapes));
  FMHA_RETURN_IF_ERROR(expect_data_tensor(a, p.out, "out", shapes.out, Access::kOutput));
  return expect_stat_tensor(a, p.lse, "lse", shapes.lse, Access::kOutput);
}

Status validate(const MergeBackwardParams& p) {
  FMHA_RETURN_IF_ERROR(check_view_ranks(p));
  MergeShapes shapes;
  FMHA_RETURN_IF_ERROR(resolve_merge(p.out, &shapes));
  const Anchor a = anchor_of(p.out);
  FMHA_RETURN_IF_ERROR(expect_parts(p.outs, p.lses));
  FMHA_RETURN_IF_ERROR(check_parts(a, p.outs, p.lses, shapes));
  FMHA_RETURN_IF_ERROR(expect_data_tensor(a, p.out, "out", shapes.out, Access::kInput));
  FMHA_RETURN_IF_ERROR(expect_stat_tensor(a, p.lse, "lse", shapes.lse, Access::kInput));
  FMHA_RETURN_IF_ERROR(expect_data_tensor(a, p.dout, "dout", shapes.out, Access::kInput));
  if (p.dlse.defined()) {
    FMHA_RETURN_IF_ERROR(expect_stat_tensor(a, p.dlse, "dlse", shapes.lse, Access::kInput));
  }
  FMHA_RETURN_IF_ERROR(expect_per_part(p.douts, "douts", p.outs.size()));
  FMHA_RETURN_IF_ERROR(expect_per_part(p.dlses, "dlses", p.outs.size()));
  for (std::size_t i = 0; i < p.douts.size(); ++i) {
    FMHA_RETURN_IF_ERROR(
        expect_data_tensor(a, p.douts[i], indexed("douts", i), shapes.out, Access::kOutput));
    FMHA_RETURN_IF_ERROR(
        expect_stat_tensor(a, p.dlses[i], indexed("dlses", i), shapes.lse, Access::kOutput));
  }
  return Status::ok_status();
}

}  // namespace fmha::detail
