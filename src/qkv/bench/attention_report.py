"""The attention benchmark's docs section and figure, from `attention.measure`'s dict.

    markdown  the "Attention at length" section of docs/benchmarks.md: a table per mode
              (causal, not), the figure, how the tiled kernel runs (with the run's exp time),
              the engine's threshold against the run's crossover, linear attention against
              softmax on real activations, the machine and its load during the run
    plot      time and peak memory against n, log–log, every method
"""

from __future__ import annotations

from pathlib import Path

from ..runtime.io import write_atomic
from . import markdown as md
from .attention import COMMAND, METHODS


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
    "How the tiled kernel runs (qkv/kernels.py): query blocks of q_block rows are independent, so they run "
    "on worker threads (NumPy releases the GIL inside matmul and exp), each with BLAS on one thread "
    "(qkv/threads.py); the block sizes and the number of workers are measured on the machine (qkv/tuning.py, "
    "named with the machine below). For each block of k_block keys, all heads' scores come from one batched "
    "matmul into a buffer reused by every key block; only blocks that cross the mask's edge (the causal "
    "diagonal, the window's edge, padding) get a mask, added in place, and blocks the mask hides entirely are "
    "never visited. exp runs in place; the row sums are a pass of their own (taking them out of the P·V "
    "product, P·[V | 1], measured no faster).")
TILED_BACKGROUND = (
    "with BLAS's own threads inside each block, every small matmul waited for a busy core on a shared machine "
    "(~10× slower when the kernel was written). What separates the kernel from torch's fused one is NumPy's "
    "float32 exp and the separate passes for the row max and the subtraction, which torch does in registers.")


def markdown(result: dict, command: str = COMMAND, plot_path: str | None = None, linear: dict | None = None,
             threshold_note: str = "") -> str:
    """The "Attention at length" section of docs/benchmarks.md, from `measure`'s dict."""
    tables = [_mode_table(result, causal) for causal in (True, False)]
    return md.join("## Attention at length", _method(result),
                   None if result["torch"] else
                   "*torch is not installed: its column is left out (pip install torch to add it).*",
                   *[part for t in tables if t for part in t],
                   f"![time and memory against n]({plot_path})" if plot_path else None,
                   HOW_TILED + " " + _exp_share(result) + md.background(TILED_BACKGROUND),
                   threshold_note or None, *(_linear(linear) if linear else []),
                   _machine(result), md.reproduce(command, "this section and the figure"))


def _method(result: dict) -> str:
    sh = result["shape"]
    return (f"One attention call on random q, k, v of shape (1, H {sh['heads']}, n, d {sh['d_head']}), "
            f"{sh['dtype']}: plain NumPy (`scaled_dot_product_attention`, holds H·n² scores), tiled "
            f"(`tiled_attention`, online softmax), sliding window (`sliding_window_attention`, w = "
            f"{sh['window']}, causal only)" + (" and torch's `scaled_dot_product_attention`" if result["torch"]
                                              else "") + ". "
            f"Each cell: median time ({result['repeats']} rounds taking turns after a warm-up, or one run "
            "where a call is long), GFLOP/s (useful FLOPs: 4·n²·d·H, half when causal; window 4·n·w·d·H) "
            "and the peak memory the call added (the process's high-water mark during the call, in a "
            "fresh process, inputs excluded, output included). "
            f"Ceiling: a 2048² float32 matmul runs at **{result['matmul_gflops']:.0f} GFLOP/s** here.")


def _mode_table(result: dict, causal: bool) -> list | None:
    """The heading and table of one mode (causal or not); None when the run has no row of it."""
    rows = [r for r in result["rows"] if r["causal"] == causal]
    if not rows:
        return None
    methods = [m for m in METHODS if (result["torch"] or m != "torch") and (causal or m != "window")]
    others = ("plain",) + (("torch",) if result["torch"] else ())
    cells = []
    for r in rows:
        ratios = [ratio(r, "tiled", other) for other in others]
        cells.append([str(r["n"])] + [_cell(r["methods"][m]) for m in methods]
                     + ["—" if x is None else f"{x:.2f}×" for x in ratios])
    header = ["n", *methods] + [f"tiled / {other}" for other in others]
    return [f"### {'Causal' if causal else 'Not causal'}", md.table(header, cells, "r" * len(header))]


def _exp_share(result: dict) -> str:
    """NumPy's exp per score, measured in this run, against tiled's time per score at the largest full n."""
    if "exp_ns" not in result:
        return ""
    said = f"NumPy's float32 exp took {result['exp_ns']:.2f} ns an element on one core in this run"
    full = [r for r in result["rows"] if not r["causal"] and "seconds" in r["methods"].get("tiled", {})]
    if not full:
        return said + ". "
    r = max(full, key=lambda r: r["n"])
    scores = result["shape"]["heads"] * r["n"] ** 2
    per_score = 1e9 * r["methods"]["tiled"]["seconds"] * result["machine"]["cores"] / scores   # ns on one core
    return (said + f"; at n = {r['n']} (not causal) tiled spent {per_score:.2f} ns of one core a score, so exp "
            f"alone is about {min(1.0, result['exp_ns'] / per_score):.0%} of it. ")


def _linear(linear: dict) -> list:
    rows = [[str(la["layer"]), f"{la['relative_error']:.3f}", f"{la['worst_relative_error']:.3f}",
             f"{la['cosine']:.3f}"] for la in linear["layers"]]
    return ["### Linear attention against softmax on real activations",
            f"`qkv.core.kernels.compare_to_softmax` on {linear['model']} reading a {linear['tokens']}-token "
            f"paragraph ({'causal' if linear['causal'] else 'not causal'}): q, k, v of every layer from "
            "`Model.run`, softmax attention (tiled) against linear attention (φ = elu + 1) on the same "
            "inputs; mean over the heads, and the worst head.",
            md.table(["layer", "relative error ‖lin − soft‖ / ‖soft‖", "worst head", "cosine"], rows, "rrrr")]


def _machine(result: dict) -> str:
    mach, torch_ = result["machine"], result["machine"].get("torch")
    noise = (md.busy(result["others_cores"]) + " " if "others_cores" in result else "")
    return (f"Machine: {md.cpu(mach)}; {md.numpy_blas(mach)}"
            + (f"; torch {torch_['version']} ({torch_['threads']} threads)" if torch_ else "")
            + f"; {md.openblas_env(mach)}. " + noise + "Figures are medians and the methods of a row take turns, "
            "but a call timed once (a long one) has no median to steady it.")


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
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return path


def threshold_note(result: dict) -> str:
    """What the run says about the engine's switch from plain to tiled (attention.TILED_MIN_SCORES)."""
    from ..core.attention import TILED_MIN_SCORES

    found = {c: crossover(result["rows"], c) for c in (True, False)}
    said = ", ".join(f"{'causal' if c else 'not causal'} from n = {n}" if n else
                     f"{'causal' if c else 'not causal'}: not faster at the sizes measured"
                     for c, n in found.items())
    side = int(TILED_MIN_SCORES ** 0.5)
    return (f"Tiled beats plain {said} in this run. The engine switches to the tiled path from n·m ≥ "
            f"`TILED_MIN_SCORES` = {TILED_MIN_SCORES:,} scores per head (n = m = {side}; qkv/attention.py). "
            + md.background("that threshold was set from an earlier run of this benchmark."))
