"""`qkv heads`: what each head of a model does, for a few texts or a whole corpus."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import numpy as np
from rich.table import Table
from rich.text import Text

from .common import check_writable, new_console
from .options import READER, backend_option, global_tokens_option, model_option
from ..runtime.errors import QkvError
from ..runtime.io import write_atomic
from ..runtime.threads import check_count, cores
from ..viz.palette import ROLE_COLOURS
from ..analysis.backends import CHUNK
from ..analysis.detectors import top_heads
from ..analysis.corpus import SPLITS, open_corpus
from ..analysis.roles import BROAD, DOMINANT, INDUCTION, strength
from ..analysis.run import HeadReport, analyse
from ..analysis.seq2seq_heads import (KIND_TITLES, SEQ2SEQ_DESCRIPTIONS, Seq2SeqHeadReport, analyse_seq2seq,
                                      check_options)
from ..analysis.stats import DESCRIPTIONS, STATS

# the roles' colours of every view (viz.palette), bold where a head has one clear target
ROLE_STYLES = {role: ("" if role in ("broad", "mixed") else "bold ") + colour for role, colour in ROLE_COLOURS.items()}
SHORT = {"previous": "prev", "punctuation": "punct", "induction": "induct"}
CHECKPOINT_NAME = "heads-checkpoint.npz"


def roles_table(report: HeadReport) -> Table:
    """Rows = layers, columns = heads; each cell the head's role and the number behind it."""
    table = Table(title=f"{report.model}: what each head does (role, and the share of attention behind it)",
                  title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("layer", justify="right", style="grey50")
    for h in range(report.heads):
        table.add_column(f"h{h}", no_wrap=True)
    for i, row in enumerate(report.roles):
        cells = [Text(str(i))]
        for h, role in enumerate(row):
            value = strength(role, i, h, report.stats, report.uniform_entropy, report.detectors["induction"])
            label = SHORT.get(role, role) + ("" if value is None or role == "mixed" else " " + _num(value))
            cells.append(Text(label, style=ROLE_STYLES[role]))
        table.add_row(*cells)
    return table


def _num(value: float) -> str:
    """0.93 → ".93", 1.0 → "1.00": two decimals in four characters."""
    text = f"{value:.2f}"
    return text[1:] if text.startswith("0.") else text


def stat_table(report: HeadReport, name: str) -> Table:
    """One statistic as numbers, rows = layers, columns = heads."""
    values = report.stats[name]
    table = Table(title=f"{name}: {DESCRIPTIONS[name]}" + (" (nats)" if name == "entropy" else ""),
                  title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("layer", justify="right", style="grey50")
    for h in range(report.heads):
        table.add_column(f"h{h}", justify="right", no_wrap=True)
    top = float(np.max(values)) or 1.0
    for i in range(report.layers):
        table.add_row(Text(str(i)), *[Text(f"{v:.2f}", style="bold bright_white" if v >= 0.5 * top else "grey62")
                                      for v in values[i]])
    return table


def legend(report: HeadReport) -> list[Text]:
    lines = [Text(f"Roles: previous / next / self / [CLS] / [SEP] / punct / first = more than {DOMINANT:.0%} of each "
                  f"token's attention, on average, goes there (first: the first position, the sink of decoders "
                  f"without a [CLS]); broad = entropy ≥ {BROAD:.0%} of evenly spread "
                  f"attention (number: that ratio); induction = induction score ≥ {INDUCTION} on repeated random "
                  "tokens; mixed = none of these.")]
    for name, why in report.not_applicable.items():
        lines.append(Text(f"{name}: not applicable ({why})."))
    return lines


DETECTOR_TEXTS = {
    "previous_token": "previous-token (your texts)",
    "duplicate_token": "duplicate-token (your texts)",
    "induction": "induction (repeated random tokens)",
    "duplicate_token_repeated": "duplicate-token (repeated random tokens)",
}


def detector_lines(report: HeadReport, k: int = 3) -> list[Text]:
    """For each detector, its k best heads: "L16 h0 .69"."""
    lines = [Text("Detectors (TransformerLens's score Σ(A⊙P)/ΣA), best heads:")]
    for name, what in DETECTOR_TEXTS.items():
        scores = report.detectors.get(name)
        best = "no repeated token in the texts" if scores is None else ", ".join(
            f"L{layer} h{head} {_num(value)}" for layer, head, value in top_heads(scores, k))
        lines.append(Text(f"  {what}: {best}"))
    return lines


def warn_failures(report: HeadReport, limit: int = 10) -> None:
    for f in report.failures[:limit]:
        where = f"text {f.index}" + (f" (line {f.line})" if f.line is not None else "")
        click.echo(f"qkv: warning: {where} skipped: {f.error}", err=True)
    if len(report.failures) > limit:
        click.echo(f"qkv: warning: {len(report.failures) - limit} more texts skipped (see 'failed' in --json)",
                   err=True)


@click.command()
@click.argument("texts", nargs=-1, metavar="[TEXT]...")
@model_option(READER)
@click.option("--file", "corpus_path", default=None, metavar="CORPUS",
              help="A UTF-8 text file: one text per line (or per paragraph with --split paragraph).")
@click.option("--split", type=click.Choice(SPLITS), default="line", show_default=True,
              help="How --file is cut into texts.")
@click.option("--window", type=int, default=None,
              help="Longest window in tokens (default: the model's context); longer texts are cut.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (L × H lists) instead of tables.")
@click.option("--stat", "show", multiple=True, metavar="NAME",
              help=f"Also print this statistic's L × H numbers ({', '.join(STATS)}); repeatable.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write heads.json, a layer × head map per statistic (PNG, SVG) and the viewer here.")
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
              help=f"Save progress here and continue from it (default with --file and --out: OUT/{CHECKPOINT_NAME}).")
@backend_option("local: this machine's cores; ray: a Ray cluster.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes (local) or actors (ray). Default: every core for a corpus, 1 for a few texts; "
                   "ray: every CPU of the cluster.")
@click.option("--address", default=None, help="Ray cluster to join (default: start Ray on this machine).")
@global_tokens_option()
def heads(texts: tuple[str, ...], source: str, corpus_path: str | None, split: str, window: int | None,
          as_json: bool, show: tuple[str, ...], out_dir: str | None, checkpoint: str | None, backend: str,
          workers: int | None, address: str | None) -> None:
    """What each head does: attention to the previous / next token, [CLS], [SEP], punctuation, …

    Give TEXT(s), or a corpus with --file. Each text counts equally in the averages.
    """
    from .common import load_model as load
    from ..analysis.text import prepare

    unknown = [s for s in show if s not in STATS]
    if unknown:
        raise QkvError(f"unknown statistic {unknown[0]!r}; choose from {', '.join(STATS)}")
    if bool(texts) == bool(corpus_path):
        raise QkvError("give either TEXT(s) or --file CORPUS (not both, not neither); see qkv heads --help")
    if address and backend != "ray":
        raise QkvError("--address is for the Ray backend; add --backend ray")
    check_count("--workers", workers, here=not address)
    for t in texts:
        if not t.strip():
            raise QkvError("the text is empty; give some words to look at")
    made_out = out_dir is not None and not os.path.lexists(out_dir)      # this run creates it
    asked_checkpoint = checkpoint
    if out_dir is not None:
        check_writable(out_dir)
        if checkpoint is None and corpus_path is not None:
            checkpoint = str(Path(out_dir) / CHECKPOINT_NAME)
    if checkpoint is not None:
        check_writable(str(Path(checkpoint).resolve().parent))
    corpus = open_corpus(corpus_path, split) if corpus_path else None
    model = load(source)
    if model.config.encoder_decoder:                   # three kinds of attention, one table each
        try:
            check_options(window, backend, workers, asked_checkpoint)
            report = analyse_seq2seq(model, corpus or list(texts))
        except QkvError:
            if made_out:
                _remove_made_out(Path(out_dir), checkpoint)
            raise
        _show_seq2seq(report, out_dir, as_json)
        return
    lacking = prepare(model, window).not_applicable
    for name in show:
        if name in lacking:
            raise QkvError(f"'{name}' does not apply to {model.name}: {lacking[name]}; choose another statistic")
    if workers is None and backend == "local":
        workers = cores() if corpus is not None and corpus.count >= 4 * CHUNK else 1
    try:
        report = _run(model, corpus or list(texts), window, backend, workers, address, checkpoint)
        warn_failures(report)
        if out_dir is not None:
            _write_out(report, Path(out_dir), model, texts[0] if texts else _first_text(corpus))
    except QkvError:
        if made_out:                                   # a failed run leaves no folder of its own behind
            _remove_made_out(Path(out_dir), checkpoint)
        raise
    if as_json:
        click.echo(json.dumps(report.to_json()))
        return
    console = new_console()
    console.print(Text(f"{report.model}: {report.layers} layers × {report.heads} heads, {report.texts} text"
                       f"{'s' if report.texts != 1 else ''}, {report.tokens} tokens"
                       + (f" in {report.windows} windows" if report.windows != report.texts else "")))
    console.print(roles_table(report))
    for line in legend(report) + detector_lines(report):
        console.print(line)
    for name in show:
        console.print(stat_table(report, name))


def _show_seq2seq(report: Seq2SeqHeadReport, out_dir: str | None, as_json: bool) -> None:
    """An encoder–decoder's report: heads.json in OUT, then JSON or one table per kind of attention."""
    warn_failures(report)
    if out_dir is not None:
        write_atomic(Path(out_dir) / "heads.json", lambda f: f.write(json.dumps(report.to_json(), indent=1).encode()))
        click.echo(f"wrote 1 file to {out_dir}", err=True)
    if as_json:
        click.echo(json.dumps(report.to_json()))
        return
    console = new_console()
    shown = "; ".join(repr(t) for t in report.translations[:3]) + (" …" if len(report.translations) > 3 else "")
    console.print(Text(f"{report.model}: encoder–decoder, {report.texts} text{'s' if report.texts != 1 else ''}, "
                       f"each translated greedily: {shown}"))
    for kind in report.kinds.values():
        console.print(Text(f"{KIND_TITLES[kind.kind]}, {kind.layers} layers × {kind.heads} heads", style="bold"))
        console.print(kind_table(kind))
        reasons: dict[str, list[str]] = {}
        for name, why in kind.not_applicable.items():
            reasons.setdefault(why, []).append(name)
        lacking = "; ".join(f"{', '.join(names)}: {why}" for why, names in reasons.items())
        console.print(Text(f"Entropy of evenly spread attention: {kind.uniform_entropy:.2f} nats"
                           + (f". Not applicable — {lacking}." if lacking else ".")))
    console.print(Text("; ".join(f"{name} = {what}" for name, what in
                                 {**DESCRIPTIONS, **SEQ2SEQ_DESCRIPTIONS}.items() if name not in ("cls", "sep"))
                       + " (averaged over each row, then over texts)."))


def kind_table(kind) -> Table:
    """One kind of attention (a seq2seq_heads.KindReport): rows = layer × head, columns = its statistics."""
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("layer", justify="right", style="grey50")
    table.add_column("head", justify="right", style="grey50")
    for name in kind.stats:
        table.add_column(name, justify="right", no_wrap=True)
    for i in range(kind.layers):
        for h in range(kind.heads):
            cells = []
            for name, values in kind.stats.items():
                v = float(values[i, h])
                strong = name != "entropy" and v >= 0.5
                cells.append(Text(f"{v:.2f}", style="bold bright_white" if strong else "grey62"))
            table.add_row(Text(str(i) if h == 0 else ""), Text(f"h{h}"), *cells)
    return table


def _remove_made_out(out: Path, checkpoint: str | None) -> None:
    """Undo what a failed run wrote into the OUT folder it created: its checkpoint, then the folder
    if nothing else is in it (an interrupted run keeps its checkpoint, to be resumed)."""
    if checkpoint is not None and Path(checkpoint).parent == out:
        Path(checkpoint).unlink(missing_ok=True)
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()


def _run(model, texts, window, backend, workers, address, checkpoint) -> HeadReport:
    """analyse(), with a progress bar on stderr for corpora."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    if isinstance(texts, list):
        return analyse(model, texts, window=window, backend=backend, workers=workers, address=address,
                       checkpoint=checkpoint)
    columns = (TextColumn("texts"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    try:
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("texts", total=texts.count)
            return analyse(model, texts, window=window, backend=backend, workers=workers, address=address,
                           checkpoint=checkpoint, progress=lambda k: bar.advance(task, k))
    except KeyboardInterrupt:
        if checkpoint is not None:
            click.echo(f"qkv: progress saved in {checkpoint}; run the same command again to continue", err=True)
        raise


def _first_text(corpus) -> str | None:
    for _, _, text in corpus.texts():
        return text
    return None


def _write_out(report: HeadReport, out: Path, model, text: str | None) -> None:
    """heads.json, the figures, and the viewer of the first text with heads coloured by role."""
    from ..viz.html import save_viewer
    from ..analysis.corpus import template_of, windows
    from ..viz.head_maps import save_head_maps

    write_atomic(out / "heads.json", lambda f: f.write(json.dumps(report.to_json(), indent=1).encode()))
    written = save_head_maps(report, out, DESCRIPTIONS)
    if text is not None:
        ids, _ = model.tokenizer.encode(text)
        first = windows(ids, model.config.max_positions, template_of(model.tokenizer))[0]
        trace = model.run(first, keep=("attentions",))
        written.append(save_viewer(trace, out / "viewer.html", roles=report.roles))
    click.echo(f"wrote {len(written) + 1} files to {out}", err=True)
