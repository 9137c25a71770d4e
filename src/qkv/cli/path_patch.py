"""`qkv path-patch`: path patching (qkv.analysis.path_patch), the effect of sender heads (FFNs, the embeddings) on
receiver heads' q, k or v input only, patched from the corrupted text into the clean one (Wang et al. 2022).
Built like `qkv patch` (cli/attribution.py); registered in qkv.cli.app."""

from __future__ import annotations

import json

import click
import numpy as np
from rich.table import Table
from rich.text import Text

from .common import check_json_file, check_writable, new_console, progress_bar, removed_if_failed, status
from .options import WRITER, global_tokens_option, model_option, other_option, token_option
from ..runtime.errors import QkvError

NO_PATH = "#d9d9d9"          # a cell with no path (or no sender): grey, apart from white's 0


@click.command(name="path-patch")
@click.argument("clean", metavar="TEXT")
@click.argument("corrupted")
@model_option(WRITER, "A pre-norm decoder: 'smollm2', a .gguf file, or a local Hugging Face directory.")
@token_option("The clean TEXT's answer, one token (e.g. ' Mary').")
@other_option("CORRUPTED's answer, one token (e.g. ' John'): the metric is logit(token) − logit(other).")
@click.option("--receivers", required=True, metavar="L.H[,L.H]", help="The receiver heads, e.g. 9.6,9.9.")
@click.option("--channel", type=click.Choice(("q", "k", "v", "all")), default="q", show_default=True,
              help="Which input of the receivers the senders reach: their queries, keys, values, or all three.")
@click.option("--senders", default=None, metavar="L.H,L.ffn,embed",
              help="One sender set, patched together (and each alone beside it). Default: every head, FFN and the "
                   "embeddings, each alone.")
@click.option("--position", "positions", type=int, multiple=True, metavar="P",
              help="Alter the receivers' input at this position only (repeatable; -1: the last). Default: all.")
@click.option("--top", type=click.IntRange(1, 50), default=10, show_default=True, help="How many senders to list.")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the effects as JSON.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the senders' heatmap (path_patch.png, .svg), path_patch.json and the viewer of TEXT's "
                   "attention with the path patching panel open (path_patch.html) into this directory.")
@global_tokens_option()
def path_patch_cmd(clean: str, corrupted: str, source: str, token: str | None, other: str | None, receivers: str,
                   channel: str, senders: str | None, positions: tuple[int, ...], top: int, json_path: str | None,
                   out_dir: str | None) -> None:
    """Path patching: each sender's output (or the --senders set's) taken from the corrupted run into the clean
    run's stream as the receivers alone read it, through their --channel input; every other component keeps its
    clean value, and everything after the receivers is recomputed. Effect = (m(patched) − m(clean)) /
    (m(clean) − m(corrupted)), m = logit(token) − logit(other): −1, the path carries the whole difference; 0,
    nothing."""
    from ..analysis.patch import metric_of
    from ..analysis.path_patch import check_path_model, parse_nodes, path_patch, reaches, sender_table
    from .common import load_model as load

    if token is None or other is None:
        raise QkvError("give --token and --other, TEXT's and CORRUPTED's next tokens (e.g. --token ' Mary' "
                       "--other ' John')")
    check_json_file(json_path, "path_patch.json")
    model = load(source)
    check_path_model(model)
    heads = parse_nodes(model, receivers, "--receivers", heads_only=True)      # bad input fails before any work
    chosen = None if senders is None else parse_nodes(model, senders, "--senders")
    if not heads or chosen == []:
        raise QkvError(f"give at least one {'receiver' if not heads else 'sender'}, e.g. "
                       f"{'--receivers 9.6' if not heads else '--senders 7.3,embed'}")
    if chosen is not None and not any(reaches(s, heads) for s in chosen):
        raise QkvError(f"--senders {senders}: none is before a receiver, so no path leads from them (a sender reaches "
                       f"heads of later layers only); choose senders before layer {max(r.layer for r in heads)}")
    where = list(positions) or None
    metric = (token, other)
    metric_of(model, metric)                                                  # bad tokens fail before DIR is touched
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        one = None
        if chosen is not None:
            with status(f"path patching {len(chosen)} senders on {model.name} …"):
                one = path_patch(model, clean, corrupted, metric, senders=chosen, receivers=receivers,
                                 channel=channel, positions=where)
        with progress_bar("patched", "paths") as progress:
            table = sender_table(model, clean, corrupted, metric, receivers=receivers, channel=channel,
                                 senders=chosen, positions=where, progress=progress)
        _print(table, one, top)
        data = {**table.as_json(), **({} if one is None else {"set": one.as_json()})}
        text = json.dumps(data, ensure_ascii=False, indent=1)
        if json_path is not None:
            from ..runtime.io import write_text

            click.echo(f"wrote {write_text(json_path, text)}", err=True)
        if out_dir is not None:
            from ..runtime.io import FileBatch
            from ..viz.drawing import save_all
            from ..viz.html import viewer_html
            from ..viz.path_patch_panel import path_patch_section

            page = viewer_html(model.run(clean, keep=("attentions",)), view="path_patch",
                               sections={"path_patch": path_patch_section(data, table.shape)})
            with FileBatch(out_dir) as batch:
                paths = save_all(batch, [("path_patch", lambda: senders_figure(table))], ("png", "svg"))
                paths.append(batch.write_text("path_patch.json", text))
                paths.append(batch.write_text("path_patch.html", page))
            for path in paths:
                click.echo(f"wrote {path}")


def _print(table, one, top: int) -> None:
    """The metric, the set's effect (--senders) and the TOP senders alone."""
    console = new_console()
    receivers = table.column_names()[0]
    console.print(Text(f"{table.model}: {table.metric} = {table.clean:.3f} clean, {table.corrupted:.3f} corrupted; "
                       f"receivers {receivers} ({table.channel}); {table.runs} paths in {table.passes} batched "
                       f"passes, {table.seconds:.1f} s"))
    if one is not None:
        together = " together" if len(one.senders) > 1 else ""
        console.print(Text(f"senders {','.join(one.senders)}{together}: effect {one.effect:+.3f} "
                           f"(m = {one.patched:.3f})"))
    rows = Table(show_edge=False, pad_edge=False)
    for name in ("#", "sender", "effect"):
        rows.add_column(name, justify="right")
    for r, (sender, effect) in enumerate(table.top(top)):
        rows.add_row(str(r + 1), sender, f"{effect:+.3f}")
    console.print(rows)


def senders_figure(table):
    """Layers (rows, layer 0 at the bottom) × heads: each sender head's effect on the receivers, beside a column of
    each layer's FFN; the embeddings' effect in the title. Blue: the path carries the clean answer (corrupting it
    lowers the metric); grey: no path (not before a receiver) or not a sender."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    from ..viz.drawing import figure_title, new_figure, styled
    from ..viz.palette import DIVERGING

    @styled
    def draw():
        L, H = table.shape
        heads = table.heads()                                                    # (L, H)
        ffn = np.full((L, 1), np.nan)
        embed = np.nan
        for s, v in zip(table.senders, table.values[:, 0]):
            if s.layer < 0:
                embed = v
            elif s.head is None:
                ffn[s.layer, 0] = v
        m = float(np.nanmax(np.abs(np.concatenate([heads.ravel(), ffn.ravel(), [0.0]])))) or 1.0
        fig = new_figure(float(np.clip(3.0 + 0.5 * H, 5.5, 15.0)), float(np.clip(1.8 + 0.22 * L, 4.0, 11.0)))
        ax, side = fig.subplots(1, 2, gridspec_kw={"width_ratios": [max(H, 2), 1]})
        cmap, norm = colormaps[DIVERGING].with_extremes(bad=NO_PATH), Normalize(-m, m)
        im = ax.imshow(heads, cmap=cmap, norm=norm, aspect="auto", origin="lower", interpolation="nearest")
        side.imshow(ffn, cmap=cmap, norm=norm, aspect="auto", origin="lower", interpolation="nearest")
        step = max(1, L // 16)
        ax.set_xticks(range(H), [str(h) for h in range(H)], fontsize=8)
        for a in (ax, side):
            a.set_yticks(range(0, L, step), [str(l) for l in range(0, L, step)], fontsize=8)
        side.set_xticks([0], ["FFN"], fontsize=8)
        ax.set_xlabel("sender head")
        ax.set_ylabel("layer")
        what = f"→ {table.column_names()[0]} ({table.channel})"
        emb = ("" if np.isnan(embed) else f", embeddings {embed:+.3f}") + "; grey: no path"
        ax.set_title(figure_title(table.model, "path patching", what) + f"\n{table.metric}{emb}", fontsize=10)
        fig.colorbar(im, ax=[ax, side], shrink=0.8, pad=0.02).set_label(
            "effect (−1: the whole clean−corrupted difference)" if table.normalised else "m(patched) − m(clean)")
        return fig
    return draw()
