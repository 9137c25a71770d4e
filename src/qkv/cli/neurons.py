"""`qkv neurons`: a layer's FFN neurons as key–value memories (README, "FFN neurons: key–value memories").
Registered in qkv.cli.app beside the other commands beyond attention weights; computes with
qkv.analysis.neurons and draws with qkv.viz.neuron_figures."""

from __future__ import annotations

import json

import click
from rich.table import Table
from rich.text import Text

from .common import check_writable, new_console, progress_bar, removed_if_failed, status
from .options import WRITER, global_tokens_option, model_option, renamed, text_argument
from ..runtime.errors import QkvError
from ..core.labels import shorten


def index_list(flag: str, value: str | None, example: str = "12,40") -> list[int] | None:
    """FLAG's value "12,40" → [12, 40], or one clear error: not integers, empty, or negative (an index
    counts from 0; -1 does not mean the last here). Whoever uses them checks that they exist."""
    if value is None:
        return None
    items = [i.strip() for i in value.split(",") if i.strip()]
    first = example.split(",")[0]
    try:
        out = [int(i) for i in items]
    except ValueError:
        raise QkvError(f"{flag} {value!r} is not a list of indices; give e.g. {flag} {first} or "
                       f"{flag} {example}") from None
    if not out:
        raise QkvError(f"{flag} is empty; give one index or several, e.g. {flag} {example}")
    negative = [i for i in out if i < 0]
    if negative:
        raise QkvError(f"{flag} {negative[0]} is negative; indices count from 0 (give e.g. {flag} {first})")
    return out


def neuron_list(value: str | None) -> list[int] | None:
    """--neuron 12,40 → [12, 40], or one clear error (the layer checks that they exist)."""
    return index_list("--neuron", value)


@click.command(name="neurons", epilog="TEXT: choose the --top neurons most active on it (largest max over its "
                                      "tokens); with --neuron, also report their max on it.")
@text_argument(required=False)
@renamed("--text", "TEXT", "text")
@click.option("--layer", type=int, required=True, help="Layer whose FFN to read (negative counts from the end).")
@model_option(WRITER)
@click.option("--file", "corpus_path", default=None, metavar="CORPUS",
              help="A UTF-8 text file, one text per line, whose contexts activate the neurons. "
                   "Default: docs/heads-corpus.txt of qkv's source tree.")
@click.option("--neuron", "neuron", default=None, metavar="I[,J…]", help="These neurons (0..d_ff-1) instead.")
@click.option("--top", type=click.IntRange(1, 100), default=5, show_default=True,
              help="How many neurons to choose (without --neuron).")
@click.option("--contexts", type=click.IntRange(1, 100), default=10, show_default=True,
              help="Top-activating contexts to keep per neuron.")
@click.option("--window", type=click.IntRange(0, 64), default=8, show_default=True,
              help="Tokens of context kept on each side of the activating token.")
@click.option("--tokens", type=click.IntRange(1, 100), default=10, show_default=True,
              help="Promoted and suppressed tokens to list per neuron.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the tables.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write neurons.json, the figure (neurons.png, .svg) and the neuron page (neurons.html) here.")
@global_tokens_option()
def neurons_cmd(text: str | None, layer: int, source: str, corpus_path: str | None, neuron: str | None, top: int,
                contexts: int, window: int, tokens: int, as_json: bool, out_dir: str | None) -> None:
    """FFN neurons as key–value memories (Geva et al. 2021): for LAYER's neurons (the --top of largest
    activation over the corpus, or on TEXT, or --neuron), the corpus contexts that activate each most,
    and the tokens its output vector W_out[i] promotes and suppresses through the final norm's scale and
    W_vocab, as the logit lens reads the stream."""
    from ..analysis.corpus import open_corpus
    from ..analysis.neurons import check_layer, default_corpus, neurons
    from .common import load_model as load

    given = neuron_list(neuron)
    corpus = open_corpus(corpus_path) if corpus_path is not None else None      # a bad file fails first
    if corpus is None:
        default_corpus()                                                        # or says to give --file
    model = load(source)
    check_layer(model, layer)
    if text is not None:
        model.encode(text)                                                    # an empty text fails before DIR is touched
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        counted = corpus is not None and corpus.count >= 200                  # a bar for a corpus, else a status
        with (progress_bar("read", "texts") if counted else status(f"computing layer {layer}'s neurons …")) as progress:
            report = neurons(model, layer, texts=corpus, text=text, top=top, neuron=given, contexts=contexts,
                             window=window, tokens=tokens, progress=progress)
        if as_json:
            click.echo(json.dumps(report.as_json(), ensure_ascii=False))
        else:
            _print(report)
        for index, error in report.skipped[:5]:
            click.echo(f"qkv: warning: text {index} skipped: {error}", err=True)
        if out_dir is not None:
            from ..viz.neuron_figures import save_neurons

            with status(f"writing figures to {out_dir} …"):
                paths = save_neurons(report, out_dir)
            if not as_json:
                for path in paths:
                    click.echo(f"wrote {path}")


def _print(report) -> None:
    """Per neuron: its statistics, its top contexts (the activating token in brackets), its value's tokens."""
    console = new_console()
    console.print(Text(f"{report.model} layer {report.layer}: {report.d_ff} FFN neurons ({report.activation}); "
                       f"{report.chosen}; contexts from {report.corpus} ({report.texts:,} texts, "
                       f"{report.tokens:,} tokens)"))
    if report.vocab:
        console.print(Text(report.vocab, style="grey50"))
    for n in report.neurons:
        head = f"neuron {n.index}: max {n.max:.3f}, mean {n.mean:.4f}, min {n.min:.3f}, h > 0 on {n.positive:.0%} of tokens"
        if n.on_text is not None:
            head += f", max on TEXT {n.on_text:.3f}"
        table = Table(title=head, title_justify="left", show_edge=False, pad_edge=False)
        for name, justify in (("h", "right"), ("text", "right"), ("context", "left")):
            table.add_column(name, justify=justify)
        for e in n.examples:
            line = Text()
            for i, t in enumerate(e.tokens):
                line.append((report.sep if i else "") + (f"[{t}]" if i == e.at else t),
                            style="bold red" if i == e.at else "")
            table.add_row(f"{e.activation:.3f}", str(e.text), line)
        console.print(table)
        if n.promotes:
            console.print(Text("  promotes:   " + "  ".join(f"{shorten(t, 14)} {v:+.2f}" for _, t, v in n.promotes),
                               style="red"))
            console.print(Text("  suppresses: " + "  ".join(f"{shorten(t, 14)} {v:+.2f}" for _, t, v in n.suppresses),
                               style="blue"))
