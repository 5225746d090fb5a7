// Which head-dim buckets this build compiled. CMake's FMHA_HEAD_DIM_BUCKETS defines FMHA_BUCKET_<D>
// to 1 or 0 for every bucket (all are built by default, and without CMake); the dispatch refuses
// a problem whose bucket was left out instead of referring to a kernel that does not exist.
#pragma once

#include <string>

#include "fmha/status.h"

#ifndef FMHA_BUCKET_32
#define FMHA_BUCKET_32 1
#endif
#ifndef FMHA_BUCKET_64
#define FMHA_BUCKET_64 1
#endif
#ifndef FMHA_BUCKET_96
#define FMHA_BUCKET_96 1
#endif
#ifndef FMHA_BUCKET_128
#define FMHA_BUCKET_128 1
#endif
#ifndef FMHA_BUCKET_160
#define FMHA_BUCKET_160 1
#endif
#ifndef FMHA_BUCKET_192
#define FMHA_BUCKET_192 1
#endif
#ifndef FMHA_BUCKET_224
#define FMHA_BUCKET_224 1
#endif
#ifndef FMHA_BUCKET_256
#define FMHA_BUCKET_256 1
#endif

namespace fmha::cuda {

constexpr bool head_dim_bucket_built(int bucket) {
  switch (bucket) {
    case 32:
      return FMHA_BUCKET_32;
    case 64:
      return FMHA_BUCKET_64;
    case 96:
      return FMHA_BUCKET_96;
    case 128:
      return FMHA_BUCKET_128;
    case 160:
      return FMHA_BUCKET_160;
    case 192:
      return FMHA_BUCKET_192;
    case 224:
      return FMHA_BUCKET_224;
    case 256:
      return FMHA_BUCKET_256;
    default:
      return false;
  }
}

inline Status head_dim_bucket_not_built(int head_dim, int value_dim, int bucket) {
  return Status::not_supported("fmha: head_dim " + std::to_string(head_dim) + " / value_dim " +
                               std::to_string(value_dim) + " runs in the head-dim bucket " +
                               std::to_string(bucket) +
                               ", which this build of the CUDA backend left out; rebuild with it "
                               "in the CMake option FMHA_HEAD_DIM_BUCKETS");
}

}  // namespace fmha::cuda
