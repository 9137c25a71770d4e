"""The forward benchmark: qkv against transformers on one prefill, same model, same run.

    random GPT-2-small (L 12, d_model 768, H 12, V 50257, 1024 positions), float32, CPU
      ─save_pretrained─▶ temp dir (safetensors) ─qkv.load─▶ the same weights, memory-mapped
    per prompt length n: check the logits agree once, then time
      qkv:           model.forward(ids, attentions=False)
      transformers:  with torch.no_grad(): hf_model(ids)   (sdpa attention, the default;
                                                             eager too when asked)
    taking turns, median of `repeats` rounds after a warm-up.

`measure` returns plain dicts; `markdown` turns them into the docs/benchmarks.md section.
torch and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from . import common
from . import markdown as md
from .common import cpu_snapshot, machine_facts, others_cores, time_interleaved

# GPT-2 small's shape (the config's defaults, written out so the benchmark says what it runs).
GPT2_SMALL = {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
TOKENS = (128, 512)
REPEATS = 9
TOL_LOGITS = 1e-3          # max abs between qkv's and transformers' logits on this random model
TARGET = 0.6               # qkv should take at most 0.6× the time of transformers
COMMAND = "qkv bench forward --out docs/benchmarks.md"
# Seconds of sleep before each timed run. Without it, transformers right after qkv ran
# ~100 ms slower at 128 tokens (OpenBLAS's workers still spinning), flattering qkv.
SETTLE = 0.3


def reference_stack():
    """(torch, transformers) for this benchmark, or a QkvError that says how to install them."""
    return common.reference_stack("forward")


def random_gpt2(directory: Path, seed: int = 0, attn: str = "sdpa"):
    """A random GPT-2-small in transformers (eval, float32), saved to `directory` as safetensors."""
    torch, transformers = reference_stack()
    transformers.utils.logging.disable_progress_bar()                  # keep the output to the table
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(**GPT2_SMALL)
    model = transformers.GPT2LMHeadModel(cfg).float().eval()
    model.save_pretrained(directory, safe_serialization=True)
    return load_reference(directory, attn)


def load_reference(directory: Path, attn: str):
    """The saved checkpoint back in transformers, with attention implementation `attn`."""
    torch, transformers = reference_stack()
    model = transformers.GPT2LMHeadModel.from_pretrained(directory, attn_implementation=attn,
                                                         dtype=torch.float32)
    return model.eval()


def timed_runs(model, hf: dict, ids: np.ndarray) -> dict:
    """What gets timed for one input, by name: each call returns the logits (1, n, V) as NumPy."""
    torch, _ = reference_stack()
    ids_t = torch.from_numpy(ids)

    def reference(hf_model):
        def run():
            with torch.no_grad():
                return hf_model(ids_t).logits.numpy()
        return run

    runs = {"qkv": lambda: model.forward(ids, attentions=False).logits}
    runs.update({f"transformers_{attn}": reference(m) for attn, m in hf.items()})
    return runs


def measure(tokens=TOKENS, repeats: int = REPEATS, warmup: int = 1, seed: int = 0, eager: bool = True,
            source: str | None = None) -> dict:
    """Time qkv and transformers on prefills of each length in `tokens`; a plain dict of results.

    source: a real decoder (e.g. "smollm2") instead of the random GPT-2-small, compared with
    transformers' model of the same float32 weights (sdpa only).
    {"model": {...}, "machine": {...}, "repeats": r, "rows": [{"tokens", "qkv_ms",
    "transformers_ms", "ratio", "eager_ms" (with eager), "max_abs_logits"}, ...]}
    """
    torch, transformers = reference_stack()
    from .. import load

    rng = np.random.default_rng(seed)
    if source is None:
        _check_lengths(tokens, GPT2_SMALL["n_positions"], "GPT-2")
    with tempfile.TemporaryDirectory(prefix="qkv-bench-", ignore_cleanup_errors=True) as tmp:
        if source is None:
            hf = {"sdpa": random_gpt2(Path(tmp), seed)}
            if eager:
                hf["eager"] = load_reference(Path(tmp), "eager")
            model = load(tmp)
        else:
            from .llm import load_reference as load_real

            model = load(source)
            hf = {"sdpa": load_real(source, torch, transformers)}
        V = model.config.vocab_size
        _check_lengths(tokens, model.config.max_positions, model.name)
        before = cpu_snapshot()                                         # others' work slows both sides
        rows = [_row(model, hf, rng.integers(0, V, size=(1, n)), repeats, warmup) for n in tokens]   # (1, n) ids
        n_params = model.weights.nbytes() // model.dtype.itemsize      # tied W_vocab counted once
        others = others_cores(before, cpu_snapshot())
    machine = machine_facts()
    machine["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads(),
                        "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    machine["transformers"] = transformers.__version__
    c = model.config
    shape = (dict(GPT2_SMALL) if source is None else
             {"name": model.name, "source": source, "n_layer": c.n_layers, "n_embd": c.d_model, "n_head": c.n_heads,
              "n_kv_heads": c.n_kv_heads, "vocab_size": c.vocab_size, "n_positions": c.max_positions})
    return {"model": dict(shape, parameters=n_params, dtype="float32", batch=1, seed=seed),
            "machine": machine, "others_cores": others, "repeats": repeats, "warmup": warmup,
            "settle_s": SETTLE, "rows": rows}


def _check_lengths(tokens, limit: int, name: str) -> None:
    for n in tokens:
        if not 1 <= n <= limit:
            raise QkvError(f"--tokens {n} is outside 1..{limit} ({name}'s context); choose a length in it")


def _row(model, hf: dict, ids: np.ndarray, repeats: int, warmup: int) -> dict:
    """One prompt length: the logits checked against transformers', then the timings taking turns."""
    n = ids.shape[1]
    runs = timed_runs(model, hf, ids)
    ours = runs["qkv"]()                                               # (1, n, V)
    diff = max(float(np.max(np.abs(ours - runs[f"transformers_{a}"]()))) for a in hf)
    if diff > TOL_LOGITS:
        raise RuntimeError(f"qkv's logits differ from transformers' by {diff:.2e} > {TOL_LOGITS} "
                           f"at {n} tokens: the engine is wrong, the timing would be meaningless")
    t = time_interleaved(runs, repeats=repeats, warmup=warmup, settle=SETTLE)
    row = {"tokens": n, "qkv_ms": 1e3 * t["qkv"], "transformers_ms": 1e3 * t["transformers_sdpa"],
           "ratio": t["qkv"] / t["transformers_sdpa"], "max_abs_logits": diff}
    if "eager" in hf:
        row["eager_ms"] = 1e3 * t["transformers_eager"]
    return row


def markdown(result: dict, command: str = COMMAND) -> str:
    """The "Forward (prefill)" section of docs/benchmarks.md, from `measure`'s dict."""
    worst = max(r["max_abs_logits"] for r in result["rows"])
    title = "## Forward (prefill)" + (f": {result['model']['name']}" if "source" in result["model"] else "")
    return md.join(title, _method(result), _table(result["rows"]),
                   f"Logits agree: max abs difference {worst:.1e} (tolerance {TOL_LOGITS}).",
                   _machine(result["machine"]),
                   md.busy(result["others_cores"]) + " " + md.background(
                       "on a busy machine NumPy's multi-threaded BLAS slows down far more than torch does, "
                       "and the ratio with it: run on an idle machine."),
                   md.reproduce(command))


def _method(result: dict) -> str:
    m = result["model"]
    what = (f"{m['name']} (L {m['n_layer']}, d_model {m['n_embd']}, {m['n_head']} query heads / {m['n_kv_heads']} "
            f"K/V heads, V {m['vocab_size']}, {m['parameters'] / 1e6:.0f}M parameters; transformers runs the same "
            "float32 weights)" if "source" in m else
            f"A random GPT-2-small-sized model (L {m['n_layer']}, d_model {m['n_embd']}, H {m['n_head']}, "
            f"V {m['vocab_size']}, {m['n_positions']} positions, {m['parameters'] / 1e6:.0f}M parameters)")
    return (f"{what}, "
            f"float32, batch 1, on the CPU: qkv `model.forward(ids, attentions=False)` against transformers "
            f"`hf_model(ids)` under `torch.no_grad()`, in the same process, taking turns; median of "
            f"{result['repeats']} rounds after {result['warmup']} warm-up, with {result.get('settle_s', 0):g} s "
            "of sleep before each run so that neither library's idle threads slow the other "
            f"({md.background('OpenBLAS keeps its threads spinning ~0.1 s after a call')}). "
            f"Target: qkv / transformers ≤ {TARGET}.")


def _table(rows: list[dict]) -> list[str]:
    eager = "eager_ms" in rows[0]
    header = ["tokens", "qkv ms", "transformers ms (sdpa)", "qkv / transformers"]
    header += ["transformers ms (eager)", "qkv / eager"] if eager else []
    cells = []
    for r in rows:
        row = [str(r["tokens"]), f"{r['qkv_ms']:.0f}", f"{r['transformers_ms']:.0f}", f"{r['ratio']:.2f}×"]
        if eager:
            row += [f"{r['eager_ms']:.0f}", f"{r['qkv_ms'] / r['eager_ms']:.2f}×"]
        cells.append(row)
    return md.table(header, cells, "r" * len(header))


def _machine(mach: dict) -> str:
    torch_ = mach["torch"]
    return (f"Machine: {md.cpu(mach)}; {md.numpy_blas(mach)}; torch {torch_['version']} "
            f"({torch_['threads']} threads, {torch_['cpu_capability']}), transformers {mach['transformers']}; "
            f"{md.openblas_env(mach)}.")
