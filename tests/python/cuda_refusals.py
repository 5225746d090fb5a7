"""The CUDA backend's refusals of valid calls that the tests may meet (src/cuda: not_supported;
docs/cuda-status.md), each by a fragment of its message. A test meeting one of these through
harness.call skips with the message; any other NotImplementedError on CUDA fails, so that a case
the backend stops running shows up as a failure instead of a skip.

A head-dim bucket left out of the build is a property of the build, not a gap of the backend:
every test that meets it skips, through harness.call or not (conftest.py). This module does not
import torch, so that conftest.py can read it in a run of the JAX tests alone."""

from __future__ import annotations

from typing import Optional

# A build configured with fewer head-dim buckets (FMHA_HEAD_DIM_BUCKETS; head_dim_buckets.h)
BUCKET_NOT_BUILT = "which this build of the CUDA backend left out"

EXPECTED_CUDA_REFUSALS = {
    # A broadcast bias's gradient is summed with atomics (backward.cu).
    "deterministic dbias of a broadcast bias": "deterministic=true with grads.dbias over a broadcast bias",
    # The sm80 kernels sum drel_h / drel_w with atomics; Hopper has an exact form for some grids.
    "deterministic drel on the sm80 kernels": "deterministic=true with grads.drel_h / grads.drel_w",
    "head-dim bucket left out of the build": BUCKET_NOT_BUILT,
    # fp32 backward above bucket 128 on GPUs with 99 KB of shared memory a block (sm86/sm89).
    "shared memory of this GPU": "bytes of shared memory per block; this GPU allows",
}


def expected_cuda_refusal(message: str) -> Optional[str]:
    """The EXPECTED_CUDA_REFUSALS entry that `message` is, or None."""
    for case, fragment in EXPECTED_CUDA_REFUSALS.items():
        if fragment in message:
            return case
    return None


def bucket_not_built(error: BaseException) -> bool:
    """Whether error is the library's refusal of a call whose head-dim bucket the build left out.
    Only the exception itself counts, not one it was raised from or while handling: a test that
    turns the refusal into another failure fails."""
    return isinstance(error, NotImplementedError) and BUCKET_NOT_BUILT in str(error)
