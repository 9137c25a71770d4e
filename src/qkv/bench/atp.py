"""The attribution-patching benchmark: AtP beside exact patching, on every family fixture and on SmolLM2's IOI pairs.

    (a) every fixture of tests/fixtures/models, loaded in float64 by qkv.load
          a decoder:   ids (n = 9) from a fixed generator, CORRUPTED = CLEAN with position 4 changed, metric
                       logit(a) − logit(b) of the two tokens that change moves most (up, down) at the last position
                       compare(atp(model, clean, corrupted, metric), patch(model, clean, corrupted, metric))
                       → per table (heads, residual, attn_out, ffn_out): Pearson r, sign agreement, cells wrong
                       by more than half (|estimate − exact| > ½·|exact|)
          refused:     what atp (or the model) says instead, one line
          an encoder:  listed as not a decoder (no logits of a next token to take a difference of)
    (b) SmolLM2 (the GGUF dequantised to float32 once; both methods run on that model), IOI pairs
          clean     "When A and B went to the P, B gave a O to"   m = logit(␣A) − logit(␣B)
          corrupted "When A and B went to the P, A gave a O to"   (the subject swapped; equal token counts)
        per pair: AtP and exact patching of every head's Z, timed side by side (one process, taking turns, the
        order swapped each pair, SETTLE s of sleep before each, NumPy's BLAS on `threads` threads), then AtP*
        (star=True) for the queries and keys; on the first `qkv_pairs` pairs also `patch_qkv` (exact patching of
        each head's queries and each K/V head's keys and values), so AtP and AtP* of queries and keys are compared.

`fixtures` and `ioi` return plain dicts; `markdown` turns them into the docs/benchmarks.md section.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import numpy as np

from ..runtime.errors import QkvError
from . import markdown as md
from .common import cpu_snapshot, machine_facts, others_cores, time_rounds

FIXTURES = "tests/fixtures/models"
TABLES = ("heads", "residual", "attn_out", "ffn_out")
TOKENS, AT = 9, 4                  # the fixtures' pair: n ids, the position that differs
MODEL = "smollm2"
# (A, B, place, object): single-token names with a leading space, objects taking "a"
IOI = [("Mary", "John", "store", "drink"), ("Alice", "Bob", "park", "ball"), ("Sarah", "Tom", "school", "book"),
       ("Anna", "David", "market", "basket"), ("Emma", "James", "beach", "towel"), ("Lisa", "Paul", "office", "pen"),
       ("Kate", "Mark", "library", "letter"), ("Laura", "Peter", "restaurant", "gift")]
PAIRS = len(IOI)
QKV_PAIRS = 2                      # pairs whose queries, keys and values are also patched exactly (~45 s each)
SETTLE = 0.5                       # s of sleep before each timed run (OpenBLAS's idle workers spin ~0.1 s)
COMMAND = "qkv bench atp --out docs/benchmarks.md"


# ── (a) the family fixtures ──────────────────────────────────────────────────────

def fixture_pair(model) -> tuple[list[int], list[int], tuple[int, int]]:
    """The fixtures' pair: CLEAN ids (TOKENS,) from a fixed generator, CORRUPTED with position AT changed, and the
    metric (a, b): the tokens whose last-position logit the change raises most and lowers most."""
    V = model.config.vocab_size
    clean = np.random.default_rng(3).integers(0, V, TOKENS)                          # (n,)
    corrupted = clean.copy()
    corrupted[AT] = (clean[AT] + 7) % V
    if getattr(model.config, "encoder_decoder", False):
        return clean.tolist(), corrupted.tolist(), (0, 1)      # atp refuses these before it reads the metric
    moved = model.run(clean, keep=()).logits[-1] - model.run(corrupted, keep=()).logits[-1]   # (V,)
    return clean.tolist(), corrupted.tolist(), (int(np.argmax(moved)), int(np.argmin(moved)))


def _agreement(a) -> dict:
    """One `Agreement` as the report keeps it (the wrong cells as (layer, index, estimate, exact))."""
    wrong = [list(w) for w in a.wrong]
    return {"pearson": a.pearson, "sign": a.sign, "cells": a.cells, "wrong": len(wrong), "wrong_cells": wrong}


def family(path: Path) -> dict:
    """One fixture: {"family", "kind": "decoder" | "encoder" | "refused", and per table its agreement, or "reason"}."""
    from .. import load
    from ..analysis.atp import atp, compare
    from ..analysis.patch import patch

    name = path.name
    model = load(path, dtype=np.float64)
    config = model.config
    if not getattr(config, "causal", True) and not getattr(config, "encoder_decoder", False):
        return {"family": name, "kind": "encoder", "model": type(model).__name__}
    try:
        clean, corrupted, metric = fixture_pair(model)
        estimate = atp(model, clean, corrupted, metric)
        exact = patch(model, clean, corrupted, metric, what=TABLES)
    except QkvError as e:
        reason = str(e).replace(str(path), name).splitlines()[0]
        return {"family": name, "kind": "refused", "reason": reason}
    return {"family": name, "kind": "decoder", "layers": config.n_layers, "heads": config.n_heads,
            "metric": [exact.clean, exact.corrupted],
            "tables": {a.table: _agreement(a) for a in compare(estimate, exact)}}


def fixtures(root: str | Path = FIXTURES, log: Callable[[str], None] = lambda m: None) -> list[dict]:
    """`family` of every model folder under ROOT (each holding a config.json), by name."""
    root = Path(root)
    folders = sorted(p for p in root.iterdir() if (p / "config.json").is_file()) if root.is_dir() else []
    if not folders:
        raise QkvError(f"no model fixtures under {root}: run from the repository's root, or give --fixtures DIR")
    out = []
    for p in folders:
        log(f"{p.name}: AtP beside exact patching")
        out.append(family(p))
    return out


# ── (b) SmolLM2 on IOI pairs ─────────────────────────────────────────────────────

def ioi_texts(a: str, b: str, place: str, obj: str) -> tuple[str, str, tuple[str, str]]:
    """(clean, corrupted, (answer, wrong)) of one IOI pair: the subject swapped from B to A."""
    clean = f"When {a} and {b} went to the {place}, {b} gave a {obj} to"
    corrupted = f"When {a} and {b} went to the {place}, {a} gave a {obj} to"
    return clean, corrupted, (" " + a, " " + b)


def ioi_pairs(model, count: int) -> tuple[list[tuple[str, str, tuple[str, str]]], list[str]]:
    """The first COUNT pairs of IOI that tokenise to equal lengths with one-token names, and a note per pair dropped."""
    from ..analysis.attribution import token_id

    kept, dropped = [], []
    for a, b, place, obj in IOI:
        if len(kept) == count:
            break
        clean, corrupted, metric = ioi_texts(a, b, place, obj)
        n, m = len(model.encode(clean)[0]), len(model.encode(corrupted)[0])
        try:
            [token_id(model, t) for t in metric]
        except QkvError:
            dropped.append(f"{a}/{b}: a name is not one token")
            continue
        if n != m:
            dropped.append(f"{a}/{b}: {n} tokens clean, {m} corrupted")
            continue
        kept.append((clean, corrupted, metric))
    return kept, dropped


def one_pair(model, clean: str, corrupted: str, metric, turn: int, with_qkv: bool) -> dict:
    """AtP and exact patching of every head for one pair, timed side by side (the order set by TURN), then AtP*
    and, WITH_QKV, exact patching of queries, keys and values: the agreements and the seconds."""
    from ..analysis.atp import atp, compare, patch_qkv
    from ..analysis.patch import patch

    got: dict = {}
    runs = {"atp": lambda: got.__setitem__("atp", atp(model, clean, corrupted, metric)),
            "exact": lambda: got.__setitem__("exact", patch(model, clean, corrupted, metric, what=("heads",)))}
    if turn % 2:
        runs = dict(reversed(list(runs.items())))
    seconds = {k: v[0] for k, v in time_rounds(runs, repeats=1, warmup=0, settle=SETTLE).items()}
    start = time.perf_counter()
    star = atp(model, clean, corrupted, metric, star=True)
    seconds["atp_star"] = time.perf_counter() - start
    qkv = None
    if with_qkv:
        start = time.perf_counter()
        qkv = patch_qkv(model, clean, corrupted, metric)
        seconds["exact_qkv"] = time.perf_counter() - start
    if not np.allclose(star.heads, got["atp"].heads, rtol=1e-6, atol=1e-9):
        raise RuntimeError("AtP* changed the heads' estimate: it recomputes queries' and keys' patterns only")
    exact = got["exact"]
    return {"clean": clean, "corrupted": corrupted, "names": [t.strip() for t in metric], "tokens": len(exact.labels),
            "metric": [exact.clean, exact.corrupted], "seconds": seconds, "first": next(iter(runs)),
            "tables": {a.table: _agreement(a) for a in compare(star, exact, qkv)}}


def _exact(table: str, exact, qkv: dict | None) -> np.ndarray:
    """The exact table `compare` set TABLE beside: a `Patching`'s, or `patch_qkv`'s ("keys (AtP*)": its keys)."""
    name = table.split(" ")[0]
    return getattr(exact, name) if name in TABLES else qkv[name]


def ioi(pairs: int = PAIRS, qkv_pairs: int = QKV_PAIRS, threads: int | None = None,
        log: Callable[[str], None] = lambda m: None) -> dict:
    """AtP beside exact patching on SmolLM2's IOI pairs (module doc): {"pairs": [one_pair's dicts], "dropped",
    "model", "shape", "machine", "others_cores", ...}."""
    from .. import load
    from ..analysis.atp import atp
    from ..analysis.input_attribution import float_model
    from ..runtime.threads import blas_threads, cores

    threads = threads or cores()
    start = time.perf_counter()
    model = float_model(load(MODEL))
    load_s = time.perf_counter() - start
    chosen, dropped = ioi_pairs(model, pairs)
    for note in dropped:
        log(f"dropped {note}")
    out = []
    with blas_threads(threads):
        if chosen:
            atp(model, *chosen[0])                                       # a warm-up, not timed
        before = cpu_snapshot()
        for i, (clean, corrupted, metric) in enumerate(chosen):
            log(f"pair {i + 1}/{len(chosen)}: {clean!r}")
            out.append(one_pair(model, clean, corrupted, metric, i, i < qkv_pairs))
        others = others_cores(before, cpu_snapshot())
    machine = machine_facts()
    machine["blas"]["num_threads"] = threads
    return {"pairs": out, "dropped": dropped, "model": Path(model.name).name,
            "shape": [model.config.n_layers, model.config.n_heads, model.config.n_kv_heads], "load_s": load_s,
            "machine": machine, "others_cores": others, "settle_s": SETTLE, "threads": threads}


def summary(pairs: list[dict], table: str) -> dict | None:
    """Mean and worst r and sign agreement of TABLE over the PAIRS that have it (None if none has)."""
    rows = [p["tables"][table] for p in pairs if table in p["tables"]]
    if not rows:
        return None
    r = [x["pearson"] for x in rows]
    s = [x["sign"] for x in rows]
    return {"pairs": len(rows), "mean_r": float(np.nanmean(r)), "worst_r": float(np.nanmin(r)),
            "mean_sign": float(np.mean(s)), "worst_sign": float(np.min(s))}


def often_wrong(pairs: list[dict]) -> tuple[int, list[dict]]:
    """The heads wrong by more than half on several pairs (at least half of them, and 2): (that count, each head's
    {"layer", "head", "pairs", "exact", "estimate"} with its mean exact and estimated effect over those pairs),
    largest mean |exact| first (a head of tiny effect is easily wrong by half and matters least)."""
    several = max(2, math.ceil(len(pairs) / 2))
    seen: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for p in pairs:
        for layer, head, est, ex in p["tables"]["heads"]["wrong_cells"]:
            seen[(layer, head)].append((est, ex))
    heads = [{"layer": l, "head": h, "pairs": len(v), "estimate": float(np.mean([e for e, _ in v])),
              "exact": float(np.mean([x for _, x in v]))} for (l, h), v in seen.items() if len(v) >= several]
    return several, sorted(heads, key=lambda x: (-abs(x["exact"]), -x["pairs"]))


# ── the report ───────────────────────────────────────────────────────────────────

def _cell(a: dict | None) -> str:
    """'r 0.98 · signs 90% · 2/16 off' of one agreement: r, the sign agreement, the cells wrong by more than half."""
    if a is None:
        return "—"
    r = "r n/a" if math.isnan(a["pearson"]) else f"r {a['pearson']:.2f}"
    return f"{r} · signs {a['sign']:.0%} · {a['wrong']}/{a['cells']} off"


def fixtures_markdown(families: list[dict]) -> list[str | list[str]]:
    """The fixtures' paragraphs: the method, one row per decoder or refused family, the encoders named."""
    decoders = [f for f in families if f["kind"] == "decoder"]
    refused = [f for f in families if f["kind"] == "refused"]
    encoders = [f["family"] for f in families if f["kind"] == "encoder"]
    rows = [[f["family"]] + [_cell(f["tables"].get(t)) for t in TABLES] for f in decoders]
    rows += [[f["family"], f"refused: {f['reason']}", "", "", ""] for f in refused]
    means = {t: [f["tables"][t] for f in decoders if t in f["tables"]] for t in TABLES}
    mean = ", ".join(f"`{t}` r {np.nanmean([a['pearson'] for a in v]):.2f}, signs {np.mean([a['sign'] for a in v]):.0%}"
                     for t, v in means.items() if v)
    return [
        "### Every family fixture",
        f"Each decoder fixture of tests/fixtures/models (random weights, float64): {TOKENS} token ids from a fixed "
        f"generator, the corrupted run with position {AT} changed, metric logit(a) − logit(b) at the last position "
        "for the two tokens that change moves most; `compare(atp(…), patch(…))` per table. A cell: Pearson r, the "
        "share of cells (exact ≠ 0) whose estimate has the exact effect's sign, and the cells where the estimate is "
        "wrong by more than half (|estimate − exact| > ½·|exact|) of all cells. A cell whose exact effect is "
        "rounding (e.g. the last layer's attention or FFN output before the last position, which cannot reach the "
        "metric: AtP gives it exactly 0, patching's batched pass ±1e-16) counts as 0 (`atp.agreement`).",
        md.table(["family"] + [f"`{t}`" for t in TABLES], rows, "lllll"),
        f"Mean over the {len(decoders)} decoders: {mean}." if decoders else None,
        (f"Not decoders, so not in the table (no next token's logits to take a difference of): "
         f"{', '.join(encoders)}.") if encoders else None]


def ioi_markdown(result: dict) -> list[str | list[str]]:
    """The SmolLM2 paragraphs: the pairs, the summary over them, the heads often wrong, the timing."""
    pairs = result["pairs"]
    L, H, Hkv = result["shape"]
    if not pairs:
        return [f"### {result['model']}: IOI pairs", f"No pair kept: {'; '.join(result['dropped']) or 'none asked'}."]
    q = lambda p, t: p["tables"].get(t)                                           # noqa: E731
    rows = []
    for i, p in enumerate(pairs):
        s = p["seconds"]
        rows.append([str(i + 1), " / ".join(p["names"]), str(p["tokens"]),
                     _cell(q(p, "heads")), _cell(q(p, "queries")), _cell(q(p, "queries (AtP*)")),
                     _cell(q(p, "keys")), _cell(q(p, "keys (AtP*)")),
                     f"{s['atp']:.2f} / {s['exact']:.1f}", f"{s['exact'] / s['atp']:.0f}×"])
    lines = []
    for table in ("heads", "queries", "queries (AtP*)", "keys", "keys (AtP*)", "values"):
        s = summary(pairs, table)
        if s:
            lines.append(f"- `{table}` ({s['pairs']} pair(s)): r mean {s['mean_r']:.3f}, worst {s['worst_r']:.3f}; "
                         f"signs mean {s['mean_sign']:.1%}, worst {s['worst_sign']:.1%}")
    several, heads = often_wrong(pairs)
    shown = ", ".join(f"L{h['layer']}.H{h['head']} ({h['pairs']}/{len(pairs)}; exact {h['exact']:+.3f}, AtP "
                      f"{h['estimate']:+.3f})" for h in heads[:12])
    atp_s = sum(p["seconds"]["atp"] for p in pairs)
    exact_s = sum(p["seconds"]["exact"] for p in pairs)
    star_s = [p["seconds"]["atp_star"] for p in pairs]
    ratios = [p["seconds"]["exact"] / p["seconds"]["atp"] for p in pairs]
    qkv_s = [p["seconds"]["exact_qkv"] for p in pairs if "exact_qkv" in p["seconds"]]
    mach = result["machine"]
    return [
        f"### {result['model']}: IOI pairs",
        f"{result['model']} ({L} layers × {H} heads, {Hkv} K/V heads), its GGUF dequantised to float32 once "
        f"({result['load_s']:.0f} s with the load, not timed below) and both methods run on that model. Each pair: "
        "clean \"When A and B went to the P, B gave a O to\", corrupted the same with the subject A, metric "
        "logit(␣A) − logit(␣B) at the last position. `heads`: AtP against exact patching of every head's Z "
        "(`patch(…, what=(\"heads\",))`); on the first "
        f"{len(qkv_s)} pair(s) also each head's queries and each K/V head's keys by AtP and AtP* against "
        "`patch_qkv`. A cell as above.",
        md.table(["pair", "names", "tokens", "`heads`", "`queries` AtP", "`queries` AtP*", "`keys` AtP", "`keys` AtP*",
                  "s AtP / exact", "exact ÷ AtP"], rows, "rlrllllllr"),
        (f"Dropped: {'; '.join(result['dropped'])}." if result["dropped"] else None),
        [f"Over the {len(pairs)} pair(s):", ""] + lines,
        (f"Heads wrong by more than half on at least {several} of the {len(pairs)} pairs ({len(heads)}; mean effect "
         f"over those pairs, the 12 of largest |exact|): {shown}." if heads else
         f"No head is wrong by more than half on {several} or more of the {len(pairs)} pairs."),
        f"Time: AtP of every head {atp_s:.1f} s over the pairs against exact patching's {exact_s:.1f} s "
        f"(**{exact_s / atp_s:.0f}×**; per pair {np.median(ratios):.0f}× the median, {min(ratios):.0f}–"
        f"{max(ratios):.0f}×), each pair's two run side by side in one process, the order swapped each pair, "
        f"{result['settle_s']:g} s of sleep before each, after one untimed AtP; AtP* {np.mean(star_s):.2f} s a pair"
        + (f", exact patching of queries, keys and values {np.mean(qkv_s):.1f} s a pair." if qkv_s else "."),
        f"Machine: {md.cpu(mach)}; {md.numpy_blas(mach)}; {md.openblas_env(mach)}. {md.busy(result['others_cores'])}"]


def markdown(families: list[dict], smollm2: dict | None, command: str = COMMAND) -> str:
    """The "Attribution patching" section of docs/benchmarks.md, from `fixtures`' list and `ioi`'s dict (None:
    the fixtures only)."""
    return md.join(
        "## Attribution patching beside exact patching",
        "AtP (`qkv.analysis.atp.atp`: the first-order estimate from two forwards and one backward) beside exact "
        "activation patching (`qkv.analysis.patch.patch`, and `atp.patch_qkv` for queries and keys) by "
        "`atp.compare`.",
        *fixtures_markdown(families),
        *(ioi_markdown(smollm2) if smollm2 else []),
        md.reproduce(command))
