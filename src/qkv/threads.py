"""Using every core from NumPy: a thread pool for independent blocks, BLAS held to one thread.

NumPy releases the GIL inside matmul and ufuncs, so independent pieces of work (the query
blocks of tiled attention) run in parallel on plain Python threads, exp and all, where
BLAS threading would only parallelise the matmuls. BLAS must then run one thread per
call: two levels of threads would fight for the same cores. One BLAS thread is also what
a one-token decoding step wants: its matrix-vector products are bound by memory, which
one core nearly saturates, and a second BLAS thread that must wait for a busy core makes
every call wait with it (on a shared 2-core machine, 20 ms per product instead of 0.1 ms;
docs/benchmarks.md). threadpoolctl sets the limit; without it, nothing is limited.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Callable, Iterable, TypeVar

import numpy as np  # noqa: F401  (loaded before threadpoolctl looks for NumPy's BLAS)

T = TypeVar("T")
R = TypeVar("R")

_pool: ThreadPoolExecutor | None = None
_controller = None
_lock = threading.Lock()
_inside = threading.local()          # set in pool threads: no nested pools


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:           # not Linux
        return os.cpu_count() or 1


def blas_one_thread() -> AbstractContextManager:
    """A context in which NumPy's BLAS uses one thread (restored on exit); no-op without threadpoolctl."""
    global _controller
    if _controller is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            return nullcontext()
        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


def parallel_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """[fn(x) for x in items], spread over one thread per core, BLAS one thread each.

    Runs in order on the calling thread (BLAS still on one thread) when there is one core
    or one item, and as it is when called from inside the pool (no nested pools).
    """
    global _pool
    items = list(items)
    if getattr(_inside, "flag", False):
        return [fn(x) for x in items]
    with blas_one_thread():
        if cores() == 1 or len(items) < 2:
            return [fn(x) for x in items]
        with _lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(cores(), thread_name_prefix="qkv", initializer=_mark_inside)
        return list(_pool.map(fn, items))


def _mark_inside() -> None:
    _inside.flag = True
