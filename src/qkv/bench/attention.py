"""The attention benchmark: plain, tiled, sliding-window and torch's SDPA, side by side, n = 512 … 65536.

    q, k, v random (1, H 12, n, d 64) float32; per n, causal and not:
      plain   qkv.core.attention.scaled_dot_product_attention (+ causal bias): holds H · n² scores
      tiled   qkv.core.kernels.tiled_attention: online softmax by blocks, never n × n
      window  qkv.core.kernels.sliding_window_attention (causal only), window w
      torch   torch.nn.functional.scaled_dot_product_attention, where torch is installed
    each method once in a fresh subprocess (its time and peak memory), then, where a call
    is short, `repeats` more rounds taking turns in this process (the median is reported).
    FLOPs = 4·n²·d·H (half that when causal; window: 4·n·w·d·H); the ceiling is a large
    matmul's GFLOP/s measured in the same run, as are NumPy's exp per element and the cores
    other processes kept busy.

`measure` returns plain dicts; `attention_report.markdown` and `.plot` turn them into docs/benchmarks.md's
section and its figure. torch is optional: without it its column is left out, with a note.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from .common import cpu_snapshot, machine_facts, others_cores, time_interleaved

SIZES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
HEADS, D_HEAD = 12, 64
WINDOW = 1024
REPEATS = 3
MAX_SECONDS = 1200.0         # skip a size whose predicted time for one call is longer
ONCE_SECONDS = 20.0          # a call longer than this is timed once (its subprocess run) instead of repeated
PLAIN_MAX_BYTES = 8 * 10**9  # plain attention's scores (H · n² floats) beyond this: skipped
METHODS = ("plain", "tiled", "window", "torch")
TARGET_VS_TORCH = 1.3        # tiled at most 1.3× torch's time
TARGET_MEMORY_8K = 100e6     # extra bytes of tiled at n = 8192
COMMAND = "qkv bench attention --out docs/benchmarks.md --plot docs/images/attention_scaling.png"
TEXT = ("The old lighthouse keeper climbed the stairs every evening to light the lamp. Ships passing "
        "in the night trusted its beam to guide them past the rocks, and for forty years it never "
        "failed. When the keeper retired, the town replaced him with an automatic light, but people "
        "still said the beam looked warmer in the years he tended it.")


def flops(n: int, causal: bool, method: str = "tiled", heads: int = HEADS, d: int = D_HEAD,
          window: int = WINDOW) -> float:
    """Useful floating-point operations of one attention call: 2·n²·d·H for Q·Kᵀ, as much for A·V.

    Causal attention needs only half the pairs; a window of w keys per query about 4·n·w·d·H
    (exactly: the first w queries see fewer keys, and with n ≤ w it is causal attention).
    Every method is credited with the same useful work (plain computes the masked half anyway).
    """
    if method == "window" and n > window:
        pairs = n * window - window * (window - 1) / 2          # Σ_i min(i + 1, w)
        return 4.0 * pairs * d * heads
    return 4.0 * n * n * d * heads / (2 if causal or method == "window" else 1)


def plain_bytes(n: int, heads: int = HEADS) -> int:
    """Memory of plain attention's score matrix: H · n² float32 (the weights reuse it)."""
    return 4 * heads * n * n


def predict_seconds(measured: dict[int, float], n: int, exponent: float) -> float | None:
    """One call's time at n, scaled from the largest smaller size measured: t·(n/n₀)^exponent.

    exponent 2 for full attention (n² pairs), 1 for a fixed window. None with nothing to go on.
    """
    smaller = [m for m in measured if m < n]
    if not smaller:
        return None
    n0 = max(smaller)
    return measured[n0] * (n / n0) ** exponent


def skip_reason(method: str, n: int, causal: bool, predicted: float | None, max_seconds: float,
                have_torch: bool) -> str | None:
    """Why `method` does not run at n (a short note for the table), or None when it runs."""
    if method == "window" and not causal:
        return "n/a"                                   # a sliding window is causal by definition
    if method == "torch" and not have_torch:
        return "no torch"
    if method == "plain" and plain_bytes(n) > PLAIN_MAX_BYTES:
        return f"skipped: needs {plain_bytes(n) / 1e9:.0f} GB"
    if predicted is not None and predicted > max_seconds:
        return f"skipped: ~{predicted:.0f} s predicted"
    return None


# ── one call, in a fresh process: its time and its peak memory ───────────────────

def inputs(n: int, seed: int = 0):
    """q, k, v: (1, H, n, d) float32, the same for every method at this n."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, HEADS, n, D_HEAD), dtype=np.float32) for _ in range(3))


def call(method: str, n: int, causal: bool, window: int = WINDOW, arrays=None):
    """A function that runs `method` once on this n's inputs (built here unless given)."""
    q, k, v = arrays if arrays is not None else inputs(n)
    if method == "plain":
        from ..core.attention import causal_mask, mask_bias, scaled_dot_product_attention

        bias = mask_bias(causal_mask(n))[None, None] if causal else None      # (1, 1, n, n)
        return lambda: scaled_dot_product_attention(q, k, v, bias)
    if method == "tiled":
        from ..core.kernels import tiled_attention

        return lambda: tiled_attention(q, k, v, causal=causal)
    if method == "window":
        from ..core.kernels import sliding_window_attention

        return lambda: sliding_window_attention(q, k, v, window=window)
    if method == "torch":
        import torch
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        return lambda: sdpa(tq, tk, tv, is_causal=causal)
    raise ValueError(f"unknown method {method!r}")


def _rss(field: str) -> int | None:
    """VmRSS or VmHWM (peak) of this process in bytes, from /proc (Linux); None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def probe(method: str, n: int, causal: bool, window: int = WINDOW) -> dict:
    """Run `method` once and report {"seconds", "peak_bytes"}: the memory the call added.

    Peak = the process's high-water mark during the call minus its size before (Linux resets
    the mark by writing 5 to /proc/self/clear_refs); elsewhere tracemalloc's peak (NumPy only).
    Inputs are made before, so they do not count; the output does.
    """
    call(method, min(n, 256), causal, window)()   # one-time setup (thread pools, torch's kernels) is not the call's
    fn = call(method, n, causal, window)
    reset = False
    try:
        Path("/proc/self/clear_refs").write_text("5")
        reset = _rss("VmHWM") is not None
    except OSError:
        pass
    before = _rss("VmRSS") if reset else None
    if not reset:
        import tracemalloc
        tracemalloc.start()
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    if reset:
        peak = _rss("VmHWM") - before
    else:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    del out
    return {"seconds": seconds, "peak_bytes": max(0, peak), "how": "rss" if reset else "tracemalloc"}


def probe_in_subprocess(method: str, n: int, causal: bool, window: int = WINDOW) -> dict:
    """`probe` in a fresh Python process, so no earlier run's memory hides this one's peak."""
    src = str(Path(__file__).resolve().parents[2])                    # the directory holding qkv/
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    args = json.dumps({"method": method, "n": n, "causal": causal, "window": window})
    r = subprocess.run([sys.executable, "-m", "qkv.bench.attention", args], capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{method} at n={n} failed in its subprocess:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# ── the whole run ────────────────────────────────────────────────────────────────

def have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
    """The machine's ceiling: GFLOP/s of a size × size float32 matmul (NumPy's BLAS, all its threads)."""
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    t = time_interleaved({"matmul": lambda: a @ a}, repeats=repeats)["matmul"]
    return 2.0 * size ** 3 / t / 1e9


def exp_ns(size: int = 1 << 22, repeats: int = 5) -> float:
    """Nanoseconds NumPy's float32 exp takes per element (one thread, an array of `size`)."""
    x = np.random.default_rng(0).standard_normal(size, dtype=np.float32)
    y = np.empty_like(x)
    return 1e9 * time_interleaved({"exp": lambda: np.exp(x, out=y)}, repeats=repeats)["exp"] / size


def measure(sizes=SIZES, repeats: int = REPEATS, max_seconds: float = MAX_SECONDS, window: int = WINDOW,
            log=None) -> dict:
    """Every method at every size, causal and not; a plain dict of rows (see `attention_report.markdown`)."""
    if not sizes or min(sizes) < 1:
        raise QkvError(f"--sizes must be positive token counts, got {list(sizes)}")
    if window < 1:
        raise QkvError(f"--window must be ≥ 1, got {window}")
    log = log or (lambda msg: None)
    torch_ok = have_torch()
    rows = []
    before = cpu_snapshot()                                      # others' work slows every method
    for causal in (True, False):
        measured: dict[str, dict[int, float]] = {m: {} for m in METHODS}
        for n in sorted(set(sizes)):
            row = {"n": n, "causal": causal, "methods": {}}
            running = []
            for method in METHODS:
                exponent = 1.0 if method == "window" else 2.0
                predicted = predict_seconds(measured[method], n, exponent)
                reason = skip_reason(method, n, causal, predicted, max_seconds, torch_ok)
                if reason:
                    row["methods"][method] = {"skipped": reason}
                    continue
                log(f"{'causal' if causal else 'full'} n={n} {method}: probing"
                    + (f" (~{predicted:.1f} s predicted)" if predicted else ""))
                p = probe_in_subprocess(method, n, causal, window)
                row["methods"][method] = {"seconds": p["seconds"], "peak_bytes": p["peak_bytes"], "rounds": 1,
                                          "memory_by": p["how"]}
                measured[method][n] = p["seconds"]
                if p["seconds"] <= ONCE_SECONDS:
                    running.append(method)
            if running:                                  # short calls: repeat them, taking turns
                arrays = inputs(n)
                t = time_interleaved({m: call(m, n, causal, window, arrays) for m in running}, repeats=repeats)
                for m in running:
                    row["methods"][m].update(seconds=t[m], rounds=repeats)
                    measured[m][n] = t[m]
                del arrays
            for m, r in row["methods"].items():
                if "seconds" in r:
                    r["gflops"] = flops(n, causal, m, window=window) / r["seconds"] / 1e9
            rows.append(row)
            log(f"{'causal' if causal else 'full'} n={n}: " + ", ".join(
                f"{m} {r['seconds']:.3f} s" for m, r in row["methods"].items() if "seconds" in r))
    others = others_cores(before, cpu_snapshot())
    machine = machine_facts()
    if torch_ok:
        import torch
        machine["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads()}
    return {"shape": {"heads": HEADS, "d_head": D_HEAD, "batch": 1, "window": window, "dtype": "float32"},
            "machine": machine, "matmul_gflops": matmul_gflops(), "exp_ns": exp_ns(), "others_cores": others,
            "repeats": repeats, "rows": rows, "torch": torch_ok}


# ── linear attention on real activations ─────────────────────────────────────────

def linear_vs_softmax(text: str = TEXT, source: str = "minilm") -> dict:
    """`kernels.compare_to_softmax` on every layer of a real model reading `text`.

    Per layer: the mean over heads of ‖linear − softmax‖ / ‖softmax‖ and of the cosine
    between the two outputs (per position), the worst head's relative error too.
    """
    from .. import load
    from ..core.kernels import compare_to_softmax

    model = load(source)
    trace = model.run(text, keep=("q", "k", "v"))
    layers = []
    for i in trace.layer_ids:
        lt = trace.layer(i)
        c = compare_to_softmax(lt.q[None], lt.k[None], lt.v[None], causal=model.config.causal)
        layers.append({"layer": i, "relative_error": float(c["relative_error"].mean()),
                       "worst_relative_error": float(c["relative_error"].max()), "cosine": float(c["cosine"].mean())})
    return {"model": model.name, "tokens": len(trace.tokens), "causal": model.config.causal, "layers": layers}


if __name__ == "__main__":                      # the subprocess of probe_in_subprocess
    a = json.loads(sys.argv[1])
    print(json.dumps(probe(a["method"], a["n"], a["causal"], a["window"])))
