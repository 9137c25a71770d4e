"""`qkv trace-fact`: causal tracing of where a decoder recalls a fact (qkv.analysis.causal_trace; README,
"Where a fact is recalled"). Registered in qkv.cli.app; draws with qkv.viz.causal_figures and writes the
viewer's "causal_trace" panel (viz.interpret_payload.causal_section) beside the figure."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from .common import MODEL_HELP, SEED, check_writable, new_console, progress_bar, removed_if_failed
from .options import WRITER, model_option, text_argument, token_option

KIND_NAMES = {"hidden": "hidden state (block output)", "ffn": "FFN outputs (window)", "attn": "attention outputs (window)"}


@click.command(name="trace-fact")
@text_argument()
@click.option("--subject", required=True, help="The words of TEXT that name the subject (e.g. 'Eiffel Tower'): "
                                                "their token embeddings get the noise.")
@model_option(WRITER, "A decoder. " + MODEL_HELP)
@token_option("The next token to trace (one token, e.g. ' Paris'). Default: the model's top-1 next token.",
              was="--answer")
@click.option("--draws", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Noise draws, averaged (each a batch row).")
@click.option("--noise", type=click.FloatRange(0, None, min_open=True), default=3.0, show_default=True,
              help="The noise's σ in standard deviations of the embedding table's entries.")
@click.option("--window", type=click.IntRange(1, None), default=10, show_default=True,
              help="Layers restored at once in the FFN and attention maps (the paper's 10).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the noise.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the three heatmaps (trace_fact.png, .svg), trace_fact.json and the viewer with "
                   "its causal-tracing panel open (trace_fact.html) into this directory.")
def trace_fact_cmd(text: str, subject: str, source: str, token: str | None, draws: int, noise: float, window: int,
                   seed: int, as_json: bool, out_dir: str | None) -> None:
    """Causal tracing (Meng et al. 2022): corrupt SUBJECT's token embeddings with Gaussian noise, then restore
    one clean state at a time — each layer's output at each token, and windows of FFN and attention outputs —
    and measure how much of P(token) comes back (the indirect effect)."""
    import json

    from ..analysis.attribution import token_id
    from ..analysis.causal_trace import KINDS, check_traceable, subject_span, trace_fact
    from .common import load_model as load

    model = load(source)
    check_traceable(model)                                         # bad input fails before DIR is touched
    model.encode(text)
    subject_span(model, text, subject)
    if token is not None:
        token_id(model, token)
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        with progress_bar("restored", "states") as progress:
            r = trace_fact(model, text, subject, token, draws=draws, noise=noise, window=window, seed=seed,
                           progress=progress)
        data = r.as_json()
        if as_json:
            click.echo(json.dumps(data, ensure_ascii=False))
        else:
            console = new_console()
            s, e = r.subject_span
            console.print(Text(f"{model.name}: P({r.answer_token}) = {r.p_clean:.3f} clean, {r.p_corrupted:.3f} with "
                               f"the subject {' '.join(r.tokens[s:e])} noised (σ = {r.noise:.3g}, {r.draws} draws); "
                               f"{r.runs} restored states in {r.passes} batched passes, {r.seconds:.1f} s"))
            table = Table(show_edge=False, pad_edge=False)
            for name, justify in (("restored", "left"), ("largest effect", "right"), ("at", "left"),
                                  ("at the last subject token", "right"), ("layer", "right")):
                table.add_column(name, justify=justify)
            for kind in KINDS:
                layer, t, effect = r.peak(kind)
                at_layer, _, at_effect = r.peak(kind, e - 1)
                table.add_row(KIND_NAMES[kind], f"{effect:+.3f}", f"layer {layer}, {r.tokens[t]}",
                              f"{at_effect:+.3f}", str(at_layer))
            console.print(table)
        if out_dir is not None:
            _write(model, r, data, out_dir, quiet=as_json)


def _write(model, r, data: dict, out_dir: str, quiet: bool) -> None:
    """trace_fact.json, .png, .svg and .html into OUT_DIR, all or none."""
    import json

    from ..runtime.io import FileBatch
    from ..viz.causal_figures import causal_trace_figure
    from ..viz.drawing import save_all
    from ..viz.html import viewer_html
    from ..viz.interpret_payload import causal_section

    page = viewer_html(model.run(r.text, keep=("attentions",)), sections={"causal_trace": causal_section(data)},
                       view="causal_trace")
    with FileBatch(out_dir) as batch:
        paths = [batch.write_text("trace_fact.json", json.dumps(data, ensure_ascii=False, indent=1)),
                 batch.write_text("trace_fact.html", page)]
        paths += save_all(batch, [("trace_fact", lambda: causal_trace_figure(data))], ("png", "svg"))
    if not quiet:
        for path in paths:
            click.echo(f"wrote {path}")
