"""Using every core from NumPy: a thread pool for independent blocks, BLAS threads chosen per task.

NumPy releases the GIL inside matmul and ufuncs, so independent pieces of work (the query
blocks of tiled attention) run in parallel on plain Python threads, exp and all, where
BLAS threading would only parallelise the matmuls. BLAS must then run one thread per
call: two levels of threads would fight for the same cores. A one-token decoding step is
matrix × vector products bound by memory: whether a second BLAS thread helps (idle
machine) or makes every product wait for a busy core (shared machine) is measured while
generating (`StepThreads`, between 1 and the count qkv.runtime.tuning measured fastest), or pinned with
QKV_THREADS=decode:N (or QKV_DECODE_THREADS=N). Worker processes that
parallelise by themselves (analysis/backends.py) set one BLAS thread for their whole life
(`set_blas_threads`). threadpoolctl sets the limits. This module is the one place qkv
counts cores and sets BLAS threads; qkv.runtime.tuning measures how many each kind of work should use.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Callable, Iterable, TypeVar

import numpy as np  # noqa: F401  (loaded before threadpoolctl looks for NumPy's BLAS)
from threadpoolctl import ThreadpoolController

from .errors import QkvError

T = TypeVar("T")
R = TypeVar("R")

_pool: ThreadPoolExecutor | None = None
_controller = None
_seen_modules = 0                 # len(sys.modules) when _controller looked for BLAS libraries
_lock = threading.Lock()
_inside = threading.local()          # set in pool threads: no nested pools


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:           # not Linux
        return os.cpu_count() or 1


MAX_REMOTE = 4096        # workers a command may ask of a Ray cluster (whose cores are not counted here)


def check_count(flag: str, n: int | None, *, here: bool = True) -> int | None:
    """A --workers or --threads count as given (None: the command chooses): 1 to the cores this process may
    run on when the work runs here (more would only queue on the same cores, each with its own memory);
    up to MAX_REMOTE for a Ray cluster elsewhere (HERE false). Else one QkvError saying how many there are.
    The one check of every such flag (qkv activations, heads, sae train, train, bench)."""
    if n is None:
        return None
    most = cores() if here else MAX_REMOTE
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= most:
        where = f"this machine has {most} core{'s' if most > 1 else ''}" if here else f"at most {most} workers"
        raise QkvError(f"{flag} {n}: {where}; give {flag} from 1 to {most}")
    return n


# Pins the BLAS threads of one-token decoding steps (e.g. QKV_DECODE_THREADS=2 on an idle machine).
DECODE_THREADS_VAR = "QKV_DECODE_THREADS"


def _blas_libs() -> list:
    """The process's BLAS libraries, as threadpoolctl controls them: found again whenever modules were imported
    since the last look (~1 ms), since an import can load a BLAS of its own (scipy's OpenBLAS, which numba's
    kernels bring in), and a library found before it would leave that one unlimited."""
    global _controller, _seen_modules
    if _controller is None or _seen_modules != len(sys.modules):
        _controller, _seen_modules = ThreadpoolController(), len(sys.modules)
    return [lib for lib in _controller.lib_controllers if lib.user_api == "blas"]


def blas_one_thread() -> AbstractContextManager:
    """A context in which NumPy's BLAS uses one thread (restored on exit)."""
    return blas_threads(1)


def blas_threads(n: int) -> AbstractContextManager:
    """A context in which NumPy's BLAS uses n threads (restored on exit).

    Plain form: threadpoolctl's `ThreadpoolController().limit(limits=n, user_api="blas")`. That
    re-reads every library's state on each entry (~0.7 ms a decoding step, 64 entries for 64
    tokens); this asks NumPy's BLAS libraries directly (a few µs).
    """
    return _BlasThreads(_blas_libs(), n)


def set_blas_threads(n: int) -> None:
    """NumPy's BLAS on n threads from now on, never restored: for a worker process's whole life."""
    for lib in _blas_libs():
        lib.set_num_threads(n)


def blas_at_most(n: int) -> AbstractContextManager:
    """A context in which NumPy's BLAS uses at most n threads: fewer if the caller already set fewer
    (a worker process held to one thread stays on one). Restored on exit."""
    libs = _blas_libs()
    now = min((lib.get_num_threads() for lib in libs), default=n)
    return _BlasThreads(libs, max(1, min(n, now)))


class _BlasThreads(AbstractContextManager):
    """Set each BLAS library to n threads on entry, back to what it had on exit."""

    def __init__(self, libs: list, n: int):
        self.libs, self.n, self.before = libs, n, []

    def __enter__(self):
        self.before = [lib.get_num_threads() for lib in self.libs]
        for lib in self.libs:
            lib.set_num_threads(self.n)
        return self

    def __exit__(self, *exc) -> None:
        for lib, n in zip(self.libs, self.before):
            lib.set_num_threads(n)


def decode_threads() -> int | None:
    """BLAS threads pinned for one-token decoding steps by QKV_DECODE_THREADS, or None: chosen by timing."""
    value = os.environ.get(DECODE_THREADS_VAR, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise QkvError(f"{DECODE_THREADS_VAR}={value!r} is not a thread count; set it to a whole number ≥ 1 "
                       "or unset it")
    return int(value)


RECENT = 4              # a thread count's time: the least of its last RECENT one-token steps
SWITCH_MARGIN = 1.08    # more threads must be this much faster to take over (as qkv.runtime.tuning.MARGIN)


class StepThreads:
    """BLAS threads for the one-token steps of one generation, chosen by timing those steps.

    A step's products are matrix × vector, bound by memory. On an idle 2-core machine two
    threads stream the weights ~1.5× faster than one; on a busy one a second thread makes
    every product wait for a core the scheduler gave to someone else (~10× slower; both
    measured, docs/benchmarks.md). Which holds changes with the load, so it is measured here,
    while generating: steps 0-2 run on 1, `most`, 1 threads (step 0 also warms up), later
    steps on the faster, and the slower is tried again now and then: after a lost probe that
    took r× the faster step, max(2, r)× later than the time before, so probes cost at most
    ~1/8 of the steps' time even where a second thread is 15× slower. A count's time is the
    least of its last RECENT steps (a hiccup only ever slows a step down), and the steps leave
    the count they run on only for one faster by SWITCH_MARGIN: one slow step does not send a
    generation to the slower count until the next probe. The numbers do not depend on the
    choice: each output of a product is summed by one thread either way.

    `pinned` (QKV_DECODE_THREADS) fixes the count; one core means one thread.
    """

    def __init__(self, pinned: int | None = None, most: int | None = None, clock: Callable[[], float] | None = None):
        import time

        self.clock = clock or time.perf_counter
        self.most = most if most is not None else min(2, cores())
        self.pinned = pinned if pinned is not None else (1 if self.most <= 1 else None)
        self.times: dict[int, list[float]] = {}     # the last RECENT step times with n threads
        self.current: int | None = None             # the count steps run on between probes
        self.step = 0
        self.gap = 8
        self.next_probe = 3 + self.gap              # step at which the slower count is tried again
        self.last: int | None = None                # the count the latest step ran with

    def choose(self) -> int:
        """The thread count for the next step."""
        if self.pinned is not None:
            return self.pinned
        if self.step < 3:                           # 1, most, 1: the first step warms up
            return self.most if self.step == 1 else 1
        if self.step >= self.next_probe:
            return self.most if self.current == 1 else 1
        return self.current

    @property
    def seconds(self) -> dict[int, float]:
        """Each count's time: the least of its last RECENT steps."""
        return {n: min(t) for n, t in self.times.items()}

    def _faster(self, n: int, than: int, seconds: float | None = None) -> bool:
        """n threads (`seconds` if given, else its time) beat `than` by SWITCH_MARGIN (fewer threads win
        a tie: safer on a busy machine)."""
        margin = SWITCH_MARGIN if n > than else 1.0
        return (self.seconds[n] if seconds is None else seconds) * margin < self.seconds[than]

    def __enter__(self) -> "StepThreads":
        """Hold the steps' thread count from step to step (set again only when the choice changes) until
        exit, which restores what BLAS had: one setting per choice instead of a set and a restore
        around every step (plain form: `with blas_threads(n)` around each step)."""
        self._libs = _blas_libs()
        self._before = [lib.get_num_threads() for lib in self._libs]
        self._held: int | None = None
        return self

    def __exit__(self, *exc) -> None:
        for lib, n in zip(self._libs, self._before):
            lib.set_num_threads(n)
        self._libs = []

    def run(self, fn: Callable[[], R]) -> R:
        """fn() as one step, with the chosen BLAS threads, timed to inform the next choices.

        Inside `with self:` the count stays set after the step; outside, it is restored after each."""
        n = self.choose()
        start = self.clock()
        if getattr(self, "_libs", None):
            if n != self._held:
                for lib in self._libs:
                    lib.set_num_threads(n)
                self._held = n
            result = fn()
        else:
            with blas_threads(n):
                result = fn()
        seconds = self.clock() - start
        if self.pinned is None:
            if self.step > 0:                       # step 0 only warms up
                self.times.setdefault(n, []).append(seconds)
                del self.times[n][:-RECENT]
            if self.step == 2:                      # both measured: the slower waits gap × r steps
                self.current = self.most if self._faster(self.most, 1) else 1
                slow, fast = max(self.seconds.values()), min(self.seconds.values())
                self.next_probe = 3 + int(self.gap * max(1.0, slow / fast))
            elif self.step > 2 and n != self.current:   # a probe: if it lost by r×, wait max(2, r)× longer
                if self._faster(n, self.current, seconds):     # the probe's own time, not older ones
                    self.current = n
                else:
                    self.gap = int(self.gap * max(2.0, seconds / self.seconds[self.current]))
                self.next_probe = self.step + self.gap
        self.step += 1
        self.last = n
        return result


def parallel_map(fn: Callable[[T], R], items: Iterable[T], workers: int | None = None) -> list[R]:
    """[fn(x) for x in items], spread over `workers` threads (default one per core), BLAS one thread each.

    Runs in order on the calling thread (BLAS still on one thread) when there is one worker
    or one item, and as it is when called from inside the pool (no nested pools).
    """
    global _pool
    items = list(items)
    if getattr(_inside, "flag", False):
        return [fn(x) for x in items]
    workers = min(workers or cores(), cores())
    with blas_one_thread():
        if workers <= 1 or len(items) < 2:
            return [fn(x) for x in items]
        with _lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(cores(), thread_name_prefix="qkv", initializer=_mark_inside)
        if workers >= cores():
            return list(_pool.map(fn, items))
        chunks = [items[i::workers] for i in range(workers)]           # `workers` of the pool's threads
        done = list(_pool.map(lambda chunk: [fn(x) for x in chunk], chunks))
        out: list = [None] * len(items)
        for i, results in enumerate(done):
            out[i::workers] = results
        return out


def _mark_inside() -> None:
    _inside.flag = True
