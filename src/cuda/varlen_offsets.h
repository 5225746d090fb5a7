// The opt-in host check of CUDA varlen offsets (VarlenForwardParams::check_cu_seqlens): a copy to
// the host, then the very check CPU offsets get (api/validate.h: check_offsets).
#pragma once

#include "api/problem.h"
#include "fmha/params.h"
#include "fmha/status.h"

namespace fmha::cuda {

// Copies cu_seqlens_q / cu_seqlens_k to the host on `stream`, waits for them (a synchronisation
// of the stream) and checks them against q's and k's rows and the max_seqlen; ok without copying
// when `check_cu_seqlens` is off.
Status check_device_offsets(const VarlenForwardParams& p, const detail::ProblemShape& shape,
                            void* stream);
Status check_device_offsets(const VarlenBackwardParams& p, const detail::ProblemShape& shape,
                            void* stream);

}  // namespace fmha::cuda
