"""`qkv eap`: edge attribution patching (EAP, EAP-IG) of a clean/corrupt pair → the top edges between the embedding,
heads, FFNs and the logits as a circuit, and its faithfulness curve by real edge patching (qkv.analysis.eap).
Options as `qkv patch`'s (cli/attribution.py, cli/options.py); registered in qkv.cli.app."""

from __future__ import annotations

import json

import click
from rich.table import Table
from rich.text import Text

from .common import check_json_file, check_writable, new_console, progress_bar, removed_if_failed, status
from .options import WRITER, global_tokens_option, model_option, other_option, text_argument, token_option
from ..runtime.errors import QkvError

CURVE = "10,30,100,300,1000,3000"


@click.command(name="eap")
@text_argument()
@click.argument("corrupted")
@model_option(WRITER, "A pre-norm decoder: 'smollm2', a .gguf file, or a local Hugging Face directory (not one that "
                      "normalises each box's output: Gemma 2/3, OLMo 2).")
@token_option("The clean TEXT's answer, one token (e.g. ' Mary'); required.")
@other_option("The corrupt input's answer, one token (e.g. ' John'): the metric is logit(token) − logit(other).")
@click.option("--ig-steps", "ig_steps", type=click.IntRange(0, 256), default=0, show_default=True,
              help="0: EAP, the gradient at the clean run. N: EAP-IG, the gradient averaged over N Gauss–Legendre "
                   "nodes on the straight path from the corrupt input's token embeddings to TEXT's.")
@click.option("--qkv", "qkv", is_flag=True,
              help="Split each head's input into the three its Q, K and V read, each a receiver of its own (three "
                   "times the heads' edges; the patched passes run attention twice).")
@click.option("--top", type=click.IntRange(1, 500), default=20, show_default=True,
              help="How many edges to list (largest |score| first).")
@click.option("--curve", default=CURVE, show_default=True, metavar="K,K,…",
              help="The faithfulness curve's edge counts ('all': every edge); no edges and every edge are always "
                   "added. Each point is one edge-patched pass.")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the scores' top edges, the metric and the curve as JSON into FILE.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the faithfulness curve beside the edge scores (eap_curve.png, .svg), eap.json and the "
                   "circuit page (eap.html: components by layer, the top edges by score) into this directory.")
@global_tokens_option()
def eap_cmd(text: str, corrupted: str, source: str, token: str | None, other: str | None, ig_steps: int, qkv: bool,
            top: int, curve: str, json_path: str | None, out_dir: str | None) -> None:
    """Edge attribution patching: score every edge sender → receiver (the embedding, each head's output, each FFN's
    → each head's own input (--qkv: its Q's, K's and V's), each FFN's, the logits) by (out_s(corrupt) −
    out_s(clean)) · ∂m/∂in_r, m = logit(token) − logit(other) after TEXT; then keep the top k edges, patch every
    other edge from the corrupt run, and measure how much of m comes back (the faithfulness curve: 1 = clean,
    0 = corrupt)."""
    from ..analysis.attribution import token_id
    from ..analysis.eap import circuit_data, curve_points, edge_attribution, faithfulness
    from ..analysis.edges import check_edges
    from ..analysis.input_attribution import float_model
    from .common import load_model as load

    if token is None or other is None:
        raise QkvError("give --token and --other, TEXT's and the corrupt input's next tokens "
                       "(e.g. --token ' Mary' --other ' John')")
    check_json_file(json_path, "eap.json")
    model = load(source)
    check_edges(model)
    a_ids, b_ids = model.encode(text)[0], model.encode(corrupted)[0]         # bad input fails before DIR is touched
    if len(a_ids) != len(b_ids):
        raise QkvError(f"TEXT has {len(a_ids)} tokens and CORRUPTED {len(b_ids)}; edge patching reads the same "
                       "positions in both: reword the corrupt input so its tokens line up")
    token_id(model, token), token_id(model, other)
    curve_points(curve, 1)                                                   # a bad --curve, before the work
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        with status(f"preparing {model.name} …"):
            model = float_model(model)                                      # a GGUF's blocks dequantised once
        with progress_bar("gradient", "passes") as progress:
            a = edge_attribution(model, text, corrupted, token, other, ig_steps=ig_steps, qkv=qkv, progress=progress)
        ks = curve_points(curve, a.graph.n_edges)
        with progress_bar("patched", "circuits") as progress:
            f = faithfulness(model, a, ks, progress=progress)
        data = {**a.to_json(top=max(top, 100)), "faithfulness": f.to_json()}
        _print(a, f, top)
        if json_path is not None:
            from ..runtime.io import write_text

            click.echo(f"wrote {write_text(json_path, json.dumps(data, ensure_ascii=False, indent=1))}")
        if out_dir is not None:
            _write_out(out_dir, a, f, data, circuit_data(a, f))


def _print(a, f, top: int) -> None:
    """The summary line, the top edges and the curve."""
    console = new_console()
    how = "EAP" if a.steps == 0 else f"EAP-IG ({a.steps} steps)"
    console.print(Text(f"{a.model}: {how} of {a.metric} = {a.clean:.3f} clean, {a.corrupted:.3f} corrupt; "
                       f"{a.graph.n_edges:,} edges scored in {a.seconds:.1f} s"))
    table = Table(show_edge=False, pad_edge=False)
    for name in ("#", "sender", "receiver", "score"):
        table.add_column(name, justify="right" if name in ("#", "score") else "left")
    for i, (s, r, v) in enumerate(a.top(top)):
        table.add_row(str(i + 1), s, r, f"{v:+.4f}")
    console.print(table)
    curve = Table(show_edge=False, pad_edge=False, title="faithfulness by edge patching")
    for name in ("edges kept", "metric", "faithfulness"):
        curve.add_column(name, justify="right")
    for k, m, share in zip(f.ks, f.metric, f.normalised):
        curve.add_row(f"{k:,}", f"{m:.3f}", f"{share:.3f}")
    console.print(curve)
    console.print(Text(f"{len(f.ks)} edge-patched passes in {f.seconds:.1f} s"))


def _write_out(out_dir: str, a, f, data: dict, page_data: dict) -> None:
    """OUT_DIR/eap_curve.{png,svg}, eap.json and eap.html, all or none."""
    from ..runtime.io import FileBatch
    from ..viz.drawing import save_all
    from ..viz.eap_figures import circuit_page, faithfulness_figure

    senders, receivers = a.graph.node_names()
    try:
        with FileBatch(out_dir) as batch:
            paths = save_all(batch, [("eap_curve", lambda: faithfulness_figure(
                f.ks, f.normalised, a.scores, senders=senders, receivers=receivers, model_name=a.model,
                what=f"{a.method.upper()} of {a.metric}"))], ("png", "svg"))
            paths.append(batch.write_text("eap.json", json.dumps(data, ensure_ascii=False, indent=1)))
            paths.append(batch.write_text("eap.html", circuit_page(page_data)))
    except OSError as e:
        raise QkvError(f"cannot write to {out_dir}: {e.strerror or e}; choose a writable directory") from None
    for path in paths:
        click.echo(f"wrote {path}")
