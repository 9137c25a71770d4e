"""`qkv bench ...`: the benchmark commands (registered in qkv.cli.app with `cli.add_command(bench)`).

Each command measures with its module (forward, attention, generate, llm, heads, train, patching, atp), writes the
report with it (attention_report for attention) and (re)writes its section of the docs;
those modules hold no command line, so they never import this one.

Importing this module does not import torch or transformers; each command does, and says
how to install them when they are missing (one line, via QkvError).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import click

from ..runtime.errors import QkvError
from ..bench import attention as ab
from ..bench import attention_report as report
from ..bench import forward as fwd
from ..bench import generate as gb
from ..bench import llm
from ..bench import llm_stored
from ..bench import patching as pb
from ..bench import train as tb
from ..bench.common import write_section
from .options import backend_option


@click.group()
def bench() -> None:
    """Time qkv against transformers (needs torch and transformers: `make bench`)."""


def command_line(command: str, options: list[tuple[str, object, object]]) -> str:
    """COMMAND and each (flag, value, default) whose value differs from its default: the line that
    reproduces a run, written into the docs. A tuple repeats the flag, True is a bare flag."""
    parts = [command]
    for flag, value, default in options:
        if value == default or value is None or value is False:
            continue
        for v in (value if isinstance(value, tuple) else (value,)):
            parts.append(flag if v is True else f"{flag} {v:g}" if isinstance(v, float) else f"{flag} {v}")
    return " ".join(parts)


def publish(result: dict, text: str, as_json: bool, out: str | None, section: str, took: str = "") -> None:
    """Print the report (or the results as JSON) and (re)write its section of OUT."""
    click.echo(json.dumps(result, indent=2, default=str) if as_json else text)
    if out:
        write_section(out, section, text)
        click.echo(f"wrote the {section} section of {out}{took}", err=True)


def section_name(model_source: str) -> str:
    """The docs section suffix of a model: 'smollm2', or a path with every other character a dash."""
    return "".join(c if c.isalnum() else "-" for c in model_source.lower())


def out_option(what: str):
    """The --out option of a benchmark: the docs file whose section WHAT it rewrites."""
    return click.option("--out", type=click.Path(dir_okay=False), default=None,
                        help=f"Markdown file whose {what} to (re)write, e.g. docs/benchmarks.md.")


json_option = click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of markdown.")


def forward_command(tokens: tuple[int, ...], repeats: int, eager: bool, out: str | None,
                    model_source: str | None = None) -> str:
    """The command line that reproduces a forward run with these options."""
    return command_line("qkv bench forward", [("--model", model_source, None), ("--tokens", tuple(tokens), fwd.TOKENS),
                                              ("--repeats", repeats, fwd.REPEATS), ("--no-eager", not eager, False),
                                              ("--out", out, None)])


@bench.command()
@click.option("--tokens", type=int, multiple=True, default=fwd.TOKENS, show_default=True,
              help="Prompt length(s) to prefill; repeat the option for several.")
@click.option("--repeats", type=click.IntRange(min=1), default=fwd.REPEATS, show_default=True,
              help="Timed rounds per length (the median is reported), after one warm-up.")
@click.option("--eager/--no-eager", default=True, show_default=True,
              help="Also time transformers with eager attention (random model only).")
@click.option("--model", "model_source", default=None,
              help="A real decoder instead of the random GPT-2-small, e.g. smollm2 (transformers runs the same "
                   "float32 weights).")
@out_option("'bench:forward' section (or 'bench:forward-MODEL')")
@json_option
def forward(tokens: tuple[int, ...], repeats: int, eager: bool, model_source: str | None, out: str | None,
            as_json: bool) -> None:
    """Prefill of a random GPT-2-small (or --model smollm2): qkv's time over transformers', same run, same weights."""
    result = fwd.measure(tokens=tokens, repeats=repeats, eager=eager and model_source is None, source=model_source)
    text = fwd.markdown(result, command=forward_command(tokens, repeats, eager, out, model_source))
    publish(result, text, as_json, out, "forward" + ("" if model_source is None else "-" + section_name(model_source)))


@bench.command(name="heads")
@click.option("--sentences", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Size of the synthetic English corpus.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes / Ray actors for the parallel runs [default: every core].")
@backend_option("local: time one process and the local cores; ray: the Ray backend too.", default="ray",
                was="--ray/--no-ray", values={True: "ray", False: "local"})
@out_option("'bench:heads' section")
@json_option
def heads_bench(sentences: int, workers: int | None, backend: str, out: str | None, as_json: bool) -> None:
    """Texts per second of `qkv heads` on the default model: one process, local cores, Ray (no torch needed)."""
    from ..bench import heads as hb
    from ..runtime.threads import check_count

    check_count("--workers", workers)
    result = hb.measure(sentences=sentences, workers=workers, ray=backend == "ray")
    command = hb.COMMAND if (sentences, workers, backend) == (hb.SENTENCES, None, "ray") else command_line(
        "qkv bench heads", [("--sentences", sentences, None), ("--workers", workers, None),
                            ("--backend", backend, "ray"), ("--out", out, None)])
    text = hb.markdown(result, command=command)
    publish(result, text, as_json, out, "heads")


def attention_command_line(sizes, repeats, max_seconds, window, out, plot_path) -> str:
    """The command line that reproduces an attention run with these options."""
    return command_line("qkv bench attention", [
        ("--sizes", tuple(sizes), ab.SIZES), ("--repeats", repeats, ab.REPEATS),
        ("--max-seconds", max_seconds, ab.MAX_SECONDS), ("--window", window, ab.WINDOW), ("--out", out, None),
        ("--plot", plot_path, None)])


@bench.command("attention")
@click.option("--sizes", type=click.IntRange(min=1), multiple=True, default=ab.SIZES, show_default=True,
              help="Token counts n; repeat the option for several.")
@click.option("--repeats", type=click.IntRange(min=1), default=ab.REPEATS, show_default=True,
              help="Timed rounds for calls shorter than 20 s (the median is reported); longer calls run once.")
@click.option("--max-seconds", type=click.FloatRange(min=0), default=ab.MAX_SECONDS, show_default=True,
              help="Skip a size whose predicted time for one call (from the smaller sizes) is longer.")
@click.option("--window", type=click.IntRange(min=1), default=ab.WINDOW, show_default=True,
              help="Sliding window width w.")
@out_option("'bench:attention' section")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Also draw time and memory against n into this PNG.")
@click.option("--linear/--no-linear", default=True, show_default=True,
              help="Also compare linear attention with softmax on MiniLM's real activations.")
@json_option
def attention_command(sizes, repeats, max_seconds, window, out, plot_path, linear, as_json) -> None:
    """Attention at n = 512 … 65536: plain, tiled, sliding window and torch's SDPA; time, memory, GFLOP/s."""
    if plot_path and not plot_path.lower().endswith(".png"):
        raise QkvError(f"--plot {plot_path} must name a .png file")
    for path in filter(None, (out, plot_path)):
        parent = Path(path).resolve().parent
        if parent.exists() and not os.access(parent, os.W_OK):
            raise QkvError(f"cannot write {path}: its directory is not writable; choose another path")
    result = ab.measure(sizes, repeats, max_seconds, window, log=lambda msg: click.echo(msg, err=True))
    result["linear"] = ab.linear_vs_softmax() if linear else None
    if plot_path:
        report.plot(result, plot_path)
    rel_plot = None
    if plot_path:
        rel_plot = os.path.relpath(Path(plot_path).resolve(), Path(out).resolve().parent) if out else plot_path
    text = report.markdown(result, attention_command_line(sizes, repeats, max_seconds, window, out, plot_path),
                           plot_path=rel_plot, linear=result["linear"], threshold_note=report.threshold_note(result))
    publish(result, text, as_json, out, "attention")


def generate_command_line(new_tokens: int, no_cache_tokens: int, repeats: int, out: str | None) -> str:
    """The command line that reproduces a generation run on the random model with these options."""
    return command_line("qkv bench generate", [
        ("--new-tokens", new_tokens, gb.NEW_TOKENS), ("--no-cache-tokens", no_cache_tokens, gb.NO_CACHE_TOKENS),
        ("--repeats", repeats, gb.REPEATS), ("--out", out, None)])


def llm_command_line(model: str, new_tokens: int, repeats: int, llama: bool, out: str | None) -> str:
    """The command line that reproduces a generation run on a real model."""
    return command_line("qkv bench generate", [
        ("--model", model, None), ("--new-tokens", new_tokens, llm.NEW_TOKENS), ("--repeats", repeats, llm.REPEATS),
        ("--llama-python", "PATH/TO/python" if llama else None, None), ("--out", out, None)])


def stored_command_line(models: tuple[str, ...], new_tokens: int, repeats: int, llama: bool, out: str | None) -> str:
    """The command line that reproduces a stored-weights run, each file's folder written PATH/TO."""
    return command_line("qkv bench generate --stored", [
        ("--model", tuple(f"PATH/TO/{Path(m).name}" for m in models), None),
        ("--new-tokens", new_tokens, llm_stored.NEW_TOKENS), ("--repeats", repeats, llm_stored.REPEATS),
        ("--llama-python", "PATH/TO/python" if llama else None, None), ("--out", out, None)])


@bench.command("generate")
@click.option("--model", "model_sources", multiple=True,
              help="A real decoder instead of the random GPT-2-small: smollm2, a .gguf or a checkpoint directory "
                   "(compared with transformers on the same float32 weights); with --stored, one or more .gguf "
                   "files (repeat the option).")
@click.option("--stored", is_flag=True,
              help="With --model FILE.gguf: only the file's stored weights, in qkv's two arithmetics (exact and "
                   "llama.cpp's) beside llama.cpp, each step timed; no float32 copy, no transformers.")
@click.option("--new-tokens", type=click.IntRange(min=1), default=None,
              help=f"Tokens to generate with a cache [default: {gb.NEW_TOKENS}; 64 with --model].")
@click.option("--no-cache-tokens", type=click.IntRange(min=1), default=gb.NO_CACHE_TOKENS, show_default=True,
              help="Tokens to generate without qkv's cache (each step recomputes the sequence; random model only).")
@click.option("--repeats", type=click.IntRange(min=1), default=gb.REPEATS, show_default=True,
              help="Timed rounds (the median is reported), after one warm-up.")
@click.option("--llama-python", type=click.Path(dir_okay=False), default=None,
              help="With --model: the python of an environment with llama-cpp-python, to time llama.cpp beside.")
@out_option("'bench:generate' section (or 'bench:generate-MODEL')")
@json_option
def generate_command(model_sources: tuple[str, ...], stored: bool, new_tokens: int | None, no_cache_tokens: int,
                     repeats: int, llama_python: str | None, out: str | None, as_json: bool) -> None:
    """Greedy generation: tokens/s of qkv and transformers (random GPT-2-small, or --model smollm2), or of a
    GGUF's stored weights beside llama.cpp (--stored)."""
    start = time.perf_counter()
    log = lambda msg: click.echo(msg, err=True)   # noqa: E731
    if stored:
        if not model_sources:
            raise QkvError("--stored times GGUF files; give them with --model FILE.gguf (repeat for several)")
        n = new_tokens or llm_stored.NEW_TOKENS
        result = llm_stored.measure(list(model_sources), n, repeats=repeats, llama_python=llama_python, log=log)
        text = llm_stored.markdown(result, stored_command_line(model_sources, n, repeats, bool(llama_python), out))
        section = llm_stored.section_name(result)
    elif model_sources:
        if len(model_sources) > 1:
            raise QkvError("--model is given once, except with --stored (GGUF files timed side by side)")
        model_source = model_sources[0]
        n = new_tokens or llm.NEW_TOKENS
        result = llm.measure(model_source, n, repeats=repeats, llama_python=llama_python, log=log)
        text = llm.markdown(result, llm_command_line(model_source, n, repeats, bool(llama_python), out))
        section = "generate-" + section_name(model_source)
    else:
        if llama_python:
            raise QkvError("--llama-python needs --model (llama.cpp runs the GGUF file itself)")
        n = new_tokens or gb.NEW_TOKENS
        result = gb.measure(n, no_cache_tokens, repeats, log=log)
        text = gb.markdown(result, generate_command_line(n, no_cache_tokens, repeats, out))
        section = "generate"
    publish(result, text, as_json, out, section, took=f" ({time.perf_counter() - start:.0f} s)")


def train_command_line(models: tuple[str, ...], repeats: int, memory_tokens: tuple[int, ...], memory: bool,
                       threads: int | None, out: str | None) -> str:
    """The command line that reproduces a training-step run with these options."""
    return command_line("qkv bench train", [
        ("--model", tuple(models), tuple(tb.MODELS)), ("--repeats", repeats, tb.REPEATS),
        ("--memory-tokens", tuple(memory_tokens), tb.MEMORY_TOKENS), ("--no-memory", not memory, False),
        ("--threads", threads, None), ("--out", out, None)])


@bench.command("train")
@click.option("--model", "models", type=click.Choice(list(tb.MODELS)), multiple=True, default=tuple(tb.MODELS),
              show_default=True, help="Model(s) to time; repeat the option for several.")
@click.option("--repeats", type=click.IntRange(min=1), default=tb.REPEATS, show_default=True,
              help="Timed rounds per model (the median is reported), after one warm-up.")
@click.option("--memory-tokens", type=click.IntRange(min=2), multiple=True, default=tb.MEMORY_TOKENS,
              show_default=True, help=f"Sequence lengths n of the activation-memory table ({tb.MEMORY_MODEL} model).")
@click.option("--memory/--no-memory", default=True, show_default=True, help="Measure the activation memory.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="BLAS threads of qkv and torch's threads [default: every core, as `qkv train`].")
@out_option("'bench:train' section")
@json_option
def train_command(models: tuple[str, ...], repeats: int, memory_tokens: tuple[int, ...], memory: bool,
                  threads: int | None, out: str | None, as_json: bool) -> None:
    """A training step (forward, backward, AdamW): qkv's tokens/s against torch's, and activation memory."""
    from ..runtime.threads import check_count

    check_count("--threads", threads)
    start = time.perf_counter()
    result = tb.measure(models=models, repeats=repeats, memory_tokens=memory_tokens if memory else (),
                        threads=threads, log=lambda msg: click.echo(msg, err=True))
    text = tb.markdown(result, train_command_line(models, repeats, memory_tokens, memory, threads, out))
    publish(result, text, as_json, out, "train", took=f" ({time.perf_counter() - start:.0f} s)")


def patch_command_line(repeats: int, threads: int | None, out: str | None) -> str:
    """The command line that reproduces a patching run with these options."""
    return command_line("qkv bench patch", [("--repeats", repeats, pb.REPEATS), ("--threads", threads, None),
                                            ("--out", out, None)])


@bench.command("patch")
@click.option("--repeats", type=click.IntRange(min=1), default=pb.REPEATS, show_default=True,
              help="Runs of each side, taking turns (each run's time is reported).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="BLAS threads of qkv and torch's threads [default: every core].")
@out_option("'bench:patch' section")
@json_option
def patch_command(repeats: int, threads: int | None, out: str | None, as_json: bool) -> None:
    """Activation patching of every head on SmolLM2 (docs/patching.md's IOI run): qkv against TransformerLens."""
    from ..runtime.threads import check_count

    check_count("--threads", threads)
    start = time.perf_counter()
    result = pb.measure(repeats=repeats, threads=threads, log=lambda msg: click.echo(msg, err=True))
    text = pb.markdown(result, patch_command_line(repeats, threads, out))
    publish(result, text, as_json, out, "patch", took=f" ({time.perf_counter() - start:.0f} s)")


def atp_command_line(fixtures: str, pairs: int, qkv_pairs: int, threads: int | None, out: str | None) -> str:
    """The command line that reproduces an attribution-patching run with these options."""
    from ..bench import atp as apb

    return command_line("qkv bench atp", [("--fixtures", fixtures, apb.FIXTURES), ("--pairs", pairs, apb.PAIRS),
                                          ("--qkv-pairs", qkv_pairs, apb.QKV_PAIRS), ("--threads", threads, None),
                                          ("--out", out, None)])


@bench.command("atp")
@click.option("--fixtures", default="tests/fixtures/models", show_default=True,
              help="The folder of family fixtures (one model folder each).")
@click.option("--pairs", type=click.IntRange(min=0), default=8, show_default=True,
              help="IOI pairs to run on SmolLM2 (0: the fixtures only).")
@click.option("--qkv-pairs", type=click.IntRange(min=0), default=2, show_default=True,
              help="Of those, how many also patch queries, keys and values exactly (AtP* beside AtP; 10–45 s each).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="NumPy's BLAS threads for the SmolLM2 timing [default: every core; 1 is steadier on a busy machine].")
@out_option("'bench:atp' section")
@json_option
def atp_command(fixtures: str, pairs: int, qkv_pairs: int, threads: int | None, out: str | None,
                as_json: bool) -> None:
    """Attribution patching beside exact patching: r, sign agreement and the cells wrong by more than half, on every
    family fixture and on SmolLM2's IOI pairs (with AtP's time against exact patching's; no torch needed)."""
    from ..bench import atp as apb
    from ..runtime.threads import check_count

    check_count("--threads", threads)
    start = time.perf_counter()
    log = lambda msg: click.echo(msg, err=True)   # noqa: E731
    families = apb.fixtures(fixtures, log=log)
    smollm2 = apb.ioi(pairs, qkv_pairs, threads, log=log) if pairs else None
    text = apb.markdown(families, smollm2, atp_command_line(fixtures, pairs, qkv_pairs, threads, out))
    publish({"fixtures": families, "smollm2": smollm2}, text, as_json, out, "atp",
            took=f" ({time.perf_counter() - start:.0f} s)")


def sparse_command_line(sizes, repeats: int, window: int, block: int, out: str | None) -> str:
    """The command line that reproduces a sparse run with these options."""
    from ..bench import sparse as sb

    return command_line("qkv bench sparse", [("--sizes", tuple(sizes), sb.SIZES), ("--repeats", repeats, sb.REPEATS),
                                             ("--window", window, sb.WINDOW), ("--block", block, sb.BLOCK),
                                             ("--out", out, None)])


@bench.command("sparse")
@click.option("--sizes", type=click.IntRange(min=1), multiple=True, default=(512, 1024, 2048, 4096, 8192),
              show_default=True, help="Token counts n; repeat the option for several.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed rounds per size (the median is reported), taking turns.")
@click.option("--window", type=click.IntRange(min=1), default=256, show_default=True,
              help="The patterns' window w.")
@click.option("--block", type=click.IntRange(min=1), default=64, show_default=True,
              help="BigBird's random blocks and block-sparse's blocks, in tokens.")
@out_option("'bench:sparse' section")
@json_option
def sparse_command(sizes, repeats: int, window: int, block: int, out: str | None, as_json: bool) -> None:
    """Sparse attention patterns in the tiled kernel (window, dilated, Longformer, BigBird, block): time, memory."""
    from ..bench import sparse as sb

    start = time.perf_counter()
    result = sb.measure(sizes, repeats, window, block, log=lambda msg: click.echo(msg, err=True))
    text = sb.markdown(result, sparse_command_line(sizes, repeats, window, block, out))
    publish(result, text, as_json, out, "sparse", took=f" ({time.perf_counter() - start:.0f} s)")


def trace_command_line(new_tokens: int, repeats: int, lens: bool, out: str | None) -> str:
    """The command line that reproduces a --trace run with these options."""
    from ..bench import trace as trb

    return command_line("qkv bench trace", [("--new-tokens", new_tokens, trb.NEW_TOKENS),
                                            ("--repeats", repeats, trb.REPEATS), ("--no-lens", not lens, False),
                                            ("--out", out, None)])


@bench.command("trace")
@click.option("--new-tokens", type=click.IntRange(min=1), default=137, show_default=True,
              help="Tokens of the reply (at most: it may end at its end of turn, the same each time).")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed rounds (the median is reported), after one warm-up, taking turns.")
@click.option("--lens/--no-lens", default=True, show_default=True, help="Time --trace --lens too.")
@out_option("'bench:trace' section")
@json_option
def trace_command(new_tokens: int, repeats: int, lens: bool, out: str | None, as_json: bool) -> None:
    """What `qkv chat --trace DIR` costs over the plain reply, on SmolLM2 (no torch needed)."""
    from ..bench import trace as trb

    start = time.perf_counter()
    result = trb.measure(new_tokens, repeats, lens, log=lambda msg: click.echo(msg, err=True))
    text = trb.markdown(result, trace_command_line(new_tokens, repeats, lens, out))
    publish(result, text, as_json, out, "trace", took=f" ({time.perf_counter() - start:.0f} s)")


def viewer_command_line(tokens, repeats: int, model_source: str, budget_mb: float | None, out: str | None) -> str:
    """The command line that reproduces a viewer run with these options."""
    from ..bench import viewer as vb

    return command_line("qkv bench viewer", [("--model", model_source, vb.MODEL), ("--tokens", tuple(tokens), vb.TOKENS),
                                             ("--repeats", repeats, vb.REPEATS), ("--budget-mb", budget_mb, None),
                                             ("--out", out, None)])


@bench.command("viewer")
@click.option("--model", "model_source", default="smollm2", show_default=True, help="The model that reads the text.")
@click.option("--tokens", type=click.IntRange(min=2), multiple=True, default=(512, 1024, 4096), show_default=True,
              help="Lengths to measure (repeat the option).")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Page loads per length (the median is reported).")
@click.option("--budget-mb", type=float, default=None, help="The page's attention budget  [default: 80].")
@out_option("'bench:viewer' section")
@json_option
def viewer_command(model_source: str, tokens: tuple[int, ...], repeats: int, budget_mb: float | None,
                   out: str | None, as_json: bool) -> None:
    """The viewer at 512 to 4,096 tokens: the page's size, first paint, hover and tab times in Chromium."""
    from ..bench import viewer as vb

    start = time.perf_counter()
    result = vb.measure(tokens, repeats, model_source, budget_mb, log=lambda msg: click.echo(msg, err=True))
    text = vb.markdown(result, viewer_command_line(tokens, repeats, model_source, budget_mb, out))
    publish(result, text, as_json, out, "viewer", took=f" ({time.perf_counter() - start:.0f} s)")


@bench.command("memory")
@click.option("--model", "model_source", default="smollm2", show_default=True,
              help="What to load: a GGUF file or a checkpoint directory (a 16-bit one: loaded as stored).")
@click.option("--no-transformers", "no_transformers", is_flag=True, help="Leave transformers out (no torch needed).")
@out_option("'bench:memory' section (or 'bench:memory-MODEL')")
@json_option
def memory_command(model_source: str, no_transformers: bool, out: str | None, as_json: bool) -> None:
    """Seconds and peak memory of loading a model, qkv (stored, float32) beside transformers."""
    from ..bench import memory as mb

    start = time.perf_counter()
    result = mb.measure(model_source, not no_transformers, log=lambda msg: click.echo(msg, err=True))
    line = command_line("qkv bench memory", [("--model", model_source, "smollm2"),
                                             ("--no-transformers", no_transformers, False), ("--out", out, None)])
    section = "memory" + ("" if model_source == "smollm2" else "-" + section_name(model_source))
    publish(result, mb.markdown(result, line), as_json, out, section, took=f" ({time.perf_counter() - start:.0f} s)")


@bench.command("tune")
@json_option
def tune_command(as_json: bool) -> None:
    """Measure this machine's choices again (BLAS threads, attention workers and blocks; ≈1–3 s) and print them."""
    from ..runtime.tuning import describe, pinned, retune

    found, seconds = retune()
    pins = pinned()
    if as_json:
        click.echo(json.dumps({"choices": found.numbers(), "measured": seconds, "pinned": pins}, indent=2,
                              default=str))
        return
    click.echo(describe(found, seconds))
    if pins:
        click.echo(f"QKV_THREADS pins {', '.join(f'{k}={v}' for k, v in pins.items())} over these")


# `qkv bench all`: every benchmark, one after the other, each with options that keep the whole
# run near 15 minutes on a 2-core machine (attention up to n = 8192; generate and forward also
# on SmolLM2). Each rewrites its own section of --out.
ALL_ATTENTION_SIZES = (512, 1024, 2048, 4096, 8192)
ALL_ATTENTION_SECONDS = 60.0


def all_commands() -> list[tuple[str, object, dict]]:
    """(title, command, its options) of every benchmark `qkv bench all` runs, in order."""
    return [("tune", tune_command, {}),
            ("forward", forward, {}),
            ("forward --model smollm2", forward, {"model_source": "smollm2", "repeats": 5}),
            ("generate", generate_command, {}),
            ("generate --model smollm2", generate_command, {"model_sources": ("smollm2",)}),
            ("trace", trace_command, {}),
            ("memory", memory_command, {}),
            ("attention", attention_command, {"sizes": ALL_ATTENTION_SIZES, "max_seconds": ALL_ATTENTION_SECONDS}),
            ("sparse", sparse_command, {}),
            ("train", train_command, {}),
            ("heads", heads_bench, {}),
            ("patch", patch_command, {})]


@bench.command("all")
@out_option("sections")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Where attention draws its figure, e.g. docs/images/attention_scaling.png.")
@click.option("--skip", multiple=True, help="A benchmark to leave out (e.g. --skip patch); repeat for several.")
@click.pass_context
def all_command(ctx: click.Context, out: str | None, plot_path: str | None, skip: tuple[str, ...]) -> None:
    """Every benchmark in one go (≈15 minutes on 2 cores): tune, forward, generate, attention, sparse, train, heads,
    patch."""
    names = [title.split()[0] for title, _, _ in all_commands()]
    for s in skip:
        if s not in names:
            raise QkvError(f"--skip {s}: no such benchmark; choose from {', '.join(dict.fromkeys(names))}")
    start = time.perf_counter()
    for title, command, options in all_commands():
        if title.split()[0] in skip:
            continue
        click.echo(f"── qkv bench {title} ({time.perf_counter() - start:.0f} s so far)", err=True)
        extra = {"out": out} if title != "tune" else {}
        if title == "attention":
            extra["plot_path"] = plot_path
        ctx.invoke(command, **options, **extra)
    click.echo(f"every benchmark ran in {time.perf_counter() - start:.0f} s", err=True)
