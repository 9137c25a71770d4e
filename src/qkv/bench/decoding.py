"""What the two generation benchmarks (generate.py: random GPT-2-small, llm.py: a real LLM) share.

A decoding step reads every weight once, so its speed is bounded by memory bandwidth:
share = weight bytes × tokens/s ÷ the bandwidth of a large copy measured in the same run.
"""

from __future__ import annotations

import numpy as np

from .common import time_interleaved

COPY_BYTES = 1 << 30         # the array copied to measure bandwidth (1 GiB of float32)
TARGET_SHARE = 0.85          # qkv ≥ 85 % of the bandwidth limit


def copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = 5) -> float:
    """Bytes per second a large float32 copy moves (read + write), median of `repeats`."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    seconds = time_interleaved({"copy": lambda: np.copyto(dst, src)}, repeats=repeats)["copy"]
    return 2 * src.nbytes / seconds


def gemv_bandwidth(nbytes: int = COPY_BYTES // 4, repeats: int = 7) -> float:
    """Bytes per second one core reads in a matrix × vector product (one BLAS thread, as qkv's
    one-token steps run): the rate a decoding step can stream its weights at, on one core."""
    from ..runtime.threads import blas_one_thread

    W = np.ones((nbytes // 4 // 1024, 1024), dtype=np.float32)          # (rows, 1024)
    x = np.ones(1024, dtype=np.float32)
    with blas_one_thread():
        seconds = time_interleaved({"gemv": lambda: W @ x}, repeats=repeats)["gemv"]
    return W.nbytes / seconds


def bandwidth_share(weight_bytes: int, tokens_per_s: float, copy_bytes_per_s: float) -> float:
    """The share of the memory-bandwidth limit a decoder reaches.

    Each token reads every weight once, so weights × tokens/s bytes stream per second;
    the copy bandwidth is what this machine can move at best.
    """
    return weight_bytes * tokens_per_s / copy_bytes_per_s


def first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
    """Index of the first token where two sequences differ (None when they are equal)."""
    if a.shape == b.shape and np.array_equal(a, b):
        return None
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def spread(seconds: list[float]) -> float:
    """(slowest − fastest) / fastest round: how far the rounds of one run moved."""
    return (max(seconds) - min(seconds)) / min(seconds)
