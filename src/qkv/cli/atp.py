"""`qkv atp`: attribution patching (AtP, AtP*; qkv.analysis.atp), the linear estimate of `qkv patch`'s tables
from two forwards and one backward, and with --exact the exact tables beside it and how far apart they are.
Options as `qkv patch`'s (cli/attribution.py, cli/options.py); registered in qkv.cli.app."""

from __future__ import annotations

import json

import click
import numpy as np
from rich.table import Table
from rich.text import Text

from .common import check_writable, new_console, progress_bar, removed_if_failed, status
from .options import WRITER, global_tokens_option, model_option, other_option, patching_metric, token_option
from ..runtime.errors import QkvError


@click.command(name="atp")
@click.argument("clean", metavar="TEXT")
@click.argument("corrupted")
@model_option(WRITER, "'smollm2', 'minilm', a .gguf file, or a local Hugging Face directory. A decoder's metric is "
                      "logit(token) − logit(other); an encoder's (MiniLM) the cosine similarity of the sentence "
                      "embedding to TEXT's. Encoder–decoders: use qkv patch.")
@token_option("Decoders: TEXT's answer, one token (e.g. ' Mary').")
@other_option("Decoders: the corrupted input's answer, one token (e.g. ' John').")
@click.option("--exact", is_flag=True, help="Also run exact activation patching (qkv patch) and print how far the "
                                            "estimate is from it: Pearson r, sign agreement, the cells wrong by more "
                                            "than half.")
@click.option("--star", is_flag=True, help="Also each head's queries, keys and values, queries and keys by AtP* too "
                                           "(the attention pattern recomputed exactly; with --exact, patched exactly).")
@click.option("--top", type=click.IntRange(1, 50), default=10, show_default=True, help="How many heads to list.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), default=None,
              help="Write the estimates (with --exact: the exact tables and the comparison too) to this JSON file.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the estimate's heatmaps (atp.png, .svg; with --exact the exact ones, patch.png, .svg), "
                   "atp.json and the viewer with its patching panel open on the estimate (atp.html) here.")
@global_tokens_option()
def atp_cmd(clean: str, corrupted: str, source: str, token: str | None, other: str | None, exact: bool, star: bool,
            top: int, json_file: str | None, out_dir: str | None) -> None:
    """Attribution patching: estimate, from one forward on TEXT (the clean run) and on CORRUPTED and one
    backward, how much of the metric each head, each position of the residual stream, attention and FFN
    outputs (and each FFN neuron) would bring back if patched from TEXT into the corrupted run (0 = corrupted,
    1 = clean), as qkv patch measures it: (a_clean − a_corrupt) · ∂m/∂a."""
    from ..analysis.atp import atp, compare, patch_qkv
    from ..analysis.patch import patch
    from .common import load_model as load

    model = load(source)
    metric = patching_metric(model, token, other)                            # bad input fails before DIR is touched
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        with status(f"attribution patching on {model.name} …"):
            e = atp(model, clean, corrupted, metric, star=star)
        p = qkv = None
        if exact:
            with progress_bar("patched", "copies") as progress:
                p = patch(model, clean, corrupted, metric, progress=progress)
            if star:
                with status("patching each head's queries, keys and values …"):
                    qkv = patch_qkv(model, clean, corrupted, metric)
        agreements = [] if p is None else compare(e, p, qkv)
        _print(e, p, agreements, top)
        data = {"atp": e.as_json(), "exact": None if p is None else p.as_json(), "exact_qkv": None if qkv is None
                else {w: np.round(t, 6).tolist() for w, t in qkv.items()},
                "comparison": [a.as_json() for a in agreements]}
        text = json.dumps(data, ensure_ascii=False, indent=1)
        if json_file is not None:
            from ..runtime.io import write_text

            try:
                click.echo(f"wrote {write_text(json_file, text)}")
            except OSError as err:
                raise QkvError(f"cannot write {json_file}: {err.strerror or err}; choose a writable path") from None
        if out_dir is not None:
            for f in _save(model, clean, e, p, text, out_dir):
                click.echo(f"wrote {f}")


def _print(e, p, agreements, top: int) -> None:
    """The estimate's summary and top heads (beside the exact effects), and the comparison table."""
    console = new_console()
    console.print(Text(f"{e.model}: {e.metric} = {e.clean:.3f} clean, {e.corrupted:.3f} corrupted; {e.method}: "
                       f"{e.heads.size} heads and {3 * e.residual.size} positions"
                       + ("" if e.neurons is None else f", {e.neurons.size} neurons")
                       + f" from 2 forwards and 1 backward in {e.seconds:.2f} s"
                       + ("" if p is None else f"; exact patching {p.seconds:.1f} s ({p.passes} batched passes)")))
    table = Table(show_edge=False, pad_edge=False)
    for name in ("#", "head", "AtP") + (() if p is None else ("exact",)):
        table.add_column(name, justify="right")
    for r, (layer, head, value) in enumerate(e.top_heads(top)):
        table.add_row(str(r + 1), f"L{layer}.H{head}", f"{value:+.3f}",
                      *(() if p is None else (f"{p.heads[layer, head]:+.3f}",)))
    console.print(table)
    for name in ("residual", "attn_out", "ffn_out"):
        t = getattr(e, name)
        layer, pos = np.unravel_index(np.argmax(np.abs(t)), t.shape)
        console.print(Text(f"{name}: largest estimate {t[layer, pos]:+.3f} at layer {layer}, {e.labels[pos]}"
                           + ("" if p is None else f" (exact {getattr(p, name)[layer, pos]:+.3f})")))
    if e.queries_star is not None:
        for name, star, plain in (("queries", e.queries_star, e.queries), ("keys", e.keys_star, e.keys)):
            layer, h = np.unravel_index(np.argmax(np.abs(star)), star.shape)
            console.print(Text(f"{name}: largest AtP* {star[layer, h]:+.3f} at L{layer}.H{h} "
                               f"(AtP {plain[layer, h]:+.3f})"))
    if not agreements:
        return
    table = Table(show_edge=False, pad_edge=False, title="the estimate beside exact patching")
    for name in ("table", "cells", "Pearson r", "signs agree", "wrong by > ½", "largest of them (exact → AtP)"):
        table.add_column(name, justify="left" if name in ("table", "largest of them (exact → AtP)") else "right")
    for a in agreements:
        worst = ", ".join(f"L{l}.{'H' if a.table.startswith(('heads', 'queries', 'keys', 'values')) else 'p'}{i} "
                          f"{x:+.3f} → {est:+.3f}" for l, i, est, x in a.wrong[:3])
        table.add_row(a.table, str(a.cells), "—" if a.pearson != a.pearson else f"{a.pearson:.3f}",
                      f"{100 * a.sign:.0f} %", str(len(a.wrong)), worst)
    console.print(table)


def _save(model, clean: str, e, p, text: str, out_dir: str) -> list:
    """atp.png, .svg (and patch.png, .svg of the exact tables), atp.json and atp.html (the viewer on its patching
    panel: the estimate's maps, or with P the exact maps each with the estimate's beside it): all or none."""
    from ..analysis.sections import patch_payload
    from ..runtime.io import FileBatch
    from ..viz.drawing import save_all
    from ..viz.html import viewer_html
    from ..viz.interpret_figures import patch_figure

    section = patch_payload(e) if p is None else patch_payload(p, e)
    page = viewer_html(model.run(clean, keep=("attentions",)), sections={"patch": section}, view="patch")
    figures = [("atp", lambda: patch_figure(e))] + ([] if p is None else [("patch", lambda: patch_figure(p))])
    try:
        with FileBatch(out_dir) as batch:
            paths = save_all(batch, figures, ("png", "svg"))
            paths.append(batch.write_text("atp.json", text))
            paths.append(batch.write_text("atp.html", page))
    except OSError as err:
        raise QkvError(f"cannot write to {out_dir}: {err.strerror or err}; choose a writable directory") from None
    return paths
