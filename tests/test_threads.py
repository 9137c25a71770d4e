"""threads: parallel_map keeps order and never nests; BLAS is held to one thread inside, restored after."""

from __future__ import annotations

import threading

import numpy as np
from threadpoolctl import threadpool_info

from qkv import threads
from qkv.attention import tiled_attention


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_parallel_map_is_an_ordered_map():
    assert threads.parallel_map(lambda x: x * x, range(10)) == [x * x for x in range(10)]
    assert threads.parallel_map(lambda x: x, []) == []


def test_parallel_map_inside_the_pool_runs_in_place():
    def outer(i):
        inner = threads.parallel_map(lambda j: (j, threading.get_ident()), range(3))
        return i, {ident for _, ident in inner} == {threading.get_ident()}
    assert threads.parallel_map(outer, range(4)) == [(i, True) for i in range(4)]


def test_blas_is_one_thread_inside_and_restored_after():
    before = blas_threads()
    assert before                                         # NumPy's BLAS is visible to threadpoolctl
    seen = []
    threads.parallel_map(lambda _: seen.append(blas_threads()), range(2))
    if threads.cores() > 1:
        assert seen and all(s == [1] * len(before) for s in seen)
    with threads.blas_one_thread():
        assert blas_threads() == [1] * len(before)
    assert blas_threads() == before


def test_tiled_attention_is_the_same_in_parallel_and_in_order(monkeypatch):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 4, 300, 16), dtype=np.float32) for _ in range(3))
    parallel = tiled_attention(q, k, v, causal=True, block_size=64)          # 5 query blocks
    monkeypatch.setattr(threads, "cores", lambda: 1)
    in_order = tiled_attention(q, k, v, causal=True, block_size=64)
    assert np.array_equal(parallel, in_order)
