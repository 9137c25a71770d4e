"""Making the shards a plan lists (qkv.features.collect): one shard's rows from its job, in this process, N local
processes or Ray actors.

    Job ─make_shard: windows longest first, batches of ≤ BATCH_TOKENS padded tokens─▶ DIR/acts-K.npy
    jobs ─run_jobs: this process | N processes (spawn) | Ray actors, each loading the model once─▶ (K, rows) …

A shard's rows depend only on its job and the settings (the same batches whoever makes it), so a store made
by any workers, stopped and continued, holds the same bits. Each worker computes with one BLAS thread and
takes at most 2 jobs at a time (analysis/backends.py does the same for texts).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import numpy as np

from ..runtime.errors import QkvError
from .activations import BATCH_TOKENS, check_range, shard_name, site_rows, write_shard

if TYPE_CHECKING:
    from ..models.model import Model


@dataclass
class Job:
    """One shard to make: its pieces (window ids (n,), first and end kept row), and where the corpus is read to."""

    index: int
    pieces: list[tuple[np.ndarray, int, int]]
    read: dict                      # {"text", "window", "row", "skipped"}: where the next shard starts

    @property
    def rows(self) -> int:
        return sum(hi - lo for _, lo, hi in self.pieces)


# ── making a shard ───────────────────────────────────────────────────────────────

def make_shard(model: "Model", job: Job, out: Path, layer: int, site: str, dtype: str, skip: int) -> int:
    """Job's rows into OUT/acts-K.npy: its windows longest first in batches of ≤ BATCH_TOKENS padded tokens
    (the same batches whoever makes it), each row put where the plan says. Returns the rows written."""
    cfg = model.config
    pad = cfg.pad_token_id if cfg.pad_token_id is not None and 0 <= cfg.pad_token_id < cfg.vocab_size else 0
    offsets = np.cumsum([0] + [hi - lo for _, lo, hi in job.pieces])                  # where each piece's rows go
    order = sorted(range(len(job.pieces)), key=lambda i: (-len(job.pieces[i][0]), i))

    def fill(put: Callable[[int, np.ndarray], None]) -> None:
        start = 0
        while start < len(order):
            n = len(job.pieces[order[start]][0])
            end = min(len(order), start + max(1, BATCH_TOKENS // n))
            part = order[start:end]
            ids = np.full((len(part), n), pad, np.int64)                                 # (B, n)
            lengths = np.array([len(job.pieces[i][0]) for i in part])
            for r, i in enumerate(part):
                ids[r, :lengths[r]] = job.pieces[i][0]
            h = site_rows(model, layer, site, ids, lengths)                              # (B, n, d)
            for r, i in enumerate(part):
                _, lo, hi = job.pieces[i]
                rows = h[r, skip + lo:skip + hi]                                         # (hi - lo, d)
                check_range(rows, dtype)
                put(int(offsets[i]), rows)
            start = end

    write_shard(out / shard_name(job.index), job.rows, cfg.d_model, dtype, fill)
    return job.rows


# ── where shards are made: this process, local processes, Ray ───────────────────

@dataclass(frozen=True)
class Spec:
    """What a worker needs to make shards: the model's source, weights and arithmetic, and the store's settings."""

    source: str
    weights: str | None
    out: str
    layer: int
    site: str
    dtype: str
    skip: int
    arith: str = "exact"          # `qkv --arith`: every worker computes as the first process does

    def load(self):
        from ..models.loading import load

        return load(self.source, dtype=self.weights, arith=self.arith)


_WORKER: tuple | None = None


def _init_worker(spec: Spec, parent: int) -> None:
    import signal

    from ..analysis.backends import die_with_parent
    from ..runtime.threads import set_blas_threads

    global _WORKER
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_blas_threads(1)
    _WORKER = (spec, spec.load())


def _worker_shard(job: Job) -> tuple[int, int]:
    spec, model = _WORKER
    return job.index, make_shard(model, job, Path(spec.out), spec.layer, spec.site, spec.dtype, spec.skip)


class RayShards:
    """A Ray actor making shards: loads the model once."""

    def __init__(self, spec: Spec):
        from ..runtime.threads import set_blas_threads

        set_blas_threads(1)
        self.spec, self.model = spec, spec.load()

    def run(self, job: Job) -> tuple[int, int]:
        s = self.spec
        return job.index, make_shard(self.model, job, Path(s.out), s.layer, s.site, s.dtype, s.skip)


def run_jobs(jobs: Iterable[Job], model: "Model", spec: Spec, workers: int, backend: str,
             address: str | None = None) -> Iterator[tuple[int, int]]:
    """(shard index, rows) as shards are done, in any order; at most 2 jobs in flight a worker."""
    from ..runtime.threads import blas_one_thread

    if backend == "local" and workers == 1:
        with blas_one_thread():
            for job in jobs:
                yield job.index, make_shard(model, job, Path(spec.out), spec.layer, spec.site, spec.dtype, spec.skip)
        return
    if backend == "local":
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        ex = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_init_worker, initargs=(spec, os.getpid()))
        try:
            pending = set()
            for job in jobs:
                pending.add(ex.submit(_worker_shard, job))
                while len(pending) >= 2 * workers:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    yield from (f.result() for f in done)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (f.result() for f in done)
        finally:
            ex.shutdown(wait=True, cancel_futures=True)
        return
    yield from _ray_jobs(jobs, spec, workers, address)


def _ray_jobs(jobs: Iterable[Job], spec: Spec, workers: int | None, address: str | None) -> Iterator[tuple[int, int]]:
    import logging

    from ..analysis.backends import import_ray
    from ..runtime.threads import cores

    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        options = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        try:
            ray.init(address=address, **options) if address else ray.init(num_cpus=workers or cores(), **options)
        except ConnectionError as e:
            raise QkvError(f"cannot reach the Ray cluster at {address}: {e}; start it (ray start --head) "
                           "or give its address") from None
    try:
        n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        actors = [ray.remote(num_cpus=1)(RayShards).remote(spec) for _ in range(n)]
        pending: dict = {}                                                    # ref → actor number
        free = list(range(n)) * 2
        for job in jobs:
            while not free:
                ready, _ = ray.wait(list(pending), num_returns=1)
                free.append(pending.pop(ready[0]))
                yield ray.get(ready[0])
            a = free.pop(0)
            pending[actors[a].run.remote(job)] = a
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            pending.pop(ready[0])
            yield ray.get(ready[0])
    finally:
        if started:
            ray.shutdown()
