"""The --trace benchmark: what `qkv chat --trace DIR` adds to the reply it traces.

    SmolLM2-135M-Instruct (the installed GGUF), greedy, one question, the same reply each time:
      plain:   "".join(chat_stream(model, QUESTION, n))                       what `qkv chat` does
      traced:  the same with record=True, then analysis.sections.save_generation(stream, DIR):
               trace.npz + trace.json + attention.html (attention, rollout, next-token candidates)
      + lens:  the same with the Logit lens tab (`--lens`), for what asking for it costs
    taking turns, median of `repeats` rounds after a warm-up, in one process (the model loaded once:
    the command's own start-up, the same with or without --trace, is left out, which makes the ratio
    stricter than timing the commands).

The target (issue 24): traced ≤ 1.2 × plain.
"""

from __future__ import annotations

import tempfile
import time
from typing import Callable

from . import markdown as md
from .common import cpu_snapshot, machine_facts, others_cores, time_rounds

MODEL = "smollm2"
QUESTION = "Explain what attention does in a transformer, in detail."
NEW_TOKENS = 137             # the reply the issue timed
REPEATS = 3
TARGET = 1.2                 # traced ÷ plain
COMMAND = "qkv bench trace --out docs/benchmarks.md"


def measure(new_tokens: int = NEW_TOKENS, repeats: int = REPEATS, lens: bool = True,
            log: Callable[[str], None] = lambda m: None) -> dict:
    """Median seconds of a plain reply, a traced one (and one with the lens), taking turns.

    {"plain_s", "traced_s", "lens_s" (or None), "ratio", "lens_ratio", "parts": {step: s} of one traced
    run, "tokens": [prompt, reply], "bytes": {file: size}, "machine", "others_cores", ...}
    """
    from ..analysis.sections import save_generation
    from ..models.loading import load
    from ..writing.chat import chat_stream

    model = load(MODEL)
    sizes: dict[str, int] = {}
    tokens: list[int] = []

    def reply(record: bool):
        stream = chat_stream(model, QUESTION, new_tokens, record=record)
        "".join(stream)
        tokens[:] = [len(stream.prompt_ids), len(stream.new_ids)]
        return stream

    def traced(with_lens: bool) -> Callable[[], None]:
        def run() -> None:
            stream = reply(True)
            with tempfile.TemporaryDirectory() as d:
                _, out, _ = save_generation(stream, d, lens=with_lens)
                sizes.update({p.name: p.stat().st_size for p in out.iterdir()} if not with_lens else {})
        return run

    runs = {"plain": lambda: reply(False), "traced": traced(False)}
    if lens:
        runs["lens"] = traced(True)
    log(f"{MODEL}: a {new_tokens}-token reply, {' / '.join(runs)}, {repeats} round(s) after a warm-up")
    before = cpu_snapshot()
    times = time_rounds(runs, repeats=repeats, warmup=1)
    others = others_cores(before, cpu_snapshot())
    median = {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}
    return {"plain_s": median["plain"], "traced_s": median["traced"], "lens_s": median.get("lens"),
            "rounds": times, "ratio": median["traced"] / median["plain"],
            "lens_ratio": median["lens"] / median["plain"] if lens else None,
            "parts": parts(model, reply(True)), "target": TARGET, "tokens": tokens, "bytes": sizes,
            "model": model.name, "layers": model.config.n_layers, "heads": model.config.n_heads,
            "vocab": int(model.weights.W_vocab.shape[1]), "repeats": repeats, "machine": machine_facts(),
            "others_cores": others}


def parts(model, stream) -> dict[str, float]:
    """Seconds of each step of one traced reply's saving (what save_generation does, step by step)."""
    from ..analysis.sections import rollout_payload
    from ..viz.html import save_viewer

    out: dict[str, float] = {}

    def timed(name: str, fn):
        start = time.perf_counter()
        value = fn()
        out[name] = time.perf_counter() - start
        return value

    trace = timed("trace from the recording", stream.trace)
    rollout = timed("rollout", lambda: rollout_payload(trace))
    with tempfile.TemporaryDirectory() as d:
        timed("trace.npz + trace.json", lambda: trace.save(d))
        timed("attention.html", lambda: save_viewer(trace, f"{d}/attention.html", tokenizer=model.tokenizer,
                                                    sections={"rollout": rollout, "lens": None}))
    return out


def markdown(result: dict, command: str = COMMAND) -> str:
    """The "Tracing a generation" section of docs/benchmarks.md, from `measure`'s dict."""
    prompt, new = result["tokens"]
    plain = result["plain_s"]
    rows = [["`qkv chat` (plain)", f"{plain:.2f}", "1.00×"],
            ["`qkv chat --trace DIR`", f"{result['traced_s']:.2f}", f"**{result['ratio']:.2f}×**"]]
    if result["lens_s"] is not None:
        rows.append(["`qkv chat --trace DIR --lens`", f"{result['lens_s']:.2f}", f"{result['lens_ratio']:.2f}×"])
    parts = ", ".join(f"{name} {s:.2f} s" for name, s in result["parts"].items())
    sizes = ", ".join(f"{name} {b / 1e6:.1f} MB" for name, b in sorted(result["bytes"].items()))
    mach = result["machine"]
    return md.join(
        "## Tracing a generation",
        f"What `--trace DIR` adds to a reply of {result['model']} ({result['layers']} layers × {result['heads']} heads, "
        f"{result['vocab']:,}-token vocabulary): one question, greedy, {new} reply tokens after a {prompt}-token "
        "prompt, the same reply each time. Plain: the reply alone. Traced: the reply recorded as it is written "
        "(each step keeps the attention weights it computes anyway, the logits it chose from), then the trace "
        "assembled from the recording, rollout, the next-token candidates of every written token at the 20 "
        "temperatures of the slider, trace.npz + trace.json and attention.html written. With the lens: the same "
        "and the Logit lens tab, (L+1)·n·V multiply-adds. In one process, the model loaded once, taking turns, "
        f"median of {result['repeats']} round(s) after a warm-up.",
        md.table(["", "seconds", "÷ plain"], rows, "lrr"),
        md.target(f"Target: --trace ≤ {result['target']:g}× the plain reply", -result["ratio"], -result["target"],
                  f"{result['ratio']:.2f}×") + ".",
        f"One traced reply's saving, step by step: {parts}. Files: {sizes}.",
        f"Machine: {md.cpu(mach)}; {md.numpy_blas(mach)}; {md.openblas_env(mach)}. {md.busy(result['others_cores'])}",
        md.reproduce(command))
