"""`qkv bench ...`: the benchmark commands (registered in qkv.cli with `cli.add_command(bench)`).

Importing this module does not import torch or transformers; each command does, and says
how to install them when they are missing (one line, via QkvError).
"""

from __future__ import annotations

import json

import click

from . import forward as fwd
from .common import write_section


@click.group()
def bench() -> None:
    """Time qkv against transformers (needs torch and transformers: `make bench`)."""


def forward_command(tokens: tuple[int, ...], repeats: int, eager: bool, out: str | None) -> str:
    """The command line that reproduces a run with these options (written into the docs)."""
    parts = ["qkv bench forward"]
    if tuple(tokens) != fwd.TOKENS:
        parts += [f"--tokens {n}" for n in tokens]
    if repeats != fwd.REPEATS:
        parts.append(f"--repeats {repeats}")
    if not eager:
        parts.append("--no-eager")
    if out:
        parts.append(f"--out {out}")
    return " ".join(parts)


@bench.command()
@click.option("--tokens", type=int, multiple=True, default=fwd.TOKENS, show_default=True,
              help="Prompt length(s) to prefill; repeat the option for several.")
@click.option("--repeats", type=click.IntRange(min=1), default=fwd.REPEATS, show_default=True,
              help="Timed rounds per length (the median is reported), after one warm-up.")
@click.option("--eager/--no-eager", default=True, show_default=True,
              help="Also time transformers with eager attention.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Markdown file whose 'bench:forward' section to (re)write, e.g. docs/benchmarks.md.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of markdown.")
def forward(tokens: tuple[int, ...], repeats: int, eager: bool, out: str | None, as_json: bool) -> None:
    """Prefill of a random GPT-2-small: qkv's time over transformers', same run, same weights."""
    result = fwd.measure(tokens=tokens, repeats=repeats, eager=eager)
    text = fwd.markdown(result, command=forward_command(tokens, repeats, eager, out))
    click.echo(json.dumps(result, indent=2) if as_json else text)
    if out:
        write_section(out, "forward", text)
        click.echo(f"wrote the forward section of {out}", err=True)


@bench.command(name="heads")
@click.option("--sentences", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Size of the synthetic English corpus.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes / Ray actors for the parallel runs [default: every core].")
@click.option("--ray/--no-ray", "use_ray", default=True, show_default=True, help="Also time the Ray backend.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Markdown file whose 'bench:heads' section to (re)write, e.g. docs/benchmarks.md.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of markdown.")
def heads_bench(sentences: int, workers: int | None, use_ray: bool, out: str | None, as_json: bool) -> None:
    """Texts per second of `qkv heads` on the default model: one process, local cores, Ray (no torch needed)."""
    from . import heads as hb

    result = hb.measure(sentences=sentences, workers=workers, ray=use_ray)
    command = hb.COMMAND if (sentences, workers, use_ray) == (hb.SENTENCES, None, True) else " ".join(
        ["qkv bench heads", f"--sentences {sentences}"] + ([f"--workers {workers}"] if workers else [])
        + ([] if use_ray else ["--no-ray"]) + ([f"--out {out}"] if out else []))
    text = hb.markdown(result, command=command)
    click.echo(json.dumps(result, indent=2) if as_json else text)
    if out:
        write_section(out, "heads", text)
        click.echo(f"wrote the heads section of {out}", err=True)


from .attention import attention_command  # noqa: E402
from .generate import generate_command  # noqa: E402

bench.add_command(attention_command)
bench.add_command(generate_command)
