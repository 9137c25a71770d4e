"""The commands that look beyond attention weights at what a text's stream and a head's weights hold: `qkv lens`,
`rollout`, `circuits` (README, "Beyond attention weights"). Registered in qkv.cli.app with `cli.add_command`; each
reads a model, computes with qkv.analysis, draws with qkv.viz.interpret_figures and writes the figure with
`cli_common.write_figure`; lens and rollout also write a viewer page beside it (lens.html, rollout.html: the
attention viewer of the text with that command's panel opened first, its section from qkv.analysis.sections or
viz.interpret_payload). The commands that explain one token (`dla`, `attribute`, `patch`) are cli/attribution.py's,
`qkv trace-fact` cli/causal.py's, `qkv neurons` cli/neurons.py's."""

from __future__ import annotations

import click
import numpy as np
from rich.table import Table
from rich.text import Text

from .common import as_decoder, check_writable, new_console, removed_if_failed, status, write_figure
from .options import READER, WRITER, global_tokens_option, model_option, prefix_option, renamed, text_argument


@click.command(name="lens")
@text_argument()
@model_option(WRITER, "A decoder: 'smollm2', a .gguf file, or a local Hugging Face directory; or an "
                   "encoder–decoder (ko-en-tiny): the lens of its decoder.")
@click.option("--top", type=click.IntRange(1, 20), default=3, show_default=True,
              help="How many tokens to list per layer.")
@prefix_option("Default: the model's own translation.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the layers × positions map (lens.png, .svg) and the viewer with its logit-lens "
                   "panel open (lens.html) into this directory.")
@click.option("--tuned", "tuned_dir", default=None, metavar="DIR",
              help="A tuned lens (qkv tuned-lens train --out DIR): read each layer through its translator; the "
                   "viewer's lens panel then switches between the logit and the tuned lens.")
@global_tokens_option()
def lens_cmd(text: str, source: str, top: int, prefix: str | None, out_dir: str | None,
             tuned_dir: str | None = None) -> None:
    """The logit lens: what each layer would predict after TEXT, reading the residual stream
    after l blocks through the final norm and W_vocab (layer 0: the embeddings). An encoder–decoder
    translates TEXT (or reads --prefix) and shows its decoder's layers."""
    from ..analysis.lens import check_lens
    from .common import load_model as load

    model = as_decoder(load(source), prefix, default=None)
    check_lens(model)
    tuned = None
    if tuned_dir is not None:
        from ..analysis.tuned_lens import check_fits, check_model, load_tuned_lens

        check_model(model)
        tuned = load_tuned_lens(tuned_dir)
        check_fits(model, tuned)
    model.encode(text)                                                        # a bad text fails before DIR is touched
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        _lens(model, text, top, out_dir, tuned)


def _lens(model, text: str, top: int, out_dir: str | None, tuned=None) -> None:
    """`qkv lens`'s work: the table of the last position (a masked-LM encoder's: its mask token), and with
    OUT_DIR the map; TUNED: a tuned lens (analysis.tuned_lens) read instead of the logit lens."""
    from ..analysis.lens import KEEP, final_prediction, lens_of_trace
    from ..writing.nexttoken import distribution, mask_position, top_tokens

    kind = "logit lens" if tuned is None else "tuned lens"
    with status(f"computing the {kind} on {model.name} …"):
        trace = model.run(text, keep=KEEP + (("attentions",) if out_dir is not None else ()))
        if tuned is None:
            lens = lens_of_trace(model, trace)                                # (L+1, n, V)
        else:
            from ..analysis.tuned_lens import tuned_lens_of_trace

            lens = tuned_lens_of_trace(model, tuned, trace)                   # (L+1, n, V)
    ids, probs = final_prediction(lens)                                       # (n,), (L+1, n)
    label = model.tokenizer.label
    at = mask_position(model, trace.ids) if not getattr(model.config, "causal", True) else None
    where = "the last position" if at is None else "the mask token"           # a masked-LM encoder: its mask
    at = -1 if at is None else at
    console = new_console()
    console.print(Text(f"{model.name}: the {kind} at {where} ({trace.labels[at]}), "
                       f"final prediction {label(int(ids[at]))}"))
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("layer", justify="right", style="grey50")
    for r in range(top):
        table.add_column(f"top {r + 1}", no_wrap=True)
    table.add_column("P(final)", justify="right")
    for l, z in enumerate(lens[:, at]):
        best, p = top_tokens(distribution(z, 1.0), top)
        table.add_row("emb" if l == 0 else str(l), *(Text(f"{label(int(i))} {q:.2f}") for i, q in zip(best, p)),
                      f"{probs[l, at]:.3f}")
    console.print(table)
    if trace.cross is not None:                                               # a translation: every position
        console.print(Text(f"each target position, the top token at every layer (the decoder reads "
                           f"{' '.join(trace.labels)} after the source {' '.join(trace.encoder.labels)}):"))
        grid = Table(show_edge=False, pad_edge=False)
        grid.add_column("layer", justify="right", style="grey50")
        for j, tok in enumerate(trace.labels):
            grid.add_column(Text(f"{tok} →"), no_wrap=True)
        best = lens.argmax(axis=-1)                                           # (L+1, n)
        for l in range(len(lens)):
            grid.add_row("emb" if l == 0 else str(l), *(Text(label(int(best[l, j]))) for j in range(len(trace.labels))))
        console.print(grid)
    if out_dir is not None:
        from ..analysis.sections import lens_payload
        from ..viz.interpret_figures import lens_figure

        with status(f"writing the figure and the viewer to {out_dir} …"):
            write_figure(lens_figure(probs, trace.labels, [label(int(i)) for i in ids], model_name=model.name,
                                     kind=kind),
                         out_dir, "lens")
            _write_viewer(trace, out_dir, "lens", lens_payload(model, trace, tuned=tuned))


def _write_viewer(trace, out_dir: str, view: str, section: dict) -> None:
    """OUT_DIR/VIEW.html: the viewer of TRACE with SECTION as its panel VIEW, opened first (an
    encoder–decoder's: its decoder's self-attention, the stack the panel reads)."""
    from pathlib import Path

    from ..viz.html import viewer_html, write_html

    path = write_html(viewer_html(_decoder_stack(trace), sections={view: section}, view=view),
                      Path(out_dir) / f"{view}.html")
    click.echo(f"wrote {path}")


def _decoder_stack(trace):
    """TRACE, or an encoder–decoder's decoder trace without its encoder and cross-attention parts."""
    import dataclasses

    return trace if trace.cross is None else dataclasses.replace(trace, encoder=None, cross=None)


@click.command(name="rollout")
@text_argument()
@model_option(READER)
@click.option("--flow", is_flag=True,
              help="Also attention flow: one max-flow per (position, token) pair, so short texts only.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write raw attention, rollout (and flow) side by side (rollout.png, .svg) and the viewer "
                   "with its rollout panel open (rollout.html) into this directory.")
@global_tokens_option()
def rollout_cmd(text: str, source: str, flow: bool, out_dir: str | None) -> None:
    """Attention rollout (and with --flow attention flow, Abnar & Zuidema 2020): for each position,
    the input token it draws most from through every layer, beside the last layer's raw attention."""
    from .common import load_model as load

    model = load(source)
    model.encode(text)                                                        # a bad text fails before DIR is touched
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        _rollout(model, text, flow, out_dir)


def _rollout(model, text: str, flow: bool, out_dir: str | None) -> None:
    """`qkv rollout`'s work: each position's strongest source under raw / rollout / flow, and the figure."""
    from ..analysis.rollout import attention_flow, attention_rollout

    with status(f"computing attention rollout{' and flow' if flow else ''} on {model.name} …"):
        trace = model.run(text, keep=("attentions",))
        rollout = attention_rollout(trace)                                    # (L, n, n)
        R = rollout[-1]                                                       # (n, n) after all L layers
        F = attention_flow(trace) if flow else None                           # (n, n), or a clear error
    A = trace.attentions[-1]                                                  # (H, n, n) the last layer
    raw = A.astype(np.float64).mean(axis=0)                                   # (n, n)
    labels, L = trace.labels, len(trace.layers)
    console = new_console()
    console.print(Text(f"{model.name}: the input token each position draws most from — raw: layer {L - 1}'s "
                       f"attention (mean of {A.shape[0]} heads); rollout" + (" and flow" if flow else "")
                       + f": through all {L} layers"))
    table = Table(show_edge=False, pad_edge=False)
    for name in ("#", "position", "raw", "rollout", *(("flow",) if flow else ())):
        table.add_column(name, justify="right" if name == "#" else "left", no_wrap=True)
    for i, position in enumerate(labels):
        cells = [Text(f"{j} {labels[j]} {m[i, j]:.2f}") for m in (raw, R, *((F,) if flow else ()))
                 for j in [int(np.argmax(m[i]))]]
        table.add_row(str(i), Text(position), *cells)
    console.print(table)
    if out_dir is not None:
        from ..analysis.rollout import MAX_FLOW_WORK
        from ..viz.figures import masked_cells
        from ..viz.interpret_figures import rollout_figure
        from ..viz.interpret_payload import rollout_section

        write_figure(rollout_figure(raw, R, F, labels, mask=masked_cells(trace, L - 1), layer=L - 1,
                                     heads=A.shape[0], model_name=model.name), out_dir, "rollout")
        note = None if flow else "no attention flow: run qkv rollout with --flow to add it (short texts: n⁴·L ≤ " \
                                 f"{MAX_FLOW_WORK:,})"
        _write_viewer(trace, out_dir, "rollout", rollout_section(rollout, F, note))


CIRCUITS_TEXT = ("When Mary and John went to the store, John gave a drink to Mary. "
                 "The cat sat on the mat.")   # names repeat (copying), a sentence of its own

@click.command(name="circuits", epilog=f"TEXT: its tokens are the OV circuit's token set, its activations give the "
                                       f"QK pattern. Default: {CIRCUITS_TEXT!r}")
@text_argument(required=False)
@renamed("--text", "TEXT", "text")
@model_option(WRITER)
@click.option("--layer", type=int, required=True, help="Layer (negative counts from the end).")
@click.option("--head", type=int, required=True, help="Query head (negative counts from the end).")
@click.option("--top", type=click.IntRange(1, 50), default=10, show_default=True, help="How many entries to list.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the figure (circuits.png, .svg) into this directory.")
@global_tokens_option()
def circuits_cmd(text: str | None, source: str, layer: int, head: int, top: int, out_dir: str | None) -> None:
    """QK and OV circuits of one head: what it copies (W_E·W_V·W_O·W_U on TEXT's tokens, the copying
    score) and where it looks by relative position."""
    default, text = text is None, CIRCUITS_TEXT if text is None else text
    from ..analysis.circuits import ov_circuit, qk_positions
    from .common import load_model as load
    from ..viz.interpret_figures import circuits_figure

    model = load(source)
    layer, head = model.check_layer(layer), model.check_head(head)
    model.encode(text)                                                        # bad input fails before DIR is touched
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        ov, qk = ov_circuit(model, layer, head, text), qk_positions(model, layer, head, text)
        if default:                                                    # after the checks: an error stays one line
            click.echo(f"text (the default; give another as TEXT): {text}", err=True)
        console = new_console()
        console.print(Text(f"{model.name} layer {layer}, head {head}: OV copying score {ov.copying_score:+.3f} "
                           f"(Σλ/Σ|λ|: +1 copies, −1 suppresses); {ov.diagonal:.0%} of the {len(ov.ids)} tokens "
                           "raise their own logit most"))
        table = Table(title="OV: attending to → raises", title_justify="left", show_edge=False, pad_edge=False)
        for name in ("attended", "raises", "value", "its top outputs over the vocabulary"):
            table.add_column(name)
        where = {t: i for i, t in enumerate(ov.labels)}
        for src, dst, v in ov.top(top):
            outs = ", ".join(f"{t} {x:.2f}" for t, x in ov.top_outputs[where[src]])
            table.add_row(Text(src), Text(dst), f"{v:+.3f}", Text(outs))
        console.print(table)
        near = np.abs(qk.deltas) < 12
        console.print(Text("QK by relative distance Δ = query − key, on the text (Δ: mean score / mean attention):\n  "
                           + "  ".join(f"{int(d)}: {s:+.2f}/{a:.2f}" for d, s, a in
                                       zip(qk.deltas[near], qk.score[near], qk.attention[near]))))
        if qk.table_by_delta is not None:
            near = np.abs(qk.deltas_table) < 12
            console.print(Text("QK by relative distance Δ, from the position table W_pos·W_Q·(W_pos·W_K)ᵀ/√d_k:\n  "
                               + "  ".join(f"{int(d)}: {s:+.2f}" for d, s in
                                           zip(qk.deltas_table[near], qk.table_by_delta[near]))))
        if out_dir is not None:
            write_figure(circuits_figure(ov, qk, model_name=model.name), out_dir, "circuits")
