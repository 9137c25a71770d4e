"""`qkv bench generate --model smollm2`: a real LLM, qkv beside transformers on the same float32 weights.

    the model ─qkv.load─▶ qkv (float32)            same file ─from_pretrained(gguf_file=…)─▶ transformers
    a GGUF file also ─qkv.load(dtype="stored")─▶ qkv with the file's quantised blocks (runtime.stored)
    a chat prompt (the model's template) → ids; then, taking turns, median of `repeats` rounds:
      decode:   64 new tokens, greedy, end-of-turn ignored (both write the same 64 tokens; checked)
                qkv model.generate(ids, 64, temperature=0, stop_at_eos=False), with its BLAS-thread
                choice for one-token steps and with the other count (1 ↔ 2)
                transformers hf.generate(ids, do_sample=False, max_new_tokens=64, eos_token_id=None)
      prefill:  time to the first token of a 128- and a 512-token prompt (generate 1 token),
                0.3 s of sleep before each run (idle BLAS / torch threads)
    share of the bandwidth limit = weight bytes × tokens/s ÷ copy bandwidth (decoding.copy_bandwidth).
    llama.cpp (the file's quantised weights, its own threads) beside them when `--llama-python` names a Python
    with llama-cpp-python (bench/llama_cpp.py runs it there, in a child process).

Without torch/transformers the qkv figures are still measured and the report says what it
could not compare.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.threads import DECODE_THREADS_VAR, decode_threads
from ..runtime.tuning import pinned as tuning_pins
from . import markdown as md
from .common import VECTOR_FLAGS, cpu_snapshot, machine_facts, others_cores, time_interleaved, vector_extensions
from .decoding import COPY_BYTES, TARGET_SHARE, bandwidth_share, copy_bandwidth, first_difference

MODEL = "smollm2"
QUESTION = "Explain how a language model predicts the next word."
NEW_TOKENS = 64
PREFILL = (128, 512)
REPEATS = 3
SETTLE = 0.3                 # seconds of sleep before each prefill run
TARGET_SPEEDUP = 1.5         # decode ≥ 1.5× transformers' tokens/s (issue 9)
THREADS = (1, 2)             # qkv is also timed with its one-token steps pinned to these BLAS thread counts
def chat_ids(model, question: str = QUESTION) -> np.ndarray:
    """The ids of a one-turn chat prompt, rendered by the model's own template when it has one."""
    tok = model.tokenizer
    messages = [{"role": "user", "content": question}]
    if getattr(tok, "chat_template", None) and hasattr(tok, "apply_chat_template"):
        return np.asarray(tok.apply_chat_template(messages, add_generation_prompt=True), dtype=np.int64)
    ids, _ = model.encode(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")   # ChatML
    return ids


def gguf_of(source: str) -> Path | None:
    """The .gguf file behind a model source ("smollm2" or a path ending in .gguf), else None."""
    from ..checkpoints import LLM, smollm2_file

    if source.lower() == LLM:
        return smollm2_file()
    return Path(source) if source.lower().endswith(".gguf") else None


def load_reference(source: str, torch, transformers):
    """transformers' model of the same checkpoint, float32 (a GGUF dequantised as qkv does)."""
    gguf = gguf_of(source)
    kwargs = {"dtype": torch.float32}
    transformers.utils.logging.disable_progress_bar()
    if gguf is not None:
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, **kwargs)
    else:
        hf = transformers.AutoModelForCausalLM.from_pretrained(source, **kwargs)
    return hf.eval()


def sixteen_bit(source: str) -> str | None:
    """"bfloat16" or "float16" when SOURCE is a checkpoint directory whose matrices are stored in 16 bits, else None."""
    from ..checkpoints import resolve
    from ..checkpoints.tensors import TensorStore

    if gguf_of(source) is not None:
        return None
    store = TensorStore(resolve(source))
    kinds = {store._where[n][1]["dtype"] for n in store.names() if len(store._where[n][1]["shape"]) == 2}
    return {"BF16": "bfloat16", "F16": "float16"}.get(kinds.pop()) if len(kinds) == 1 else None


def _with_threads(n: int, fn):
    """fn run with QKV_DECODE_THREADS=n (the variable restored after)."""
    def run():
        old = os.environ.get(DECODE_THREADS_VAR)
        os.environ[DECODE_THREADS_VAR] = str(n)
        try:
            return fn()
        finally:
            if old is None:
                del os.environ[DECODE_THREADS_VAR]
            else:
                os.environ[DECODE_THREADS_VAR] = old
    return run


def measure(source: str = MODEL, new_tokens: int = NEW_TOKENS, prefill: tuple[int, ...] = PREFILL,
            repeats: int = REPEATS, llama_python: str | None = None, seed: int = 0, log=None) -> dict:
    """Time qkv, transformers (if installed) and llama.cpp (if asked) on a real model; a plain dict."""
    from .. import load

    log = log or (lambda msg: None)
    model = load(source, dtype="float32")           # the readable path, the reference
    cfg = model.config
    half = sixteen_bit(source)                      # a 16-bit checkpoint: also timed as stored, beside torch's own
    stored = load(source, dtype="stored") if gguf_of(source) is not None or half else None   # as the file keeps it
    if not cfg.causal or model.weights.W_vocab is None:
        raise QkvError(f"{model.name} is an encoder and cannot generate; give a decoder, e.g. --model smollm2")
    ids = chat_ids(model)
    if len(ids) + new_tokens > cfg.max_positions or max(prefill, default=1) + 1 > cfg.max_positions:
        raise QkvError(f"the prompts do not fit {model.name}'s {cfg.max_positions} positions; choose fewer tokens")
    try:
        import torch
        import transformers
        missing = None
    except ImportError as e:
        torch = transformers = None
        missing = e.name
    hf = None
    if torch is not None:
        log("loading the same weights in transformers")
        hf = load_reference(source, torch, transformers)
        hf_half = None
        if half:
            log(f"and in {half}, as the checkpoint stores it")
            hf_half = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, half)).eval()

    pinned = decode_threads() or tuning_pins().get("decode")

    def runs(n: int, prompt: np.ndarray = ids[None], variants: bool = True) -> dict:
        """Each generator writing N tokens after PROMPT (1, n_prompt): name → a call returning its new ids.
        variants: also qkv on each count of THREADS and transformers in a 16-bit checkpoint's own dtype."""
        out = {"qkv": lambda: model.generate(prompt, n, temperature=0, stop_at_eos=False)[0, prompt.shape[1]:]}
        for t in THREADS if variants else ():
            out[f"qkv_{t}"] = _with_threads(t, out["qkv"])
        if stored is not None:
            out["qkv_stored"] = lambda: stored.generate(prompt, n, temperature=0, stop_at_eos=False)[0, prompt.shape[1]:]
        if hf is not None:
            prompt_t = torch.from_numpy(prompt)
            for name, m in (("transformers", hf), ("transformers_stored", hf_half if variants else None)):
                if m is not None:
                    out[name] = lambda m=m: _hf_generate(m, prompt_t, n, cfg.pad_token_id)
        return out
    decode_runs = runs(new_tokens)
    log("checking that they choose the same tokens")
    tokens = {name: run() for name, run in decode_runs.items()}
    same = {name: first_difference(tokens["qkv"], t) for name, t in tokens.items() if name != "qkv"}
    log("copy bandwidth")
    bandwidth = copy_bandwidth()
    log(f"decode: {repeats} rounds after a warm-up, taking turns")
    snap = cpu_snapshot()
    decode_s = time_interleaved(decode_runs, repeats=repeats)
    log("the prompt alone (one new token), to tell the steps after it")
    first_s = time_interleaved(runs(1), repeats=repeats) if new_tokens > 1 else {}
    busy_decode = others_cores(snap, cpu_snapshot())

    prefill_s: dict[int, dict[str, float]] = {}
    rng = np.random.default_rng(seed)
    prompts = {n: rng.integers(0, cfg.vocab_size, size=(1, n)) for n in prefill}      # (1, n) each
    snap = cpu_snapshot()
    for n, p in prompts.items():
        log(f"prefill of {n} tokens")
        prefill_s[n] = time_interleaved(runs(1, p, variants=False), repeats=repeats, settle=SETTLE)
    busy_prefill = others_cores(snap, cpu_snapshot())
    bandwidth_after = copy_bandwidth()

    llama = None
    if llama_python:
        from .llama_cpp import run_llama_cpp

        log("llama.cpp (child process)")
        llama = run_llama_cpp(llama_python, gguf_of(source), ids, new_tokens,
                              {n: p[0] for n, p in prompts.items()}, repeats)
        if llama.get("tokens") is not None:
            llama["first_difference"] = first_difference(tokens["qkv"], np.asarray(llama["tokens"]))

    weight_bytes = model.weights.nbytes()
    stored_bytes = stored.weights.nbytes() if stored is not None else None
    copy_bw = float(np.mean([bandwidth, bandwidth_after]))
    tps = {name: new_tokens / s for name, s in decode_s.items()}

    def shares(rates: dict[str, float]) -> dict[str, float]:
        """Each qkv or transformers rate's share of its storage's bandwidth limit (llama.cpp's bytes are its own)."""
        return {name: bandwidth_share(stored_bytes if name.endswith("_stored") else weight_bytes, v, copy_bw)
                for name, v in rates.items() if name != "llama.cpp"}
    steps = {name: (new_tokens - 1) / (s - first_s[name]) for name, s in decode_s.items()
             if name in first_s and s > first_s[name]}             # the tokens after the first: one step each
    if llama and llama.get("decode_s"):
        tps["llama.cpp"] = new_tokens / llama["decode_s"]
        if llama.get("first_s") and llama["decode_s"] > llama["first_s"] and new_tokens > 1:
            steps["llama.cpp"] = (new_tokens - 1) / (llama["decode_s"] - llama["first_s"])
    machine = machine_facts()
    machine["vector"] = vector_extensions()
    if torch is not None:
        capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: None)()
        machine["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads(),
                            "capability": capability}
        machine["transformers"] = transformers.__version__
    return {
        "model": {"name": model.name, "source": source, "n_layers": cfg.n_layers, "d_model": cfg.d_model,
                  "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "d_ff": cfg.d_ff,
                  "vocab_size": cfg.vocab_size, "parameters": weight_bytes // 4},
        "machine": machine, "missing": missing, "prompt": len(ids), "question": QUESTION,
        "new_tokens": new_tokens, "repeats": repeats, "settle_s": SETTLE, "pinned_threads": pinned,
        "decode_seconds": decode_s, "first_token_seconds": first_s, "tokens_per_s": tps, "step_tokens_per_s": steps,
        "step_share": shares(steps), "prefill_seconds": {str(n): s for n, s in prefill_s.items()},
        "weight_bytes": weight_bytes, "copy_bytes_per_s": copy_bw, "copy_bytes_per_s_runs": [bandwidth, bandwidth_after],
        "bandwidth_limit_tokens_per_s": copy_bw / weight_bytes,
        "share": shares(tps),
        "stored_bytes": stored_bytes, "sixteen_bit": half,
        "first_difference": same, "others_cores": {"decode": busy_decode, "prefill": busy_prefill},
        "reply": model.tokenizer.decode(tokens["qkv"].tolist()) if model.tokenizer else None,
        "llama_cpp": llama,
    }


def _hf_generate(hf, prompt, n: int, pad: int | None) -> np.ndarray:
    """transformers' greedy N new ids after PROMPT (1, n) (a tensor), end-of-turn ignored."""
    import torch

    with torch.no_grad():
        out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=n,
                          eos_token_id=None, pad_token_id=pad if pad is not None else 0)
    return out[0, prompt.shape[1]:].numpy()


def markdown(result: dict, command: str) -> str:
    """The "Generation: <model>" section of docs/benchmarks.md, from `measure`'s dict."""
    m, n = result["model"], result["new_tokens"]
    return md.join(f"## Generation: {m['name']}", _setup(result),
                   f"**Decode**: {n} new tokens, greedy, after a {result['prompt']}-token chat prompt (the model's "
                   f"template around \"{result['question']}\"), end-of-turn ignored; tokens/s = {n} ÷ the wall time "
                   "of the whole `generate` call (prompt included); after the prompt: the steps alone, "
                   f"{n - 1} ÷ (that time − the time of `generate` of 1 token).",
                   _decode_table(result), _comparison(result), _bandwidth(result), _llama_note(result),
                   "**Prefill**: time to the first token (`generate` of 1 token) of a prompt of random token ids, "
                   f"{result.get('settle_s', SETTLE):g} s of sleep before each run.",
                   _prefill_table(result), _machine(result), md.reproduce(command))


def _setup(result: dict) -> str:
    m = result["model"]
    return (f"{m['name']} (L {m['n_layers']}, d_model {m['d_model']}, {m['n_heads']} query heads / "
            f"{m['n_kv_heads']} K/V heads, d_ff {m['d_ff']}, V {m['vocab_size']}, {m['parameters'] / 1e6:.0f}M "
            f"parameters = {m['parameters'] * 4 / 1e6:.0f} MB of float32 read per step), from "
            f"`--model {m['source']}`: qkv and transformers run the same float32 weights (the GGUF dequantised), "
            f"batch 1, CPU, one process, taking turns; median of {result['repeats']} rounds after a warm-up.")


def _ratio(x: float | None, ref: float | None) -> str:
    return f"{x / ref:.2f}×" if x and ref else "—"


def _llama(result: dict) -> dict | None:
    """llama.cpp's results when it ran (None when not asked or when it failed)."""
    llama = result.get("llama_cpp")
    return llama if llama and "llama.cpp" in result["tokens_per_s"] else None


def _decode_table(result: dict) -> list[str]:
    tps, share, ref = result["tokens_per_s"], result["share"], result["tokens_per_s"].get("transformers")
    pinned = result.get("pinned_threads")
    names = {"qkv": "qkv, as shipped (" + (f"QKV_DECODE_THREADS={pinned} set" if pinned else
                                           "BLAS threads of one-token steps chosen by timing them") + ")"}
    names.update({f"qkv_{t}": f"qkv, one-token steps on {t} BLAS thread{'s' if t > 1 else ''} "
                              f"(`QKV_DECODE_THREADS={t}`)" for t in THREADS})
    if result.get("stored_bytes"):
        names["qkv_stored"] = (f"qkv, weights as the file stores them (`dtype=\"stored\"`, "
                               f"{result['stored_bytes'] / 1e6:.0f} MB read per step)")
    names["transformers"] = "transformers (torch, its threads)"
    if result.get("sixteen_bit"):
        names["transformers"] = "transformers (torch, its threads, float32)"
        names["transformers_stored"] = f"transformers in {result['sixteen_bit']}, as the checkpoint stores it"
    steps, step_share = result.get("step_tokens_per_s", {}), result.get("step_share", {})
    step_ref = steps.get("transformers")

    def after(k: str) -> list[str]:
        if k not in steps:
            return ["—", "—", "—"]
        return [f"{steps[k]:.1f}", _ratio(steps[k], step_ref), f"{100 * step_share[k]:.0f} %" if k in step_share else "—"]
    rows = [[name, f"{tps[k]:.1f}", _ratio(tps[k], ref), f"{100 * share[k]:.0f} %", *after(k)]
            for k, name in names.items() if k in tps]
    llama = _llama(result)
    if llama:
        rows.append([f"llama.cpp {llama.get('version', '')} ({llama.get('weights')} weights, "
                     f"{llama.get('threads')} threads, {llama.get('weight_bytes', 0) / 1e6:.0f} MB read per step)",
                     f"{tps['llama.cpp']:.1f}", _ratio(tps["llama.cpp"], ref), "—", *after("llama.cpp")[:2], "—"])
    return md.table(["generator", "tokens/s", "× transformers", "share of the bandwidth limit",
                     "after the prompt: tokens/s", "× transformers", "share"], rows, "lrrrrrr")


def _comparison(result: dict) -> list[str]:
    """Same tokens and the targets, or why nothing is compared."""
    tps, n = result["tokens_per_s"], result["new_tokens"]
    ref = tps.get("transformers")
    if ref is None:
        return [f"transformers is not installed ({result['missing']} is missing), so nothing is compared: "
                "`pip install torch transformers accelerate` to see it beside qkv."]
    diffs = result["first_difference"]
    d = diffs.get("transformers")
    threads_same = all(diffs.get(f"qkv_{t}") is None for t in THREADS)
    speed, share = tps["qkv"] / ref, result["share"]["qkv"]
    prefill = [s["qkv"] / s["transformers"] for s in result["prefill_seconds"].values() if s.get("transformers")]
    worst = max(prefill, default=None)
    prefill_target = "prefill no slower than transformers (table below" + (
        "" if worst is None else f"; here at worst {worst:.2f}× its time: {md.MET[worst <= 1.0]}") + ")"
    return ["Same tokens: qkv and transformers write "
            + (f"the same {n} tokens" if d is None else f"different tokens from new token {d}")
            + "; qkv with 1 or 2 BLAS threads: " + ("the same" if threads_same else "different")
            + ("" if "qkv_stored" not in diffs else "; qkv with stored weights: " + (
                "the same" if diffs["qkv_stored"] is None else f"different from new token {diffs['qkv_stored']}"))
            + ".",
            "",
            *_sixteen_bit_targets(result),
            "Targets: " + md.target(f"decode ≥ {TARGET_SPEEDUP:g}× transformers", speed, TARGET_SPEEDUP,
                                    f"{speed:.2f}×")
            + ", " + md.target(f"≥ {100 * TARGET_SHARE:.0f} % of the bandwidth limit", share, TARGET_SHARE,
                               f"{100 * share:.0f} %")
            + ", " + prefill_target + "."]


def _sixteen_bit_targets(result: dict) -> list[str]:
    """A 16-bit checkpoint's own targets (issue 25): stored decoding ≥ 1.5× transformers in the same dtype,
    ≥ 85 % of the 16-bit bandwidth limit."""
    tps, half = result["tokens_per_s"], result.get("sixteen_bit")
    if not half or "qkv_stored" not in tps or "transformers_stored" not in tps:
        return []
    lines = []
    steps = result.get("step_tokens_per_s", {})
    for what, rate, shares in (("whole calls", tps, result["share"]),
                               ("after the prompt", steps, result.get("step_share", {}))):
        if "qkv_stored" not in rate or "transformers_stored" not in rate:
            continue
        speed, share = rate["qkv_stored"] / rate["transformers_stored"], shares["qkv_stored"]
        lines.append(f"Stored ({half}), {what}: "
                     + md.target(f"decode ≥ {TARGET_SPEEDUP:g}× transformers in {half}", speed, TARGET_SPEEDUP,
                                 f"{speed:.2f}×")
                     + ", " + md.target(f"≥ {100 * TARGET_SHARE:.0f} % of the {half} bandwidth limit", share,
                                        TARGET_SHARE, f"{100 * share:.0f} %") + ".")
    return [" ".join(lines), ""] if lines else []


def _bandwidth(result: dict) -> str:
    runs = ", ".join(f"{b / 1e9:.1f}" for b in result["copy_bytes_per_s_runs"])
    return (f"Bandwidth limit: copy bandwidth ÷ weight bytes = **{result['bandwidth_limit_tokens_per_s']:.1f} "
            f"tokens/s** (a step reads every weight once, {result['weight_bytes'] / 1e6:.0f} MB, the tied W_vocab "
            f"counted once; `np.copyto` of a {COPY_BYTES / 2**30:g} GiB float32 array, read + write, before and "
            f"after the timing: {runs} GB/s, their mean used).")


def _llama_note(result: dict) -> str | None:
    llama = _llama(result)
    if llama is None:
        return None
    d = llama.get("first_difference")
    return (f"llama.cpp reads its {llama.get('weights')} weights as they are in the file "
            f"({llama.get('weight_bytes', 0) / 1e6:.0f} MB against {result['weight_bytes'] / 1e6:.0f} MB of "
            "float32); its greedy tokens " + ("equal qkv's" if d is None else f"leave qkv's at new token {d}")
            + ": qkv and transformers run the dequantised float32 numbers, llama.cpp the quantised blocks "
              "themselves (with quantised activations).")


def _prefill_table(result: dict) -> list[str]:
    llama = _llama(result)
    llama_prefill = (llama or {}).get("prefill_s")
    rows = []
    for k, s in result["prefill_seconds"].items():
        ours, theirs = s["qkv"], s.get("transformers")
        row = [k, f"{1e3 * ours:.0f}", f"{1e3 * theirs:.0f}" if theirs else "—", _ratio(ours, theirs)]
        if "qkv_stored" in s:
            row.append(f"{1e3 * s['qkv_stored']:.0f}")
        if llama_prefill:
            lp = llama_prefill.get(k)
            row.append(f"{1e3 * lp:.0f}" if lp else "—")
        rows.append(row)
    stored = any("qkv_stored" in s for s in result["prefill_seconds"].values())
    header = ["prompt tokens", "qkv ms", "transformers ms", "qkv / transformers"] + (
        ["qkv stored ms"] if stored else []) + (["llama.cpp ms"] if llama_prefill else [])
    return md.table(header, rows, "r" * len(header))


def _machine(result: dict) -> str:
    mach, torch_ = result["machine"], result["machine"].get("torch")
    busy = result.get("others_cores") or {}
    busy_txt = ", ".join(f"{v:.1f} ({k})" for k, v in busy.items() if v is not None)
    return (f"Machine: {mach['cpu']}, {mach['cores']} cores, vector extensions "
            f"{', '.join(mach.get('vector') or ['unknown'])}; "
            + md.numpy_blas(mach, " for products of many rows") + "; "
            + (f"torch {torch_['version']} ({torch_['threads']} threads, {torch_.get('capability')} kernels), "
               f"transformers {mach['transformers']}; " if torch_ else "")
            + f"{md.openblas_env(mach)}. Other processes kept {busy_txt or 'an unknown number of'} cores busy "
              "on average during the timing.")
