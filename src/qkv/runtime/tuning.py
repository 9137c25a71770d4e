"""Choices measured where qkv runs: BLAS threads, attention workers and block sizes.

How many BLAS threads a one-token step should use, how many a prefill, how many threads
tiled attention should spread its query blocks over and how large its blocks should be,
all depend on the machine (cores, caches, memory bandwidth, the BLAS kernel) and on how
busy it is. Figures from one machine did not hold on the next (issue 16), so qkv measures
them once, on first use (≈1–3 s), and keeps them per machine in the qkv cache directory
($QKV_CACHE, else $XDG_CACHE_HOME/qkv or ~/.cache/qkv; QKV_CACHE=off keeps them in memory
only), keyed by CPU model, cores, BLAS library and kernel, and NumPy version; choices measured
while the machine was busy (load ≥ cores) are measured again once it is idle (load < cores / 2).

    decode     BLAS threads of a one-token step: 1 row × every weight matrix (memory bound)
    prefill    BLAS threads of products of many rows (compute bound)
    attention  worker threads of tiled attention (each with BLAS on one thread)
    q_block, k_block   rows of queries and of keys per block of tiled attention

Safe on a busy machine: more threads are chosen only when they were measured faster than
fewer by a margin (`MARGIN`), never by default. `qkv bench tune` measures again and prints
the choices; QKV_THREADS pins any of them, e.g. QKV_THREADS=decode:1,prefill:2 (the others
are still measured). A cache file that cannot be read, or holds anything but whole numbers
in range, is ignored with a one-line warning and measured again.
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import QkvError
from .io import cache_dir, write_text
from .io_json import read_json
from .threads import _blas_libs, blas_threads, cores

ENV = "QKV_THREADS"               # pins choices: decode:1,prefill:2,attention:2,q_block:128,k_block:512
FILE = "tuning.json"
VERSION = 1                       # of the measurement; a file of another version is measured again
MARGIN = 1.08                     # more threads must be ≥ 8 % faster than fewer to be chosen
BLOCKS = ((64, 512), (128, 256), (128, 512), (256, 512))    # (q_block, k_block) candidates
BLOCK_KEYS = 2048                 # keys one measured query block reads
LIMITS = {"decode": 256, "prefill": 256, "attention": 256, "q_block": 4096, "k_block": 16384}


@dataclass(frozen=True)
class Choices:
    """What qkv runs with on this machine (see the module docstring); `source` says where each came from."""

    decode: int = 1
    prefill: int = 1
    attention: int = 1
    q_block: int = 128
    k_block: int = 512
    source: str = "default"       # measured | cache | default, "+ pinned" when QKV_THREADS set some

    def numbers(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}


_choices: Choices | None = None
_lock = threading.Lock()


def machine_key() -> dict:
    """What the choices depend on: a cache made under another key is measured again."""
    blas = next(iter(_blas_libs()), None)
    return {"cpu": cpu_name(), "cores": cores(), "numpy": np.__version__,
            "blas": None if blas is None else f"{blas.internal_api} {blas.version} {blas.architecture}",
            "version": VERSION}


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def physical_memory() -> int:
    """Bytes of memory the machine has (what size checks bound themselves by), 8 GiB if it cannot tell."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def available_memory() -> int | None:
    """Bytes of memory free for a new allocation now (MemAvailable of /proc/meminfo, else the free pages),
    None when the system does not say: what a check before a large allocation compares with."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def cache_file() -> Path | None:
    """$QKV_CACHE/tuning.json (else $XDG_CACHE_HOME/qkv or ~/.cache/qkv); None when QKV_CACHE is off."""
    folder = cache_dir()
    return None if folder is None else folder / FILE


def pinned() -> dict[str, int]:
    """QKV_THREADS as {name: value}, e.g. "decode:1,prefill:2" → {"decode": 1, "prefill": 2}."""
    text = os.environ.get(ENV, "").strip()
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition(":")
        name, value = name.strip(), value.strip()
        if name not in LIMITS or not value.isdigit() or not 1 <= int(value) <= LIMITS[name]:
            raise QkvError(f"{ENV}={text!r}: {part!r} is not NAME:COUNT with NAME one of {', '.join(LIMITS)} "
                           f"and COUNT a whole number ≥ 1; e.g. {ENV}=decode:1,prefill:2, or unset it")
        out[name] = int(value)
    return out


def read_cache(path: Path) -> Choices | None:
    """The choices stored at `path` for this machine; None (with a one-line warning if the file is
    damaged or hostile) when there are none to trust. Never follows a symlink."""
    try:
        if path.is_symlink() or not path.is_file():
            if path.is_symlink():
                warnings.warn(f"qkv: ignoring {path}: it is a symbolic link; measuring again", stacklevel=2)
            return None
        try:                                             # bounded and checked: runtime.io_json
            data = read_json(path, what="it", fix="measuring again", limit=65536)
        except QkvError as e:
            raise ValueError(str(e).split("; ")[0]) from None
        if data.get("machine") != machine_key():
            return None                                  # another machine, BLAS or NumPy: measure here
        then, now = data.get("load"), _load()
        if isinstance(then, (int, float)) and now is not None and then >= cores() and now < cores() / 2:
            return None                                  # measured while busy, idle now: measure again
        numbers = data.get("choices")
        if not isinstance(numbers, dict) or set(numbers) != set(LIMITS):
            raise ValueError("its choices are not " + ", ".join(LIMITS))
        for name, value in numbers.items():
            if type(value) is not int or not 1 <= value <= LIMITS[name]:
                raise ValueError(f"{name} = {value!r} is not a whole number in 1..{LIMITS[name]}")
        return Choices(**numbers, source="cache")
    except (OSError, ValueError, UnicodeDecodeError) as e:
        warnings.warn(f"qkv: ignoring the tuning cache {path} ({e}); measuring again", stacklevel=2)
        return None


def write_cache(path: Path, choices: Choices, seconds: dict | None = None) -> None:
    """Store the choices for this machine (atomically); a cache that cannot be written is skipped."""
    data = {"machine": machine_key(), "choices": choices.numbers(), "load": _load(), "measured": seconds or {}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(data, indent=2) + "\n")
    except OSError as e:
        warnings.warn(f"qkv: cannot write the tuning cache {path} ({e.strerror}); set QKV_CACHE to a writable "
                      "directory", stacklevel=2)


def _load() -> float | None:
    """The machine's load (runnable processes, 1-minute average); None where the OS does not say."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def choices() -> Choices:
    """This machine's choices: pinned by QKV_THREADS, else from the cache, else measured now (once)."""
    global _choices
    pins = pinned()
    with _lock:
        if _choices is None:
            path = cache_file()
            found = read_cache(path) if path is not None else None
            if found is None:
                found, seconds = measure()
                if path is not None:
                    write_cache(path, found, seconds)
            _choices = found
        base = _choices
    if not pins:
        return base
    return replace(base, **pins, source=base.source + " + pinned")


def retune() -> tuple[Choices, dict]:
    """Measure again now (`qkv bench tune`), store, and return (choices, the seconds measured)."""
    global _choices
    found, seconds = measure()
    path = cache_file()
    if path is not None:
        write_cache(path, found, seconds)
    with _lock:
        _choices = found
    return found, seconds


def forget() -> None:
    """Drop the choices held in memory (the next `choices()` reads the cache or measures)."""
    global _choices
    with _lock:
        _choices = None


# ── measuring ───────────────────────────────────────────────────────────────────

def _best(seconds: dict[int, float]) -> int:
    """The fewest threads within MARGIN of the fastest: more threads must earn their place."""
    fastest = min(seconds.values())
    return min(n for n, s in seconds.items() if s <= fastest * MARGIN)


def _time(runs: dict[object, Callable[[], float]], rounds: int) -> dict:
    """Least seconds of each run over `rounds` rounds taking turns (the least is the least disturbed);
    each run returns the seconds it measured."""
    best = {name: float("inf") for name in runs}
    for r in range(rounds):
        names = list(runs)
        for name in names[r % len(names):] + names[:r % len(names)]:
            best[name] = min(best[name], runs[name]())
    return best


def _timed(fn: Callable[[], None], threads: int) -> Callable[[], float]:
    """A run of fn on `threads` BLAS threads, timed after one untimed call: BLAS threads woken from
    sleep (after a change of count) take milliseconds to start, which a generation pays once, not per step."""
    def run() -> float:
        with blas_threads(threads):
            fn()
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
    return run


def _counts() -> list[int]:
    """Thread counts worth trying: 1, 2, 4, … up to the cores."""
    n, out = 1, []
    while n < cores():
        out.append(n)
        n *= 2
    return out + [cores()]


def measure(rounds: int = 5) -> tuple[Choices, dict]:
    """Measure every choice (≈1–3 s); (choices, {what: {candidate: seconds}})."""
    counts = _counts()
    # decode: one row through 100 MB of weight matrices (more than any cache), as a step does;
    # the values do not change the speed, so they are constants (no time spent drawing them)
    mats = [np.full((768, 4096), 0.01, dtype=np.float32) for _ in range(8)]        # 8 × (768, 4096)
    row = np.full((1, 768), 0.01, dtype=np.float32)

    def step():
        for W in mats:
            row @ W
    decode = _time({n: _timed(step, n) for n in counts}, rounds)
    mats.clear()                                                  # 100 MB freed before the next part
    # prefill: 256 rows × a (768, 3072) matrix, as GPT-2-small's FFN
    x = np.full((256, 768), 0.01, dtype=np.float32)
    W = np.full((768, 3072), 0.01, dtype=np.float32)

    def gemm():
        for _ in range(2):
            x @ W
    prefill = _time({n: _timed(gemm, n) for n in counts}, rounds)
    # attention blocks, one thread: seconds per score of the kernel's inner loop
    blocks = {f"{bq}x{bk}": _timed(_block_runner(bq, bk), 1) for bq, bk in BLOCKS}
    block_s = _time(blocks, 2)
    per_score = {name: s / (int(name.split("x")[0]) * BLOCK_KEYS) for name, s in block_s.items()}
    q_block, k_block = (int(v) for v in min(per_score, key=per_score.get).split("x"))
    # attention workers: the same block loop on 1 … cores threads at once (time of the batch of blocks)
    run_block = _block_runner(q_block, k_block)
    workers = _time({n: _parallel(run_block, n, max(counts)) for n in counts}, 2)
    chosen = Choices(decode=_best(decode), prefill=_best(prefill), attention=_best(workers), q_block=q_block,
                     k_block=k_block, source="measured")
    return chosen, {"decode": decode, "prefill": prefill, "blocks_per_score": per_score, "attention": workers}


def _block_runner(bq: int, bk: int, heads: int = 12, d: int = 64, keys: int = BLOCK_KEYS) -> Callable[[], None]:
    """One query block of tiled attention over `keys` keys (kernels._query_block's loop, one thread):
    S = Q·Kᵀ into a reused buffer, the row max, exp(S − M) in place, the row sum, P·V."""
    q = np.full((heads, bq, d), 0.01, dtype=np.float32)
    k = np.full((heads, d, keys), 0.01, dtype=np.float32)
    v = np.full((heads, keys, d), 0.01, dtype=np.float32)
    s = np.empty((heads, bq, bk), dtype=np.float32)
    acc = np.zeros((heads, bq, d), dtype=np.float32)
    pv = np.empty_like(acc)

    def run():
        for k0 in range(0, keys, bk):
            np.matmul(q, k[:, :, k0:k0 + bk], out=s)
            m = s.max(axis=-1, keepdims=True)
            np.subtract(s, m, out=s)
            np.exp(s, out=s)
            s.sum(axis=-1)
            acc.__iadd__(np.matmul(s, v[:, k0:k0 + bk], out=pv))
    return run


def _parallel(fn: Callable[[], None], n: int, jobs: int) -> Callable[[], float]:
    """`jobs` calls of fn spread over n threads, BLAS on one thread each: their seconds, all together."""
    def run() -> float:
        with blas_threads(1), ThreadPoolExecutor(n) as pool:
            start = time.perf_counter()
            list(pool.map(lambda _: fn(), range(jobs)))
            return time.perf_counter() - start
    return run


def describe(c: Choices, seconds: dict | None = None) -> str:
    """The choices in a few lines (and what was measured), as `qkv bench tune` prints them."""
    lines = [f"decode: {c.decode} BLAS thread(s) for one-token steps",
             f"prefill: {c.prefill} BLAS thread(s) for products of many rows",
             f"attention: {c.attention} worker thread(s) for tiled attention",
             f"q_block: {c.q_block}, k_block: {c.k_block} (rows of queries and keys per block)",
             f"source: {c.source}; pin with {ENV}=decode:N,prefill:N,attention:N,q_block:N,k_block:N"]
    if seconds:
        lines.append("measured (least milliseconds of each candidate; blocks: nanoseconds a score): " + json.dumps(
            {k: {str(n): round(s * (1e9 if k == "blocks_per_score" else 1e3), 3) for n, s in v.items()}
             for k, v in seconds.items()}))
    path = cache_file()
    lines.append(f"cache: {path if path is not None else 'off (QKV_CACHE=off)'}")
    return "\n".join(lines)
