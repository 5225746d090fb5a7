// CallAttrs from named attributes. One decoder serves both sources: XLA's attribute dictionary
// (the FFI handlers) and a Python dict (the trace-time check), so the two read the same names.
// A Source provides
//   Status integer(std::string_view name, std::int64_t* value);
//   Status real(std::string_view name, float* value);
//   Status triple(std::string_view name, std::array<std::int64_t, 3>* value);
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "jax/calls.h"

namespace fmha::jax {

template <typename Source>
Status decode_attrs(Source& s, CallAttrs* a) {
  std::int64_t flag = 0;
  auto boolean = [&](std::string_view name, bool* value) {
    Status status = s.integer(name, &flag);
    *value = flag != 0;
    return status;
  };
  FMHA_RETURN_IF_ERROR(s.integer("inputs", &a->inputs));
  FMHA_RETURN_IF_ERROR(s.integer("grads", &a->grads));
  FMHA_RETURN_IF_ERROR(boolean("has_dlse", &a->has_dlse));
  FMHA_RETURN_IF_ERROR(boolean("has_scale", &a->has_scale));
  FMHA_RETURN_IF_ERROR(s.real("scale", &a->scale));
  FMHA_RETURN_IF_ERROR(s.real("softcap", &a->softcap));
  FMHA_RETURN_IF_ERROR(boolean("causal", &a->causal));
  FMHA_RETURN_IF_ERROR(boolean("bottom_right", &a->bottom_right));
  FMHA_RETURN_IF_ERROR(s.integer("window_left", &a->window_left));
  FMHA_RETURN_IF_ERROR(s.integer("window_right", &a->window_right));
  FMHA_RETURN_IF_ERROR(boolean("deterministic", &a->deterministic));
  FMHA_RETURN_IF_ERROR(boolean("allow_tf32", &a->allow_tf32));
  FMHA_RETURN_IF_ERROR(boolean("cpu_reference", &a->cpu_reference));
  std::int64_t impl = 0;
  FMHA_RETURN_IF_ERROR(s.integer("backward_impl", &impl));
  switch (impl) {
    case 0: a->backward_impl = BackwardImpl::kAuto; break;
    case 1: a->backward_impl = BackwardImpl::kFused; break;
    case 2: a->backward_impl = BackwardImpl::kSplit; break;
    default:
      return Status::invalid_argument("fmha.jax: backward_impl = " + std::to_string(impl) +
                                      "; accepted: 0 (auto), 1 (fused), 2 (split)");
  }
  FMHA_RETURN_IF_ERROR(s.integer("max_seqlen_q", &a->max_seqlen_q));
  FMHA_RETURN_IF_ERROR(s.integer("max_seqlen_k", &a->max_seqlen_k));
  std::int64_t num_dims = 0;
  FMHA_RETURN_IF_ERROR(s.integer("na_dims", &num_dims));
  a->neighborhood.num_dims = static_cast<int>(num_dims);
  FMHA_RETURN_IF_ERROR(s.triple("kernel_size", &a->neighborhood.kernel_size));
  FMHA_RETURN_IF_ERROR(s.triple("dilation", &a->neighborhood.dilation));
  std::array<std::int64_t, 3> causal{};
  FMHA_RETURN_IF_ERROR(s.triple("na_causal", &causal));
  for (std::size_t i = 0; i < causal.size(); ++i) a->neighborhood.causal[i] = causal[i] != 0;
  return s.integer("num_parts", &a->num_parts);
}

}  // namespace fmha::jax
