"""The attention benchmark's docs section and figure, from `attention.measure`'s dict.

    markdown  the "Attention at length" section of docs/benchmarks.md: a table per mode
              (causal, not), the figure, how the tiled kernel runs, the engine's threshold,
              linear attention against softmax on real activations, the machine
    plot      time and peak memory against n, log–log, every method
"""

from __future__ import annotations

import os
from pathlib import Path

from .attention import COMMAND, METHODS
from .common import OPENBLAS_VARS


def _cell(r: dict) -> str:
    if "skipped" in r:
        return r["skipped"]
    once = " (1 run)" if r.get("rounds", 1) == 1 else ""
    return f"{_secs(r['seconds'])}{once} · {r['gflops']:.0f} GF/s · {r['peak_bytes'] / 1e6:.0f} MB"


def _secs(s: float) -> str:
    return f"{s:.3f} s" if s < 1 else f"{s:.2f} s" if s < 100 else f"{s:.0f} s"


def ratio(row: dict, a: str, b: str) -> float | None:
    """time(a) / time(b) in one row, None when either did not run."""
    ra, rb = row["methods"].get(a, {}), row["methods"].get(b, {})
    if "seconds" in ra and "seconds" in rb:
        return ra["seconds"] / rb["seconds"]
    return None


def crossover(rows: list[dict], causal: bool) -> int | None:
    """The smallest n from which tiled is faster than plain at every measured size (None: never)."""
    pairs = [(r["n"], ratio(r, "tiled", "plain")) for r in rows if r["causal"] == causal]
    pairs = [(n, x) for n, x in pairs if x is not None]
    found = None
    for n, x in sorted(pairs, reverse=True):
        if x >= 1:
            break
        found = n
    return found


HOW_TILED = (
    "How the tiled kernel runs (qkv/kernels.py): query blocks of `Q_BLOCK` rows are independent, so they run "
    "on one thread per core (NumPy releases the GIL inside matmul and exp), each with BLAS on one thread "
    "(qkv/threads.py; with BLAS's own threads every small matmul waited for a busy core on this shared machine, "
    "~10× slower). For each block of `K_BLOCK` keys, all heads' scores come from one batched matmul into a "
    "buffer reused by every key block; only blocks that cross the mask's edge (the causal diagonal, the "
    "window's edge, padding) get a mask, added in place, and blocks the mask hides entirely are never visited. "
    "What separates it from torch's fused kernel: NumPy's float32 exp (~1.3 ns a score on this AVX2 CPU, "
    "about a quarter of the time) and the separate passes for the row max, the subtraction and the row sum, "
    "which torch does in registers.")


def markdown(result: dict, command: str = COMMAND, plot_path: str | None = None, linear: dict | None = None,
             threshold_note: str = "") -> str:
    """The "Attention at length" section of docs/benchmarks.md, from `measure`'s dict."""
    sh, mach = result["shape"], result["machine"]
    methods = [m for m in METHODS if result["torch"] or m != "torch"]
    lines = ["## Attention at length", "",
             f"One attention call on random q, k, v of shape (1, H {sh['heads']}, n, d {sh['d_head']}), "
             f"{sh['dtype']}: plain NumPy (`scaled_dot_product_attention`, holds H·n² scores), tiled "
             f"(`tiled_attention`, online softmax), sliding window (`sliding_window_attention`, w = "
             f"{sh['window']}, causal only)" + (" and torch's `scaled_dot_product_attention`" if result["torch"]
                                               else "") + ". "
             f"Each cell: median time ({result['repeats']} rounds taking turns after a warm-up, or one run "
             "where a call is long), GFLOP/s (useful FLOPs: 4·n²·d·H, half when causal; window 4·n·w·d·H) "
             "and the peak memory the call added (the process's high-water mark during the call, in a "
             "fresh process, inputs excluded, output included). "
             f"Ceiling: a 2048² float32 matmul runs at **{result['matmul_gflops']:.0f} GFLOP/s** here.",
             ""]
    if not result["torch"]:
        lines += ["*torch is not installed: its column is left out (pip install torch to add it).*", ""]
    for causal in (True, False):
        rows = [r for r in result["rows"] if r["causal"] == causal]
        if not rows:
            continue
        ms = [m for m in methods if causal or m != "window"]
        lines += [f"### {'Causal' if causal else 'Not causal'}", "",
                  "| n | " + " | ".join(ms) + " | tiled / plain |" + (" tiled / torch |" if result["torch"] else ""),
                  "|---:|" + "---:|" * len(ms) + "---:|" + ("---:|" if result["torch"] else "")]
        for r in rows:
            cells = [str(r["n"])] + [_cell(r["methods"][m]) for m in ms]
            for other in ("plain",) + (("torch",) if result["torch"] else ()):
                x = ratio(r, "tiled", other)
                cells.append("—" if x is None else f"{x:.2f}×")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if plot_path:
        lines += [f"![time and memory against n]({plot_path})", ""]
    lines += [HOW_TILED, ""]
    if threshold_note:
        lines += [threshold_note, ""]
    if linear:
        lines += ["### Linear attention against softmax on real activations", "",
                  f"`qkv.kernels.compare_to_softmax` on {linear['model']} reading a {linear['tokens']}-token "
                  f"paragraph ({'causal' if linear['causal'] else 'not causal'}): q, k, v of every layer from "
                  "`Model.run`, softmax attention (tiled) against linear attention (φ = elu + 1) on the same "
                  "inputs; mean over the heads, and the worst head.", "",
                  "| layer | relative error ‖lin − soft‖ / ‖soft‖ | worst head | cosine |", "|---:|---:|---:|---:|"]
        for la in linear["layers"]:
            lines.append(f"| {la['layer']} | {la['relative_error']:.3f} | {la['worst_relative_error']:.3f} | "
                         f"{la['cosine']:.3f} |")
        lines.append("")
    blas = mach["blas"]
    env = ", ".join(f"{k}={mach['env'][k] if mach['env'][k] is not None else 'unset'}" for k in OPENBLAS_VARS)
    torch_ = mach.get("torch")
    lines += [f"Machine: {mach['cpu']}, {mach['cores']} cores, shared with other work while this ran: figures "
              "are medians, the methods of a row take turns, yet a cell can be off by up to 2× when that work "
              "starts or stops mid-run (two full runs made here differed that much in single cells; in most rows "
              f"of both, tiled / torch was 1.5–2× from n = 2048 up); Python {mach['python']}; "
              f"NumPy {mach['numpy']} with "
              f"{blas.get('internal_api')} {blas.get('version') or ''} (kernel {blas.get('architecture')}, "
              f"{blas.get('num_threads')} threads)"
              + (f"; torch {torch_['version']} ({torch_['threads']} threads)" if torch_ else "") + f"; {env}.",
              "", "Reproduce (rewrites only this section and the figure):", "", "```sh", command, "```"]
    return "\n".join(lines)


def plot(result: dict, path: str | Path) -> Path:
    """Time and peak memory against n, log–log, every method; causal solid, not causal dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"plain": "tab:red", "tiled": "tab:blue", "window": "tab:green", "torch": "tab:gray"}
    for method in METHODS:
        for causal, style in ((True, "-"), (False, "--")):
            pts = [(r["n"], r["methods"][method]) for r in result["rows"]
                   if r["causal"] == causal and "seconds" in r["methods"].get(method, {})]
            if not pts:
                continue
            ns = [n for n, _ in pts]
            label = f"{method} ({'causal' if causal else 'full'})"
            ax_t.plot(ns, [p["seconds"] for _, p in pts], style, marker="o", ms=3, color=colors[method], label=label)
            ax_m.plot(ns, [max(p["peak_bytes"], 1) / 1e6 for _, p in pts], style, marker="o", ms=3,
                      color=colors[method], label=label)
    for ax, title, unit in ((ax_t, "time of one call", "seconds"), (ax_m, "peak extra memory", "MB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n (tokens)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7, ncol=2)
    fig.suptitle(f"Attention, H {result['shape']['heads']}, d {result['shape']['d_head']}, float32")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def threshold_note(result: dict) -> str:
    """What the run says about the engine's switch from plain to tiled (attention.TILED_MIN_SCORES)."""
    from ..attention import TILED_MIN_SCORES

    found = {c: crossover(result["rows"], c) for c in (True, False)}
    said = ", ".join(f"{'causal' if c else 'not causal'} from n = {n}" if n else
                     f"{'causal' if c else 'not causal'}: not faster at the sizes measured"
                     for c, n in found.items())
    side = int(TILED_MIN_SCORES ** 0.5)
    return (f"Tiled beats plain {said}. The engine switches to the tiled path from n·m ≥ "
            f"`TILED_MIN_SCORES` = {TILED_MIN_SCORES:,} scores per head (n = m = {side}), "
            "set from these measurements (qkv/attention.py).")
