"""Benchmark suite of fmha: `python -m fmha.bench --help`.

Every case is checked against a materialised reference, then timed for fmha and for every peer
available in the same process (PyTorch SDPA with each backend forced, compiled FlexAttention, a
naive materialised implementation), forward, backward and forward+backward separately.
"""
