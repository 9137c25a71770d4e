"""The generation benchmark: tokens per second of qkv (with and without its KV cache) and transformers.

    random GPT-2-small (as `qkv bench forward`), float32, CPU, greedy, a 16-token prompt:
      qkv, cache:     model.generate(ids, 128, temperature=0, stop_at_eos=False)
      qkv, no cache:  the same with use_cache=False (fewer tokens: it recomputes everything)
      transformers:   hf.generate(ids, do_sample=False, max_new_tokens=128, min_new_tokens=128)
    taking turns, median of `repeats` rounds after a warm-up; tokens/s = new tokens / wall time
    of the whole call (prefill included).

The bandwidth limit and share (bench/decoding.py) are measured in the same run.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..core.cache import KVCache
from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from . import common
from . import markdown as md
from .common import cpu_snapshot, machine_facts, others_cores, time_rounds
from .decoding import (COPY_BYTES, TARGET_SHARE, bandwidth_share, copy_bandwidth, first_difference, gemv_bandwidth,
                       spread)
from .forward import GPT2_SMALL

PROMPT = 16
NEW_TOKENS = 128
NO_CACHE_TOKENS = 32         # without a cache each step recomputes the whole sequence: fewer steps suffice
REPEATS = 3
TARGET_SPEEDUP = 2.0         # qkv ≥ 2× transformers' tokens/s
GQA = {"n_heads": 12, "n_kv_heads": 4}     # a Llama-style grouping of GPT-2-small's 12 heads
COMMAND = "qkv bench generate --out docs/benchmarks.md"


def reference_stack():
    """(torch, transformers): the baseline, or a QkvError that says how to install them."""
    return common.reference_stack("generation")


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
        snap = cpu_snapshot()
        rounds = time_rounds({"qkv_cache": qkv_cached, "qkv_no_cache": qkv_uncached, "transformers": reference},
                             repeats=repeats)
        others = others_cores(snap, cpu_snapshot())
        t = {name: float(np.median(ts)) for name, ts in rounds.items()}
        bandwidth_after = copy_bandwidth()
        gemv = gemv_bandwidth()
        weight_bytes = model.weights.nbytes()          # what one step reads; a tied W_vocab counted once
        cfg = model.config
    tps = {"qkv_cache": new_tokens / t["qkv_cache"], "qkv_no_cache": no_cache_tokens / t["qkv_no_cache"],
           "transformers": new_tokens / t["transformers"]}
    copy_bw = float(np.mean([bandwidth, bandwidth_after]))
    machine = machine_facts()
    machine["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads()}
    machine["transformers"] = transformers.__version__
    return {
        "model": dict(GPT2_SMALL, parameters=weight_bytes // 4, dtype="float32", seed=seed),
        "machine": machine, "prompt": prompt, "new_tokens": new_tokens, "no_cache_tokens": no_cache_tokens,
        "repeats": repeats, "seconds": t, "rounds_seconds": rounds, "others_cores": others, "tokens_per_s": tps,
        "speedup": tps["qkv_cache"] / tps["transformers"],
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
    return md.join("## Generation", _method(result), _table(result), _targets(result), _bandwidth(result),
                   _one_core(result), _same_tokens(result),
                   "KV cache: what each token adds to the cache (K and V, every layer, float32), "
                   "and what grouping the K/V heads saves:",
                   _kv_table(result["kv_cache"]),
                   _machine(result), md.reproduce(command))


_NAMES = {"qkv_cache": "qkv, KV cache", "qkv_no_cache": "qkv, no cache", "transformers": "transformers (cache)"}


def _method(result: dict) -> str:
    m = result["model"]
    return (f"A random GPT-2-small-sized model (L {m['n_layer']}, d_model {m['n_embd']}, H {m['n_head']}, "
            f"V {m['vocab_size']}, {m['parameters'] / 1e6:.0f}M parameters, {result['weight_bytes'] / 1e6:.0f} MB "
            f"float32), greedy, after a {result['prompt']}-token prompt, batch 1, CPU: qkv "
            "`model.generate(ids, N, temperature=0, stop_at_eos=False)` (and `use_cache=False`) against "
            "transformers `generate(do_sample=False, max_new_tokens=N, min_new_tokens=N)` under "
            f"`torch.no_grad()`, in one process, taking turns; median of {result['repeats']} rounds after a "
            "warm-up. tokens/s = new tokens ÷ the wall time of the whole call, prompt included.")


def _table(result: dict) -> list[str]:
    tps, share = result["tokens_per_s"], result["share"]
    tokens = {"qkv_cache": result["new_tokens"], "qkv_no_cache": result["no_cache_tokens"],
              "transformers": result["new_tokens"]}
    rows = [[_NAMES[k], str(tokens[k]), f"{tps[k]:.1f}", f"{tps[k] / tps['transformers']:.2f}×",
             f"{100 * share[k]:.0f} %"] for k in _NAMES]
    return md.table(["generator", "new tokens", "tokens/s", "× transformers", "share of the bandwidth limit"],
                    rows, "lrrrr")


def _kv_table(rows: list[dict]) -> list[str]:
    cells = [[r["attention"], str(r["n_heads"]), str(r["n_kv_heads"]),
              f"{r['bytes_per_token']:,} ({r['bytes_per_token'] / 1024:.0f} KiB)", f"{r['saving']:.0f}×"] for r in rows]
    return md.table(["attention", "query heads", "K/V heads", "bytes per token", "saving"], cells, "lrrrr")


def _targets(result: dict) -> str:
    speed, share = result["speedup"], result["share"]["qkv_cache"]
    return ("Targets: " + md.target(f"≥ {TARGET_SPEEDUP:g}× transformers' tokens/s", speed, TARGET_SPEEDUP,
                                    f"{speed:.2f}×")
            + " and " + md.target(f"≥ {100 * TARGET_SHARE:.0f} % of the bandwidth limit", share, TARGET_SHARE,
                                  f"{100 * share:.0f} %") + ".")


def _bandwidth(result: dict) -> str:
    runs = ", ".join(f"{b / 1e9:.1f}" for b in result["copy_bytes_per_s_runs"])
    return (f"Bandwidth limit: a decoding step reads every weight once ({result['weight_bytes'] / 1e6:.0f} MB, "
            "a tied W_vocab counted once), so at most copy bandwidth ÷ weight bytes = "
            f"**{result['bandwidth_limit_tokens_per_s']:.1f} tokens/s**, where the copy bandwidth is what "
            f"`np.copyto` of a {COPY_BYTES / 2**30:g} GiB float32 array moves (read + write), measured before "
            f"and after the timing: {runs} GB/s (their mean is used).")


def _one_core(result: dict) -> str:
    """qkv's steps against one core's reading rate, and the time a step spends on anything else."""
    gemv = result["gemv_bytes_per_s"]
    step_ms = 1e3 / result["tokens_per_s"]["qkv_cache"]             # the whole call ÷ new tokens
    stream_ms = 1e3 * result["weight_bytes"] / gemv                 # reading every weight at that rate
    return (f"One core reading a matrix (`W @ x`, one BLAS thread, the way qkv's one-token steps run) "
            f"streams {gemv / 1e9:.1f} GB/s: measured against that, qkv's steps reach "
            f"{100 * result['gemv_share']:.0f} % (a step took {step_ms:.1f} ms, the whole call ÷ "
            f"{result['new_tokens']} tokens; reading the weights at that rate takes {stream_ms:.1f} ms). "
            "qkv times its one-token steps with one and two BLAS threads while generating and keeps the "
            "faster (qkv/threads.py; `QKV_THREADS=decode:N` or `QKV_DECODE_THREADS=N` pins it). " + md.background(
                "the rest of a step is the many smaller matrices, which stream a little slower than one large "
                "one, and the Python and small ops between the products; a second BLAS thread reads faster on "
                "an idle machine, and on a shared one waits for a busy core at every product."))


def _same_tokens(result: dict) -> str:
    n = result["new_tokens"]
    same = (f"qkv and transformers choose the same {n} greedy tokens" if result["same_tokens"] else
            f"qkv and transformers first choose a different token at new token {result['first_difference']} "
            "(a near-tie between two logits of this random model, within float32 rounding)")
    return (f"Same tokens: {same}; without the cache qkv chooses "
            f"{'the same' if result['same_without_cache'] else 'different'} tokens as with it.")


def _machine(result: dict) -> str:
    mach, torch_ = result["machine"], result["machine"]["torch"]
    return (f"Machine: {md.cpu(mach)}; "
            + md.numpy_blas(mach, "; qkv's one-token steps on 1 or more, chosen by timing them, see qkv/threads.py")
            + f"; torch {torch_['version']} ({torch_['threads']} threads), transformers {mach['transformers']}; "
            f"{md.openblas_env(mach)}. " + _noise(result))


def _noise(result: dict) -> str:
    """What the run saw of other work: the cores others kept busy, and how far the rounds moved."""
    said = []
    if "others_cores" in result:
        said.append(md.busy(result["others_cores"]))
    rounds = result.get("rounds_seconds")
    if rounds and min(len(ts) for ts in rounds.values()) > 1:
        said.append("From the fastest to the slowest round, the time of a call moved by "
                    + ", ".join(f"{100 * spread(rounds[k]):.0f} % ({_NAMES[k]})" for k in _NAMES if k in rounds)
                    + "; the table gives medians.")
    return " ".join(said)
