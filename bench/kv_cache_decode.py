"""Decode over a KV cache: the `decode` suite of `python -m fmha.bench`, which this script runs.

    python bench/kv_cache_decode.py                    # = python -m fmha.bench --suite decode
    python bench/kv_cache_decode.py --quick            # issue 33's three GQA 32/8 D128 cells
    python bench/kv_cache_decode.py --page-sizes 16,64,256 --cases "^GQA"

Every other argument goes to `python -m fmha.bench` as it is (see its --help; results in
bench/results/<device-name>/decode.{json,md}).
"""
from __future__ import annotations

import sys

from fmha.bench.__main__ import main

QUICK_CASES = "^GQA 32/8 D128 (B1 L128k|B8 L32k|B64 L4k)$"


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "--quick"]
    if len(argv) != len(sys.argv) - 1:
        argv += ["--cases", QUICK_CASES]
    sys.exit(main(["--suite", "decode", *argv]))
