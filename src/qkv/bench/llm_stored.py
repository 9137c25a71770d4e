"""`qkv bench generate --stored --model A.gguf [--model B.gguf …]`: GGUF files decoded with their stored
weights by qkv in both arithmetics, beside llama.cpp on the same files (issue 49: a model big enough that a
step's bytes show).

    each file ─qkv.load(dtype="stored")────────────────────▶ qkv, exact arithmetic (float32 activations)
              ─qkv.load(dtype="stored", arith="llama.cpp")─▶ qkv, llama.cpp's arithmetic (int8 activations)
              ─llama-cpp-python (--llama-python, a child)──▶ llama.cpp (its threads: every core)
    a prompt: the file's chat template around QUESTION (random ids without a tokenizer); then
      decode:   N new tokens, greedy, end-of-turn ignored, each token's time taken (qkv: model.stream,
                llama.cpp: its generate loop), qkv's two taking turns, median of `repeats` rounds after a
                warm-up; llama.cpp's prompt cache reset before every call (bench/llama_cpp.py)
      prefill:  time to the first token of a prompt of 128 / 512 random ids, 0.3 s of sleep before each run
    bandwidth limit of a storage = copy bandwidth ÷ the bytes a step reads (every matrix once, a tied table once)

No float32 copy and no transformers (bench/llm.py times those): a 1B model in float32 is 5 GB a step.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from . import markdown as md
from .common import cpu_snapshot, machine_facts, others_cores, time_interleaved, time_rounds
from .decoding import COPY_BYTES, bandwidth_share, copy_bandwidth, first_difference
from .llm import QUESTION, SETTLE, chat_ids

NEW_TOKENS = 64
PREFILL = (128, 512)
REPEATS = 3
RANDOM_PROMPT = 32            # prompt ids of a file without a tokenizer
TARGET_SPEED = 1.0            # issue 49: llama.cpp's arithmetic ≥ 1.0× llama.cpp's tokens/s
TARGET_SHARE = 0.80           # … and ≥ 80 % of the bandwidth limit (4-bit files)
TARGET_SPREAD = 3.0           # no decode step slower than 3× the median
GENERATORS = {"exact": "qkv stored, exact arithmetic", "llama_arith": "qkv stored, llama.cpp's arithmetic",
              "llama.cpp": "llama.cpp"}
# files made by a script of this repository (their general.name): what they are, the command that remakes them
ABOUT = {"Llama-3.2-1B-shaped": "random weights (normal, σ 0.02, norms 1) written as float16 by "
                                "benchmarks/make_llama_1b_gguf.py and quantised by llama.cpp itself "
                                "(`llama_model_quantize`); SmolLM2's byte-level BPE vocabulary and chat template, "
                                "padded to 128256 with unused tokens; Llama 3's RoPE scaling left out (it changes "
                                "the lowest frequencies' angles, not the work or the bytes a step reads)"}
MADE_BY = {"Llama-3.2-1B-shaped": "python benchmarks/make_llama_1b_gguf.py "
                                  "--vocab-from PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf --out PATH/TO"}


def gguf_name(path: Path) -> str:
    """What the file is called: its general.name when a script here made it (ABOUT), else its file name up to the
    first dot ("SmolLM2-135M-Instruct"; a converter's general.name can be a training run's, "Smollm2 135M 8k Lc100K
    Mix1 Ep2")."""
    from ..checkpoints.gguf_reader import open_reader

    field = open_reader(path).fields.get("general.name")
    name = str(field.contents()) if field is not None else None
    return name if name in ABOUT else path.name.split(".")[0]


def prompt_ids(model, seed: int = 0) -> np.ndarray:
    """(n,) ids: a chat prompt when the file has a tokenizer, else RANDOM_PROMPT random ids."""
    if model.tokenizer is not None:
        return chat_ids(model)
    return np.random.default_rng(seed).integers(0, model.config.vocab_size, size=RANDOM_PROMPT)


def timed_stream(model, prompt: np.ndarray, n: int) -> tuple[np.ndarray, list[float]]:
    """N greedy ids after PROMPT (1, n_prompt) and the seconds to each: [prompt + first token, step, step, …]."""
    ids, stamps = [], [time.perf_counter()]
    for tok in model.stream(prompt, n, temperature=0, stop_at_eos=False):       # (1,) ids each
        stamps.append(time.perf_counter())
        ids.append(int(tok[0]))
    return np.asarray(ids), np.diff(stamps).tolist()


def step_spread(steps: list[float]) -> dict:
    """Median, 90th percentile and slowest of the steps after the first token (seconds), and slowest ÷ median."""
    s = np.asarray(steps)
    if not len(s):
        return {}
    med = float(np.median(s))
    return {"median": med, "p90": float(np.percentile(s, 90)), "max": float(s.max()),
            "max_over_median": float(s.max()) / med}


def measure_file(path: Path, new_tokens: int, prefill: tuple[int, ...], repeats: int, llama_python: str | None,
                 seed: int, log) -> dict:
    """One GGUF file: qkv's two arithmetics and llama.cpp (when asked) on it; a plain dict."""
    from .. import load
    from .llama_cpp import gguf_weights, run_llama_cpp

    models = {"exact": load(path, dtype="stored"), "llama_arith": load(path, dtype="stored", arith="llama.cpp")}
    cfg = models["exact"].config
    if not cfg.causal or models["exact"].weights.W_vocab is None:
        raise QkvError(f"{path.name} is not a decoder; --stored times generation of a decoder's GGUF file")
    ids = prompt_ids(models["exact"], seed)
    if len(ids) + new_tokens > cfg.max_positions or max(prefill, default=1) + 1 > cfg.max_positions:
        raise QkvError(f"the prompts do not fit {path.name}'s {cfg.max_positions} positions; choose fewer tokens")
    calls: dict[str, list] = {name: [] for name in models}          # every call: (ids, [first, step, …])

    def decode(name: str):
        return lambda: calls[name].append(timed_stream(models[name], ids[None], new_tokens))
    log(f"{path.name}: decode, {repeats} rounds after a warm-up, taking turns")
    snap = cpu_snapshot()
    whole = time_rounds({name: decode(name) for name in models}, repeats=repeats)
    busy_decode = others_cores(snap, cpu_snapshot())
    tokens = {name: c[0][0] for name, c in calls.items()}             # the warm-up's ids
    steady = {name: all(np.array_equal(c[0][0], t) for t, _ in c) for name, c in calls.items()}
    timed = {name: c[1:] for name, c in calls.items()}                # the warm-up left out
    steps = {name: [s for _, gaps in c for s in gaps[1:]] for name, c in timed.items()}
    step_totals = {name: [sum(gaps[1:]) for _, gaps in c] for name, c in timed.items()}

    rng = np.random.default_rng(seed)
    prompts = {n: rng.integers(0, cfg.vocab_size, size=(1, n)) for n in prefill}       # (1, n) each
    prefill_s: dict[str, dict[str, float]] = {}
    snap = cpu_snapshot()
    for n, p in prompts.items():
        log(f"{path.name}: prefill of {n} tokens")
        prefill_s[str(n)] = time_interleaved(
            {name: (lambda m=m, p=p: m.generate(p, 1, temperature=0, stop_at_eos=False)) for name, m in models.items()},
            repeats=repeats, settle=SETTLE)
    busy_prefill = others_cores(snap, cpu_snapshot())

    kinds, file_bytes = gguf_weights(path)
    unjoined = sum(b.attn is not None and b.attn.W_QKV is None for b in models["exact"].weights.blocks)
    out = {"file": path.name, "name": gguf_name(path), "weights": kinds, "prompt": len(ids),
           "bytes": {"exact": models["exact"].weights.nbytes(), "llama_arith": models["llama_arith"].weights.nbytes(),
                     "llama.cpp": file_bytes},
           "decode_s": {name: float(np.median(ts)) for name, ts in whole.items()},
           "steps_total_s": step_totals, "spread": {name: step_spread(s) for name, s in steps.items()},
           "steady": steady, "prefill_s": prefill_s, "unjoined_layers": unjoined,
           "others_cores": {"decode": busy_decode, "prefill": busy_prefill},
           "model": {"n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_heads": cfg.n_heads,
                     "n_kv_heads": cfg.n_kv_heads, "d_ff": cfg.d_ff, "vocab_size": cfg.vocab_size}}
    del models, calls
    if llama_python:
        log(f"{path.name}: llama.cpp (child process)")
        llama = run_llama_cpp(llama_python, path, ids, new_tokens, {n: p[0] for n, p in prompts.items()}, repeats)
        out["llama_cpp"] = llama
        if "error" not in llama:
            tokens["llama.cpp"] = np.asarray(llama["tokens"])
            out["decode_s"]["llama.cpp"] = llama["decode_s"]
            out["steps_total_s"]["llama.cpp"] = llama["steps_total_s"]
            out["spread"]["llama.cpp"] = step_spread(llama["step_s"])
            for n, s in llama["prefill_s"].items():
                out["prefill_s"][n]["llama.cpp"] = s
    out["tokens_per_s"] = {name: new_tokens / s for name, s in out["decode_s"].items()}
    out["step_tokens_per_s"] = {name: (new_tokens - 1) / float(np.median(t))
                                for name, t in out["steps_total_s"].items() if new_tokens > 1 and np.median(t) > 0}
    names = list(tokens)
    out["first_difference"] = {f"{a}|{b}": first_difference(tokens[a], tokens[b])
                               for i, a in enumerate(names) for b in names[i + 1:]}
    return out


def measure(sources: list[str], new_tokens: int = NEW_TOKENS, prefill: tuple[int, ...] = PREFILL,
            repeats: int = REPEATS, llama_python: str | None = None, seed: int = 0, log=None,
            copy_bytes: int = COPY_BYTES) -> dict:
    """Time qkv (both arithmetics, stored weights) and llama.cpp (if asked) on each GGUF file; a plain dict.
    copy_bytes: the array copied to measure the bandwidth (smaller in tests)."""
    import numba

    log = log or (lambda msg: None)
    paths = [Path(s) for s in sources]
    for p in paths:
        if p.suffix.lower() != ".gguf" or not p.is_file():
            raise QkvError(f"--stored times GGUF files, and {p.name!r} is not one; give --model FILE.gguf")
    log("copy bandwidth")
    bandwidth = copy_bandwidth(copy_bytes)
    files = [measure_file(p, new_tokens, prefill, repeats, llama_python, seed, log) for p in paths]
    bandwidth_after = copy_bandwidth(copy_bytes)
    copy_bw = float(np.mean([bandwidth, bandwidth_after]))
    for f in files:
        f["limit_tokens_per_s"] = {name: copy_bw / b for name, b in f["bytes"].items()}
        f["share"] = {name: bandwidth_share(f["bytes"][name], v, copy_bw) for name, v in f["tokens_per_s"].items()}
        f["step_share"] = {name: bandwidth_share(f["bytes"][name], v, copy_bw)
                           for name, v in f["step_tokens_per_s"].items()}
    machine = machine_facts()
    machine["numba_threads"] = numba.get_num_threads()
    return {"files": files, "new_tokens": new_tokens, "repeats": repeats, "question": QUESTION, "settle_s": SETTLE,
            "copy_bytes_per_s": copy_bw, "copy_bytes_per_s_runs": [bandwidth, bandwidth_after], "machine": machine}


def section_name(result: dict) -> str:
    """'generate-llama-3-2-1b-shaped': the docs section of the first file's general.name."""
    name = result["files"][0]["name"].lower()
    return "generate-" + "-".join("".join(c if c.isalnum() else " " for c in name).split())


def markdown(result: dict, command: str) -> str:
    """The "Generation: <name>, stored weights" section of docs/benchmarks.md, from `measure`'s dict."""
    f0, n = result["files"][0], result["new_tokens"]
    made = MADE_BY.get(f0["name"])
    return md.join(f"## Generation: {f0['name']}, stored weights, beside llama.cpp", _setup(result),
                   f"**Decode**: {n} new tokens, greedy, after a {f0['prompt']}-token prompt"
                   + (f" (the file's chat template around \"{result['question']}\")" if f0["prompt"] != RANDOM_PROMPT
                      else " of random ids") + ", end-of-turn ignored; tokens/s = "
                   f"{n} ÷ the wall time of the whole call (prompt included); after the prompt: the {n - 1} steps "
                   "alone, timed token by token (qkv `model.stream`, llama.cpp its `generate` loop), median of the "
                   "rounds; share = bytes a step reads × tokens/s ÷ copy bandwidth; steps: median / 90th percentile "
                   "/ slowest of every timed step after the first token, pooled over the rounds.",
                   _decode_table(result), _same_tokens(result), _targets(result), _unjoined(result),
                   _bandwidth(result),
                   "**Prefill**: time to the first token of a prompt of random ids (qkv `generate` of 1 token, "
                   f"llama.cpp `eval` after `reset`), {result['settle_s']:g} s of sleep before each run, median of "
                   f"{result['repeats']}.",
                   _prefill_table(result), _machine(result),
                   md.reproduce(f"{made}\n{command}" if made else command,
                                "this section; the first line remakes the files" if made else "this section"))


def _setup(result: dict) -> str:
    f0 = result["files"][0]
    m = f0["model"]
    files = ", ".join(f"`{f['file']}` ({f['weights']})" for f in result["files"])
    about = f": {ABOUT[f0['name']]}" if f0["name"] in ABOUT else ""
    return (f"{f0['name']} (L {m['n_layers']}, d_model {m['d_model']}, {m['n_heads']} query heads / "
            f"{m['n_kv_heads']} K/V heads, d_ff {m['d_ff']}, V {m['vocab_size']}{about}), from {files}. "
            "Three generators "
            "on each file's quantised blocks: qkv `load(path, dtype=\"stored\")` (exact: float32 activations, each "
            "product equal to the dequantised one), qkv `load(path, dtype=\"stored\", arith=\"llama.cpp\")` "
            "(activations quantised to 8 bits a block, integer dot products, as ggml), and llama.cpp through "
            "llama-cpp-python in a child process; batch 1, CPU; qkv's two taking turns in one process, llama.cpp "
            f"after them; median of {result['repeats']} rounds after a warm-up.")


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{1e3 * x:.1f}"


def _decode_table(result: dict) -> list[str]:
    rows = []
    for f in result["files"]:
        ref = f["tokens_per_s"].get("llama.cpp")
        ref_step = f["step_tokens_per_s"].get("llama.cpp")
        for k, label in GENERATORS.items():
            if k not in f["tokens_per_s"]:
                continue
            tps, step, sp = f["tokens_per_s"][k], f["step_tokens_per_s"].get(k), f["spread"].get(k) or {}
            rows.append([f["file"], label, f"{f['bytes'][k] / 1e6:.0f}", f"{f['limit_tokens_per_s'][k]:.1f}",
                         f"{tps:.1f}", f"{tps / ref:.2f}×" if ref else "—",
                         f"{step:.1f}" if step else "—", f"{step / ref_step:.2f}×" if step and ref_step else "—",
                         f"{100 * f['step_share'][k]:.0f} %" if k in f["step_share"] else "—",
                         " / ".join(_ms(sp.get(q)) for q in ("median", "p90", "max"))
                         + (f" ({sp['max_over_median']:.1f}×)" if sp else "")])
    return md.table(["file", "generator", "MB read a step", "bandwidth limit tok/s", "tokens/s",
                     "× llama.cpp", "after the prompt: tok/s", "× llama.cpp", "share of the limit",
                     "steps ms: median / p90 / max (max ÷ median)"], rows, "llrrrrrrrl")


def _same_tokens(result: dict) -> str:
    """Per file: which generators wrote the same greedy ids, and where the others leave them."""
    parts = []
    for f in result["files"]:
        d, n = f["first_difference"], result["new_tokens"]
        if all(v is None for v in d.values()):
            said = f"all {len(f['tokens_per_s'])} generators write the same {n} tokens"
        else:
            said = "; ".join(f"{GENERATORS[a]} and {GENERATORS[b]}: "
                             + (f"the same {n} tokens" if v is None else f"different from new token {v}")
                             for a, b, v in (pair.split("|") + [v] for pair, v in d.items()))
        unsteady = [GENERATORS[k] for k, ok in f["steady"].items() if not ok]
        parts.append(f"`{f['file']}`: {said}" + (f"; calls of {', '.join(unsteady)} did not all write the same ids"
                                                 if unsteady else "")
                     + (f"; {f['llama_cpp']['error']}" if "error" in f.get("llama_cpp", {}) else ""))
    return "Same tokens: " + ". ".join(parts) + "."


def _targets(result: dict) -> str:
    lines = []
    for f in result["files"]:
        ref, rate, share, sp = (f["step_tokens_per_s"].get("llama.cpp"), f["step_tokens_per_s"].get("llama_arith"),
                                f["step_share"].get("llama_arith"), f["spread"].get("llama_arith") or {})
        said = []
        four_bit = f["weights"].startswith("Q4")                 # the issue's speed targets: Q4_0 and Q4_K_M
        if ref and rate and four_bit:
            said.append(md.target(f"≥ {TARGET_SPEED:g}× llama.cpp", rate / ref, TARGET_SPEED, f"{rate / ref:.2f}×"))
        if share is not None and four_bit:
            said.append(md.target(f"≥ {100 * TARGET_SHARE:.0f} % of the bandwidth limit", share, TARGET_SHARE,
                                  f"{100 * share:.0f} %"))
        worst = max((s["max_over_median"] for k, s in f["spread"].items() if s and k != "llama.cpp"), default=None)
        if worst is not None:
            said.append(md.target(f"no qkv step slower than {TARGET_SPREAD:g}× its median", TARGET_SPREAD / worst, 1.0,
                                  f"at worst {worst:.1f}×"))
        if said:
            lines.append(f"`{f['file']}`: " + ", ".join(said))
    return ("Targets (issue 49; speed and share: qkv with llama.cpp's arithmetic after the prompt, on the 4-bit "
            "files): " + "; ".join(lines) + ".") if lines else ""


def _unjoined(result: dict) -> str | None:
    """The files whose layers mix quantised kinds in Q, K, V (core/layout.py cannot join them)."""
    mixed = [f for f in result["files"] if f.get("unjoined_layers")]
    if not mixed:
        return None
    return (" ".join(f"`{f['file']}`: in {f['unjoined_layers']} of its {f['model']['n_layers']} layers W_V is of "
                     "another kind than W_Q and W_K." for f in mixed)
            + " qkv multiplies those three apart; the compiled step (core/step_compiled.py) runs their three "
              "products side by side in the same call a layer.")


def _bandwidth(result: dict) -> str:
    runs = ", ".join(f"{b / 1e9:.1f}" for b in result["copy_bytes_per_s_runs"])
    return (f"Bandwidth limit: copy bandwidth ÷ the bytes a step reads (qkv: its stored matrices, the tied "
            "embedding table once, as `weights.nbytes()` counts them; llama.cpp: the file's tensors). The copy "
            f"bandwidth is what `np.copyto` of a {COPY_BYTES / 2**30:g} GiB float32 array moves (read + write), "
            f"measured before and after all the timing: {runs} GB/s, their mean used.")


def _prefill_table(result: dict) -> list[str]:
    rows = []
    for f in result["files"]:
        for n, s in f["prefill_s"].items():
            rows.append([f["file"], n] + [_ms(s.get(k)) if k in s else "—" for k in GENERATORS]
                        + ([f"{s['llama_arith'] / s['llama.cpp']:.2f}×"] if "llama.cpp" in s else ["—"]))
    return md.table(["file", "prompt tokens", "qkv exact ms", "qkv llama.cpp arithmetic ms", "llama.cpp ms",
                     "llama.cpp arithmetic ÷ llama.cpp"], rows, "lrrrrr")


def _machine(result: dict) -> str:
    mach = result["machine"]
    threads = sorted({f["llama_cpp"].get("threads") for f in result["files"] if f.get("llama_cpp", {}).get("threads")})
    version = next((f["llama_cpp"].get("version") for f in result["files"] if f.get("llama_cpp", {}).get("version")),
                   None)
    busy = [v for f in result["files"] for v in f["others_cores"].values() if v is not None]
    return (f"Machine: {md.cpu(mach)}; {md.numpy_blas(mach)}; qkv's compiled kernels on {mach['numba_threads']} "
            "numba threads" + (f"; llama-cpp-python {version} on {', '.join(map(str, threads))} threads"
                               if version else "")
            + f"; {md.openblas_env(mach)}. Other processes kept "
            + (f"{min(busy):.2f}–{max(busy):.2f} cores" if busy else "an unknown number of cores")
            + " busy on average during qkv's timing.")
