"""Where the texts are analysed: this process, all local cores, or a Ray cluster.

Every backend takes jobs (index, line, text) and yields (index, TextResult | Failure) in
whatever order they finish; `Totals.offer` puts them back in order. Workers load the model
once each (from its source: memory-mapped, so cheap) and take texts in chunks, with a
bounded number of chunks in flight, so the corpus is never all in memory.

Each worker computes with one BLAS thread: a text is a few small matrix products, which
threads do not speed up, and N processes × several BLAS threads on N cores slow to a crawl
(measured: 40 ms → 620 ms a text on a busy 2-core machine). Parallelism comes from workers.
Cores and BLAS threads are counted and set by qkv.runtime.threads, as everywhere.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Iterable, Iterator

from ..runtime.errors import QkvError
from ..runtime.threads import blas_one_thread, cores, set_blas_threads
from .text import Setup, analyse_job, prepare

BACKENDS = ("local", "ray")
CHUNK = 8                 # texts per task: large enough to hide the messaging, small enough to balance
IN_FLIGHT = 2             # chunks queued per worker
RAY_INSTALL = "pip install 'qkv[ray]' (or: pip install ray)"

Job = tuple[int, "int | None", str]


@dataclass(frozen=True)
class WorkerSpec:
    """How a worker makes its own Setup: the model's source, float type, window and arithmetic (as the first
    process loaded it: `qkv --arith`)."""

    source: str
    dtype: str
    window: int
    arith: str = "exact"

    def setup(self) -> Setup:
        from ..models.loading import load

        return prepare(load(self.source, dtype=self.dtype, arith=self.arith), self.window)


def chunks(jobs: Iterable[Job], size: int = CHUNK) -> Iterator[list[Job]]:
    it = iter(jobs)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def run_chunk(setup: Setup, chunk: list[Job]) -> list:
    return [analyse_job(setup, *job) for job in chunk]


# ── this process ────────────────────────────────────────────────────────────────

def in_process(setup: Setup, jobs: Iterable[Job]) -> Iterator:
    with blas_one_thread():
        for job in jobs:
            yield analyse_job(setup, *job)


# ── local cores ─────────────────────────────────────────────────────────────────

_WORKER_SETUP: Setup | None = None


def die_with_parent(parent: int) -> None:
    """End this worker process when process PARENT ends, even by kill -9 (no cleanup can run there).

    The worker holds both ends of its task queue, so it would otherwise wait on it forever.
    Linux: the kernel sends SIGKILL at the parent's death (prctl PR_SET_PDEATHSIG); elsewhere a
    thread looks every half second whether the parent is still this process's parent.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:                # the parent died before the prctl
                os._exit(1)
            return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="qkv-parent-watch", daemon=True).start()


def _init_worker(spec: WorkerSpec, parent: int | None = None) -> None:
    global _WORKER_SETUP
    if parent is not None:
        die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is the parent's to handle
    set_blas_threads(1)                               # for the life of the worker
    _WORKER_SETUP = spec.setup()


def _pool_chunk(chunk: list[Job]) -> list:
    return run_chunk(_WORKER_SETUP, chunk)


def process_pool(spec: WorkerSpec, jobs: Iterable[Job], workers: int) -> Iterator:
    """`workers` processes (spawned, so no state is shared by accident), each loading the model once."""
    import multiprocessing

    ex = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker, initargs=(spec, os.getpid()))
    try:
        pending = set()
        for chunk in chunks(jobs):
            pending.add(ex.submit(_pool_chunk, chunk))
            if len(pending) >= IN_FLIGHT * workers:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield from future.result()
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield from future.result()
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


# ── Ray ─────────────────────────────────────────────────────────────────────────

def import_ray():
    try:
        import ray
    except ImportError:
        raise QkvError(f"the ray backend needs Ray, which is not installed; {RAY_INSTALL}") from None
    return ray


class RayWorker:
    """A Ray actor: loads the model once, then analyses the chunks it is sent."""

    def __init__(self, spec: WorkerSpec):
        set_blas_threads(1)                           # for the life of the actor's process
        self.setup = spec.setup()

    def run(self, chunk: list[Job]) -> list:
        return run_chunk(self.setup, chunk)


RAY_CONNECT_SECONDS = 5          # a head that does not answer in this long is not there (Ray itself retries ~60 s)


def reach(address: str) -> None:
    """One QkvError, within RAY_CONNECT_SECONDS, when nothing listens at ADDRESS (host:port, or ray://host:port
    of a Ray Client server); "auto" (the cluster this machine runs) is left to Ray."""
    import socket

    if address == "auto":
        return
    where = address.removeprefix("ray://")
    host, _, port = where.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise QkvError(f"--address {address!r} is not host:port (e.g. 10.0.0.5:6379, ray://10.0.0.5:10001, auto); "
                       "give the address `ray start --head` printed")
    try:
        socket.create_connection((host, int(port)), timeout=RAY_CONNECT_SECONDS).close()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise QkvError(f"cannot reach the Ray cluster at {address} ({reason}); start it (ray start --head) "
                       "or give its address") from None


def ray_cluster(spec: WorkerSpec, jobs: Iterable[Job], workers: int | None = None,
                address: str | None = None) -> Iterator:
    """Run on Ray: a local instance (`ray.init()`) by default, or join the cluster at `address`.

    One actor per worker (default: every CPU of the cluster). Each node needs qkv installed
    and the model at the same source (the bundled default, or the same directory path).
    A Ray instance this function started is shut down at the end; one already running is kept.
    """
    ray = import_ray()
    started = not ray.is_initialized()
    if started and address:
        reach(address)
    if started:
        options = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        try:
            if address:
                ray.init(address=address, **options)
            else:
                ray.init(num_cpus=workers or cores(), **options)
        except ConnectionError as e:
            raise QkvError(f"cannot reach the Ray cluster at {address}: {e}; start it (ray start --head) "
                           "or give its address") from None
    try:
        n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        actor = ray.remote(num_cpus=1)(RayWorker)
        actors = [actor.remote(spec) for _ in range(n)]
        busy = {a: 0 for a in range(n)}
        pending: dict = {}                                  # object ref → actor number
        for chunk in chunks(jobs):
            while len(pending) >= IN_FLIGHT * n:
                yield from _ray_collect(ray, pending, busy)
            a = min(busy, key=busy.get)
            pending[actors[a].run.remote(chunk)] = a
            busy[a] += 1
        while pending:
            yield from _ray_collect(ray, pending, busy)
    finally:
        if started:
            ray.shutdown()


def _ray_collect(ray, pending: dict, busy: dict) -> list:
    ready, _ = ray.wait(list(pending), num_returns=1)
    busy[pending.pop(ready[0])] -= 1
    return ray.get(ready[0])
