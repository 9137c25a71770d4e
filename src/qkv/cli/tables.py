"""The terminal's attention tables: where each token looks most per head, one head's matrix, and an
encoder–decoder's cross-attention (each target token over the source)."""

from __future__ import annotations

import numpy as np
from rich.table import Table
from rich.text import Text

from ..core.labels import shorten as _label
from .common import new_console


def _shade(weight: float) -> str:
    """A colour for an attention weight: brighter = more attention (as every view, `viz.palette`)."""
    level = int(round(min(max(weight, 0.0), 1.0) * 5))
    return ["grey35", "grey50", "cyan", "bright_cyan", "bold bright_cyan", "bold bright_white"][level]


def heads_table(tokens: list[str], attn: np.ndarray, layer: int, heads: list[int], *, keys: list[str] | None = None,
                title: str | None = None, mean: bool = False, sinks: np.ndarray | None = None) -> Table:
    """For each token (row) and head (column): the token it attends to most, and how much.

    attn (H, n_q, n_k); keys: the columns' tokens when they are another sequence's (cross-attention:
    the source), else the rows' own; mean: a last column for the mean of all H heads. sinks (H, n_q): each row's
    share its head's sink took (attention sinks, gpt-oss), one more place a row may look most ("sink")."""
    keys = tokens if keys is None else keys
    if sinks is not None:                                             # the sink as one more key, the last
        attn = np.concatenate([attn, sinks[..., None].astype(attn.dtype)], axis=-1)   # (H, n_q, n_k + 1)
        keys = list(keys) + ["sink"]
    table = Table(title=title or f"layer {layer}: where each token looks most (argmax of its attention row)",
                  title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("#", justify="right", style="grey50")
    table.add_column("token", style="bold")
    columns = [(f"h{h}", attn[h]) for h in heads] + ([("mean", attn.mean(axis=0))] if mean else [])
    for name, _ in columns:
        table.add_column(name, no_wrap=True)
    for i, tok in enumerate(tokens):
        row = [Text(str(i)), Text(_label(tok, 10))]
        for _, a in columns:                                          # a (n_q, n_k)
            j = int(np.argmax(a[i]))
            weight = float(a[i, j])
            shown = f"{weight:.2f}".replace("0.", ".", 1)                   # .42: the weight, its 0 left out
            row.append(Text(f"{_label(keys[j], 7)} {shown}", style=_shade(weight)))
        table.add_row(*row)
    return table


def head_matrix(tokens: list[str], attn: np.ndarray, layer: int, head: int, limit: int = 32, *,
                keys: list[str] | None = None, title: str | None = None, sinks: np.ndarray | None = None) -> Table:
    """One head's full attention matrix A (rows: queries, columns: keys, another sequence's if given), as numbers;
    sinks (H, n_q): a last column "sink", each row's share its head's sink took (attention sinks, gpt-oss: the row's
    weights sum to 1 − it)."""
    keys = tokens if keys is None else keys
    n, m = min(len(tokens), limit), min(len(keys), limit)
    table = Table(title=title or f"layer {layer}, head {head}: attention weights A (row = query, column = key)",
                  title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("query", style="bold")
    for j in range(m):
        table.add_column(Text(_label(keys[j], 6)), justify="right", no_wrap=True)
    if sinks is not None:
        table.add_column(Text("sink"), justify="right", no_wrap=True, style="magenta")
    for i in range(n):
        cells = [Text(f"{attn[head, i, j]:.2f}", style=_shade(float(attn[head, i, j]))) for j in range(m)]
        if sinks is not None:
            cells.append(Text(f"{sinks[head, i]:.2f}", style=_shade(float(sinks[head, i]))))
        table.add_row(Text(_label(tokens[i], 10)), *cells)
    return table


def print_cross(trace, cross, model, layer: int, head: int | None, translated: bool) -> None:
    """The terminal part of `show` on an encoder–decoder: source, target, and where each target token
    (labelled by what it wrote) looks most in the source at one decoder layer."""
    c, console = model.config, new_console()
    src, tgt = trace.encoder.labels, cross.labels
    console.print(Text(f"{model.name}: {len(src)} source tokens → {len(tgt)} target tokens; encoder {c.n_layers} "
                       f"layers, decoder {c.n_decoder_layers} layers, {c.n_heads} heads"))
    console.print(Text("source: ") + Text(" ".join(f"{i}:{t}" for i, t in enumerate(src))))
    console.print(Text(("translation (greedy): " if translated else "target (given): ") + (trace.text or "")))
    console.print(Text("target, as written: ") + Text(" ".join(f"{i}:{t}" for i, t in enumerate(tgt))))
    attn = cross.layer(layer).attentions                                      # (H, n_tgt, n_src)
    if head is not None:
        console.print(head_matrix(tgt, attn, layer, head, keys=src, title=(
            f"cross-attention, decoder layer {layer}, head {head}: A (row = target token written, column = source)")))
        return
    H, per_table = c.n_heads, max(1, (console.width - 16) // 12 - 1)
    for start in range(0, H, per_table):
        heads = list(range(start, min(H, start + per_table)))
        console.print(heads_table(tgt, attn, layer, heads, keys=src, mean=heads[-1] == H - 1, title=(
            f"cross-attention, decoder layer {layer}: where each target token (row: the token it wrote) "
            "looks most in the source")))
