"""`qkv train`: train a small transformer in NumPy and watch it learn (registered in qkv.cli.app).

    qkv train --task induction --out DIR     induction heads forming on repeated random tokens
    qkv train --text FILE --out DIR          a small language model on any UTF-8 text

Running the same command again on the same DIR continues from its last checkpoint. Options
left out are then taken from the run; options given must agree with it (else one line, exit 2).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from .common import SEED, new_console
from ..runtime.errors import QkvError

SMALL = 256                 # d_model up to which training runs on one BLAS thread (see `train`)

# option name → (type, help); None = the task's default (qkv.train.tasks.DEFAULTS / Settings)
SETTINGS = {
    "steps": (int, "Optimiser steps [induction 2000, text 1000]."),
    "seed": (SEED, "Seed of the initial weights and of every batch [0]."),
    "batch": (int, "Sequences per step [induction 32, text 16]."),
    "lr": (float, "Peak learning rate of AdamW [1e-3]."),
    "min_lr": (float, "Learning rate at the end of the cosine schedule [1e-4]."),
    "warmup": (int, "Steps of linear warm-up [100, at most a tenth of --steps]."),
    "weight_decay": (float, "AdamW's decoupled weight decay, not on biases and norms [induction 0.01, text 0.1]."),
    "clip": (float, "Largest global gradient norm [1.0]."),
    "every": (int, "Record (induction: losses and head scores; text: held-out loss and a sample) every K "
                   "steps [induction 50, text 200]."),
    "checkpoint_every": (int, "Save a checkpoint every N steps [induction 250, text 200]."),
    "layers": (int, "Layers L [induction 2, text 4]."),
    "heads": (int, "Heads H per layer [4]."),
    "d_model": (int, "Width d_model [induction 64, text 128]."),
    "vocab": (int, "Induction: token ids 1..V-1 are drawn, 0 is [BOS] [64]."),
    "half": (int, "Induction: at most this many random tokens before they repeat [32]."),
    "min_half": (int, "Induction: at least this many (each step draws a length between) [16]."),
    "tokenizer": (str, "Text: char (one token a character) or bpe (byte-level BPE learned from the text) [char]."),
    "vocab_size": (int, "Text with --tokenizer bpe: the vocabulary to learn [512]."),
    "arch": (str, "gpt2 (LayerNorm, learned positions, GELU) or llama (RMSNorm, RoPE, SwiGLU) "
                  "[induction llama, text gpt2]."),
    "context": (int, "Text: tokens per training sequence, the model's context [128]."),
}


def _options(command):
    for name, (kind, text) in reversed(SETTINGS.items()):
        command = click.option(f"--{name.replace('_', '-')}", name, type=kind, default=None, help=text)(command)
    return command


@click.command(name="train")
@click.option("--task", default=None, help="induction: an attention-only model on random tokens repeated twice; "
                                            "translate-ko-en: the guide's Korean→English example; digits: a Vision "
                                            "Transformer on handwritten digits; speech: a tiny Whisper on digits "
                                            "spoken by espeak-ng (or give --text FILE).")
@click.option("--text", "text", default=None, metavar="FILE", help="Learn this UTF-8 text (any language).")
@click.option("--out", "out", default=None, metavar="DIR",
              help="The run's directory: log, figures, checkpoints, the model. Give it again to continue.")
@click.option("--threads", type=int, default=None, help=f"BLAS threads [1 up to d_model {SMALL}, else every core].")
@_options
def train(task: str | None, text: str | None, out: str | None, threads: int | None, **options) -> None:
    """Train a small transformer in NumPy, with a progress bar, a log, figures and checkpoints.

    --task induction: watch induction heads form (DIR/induction.png, the viewer before and after).
    --text FILE: a small language model that prints samples as it learns; DIR/model is an ordinary
    checkpoint (`qkv generate --model DIR/model`, `qkv show --model DIR/model`).
    Ctrl-C saves a checkpoint; the same command continues the run.
    """
    from ..runtime.threads import blas_threads, cores
    from ..train.loop import Interrupted, open_run

    if out is None:
        raise QkvError("give --out DIR, the directory of the run (a new one, or a run to continue)")
    if task is not None and text is not None:
        raise QkvError("give --task induction or --text FILE, not both")
    if text is not None:
        task, options["text"] = "text", text
    from ..runtime.threads import check_count

    check_count("--threads", threads)
    given = {k: v for k, v in options.items() if v is not None}
    run = open_run(out, task, given)
    _start(run)
    # Small models: one BLAS thread. Their products are too small to split, and on a shared machine
    # a second thread made a step of the induction model 13× slower (measured); bigger ones use every core.
    with blas_threads(threads or (1 if run.config.d_model <= SMALL else cores())):
        try:
            took = _train(run)
        except Interrupted as e:
            click.echo(f"qkv: interrupted at step {e.step}; saved {e.checkpoint}; run the same command again to "
                       "continue", err=True)
            sys.exit(130)
        written = run.finish()
    _summary(run, took, written)


def _start(run) -> None:
    """What is about to happen: the model, the data, fresh or resumed."""
    s, c = run.settings, run.config
    ffn = "attention-only" if c.d_ff == 0 else f"d_ff {c.d_ff}"
    click.echo(f"qkv train {s.task}: {c.family} {c.n_layers} layers × {c.n_heads} heads, d_model {c.d_model}, "
               f"{ffn}, {run.n_params():,} parameters; {run.task.describe()}")
    click.echo(f"{s.steps} steps of {s.batch} sequences, AdamW lr {s.lr:g} (warm-up {s.warmup}, cosine to "
               f"{s.min_lr:g}), seed {s.seed} → {run.out}")
    if run.resumed_from is not None:
        done = " (complete)" if run.step >= s.steps else ""
        click.echo(f"resuming from step {run.step} of {s.steps}{done}: {run.resumed_from}")


def _train(run) -> float:
    """Run.train under a progress bar; records printed as they come. Returns the seconds.

    On a terminal the bar and the records share stdout and rich prints each record above the bar (two
    streams writing to one terminal would run into each other's lines); with stdout piped or redirected,
    records go there as plain lines and the bar to stderr."""
    import sys

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("step"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[speed]} tokens/s"),
               TimeRemainingColumn())
    t0 = time.perf_counter()
    shared = sys.stdout.isatty()
    with Progress(*columns, console=Console(stderr=not shared), transient=True) as bar:
        job = bar.add_task("train", total=run.settings.steps, completed=run.step, loss="…", speed="…")

        def on_step(e: dict) -> None:
            bar.update(job, completed=e["step"], loss=f"{e['loss']:.3f}", speed=f"{e['tokens_per_s']:,.0f}")

        def on_record(e: dict) -> None:
            if shared:
                bar.console.print(record_line(e), markup=False, highlight=False, soft_wrap=True)   # above the bar
            else:
                click.echo(record_line(e))

        run.train(on_step, on_record)
    return time.perf_counter() - t0


def record_line(e: dict) -> str:
    """One line for a record of the log: the task's numbers at that step."""
    parts = [f"step {e['step']:>6}"]
    if "loss" in e:
        parts.append(f"loss {e['loss']:.3f}")
    if "induction" in e:
        import numpy as np

        from ..analysis.detectors import top_heads

        (layer, head, score), = top_heads(np.asarray(e["induction"]), 1)
        parts.append(f"repeated half {e['loss_repeated']:.3f}, first half {e['loss_first']:.3f}; "
                     f"best induction head L{layer} h{head} {score:.2f}")
    if "exact" in e:
        parts.append(f"held-out: exact {e['exact']:.1%}, cross-attention alignment {e['alignment']:.1%}")
    if "accuracy" in e:
        parts.append(f"held-out accuracy {e['accuracy']:.1%}")
    if "word_accuracy" in e:
        parts.append(f"words {e['word_accuracy']:.1%}")
    if "val_loss" in e:
        parts.append(f"held-out {e['val_loss']:.3f}")
    line = "  ".join(parts)
    if "sample" in e:
        line += "\n  " + e["sample"].replace("\n", "\n  ")
    return line


def _summary(run, took: float, written: list[Path]) -> None:
    """How it went, where the files are, and what to run next."""
    s = run.settings
    console = new_console()
    trained = [e for e in run.log if "loss" in e]
    if trained:
        console.print(f"{s.steps} steps; loss {trained[0]['loss']:.3f} → {trained[-1]['loss']:.3f}"
                      + (f"; this session {took:.1f} s" if run.step > run.start_step else ""), highlight=False)
    crossed = next((e for e in run.log if e.get("induction_best", 0) >= 0.5), None)
    if s.task == "induction":
        console.print(f"an induction head (score ≥ 0.5) formed at step {crossed['step']}, after "
                      f"{crossed.get('seconds', 0):.1f} s of training" if crossed
                      else "no head reached an induction score of 0.5; train longer (--steps) or with a higher --lr",
                      highlight=False)
    click.echo(f"wrote {len(written)} files to {run.out}:")
    for f in written:
        click.echo(f"  {f}")
    model = run.out / "model"
    if s.task == "translate-ko-en":
        click.echo(f"try: qkv translate \"나는 학교에 간다\" --model {model}")
        return
    if s.task == "digits":
        click.echo(f"try: qkv show IMAGE.png --model {model} --out DIR   (a digit, dark ink on white)")
        return
    if s.task == "speech":
        click.echo(f"try: qkv transcribe FILE.wav --model {model} --words   (a few spoken digits; examples in "
                   f"{run.out / 'examples'})")
        return
    click.echo(f"open {run.out / 'before.html'} and {run.out / 'after.html'} in a browser to see the heads "
               "before and after" if s.task == "induction"
               else f"try: qkv generate --model {model} \"{_prompt(run)}\"")


def _prompt(run) -> str:
    text = " ".join(run.task.tokenizer.decode(run.task.prompt_ids()).replace('"', "").split())
    return (text.rsplit(" ", 1)[0] if " " in text else text) or "a"           # whole words
