"""threads: parallel_map keeps order and never nests; BLAS is held to one thread inside, restored after."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from qkv import QkvError

from qkv.runtime import threads
from qkv.core.kernels import tiled_attention


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


class StepClock:
    """A fake clock: each step 'takes' seconds[n] for the thread count n it runs with."""

    def __init__(self, seconds: dict[int, float]):
        self.seconds, self.now, self.n = seconds, 0.0, None

    def __call__(self) -> float:
        return self.now


def run_steps(chooser: threads.StepThreads, clock: StepClock, steps: int) -> list[int]:
    used = []
    for _ in range(steps):
        def step():
            n = blas_threads()[0]
            used.append(n)
            clock.now += clock.seconds[n]
        chooser.run(step)
    return used


def test_step_threads_keep_the_faster_count_and_probe_less_when_it_loses():
    if threads.cores() < 2:
        return
    slow_second = StepClock({1: 0.03, 2: 0.45})                     # a busy machine: 2 threads 15× slower
    used = run_steps(threads.StepThreads(clock=slow_second), slow_second, 200)
    assert used[:3] == [1, 2, 1] and used.count(2) <= 3               # 1 probe at the start, then rarely
    fast_second = StepClock({1: 0.03, 2: 0.02})                     # an idle machine: 2 threads faster
    used = run_steps(threads.StepThreads(clock=fast_second), fast_second, 64)
    assert used[:3] == [1, 2, 1] and used[3:].count(2) >= 56


def test_step_threads_do_not_leave_the_faster_count_for_one_slow_step():
    if threads.cores() < 2:
        return
    clock = StepClock({1: 0.03, 2: 0.02})                           # an idle machine: 2 threads faster
    chooser, used = threads.StepThreads(clock=clock), []
    for step in range(64):
        def work():
            n = blas_threads()[0]
            used.append(n)
            clock.now += 0.5 if step in (5, 20) else clock.seconds[n]    # two hiccups (another process ran)
        chooser.run(work)
    assert chooser.current == 2 and used[3:].count(2) >= 56          # the hiccups did not send it to 1
    clock = StepClock({1: 0.030, 2: 0.029})                         # 2 threads barely faster: not worth it
    used = run_steps(threads.StepThreads(clock=clock), clock, 64)
    assert used[3:].count(1) >= 56


def test_step_threads_pinned(monkeypatch):
    clock = StepClock({1: 0.03, 2: 0.01})
    assert set(run_steps(threads.StepThreads(pinned=1, clock=clock), clock, 10)) == {1}
    monkeypatch.setenv(threads.DECODE_THREADS_VAR, "2")
    assert threads.decode_threads() == 2
    monkeypatch.setenv(threads.DECODE_THREADS_VAR, "two")
    with pytest.raises(QkvError, match="QKV_DECODE_THREADS"):
        threads.decode_threads()


def test_set_blas_threads_lasts_until_set_again():
    before = blas_threads()
    try:
        threads.set_blas_threads(1)
        assert blas_threads() == [1] * len(before)
    finally:
        for lib, n in zip(threads._blas_libs(), before):
            lib.set_num_threads(n)
    assert blas_threads() == before


def test_a_blas_loaded_after_the_first_look_is_found(monkeypatch):
    """A library an import brings in later (scipy's OpenBLAS, loaded with numba's kernels) is limited too: the
    libraries are looked for again once modules were imported since the last look."""
    import sys
    import types

    from qkv.runtime import threads

    class Nothing:                          # what a look before that import found: no BLAS at all
        lib_controllers = []

    monkeypatch.setattr(threads, "_controller", Nothing())
    monkeypatch.setattr(threads, "_seen_modules", len(sys.modules))
    assert threads._blas_libs() == []                                   # no import since: the same look
    monkeypatch.setitem(sys.modules, "qkv_test_a_new_module", types.ModuleType("qkv_test_a_new_module"))
    assert [lib.user_api for lib in threads._blas_libs()] and all(
        lib.user_api == "blas" for lib in threads._blas_libs())           # looked again: NumPy's BLAS found
