"""The sparse attention benchmark: each pattern of `qkv.core.sparse.gallery` in the tiled kernel, n = 512 … 8192.

    q, k, v random (1, H 9, n, 64) with 3 K/V heads (SmolLM2's attention), float32, causal; per n:
      dense    softmax(Q·Kᵀ/√d + M)·V on the whole n × n matrix (the mask added, nothing saved)
      tiled    qkv.core.kernels.tiled_attention, causal: the engine's kernel
      <name>   qkv.core.sparse.sparse_attention with each gallery pattern (window w, blocks of `block`),
               tiles of `tile`: the hidden tiles skipped
    the time of one call (median of `repeats` rounds taking turns) and its peak memory (tracemalloc,
    one call: NumPy's allocations, inputs excluded, output included), the tiles computed and the
    share of pairs each pattern keeps. Outputs are checked against the dense masked call up to
    n = 2048. `lessons.sparse.measure_cost` does the measuring (the lesson runs it at small n).

`measure` returns a plain dict; `markdown` turns it into docs/benchmarks.md's "sparse" section.
No torch needed.
"""

from __future__ import annotations

from ..core import sparse as sp
from ..runtime.errors import QkvError
from ..lessons.sparse import measure_cost
from . import markdown as md
from .common import cpu_snapshot, machine_facts, others_cores, vector_extensions

SIZES = (512, 1024, 2048, 4096, 8192)
HEADS, KV_HEADS, D_HEAD = 9, 3, 64
WINDOW, BLOCK, TILE = 256, 64, sp.BLOCK
REPEATS = 3
COMMAND = "qkv bench sparse --out docs/benchmarks.md"


def measure(sizes=SIZES, repeats: int = REPEATS, window: int = WINDOW, block: int = BLOCK, tile: int = TILE,
            log=None) -> dict:
    """Every gallery pattern at every size; a plain dict (see `markdown`)."""
    if not sizes or min(sizes) < 1:
        raise QkvError(f"--sizes must be positive token counts, got {list(sizes)}")
    patterns = sp.gallery(True, window, block)                     # QkvError for a bad window or block
    before = cpu_snapshot()
    result = measure_cost(patterns, sorted(set(sizes)), HEADS, KV_HEADS, D_HEAD, repeats=repeats, block=tile, log=log)
    machine = machine_facts()
    machine["vector"] = vector_extensions()
    return result | {"machine": machine, "others_cores": others_cores(before, cpu_snapshot()), "window": window,
                     "pattern_block": block}


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def markdown(result: dict, command: str = COMMAND) -> str:
    """The "sparse" section of docs/benchmarks.md, from `measure`'s dict."""
    names = list(result["rows"][0]["methods"]) if result["rows"] else []
    labels = {p["name"]: p["label"] for p in result["patterns"]}
    sh = result["shape"]
    method = (f"One causal attention call on random q, k, v: (1, H {sh['H']}, n, d {sh['d']}) queries, {sh['H_kv']} "
              f"K/V heads (SmolLM2's shape), {sh['dtype']}. `dense` adds the mask to the whole n × n score matrix "
              "(`attention.scaled_dot_product_attention`); `tiled` is the engine's tiled kernel "
              "(`kernels.tiled_attention`, causal); each pattern runs in `sparse.sparse_attention` with tiles of "
              f"{result['block']} × {result['block']}, skipping the tiles it hides. Patterns: "
              + "; ".join(f"`{n}` {labels[n]}" for n in labels) + ". "
              f"Each cell: median time of {result['repeats']} rounds taking turns, and the peak memory one call "
              "allocated (tracemalloc: NumPy's arrays, inputs excluded, output included). Outputs equal the dense "
              "masked call's up to n = 2048 (checked in the run).")
    time_rows, mem_rows, tile_rows = [], [], []
    for row in result["rows"]:
        got = row["methods"]
        time_rows.append([str(row["n"])] + [_ms(got[m]["seconds"]) if m in got else "skipped" for m in names]
                         + [f"{got['tiled']['seconds'] / got[m]['seconds']:.1f}×" if m in labels and m in got
                            else "" for m in names if m in labels])
        mem_rows.append([str(row["n"])] + [f"{got[m]['peak_bytes'] / 1e6:.1f}" if m in got else "—" for m in names])
        tile_rows.append([str(row["n"])] + [f"{row['density'][m]:.1%} · {got[m]['visited']}/{got[m]['tiles']}"
                                            for m in names if m in labels])
    pats = [m for m in names if m in labels]
    return md.join(
        "## Sparse attention", method,
        "### Time of one call", md.table(["n", *names, *[f"tiled / {m}" for m in pats]], time_rows,
                                         "r" * (1 + len(names) + len(pats))),
        "### Peak memory of one call (MB)", md.table(["n", *names], mem_rows, "r" * (1 + len(names))),
        "### Pairs kept · tiles computed / all tiles", md.table(["n", *pats], tile_rows, "r" * (1 + len(pats))),
        md.background("by construction, a pattern's work follows the tiles it computes, not the pairs it keeps "
                      "(a partial tile costs a whole tile plus its mask); the dense method holds H·n² scores, the "
                      "tiled kernels a few tiles per query block."),
        _machine(result), md.reproduce(command))


def _machine(result: dict) -> str:
    mach = result["machine"]
    return (f"Machine: {mach['cpu']}, {mach['cores']} cores, vector extensions "
            f"{', '.join(mach.get('vector') or ['unknown'])}; {md.numpy_blas(mach)}; {md.openblas_env(mach)}. "
            + md.busy(result.get("others_cores")))
