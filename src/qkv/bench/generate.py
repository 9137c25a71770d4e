"""The generation benchmark: tokens per second of qkv (with and without its KV cache) and transformers.

    random GPT-2-small (as `qkv bench forward`), float32, CPU, greedy, a 16-token prompt:
      qkv, cache:     model.generate(ids, 128, temperature=0, stop_at_eos=False)
      qkv, no cache:  the same with use_cache=False (fewer tokens: it recomputes everything)
      transformers:   hf.generate(ids, do_sample=False, max_new_tokens=128, min_new_tokens=128)
    taking turns, median of `repeats` rounds after a warm-up; tokens/s = new tokens / wall time
    of the whole call (prefill included).

A decoding step reads every weight once, so its speed is bounded by memory bandwidth:
share = weight bytes × tokens/s ÷ the bandwidth of a large copy measured in the same run.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import click
import numpy as np

from ..cache import KVCache
from ..config import ModelConfig
from ..errors import QkvError
from . import common
from .common import OPENBLAS_VARS, machine_facts, time_interleaved, write_section
from .forward import GPT2_SMALL

PROMPT = 16
NEW_TOKENS = 128
NO_CACHE_TOKENS = 32         # without a cache each step recomputes the whole sequence: fewer steps suffice
REPEATS = 3
COPY_BYTES = 1 << 30         # the array copied to measure bandwidth (1 GiB of float32)
TARGET_SPEEDUP = 2.0         # qkv ≥ 2× transformers' tokens/s
TARGET_SHARE = 0.85          # qkv ≥ 85 % of the bandwidth limit
GQA = {"n_heads": 12, "n_kv_heads": 4}     # a Llama-style grouping of GPT-2-small's 12 heads
COMMAND = "qkv bench generate --out docs/benchmarks.md"


def reference_stack():
    """(torch, transformers): the baseline, or a QkvError that says how to install them."""
    return common.reference_stack("generation")


def copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = 5) -> float:
    """Bytes per second a large float32 copy moves (read + write), median of `repeats`."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    seconds = time_interleaved({"copy": lambda: np.copyto(dst, src)}, repeats=repeats)["copy"]
    return 2 * src.nbytes / seconds


def gemv_bandwidth(nbytes: int = COPY_BYTES // 4, repeats: int = 7) -> float:
    """Bytes per second one core reads in a matrix × vector product (one BLAS thread, as qkv's
    one-token steps run): the rate a decoding step can stream its weights at, on one core."""
    from ..threads import blas_one_thread

    W = np.ones((nbytes // 4 // 1024, 1024), dtype=np.float32)          # (rows, 1024)
    x = np.ones(1024, dtype=np.float32)
    with blas_one_thread():
        seconds = time_interleaved({"gemv": lambda: W @ x}, repeats=repeats)["gemv"]
    return W.nbytes / seconds


def bandwidth_share(weight_bytes: int, tokens_per_s: float, copy_bytes_per_s: float) -> float:
    """The share of the memory-bandwidth limit a decoder reaches.

    Each token reads every weight once, so weights × tokens/s bytes stream per second;
    the copy bandwidth is what this machine can move at best.
    """
    return weight_bytes * tokens_per_s / copy_bytes_per_s


def kv_cache_rows(cfg: ModelConfig, gqa: dict = GQA) -> list[dict]:
    """KV-cache bytes per token of `cfg` and of the same model with grouped K/V heads (GQA)."""
    grouped = cfg.with_(**gqa)
    base = KVCache.bytes_per_token(cfg)
    rows = []
    for name, c in (("multi-head (GPT-2)", cfg), (f"GQA ({c_h(grouped)})", grouped)):
        b = KVCache.bytes_per_token(c)
        rows.append({"attention": name, "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads, "bytes_per_token": b,
                     "saving": base / b})
    return rows


def c_h(cfg: ModelConfig) -> str:
    return f"{cfg.n_heads} query heads / {cfg.n_kv_heads} K/V heads"


def first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
    """Index of the first token where two sequences differ (None when they are equal)."""
    if a.shape == b.shape and np.array_equal(a, b):
        return None
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def measure(new_tokens: int = NEW_TOKENS, no_cache_tokens: int = NO_CACHE_TOKENS, repeats: int = REPEATS,
            prompt: int = PROMPT, seed: int = 0, log=None) -> dict:
    """Time the three generators on one random GPT-2-small; a plain dict of results (see `markdown`)."""
    torch, transformers = reference_stack()
    from .. import load
    from .forward import random_gpt2

    limit = GPT2_SMALL["n_positions"]
    if prompt < 1 or prompt + max(new_tokens, no_cache_tokens) > limit:
        raise QkvError(f"a {prompt}-token prompt plus {max(new_tokens, no_cache_tokens)} new tokens does not "
                       f"fit GPT-2's {limit} positions; choose fewer tokens")
    log = log or (lambda msg: None)
    ids = np.random.default_rng(seed).integers(0, GPT2_SMALL["vocab_size"], size=(1, prompt))   # (1, prompt)
    with tempfile.TemporaryDirectory(prefix="qkv-bench-", ignore_cleanup_errors=True) as tmp:
        hf = random_gpt2(Path(tmp), seed)
        model = load(tmp)
        ids_t = torch.from_numpy(ids)

        def qkv_cached():
            return model.generate(ids, new_tokens, temperature=0, stop_at_eos=False)

        def qkv_uncached():
            return model.generate(ids, no_cache_tokens, temperature=0, stop_at_eos=False, use_cache=False)

        def reference():
            with torch.no_grad():
                return hf.generate(ids_t, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                   pad_token_id=0).numpy()

        log("checking that qkv and transformers choose the same tokens")
        ours, theirs, slow = qkv_cached()[0, prompt:], reference()[0, prompt:], qkv_uncached()[0, prompt:]
        differ = first_difference(ours, theirs)
        same_without_cache = bool(np.array_equal(slow, ours[:no_cache_tokens]))
        log("copy bandwidth")
        bandwidth = copy_bandwidth()
        log(f"timing {repeats} rounds after a warm-up, taking turns")
        t = time_interleaved({"qkv_cache": qkv_cached, "qkv_no_cache": qkv_uncached, "transformers": reference},
                             repeats=repeats)
        bandwidth_after = copy_bandwidth()
        gemv = gemv_bandwidth()
        weight_bytes = model.weights.nbytes()          # what one step reads; a tied W_vocab counted once
        cfg = model.config
    tps = {"qkv_cache": new_tokens / t["qkv_cache"], "qkv_no_cache": no_cache_tokens / t["qkv_no_cache"],
           "transformers": new_tokens / t["transformers"]}
    copy_bw = float(np.median([bandwidth, bandwidth_after]))
    machine = machine_facts()
    machine["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads()}
    machine["transformers"] = transformers.__version__
    return {
        "model": dict(GPT2_SMALL, parameters=weight_bytes // 4, dtype="float32", seed=seed),
        "machine": machine, "prompt": prompt, "new_tokens": new_tokens, "no_cache_tokens": no_cache_tokens,
        "repeats": repeats, "seconds": t, "tokens_per_s": tps, "speedup": tps["qkv_cache"] / tps["transformers"],
        "weight_bytes": weight_bytes, "copy_bytes_per_s": copy_bw,
        "copy_bytes_per_s_runs": [bandwidth, bandwidth_after], "gemv_bytes_per_s": gemv,
        "gemv_share": bandwidth_share(weight_bytes, tps["qkv_cache"], gemv),
        "bandwidth_limit_tokens_per_s": copy_bw / weight_bytes,
        "share": {k: bandwidth_share(weight_bytes, v, copy_bw) for k, v in tps.items()},
        "same_tokens": differ is None, "first_difference": differ, "same_without_cache": same_without_cache,
        "kv_cache": kv_cache_rows(cfg),
    }


def markdown(result: dict, command: str = COMMAND) -> str:
    """The "Generation" section of docs/benchmarks.md, from `measure`'s dict."""
    m, mach, tps, share = result["model"], result["machine"], result["tokens_per_s"], result["share"]
    names = {"qkv_cache": "qkv, KV cache", "qkv_no_cache": "qkv, no cache", "transformers": "transformers (cache)"}
    tokens = {"qkv_cache": result["new_tokens"], "qkv_no_cache": result["no_cache_tokens"],
              "transformers": result["new_tokens"]}
    lines = ["## Generation", "",
             f"A random GPT-2-small-sized model (L {m['n_layer']}, d_model {m['n_embd']}, H {m['n_head']}, "
             f"V {m['vocab_size']}, {m['parameters'] / 1e6:.0f}M parameters, {result['weight_bytes'] / 1e6:.0f} MB "
             f"float32), greedy, after a {result['prompt']}-token prompt, batch 1, CPU: qkv "
             "`model.generate(ids, N, temperature=0, stop_at_eos=False)` (and `use_cache=False`) against "
             "transformers `generate(do_sample=False, max_new_tokens=N, min_new_tokens=N)` under "
             f"`torch.no_grad()`, in one process, taking turns; median of {result['repeats']} rounds after a "
             "warm-up. tokens/s = new tokens ÷ the wall time of the whole call, prompt included.",
             "", "| generator | new tokens | tokens/s | × transformers | share of the bandwidth limit |",
             "|---|---:|---:|---:|---:|"]
    for k in ("qkv_cache", "qkv_no_cache", "transformers"):
        lines.append(f"| {names[k]} | {tokens[k]} | {tps[k]:.1f} | {tps[k] / tps['transformers']:.2f}× | "
                     f"{100 * share[k]:.0f} % |")
    same = ("qkv and transformers choose the same 128 greedy tokens" if result["same_tokens"] else
            f"qkv and transformers first choose a different token at new token {result['first_difference']} "
            "(a near-tie between two logits of this random model, within float32 rounding)")
    same = same.replace("128", str(result["new_tokens"]))
    met = {True: "met", False: "not met"}
    lines += ["", f"Targets: ≥ {TARGET_SPEEDUP:g}× transformers' tokens/s (here {result['speedup']:.2f}×: "
              f"{met[result['speedup'] >= TARGET_SPEEDUP]}) and ≥ {100 * TARGET_SHARE:.0f} % of the bandwidth "
              f"limit (here {100 * share['qkv_cache']:.0f} %: {met[share['qkv_cache'] >= TARGET_SHARE]}).",
              "", f"Bandwidth limit: a decoding step reads every weight once ({result['weight_bytes'] / 1e6:.0f} MB, "
              "a tied W_vocab counted once), so at most copy bandwidth ÷ weight bytes = "
              f"**{result['bandwidth_limit_tokens_per_s']:.1f} tokens/s**, where the copy bandwidth is what "
              f"`np.copyto` of a {COPY_BYTES / 2**30:g} GiB float32 array moves (read + write), measured before "
              f"and after the timing: {', '.join(f'{b / 1e9:.1f}' for b in result['copy_bytes_per_s_runs'])} "
              "GB/s (their mean is used).",
              "", f"One core reading a matrix (`W @ x`, one BLAS thread, the way qkv's one-token steps run) "
              f"streams {result['gemv_bytes_per_s'] / 1e9:.1f} GB/s: measured against that, qkv's steps reach "
              f"{100 * result['gemv_share']:.0f} % (the rest: 73 smaller matrices, some of them strided views, stream a "
              "little slower than one large one, and the Python and small ops between the products take "
              "~2.5 ms a step). "
              "qkv times its one-token steps with one and two BLAS threads while generating and keeps the "
              "faster: a second thread reads faster on an idle machine, and on a shared one waits for a busy "
              "core at every product (qkv/threads.py, `QKV_DECODE_THREADS` pins it).",
              "", f"Same tokens: {same}; without the cache qkv chooses "
              f"{'the same' if result['same_without_cache'] else 'different'} tokens as with it.",
              "", "KV cache: what each token adds to the cache (K and V, every layer, float32), "
              "and what grouping the K/V heads saves:", "",
              "| attention | query heads | K/V heads | bytes per token | saving |", "|---|---:|---:|---:|---:|"]
    for r in result["kv_cache"]:
        lines.append(f"| {r['attention']} | {r['n_heads']} | {r['n_kv_heads']} | {r['bytes_per_token']:,} "
                     f"({r['bytes_per_token'] / 1024:.0f} KiB) | {r['saving']:.0f}× |")
    blas, torch_ = mach["blas"], mach["torch"]
    env = ", ".join(f"{k}={mach['env'][k] if mach['env'][k] is not None else 'unset'}" for k in OPENBLAS_VARS)
    lines += ["", f"Machine: {mach['cpu']}, {mach['cores']} cores, shared with other work while this ran "
              "(figures are medians of runs taking turns; between runs of this benchmark here, tokens/s moved "
              "by up to 15 % for qkv and 20 % for transformers); "
              f"Python {mach['python']}; NumPy {mach['numpy']} with {blas.get('internal_api')} "
              f"{blas.get('version') or ''} (kernel {blas.get('architecture')}, {blas.get('num_threads')} threads; "
              f"qkv's one-token steps on 1 or 2, chosen by timing them, see qkv/threads.py); torch {torch_['version']} "
              f"({torch_['threads']} threads), transformers {mach['transformers']}; {env}.",
              "", "Reproduce (rewrites only this section):", "", "```sh", command, "```"]
    return "\n".join(lines)


def generate_command_line(new_tokens: int, no_cache_tokens: int, repeats: int, out: str | None) -> str:
    """The command line that reproduces a run with these options (written into the docs)."""
    parts = ["qkv bench generate"]
    for flag, value, default in (("--new-tokens", new_tokens, NEW_TOKENS),
                                 ("--no-cache-tokens", no_cache_tokens, NO_CACHE_TOKENS),
                                 ("--repeats", repeats, REPEATS)):
        if value != default:
            parts.append(f"{flag} {value}")
    if out:
        parts.append(f"--out {out}")
    return " ".join(parts)


def llm_command_line(model: str, new_tokens: int, repeats: int, llama: bool, out: str | None) -> str:
    """The command line that reproduces a run on a real model (written into the docs)."""
    from . import llm

    parts = [f"qkv bench generate --model {model}"]
    if new_tokens != llm.NEW_TOKENS:
        parts.append(f"--new-tokens {new_tokens}")
    if repeats != llm.REPEATS:
        parts.append(f"--repeats {repeats}")
    if llama:
        parts.append("--llama-python PATH/TO/python")
    if out:
        parts.append(f"--out {out}")
    return " ".join(parts)


@click.command("generate")
@click.option("--model", "model_source", default=None,
              help="A real decoder instead of the random GPT-2-small: smollm2, a .gguf or a checkpoint directory "
                   "(compared with transformers on the same float32 weights).")
@click.option("--new-tokens", type=click.IntRange(min=1), default=None,
              help=f"Tokens to generate with a cache [default: {NEW_TOKENS}; 64 with --model].")
@click.option("--no-cache-tokens", type=click.IntRange(min=1), default=NO_CACHE_TOKENS, show_default=True,
              help="Tokens to generate without qkv's cache (each step recomputes the sequence; random model only).")
@click.option("--repeats", type=click.IntRange(min=1), default=REPEATS, show_default=True,
              help="Timed rounds (the median is reported), after one warm-up.")
@click.option("--llama-python", type=click.Path(dir_okay=False), default=None,
              help="With --model: the python of an environment with llama-cpp-python, to time llama.cpp beside.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Markdown file whose 'bench:generate' section (or 'bench:generate-MODEL') to (re)write.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of markdown.")
def generate_command(model_source: str | None, new_tokens: int | None, no_cache_tokens: int, repeats: int,
                     llama_python: str | None, out: str | None, as_json: bool) -> None:
    """Greedy generation: tokens/s of qkv and transformers (random GPT-2-small, or --model smollm2)."""
    import json

    start = time.perf_counter()
    log = lambda msg: click.echo(msg, err=True)   # noqa: E731
    if model_source is not None:
        from . import llm

        n = new_tokens or llm.NEW_TOKENS
        result = llm.measure(model_source, n, repeats=repeats, llama_python=llama_python, log=log)
        text = llm.markdown(result, llm_command_line(model_source, n, repeats, bool(llama_python), out))
        section = "generate-" + "".join(c if c.isalnum() else "-" for c in model_source.lower())
    else:
        if llama_python:
            raise QkvError("--llama-python needs --model (llama.cpp runs the GGUF file itself)")
        n = new_tokens or NEW_TOKENS
        result = measure(n, no_cache_tokens, repeats, log=log)
        text = markdown(result, generate_command_line(n, no_cache_tokens, repeats, out))
        section = "generate"
    click.echo(json.dumps(result, indent=2, default=str) if as_json else text)
    if out:
        write_section(out, section, text)
        click.echo(f"wrote the {section} section of {out} ({time.perf_counter() - start:.0f} s)", err=True)
