"""The patching benchmark: docs/patching.md's indirect-object run, qkv against TransformerLens.

    SmolLM2 (the converted checkpoint directory of `qkv.checkpoints.resolve("smollm2")`)
      ─qkv.load─▶ qkv (float32)        ─from_pretrained(eager, float32)─▶ TransformerBridge (no processing)
    the same token ids of CLEAN and CORRUPTED, metric m = logit(␣Mary) − logit(␣John) at the last position
      qkv:  analysis.patch(model, clean, corrupted, metric, what=("heads",))        (batched passes)
      TL:   run_with_cache(clean), the corrupted logits, then
            patching.get_act_patch_attn_head_out_all_pos: blocks.l.attn.hook_z[:, :, h] from the clean
            cache, one forward per (l, h)                                            (L·H passes)
    both tables normalised: (m(patched) − m(corrupted)) / (m(clean) − m(corrupted)), (L, H)

Runs this long need no interleaved medians: each side runs `repeats` times, taking turns, each
round's seconds reported; the two (L, H) tables must agree within TOL. TransformerLens's progress
bar (tqdm) is switched off: it writes to the terminal and is not part of the work.
`measure` returns plain dicts; `markdown` turns them into the docs/benchmarks.md section.
"""

from __future__ import annotations

from typing import Callable
from unittest import mock

import numpy as np

from ..runtime.errors import QkvError
from . import markdown as md
from .common import cpu_snapshot, others_cores, time_rounds, torch_machine_facts

MODEL = "smollm2"
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"
ANSWER, WRONG = " Mary", " John"
REPEATS = 2
SETTLE = 1.0               # seconds of sleep before each run (OpenBLAS's idle workers spin ~0.1 s)
TOL = 1e-3                 # max |qkv's normalised effect − TransformerLens's|
COMMAND = "qkv bench patch --out docs/benchmarks.md"
REFERENCE_FIX = "run `make bench`, or: pip install torch==2.13.0 transformers transformer-lens==4.3.0"


def reference_stack():
    """(torch, transformers, transformer_lens), or a QkvError that says how to install them."""
    try:
        import torch
        import transformer_lens
        import transformers
    except ImportError as e:
        raise QkvError(f"the patching benchmark needs torch, transformers and transformer-lens ({e.name} is "
                       f"missing); {REFERENCE_FIX}") from None
    return torch, transformers, transformer_lens


# ── the two sides ────────────────────────────────────────────────────────────────

def qkv_run(model, clean_ids: np.ndarray, corrupted_ids: np.ndarray) -> Callable[[], dict]:
    """qkv's patching of every head, as a function returning {"table" (L, H), "passes", "runs", "skipped"}."""
    from ..analysis.patch import patch

    def run() -> dict:
        p = patch(model, clean_ids.tolist(), corrupted_ids.tolist(), (ANSWER, WRONG), what=("heads",))
        return {"table": p.heads, "passes": p.passes, "runs": p.runs, "skipped": p.skipped,
                "clean": p.clean, "corrupted": p.corrupted}
    return run


def bridge(directory):
    """SmolLM2 in TransformerLens: transformers' model (eager attention, float32) in a TransformerBridge
    with no weight processing, so its numbers are the checkpoint's (as tests/live do)."""
    torch, transformers, _ = reference_stack()
    from transformer_lens import TransformerBridge

    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    tl = TransformerBridge.boot_transformers(str(directory), hf_model=hf, tokenizer=tokenizer)
    tl.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return tl


def tl_run(tl, clean_ids: np.ndarray, corrupted_ids: np.ndarray, answer: int, wrong: int) -> Callable[[], dict]:
    """TransformerLens's patching of every head's z, as its users write it, as a function returning
    {"table" (L, H), "passes"}: the clean cache, the corrupted baseline, get_act_patch_attn_head_out_all_pos."""
    torch, _, _ = reference_stack()
    from transformer_lens import patching

    clean, corrupted = torch.as_tensor(clean_ids[None]), torch.as_tensor(corrupted_ids[None])     # (1, n)

    def metric(logits):                                                   # (1, n, V) → ()
        return logits[0, -1, answer] - logits[0, -1, wrong]

    def run() -> dict:
        with torch.no_grad(), mock.patch.object(patching, "tqdm", lambda rows: rows):
            clean_logits, cache = tl.run_with_cache(clean)
            m_clean, m_corrupt = float(metric(clean_logits)), float(metric(tl(corrupted)))
            raw = patching.get_act_patch_attn_head_out_all_pos(tl, corrupted, cache, metric)   # (L, H)
        L, H = raw.shape
        return {"table": ((raw.double() - m_corrupt) / (m_clean - m_corrupt)).numpy(), "passes": L * H + 2,
                "clean": m_clean, "corrupted": m_corrupt}
    return run


# ── the benchmark ────────────────────────────────────────────────────────────────

def measure(repeats: int = REPEATS, threads: int | None = None, log: Callable[[str], None] = lambda m: None) -> dict:
    """Time both sides' (L, H) head-patching table on SmolLM2, taking turns; check the tables agree.

    {"qkv_s": [s per round], "tl_s": [...], "ratio": min TL / min qkv, "max_diff", "qkv": {passes, runs,
    skipped}, "tl": {passes}, "shape": (L, H), "tokens": n, "metric": (clean, corrupted), "machine": {...}, ...}
    """
    torch, transformers, transformer_lens = reference_stack()
    from importlib.metadata import version

    from .. import load
    from ..analysis.attribution import token_id
    from ..checkpoints import resolve
    from ..runtime.threads import blas_threads, cores

    threads = threads or cores()
    torch.set_num_threads(threads)
    directory = resolve(MODEL)
    model = load(directory)
    clean_ids, _ = model.encode(CLEAN)                                    # (n,) the same ids for both sides
    corrupted_ids, _ = model.encode(CORRUPTED)
    answer, wrong = token_id(model, ANSWER), token_id(model, WRONG)
    log(f"loading {MODEL} into TransformerLens {version('transformer-lens')}")
    tl = bridge(directory)
    results: dict[str, dict] = {}

    def keep(name: str, fn: Callable[[], dict]) -> Callable[[], None]:
        def run() -> None:
            log(f"{name}: patching {model.config.n_layers} × {model.config.n_heads} heads")
            results[name] = fn()
        return run

    runs = {"qkv": keep("qkv", qkv_run(model, clean_ids, corrupted_ids)),
            "tl": keep("tl", tl_run(tl, clean_ids, corrupted_ids, answer, wrong))}
    with blas_threads(threads):
        before = cpu_snapshot()
        times = time_rounds(runs, repeats=repeats, warmup=0, settle=SETTLE)
        others = others_cores(before, cpu_snapshot())
    ours, theirs = results["qkv"], results["tl"]
    if ours["table"].shape != theirs["table"].shape:
        raise RuntimeError(f"qkv's table is {ours['table'].shape}, TransformerLens's {theirs['table'].shape}")
    diff = float(np.abs(ours["table"] - theirs["table"]).max())
    if diff > TOL:
        raise RuntimeError(f"qkv's and TransformerLens's head tables differ by {diff:.2e} > {TOL}: not the same "
                           "patching, the timing would be meaningless")

    machine = torch_machine_facts(torch, transformers, threads)
    machine["transformer_lens"] = version("transformer-lens")
    top = np.argsort(-np.abs(ours["table"]), axis=None)[:3]
    H = ours["table"].shape[1]
    return {"qkv_s": times["qkv"], "tl_s": times["tl"], "ratio": min(times["tl"]) / min(times["qkv"]),
            "max_diff": diff, "tol": TOL, "shape": list(ours["table"].shape), "tokens": int(len(clean_ids)),
            "metric": [ours["clean"], ours["corrupted"]], "tl_metric": [theirs["clean"], theirs["corrupted"]],
            "qkv": {k: ours[k] for k in ("passes", "runs", "skipped")}, "tl": {"passes": theirs["passes"]},
            "top": [{"layer": int(i // H), "head": int(i % H), "qkv": float(ours["table"].flat[i]),
                     "tl": float(theirs["table"].flat[i])} for i in top],
            "model": directory.name.split(".")[0], "machine": machine, "others_cores": others, "repeats": repeats,
            "settle_s": SETTLE}


# ── the report ───────────────────────────────────────────────────────────────────

def markdown(result: dict, command: str = COMMAND) -> str:
    """The "Activation patching" section of docs/benchmarks.md, from `measure`'s dict."""
    L, H = result["shape"]
    q, t = result["qkv"], result["tl"]
    seconds = lambda ts: " / ".join(f"{s:.1f}" for s in ts)             # noqa: E731
    table = md.table(["", "seconds (each run, in turn)", "forward passes"], [
        ["qkv `analysis.patch`", seconds(result["qkv_s"]),
         f"{q['passes']} batched, over blocks l..{L - 1} ({q['runs']} patched copies, {q['skipped']} skipped)"],
        ["TransformerLens `get_act_patch_attn_head_out_all_pos`", seconds(result["tl_s"]),
         f"{t['passes']} whole ({L} × {H} patched, clean cache, corrupted baseline)"]], "lrl")
    top = ", ".join(f"L{r['layer']}.H{r['head']} {r['qkv']:+.3f} / {r['tl']:+.3f}" for r in result["top"])
    return md.join(
        "## Activation patching", _method(result), table,
        f"TransformerLens ÷ qkv (the faster run of each): **{result['ratio']:.1f}×**.",
        f"The two (L, H) tables of normalised effects agree within {result['max_diff']:.1e} "
        f"(tolerance {result['tol']:g}); the largest heads, qkv / TransformerLens: {top}.",
        md.torch_machine(result, f", transformer-lens {result['machine']['transformer_lens']}"),
        md.reproduce(command))


def _method(result: dict) -> str:
    L, H = result["shape"]
    m_clean, m_corrupt = result["metric"]
    return (f"docs/patching.md's indirect-object run on {result['model']} ({L} layers × {H} heads, "
            f"{result['tokens']} tokens): clean \"{CLEAN}\", corrupted \"{CORRUPTED}\", metric "
            f"logit(␣Mary) − logit(␣John) at the last position ({m_clean:.3f} clean, {m_corrupt:.3f} corrupted). "
            "Every head's output Z (all positions) copied from the clean run into the corrupted one, one head at a "
            "time; effect = (m(patched) − m(corrupted)) / (m(clean) − m(corrupted)). Both sides get the same token "
            "ids and the same float32 weights (the converted SmolLM2 checkpoint): qkv loads it, TransformerLens "
            "wraps transformers' model of it (eager attention) in a TransformerBridge without weight processing "
            "and patches `blocks.l.attn.hook_z` head by head. Each time includes the clean and corrupted runs "
            f"both sides need. In one process, taking turns, {result['repeats']} run(s) each, "
            f"{result['settle_s']:g} s of sleep before each.")
