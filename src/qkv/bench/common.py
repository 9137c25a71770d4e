"""What every benchmark shares: interleaved timing, the machine's facts, markdown sections.

Nothing here imports torch or transformers: a benchmark imports them inside its own
functions, so `import qkv.bench` works without the reference stack.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import write_text
from ..runtime.tuning import cpu_name

REFERENCE_FIX = "run `make bench`, or: pip install torch==2.13.0 transformers"


def reference_stack(benchmark: str):
    """(torch, transformers), or a QkvError that names the benchmark and how to install them."""
    try:
        import torch
        import transformers
    except ImportError as e:
        raise QkvError(f"the {benchmark} benchmark needs torch and transformers ({e.name} is missing); "
                       f"{REFERENCE_FIX}") from None
    return torch, transformers


# The OpenBLAS variables that pick a kernel and a cache size. Some machines set them and
# get a slower kernel; benchmarks report them and never change them.
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def time_interleaved(runs: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 1,
                     clock: Callable[[], float] = time.perf_counter, settle: float = 0.0,
                     sleep: Callable[[float], None] = time.sleep) -> dict[str, float]:
    """Median seconds of each run, the runs taking turns so machine noise hits all alike.

    Every round runs each function once (after `warmup` untimed rounds); the order
    rotates by one each round, so no run always follows the same other run. `settle`
    seconds of sleep before each run let the previous run's thread pools go idle: after
    a call OpenBLAS's workers keep spinning for ~0.1 s and slow whatever runs next.
    """
    times = time_rounds(runs, repeats, warmup, clock, settle, sleep)
    return {name: statistics.median(ts) for name, ts in times.items()}


def time_rounds(runs: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 1,
                clock: Callable[[], float] = time.perf_counter, settle: float = 0.0,
                sleep: Callable[[float], None] = time.sleep) -> dict[str, list[float]]:
    """Every timed round's seconds of each run, in round order (`time_interleaved` takes their medians)."""
    if repeats < 1:
        raise ValueError(f"repeats must be ≥ 1, got {repeats}")
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if settle:
                sleep(settle)
            start = clock()
            runs[name]()
            if r >= warmup:
                times[name].append(clock() - start)
    return times


def blas_info() -> dict:
    """NumPy's BLAS as threadpoolctl sees it: library, kernel (architecture), threads."""
    from threadpoolctl import threadpool_info

    for lib in threadpool_info():
        if lib.get("user_api") == "blas":
            return {k: lib.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
    return {"internal_api": "none found"}


def machine_facts() -> dict:
    """The facts a timing depends on: CPU, its vector extensions, cores, NumPy, its BLAS kernel,
    OpenBLAS variables, and the choices qkv measured on this machine (qkv.runtime.tuning)."""
    from ..runtime.tuning import choices

    tuned = choices()
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "vector": vector_extensions(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas_info(),
        "env": {var: os.environ.get(var) for var in OPENBLAS_VARS},   # None = unset
        "tuned": {**tuned.numbers(), "source": tuned.source},
    }


VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16",
                "neon", "asimd", "sve")


def vector_extensions() -> list[str]:
    """The SIMD extensions this CPU reports (/proc/cpuinfo flags), among those kernels care about."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[1].split())
            break
    return [f for f in VECTOR_FLAGS if f in flags]


def cpu_snapshot() -> tuple[float, float, float] | None:
    """(wall seconds, CPU seconds used by the whole machine, CPU seconds used by this process).

    The machine's share comes from /proc/stat (Linux; None elsewhere): user, nice, system,
    irq, softirq and steal time, i.e. everything but idle and I/O wait.
    """
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    own = os.times()
    return time.perf_counter(), busy, own.user + own.system


def others_cores(start: tuple | None, end: tuple | None) -> float | None:
    """Cores that other processes kept busy, on average, between two `cpu_snapshot`s."""
    if start is None or end is None or end[0] <= start[0]:
        return None
    return max(0.0, ((end[1] - start[1]) - (end[2] - start[2])) / (end[0] - start[0]))


def torch_machine_facts(torch, transformers, threads: int) -> dict:
    """machine_facts with qkv's BLAS thread count, the CPU's vector extensions and torch's side (version,
    threads, kernel capability): what a report against torch names."""
    machine = machine_facts()
    machine["blas"]["num_threads"] = threads
    machine["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads(),
                        "capability": torch.backends.cpu.get_cpu_capability()}
    machine["transformers"] = transformers.__version__
    return machine


def write_section(path: str | Path, name: str, body: str, title: str = "# Benchmarks") -> None:
    """Put `body` between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` in the file at `path`.

    Only that section changes: the rest of the file (other benchmarks, prose) is kept.
    A missing section is appended; a missing file is created with `title`.
    """
    path = Path(path)
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    section = f"{start}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else f"{title}\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, text)                                     # atomically: never a half-written page
