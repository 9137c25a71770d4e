"""`qkv diff`: model diffing (qkv.analysis.diff), two checkpoints of one architecture on one text — each head's
attention pattern (JS divergence), the residual stream (cosine, norm ratio) and each layer's logit lens
(KL) — and quantisation diffing: one model as its file stores it, as float32, or re-quantised (--weights-a,
--weights-b, --requantize-b), or computing in llama.cpp's arithmetic (--arith-a, --arith-b: what its 8-bit
activations change). Built like `qkv patch` (cli/attribution.py); registered in qkv.cli.app."""

from __future__ import annotations

import json

import click
import numpy as np
from rich.table import Table
from rich.text import Text

from .common import ARITHS, WEIGHTS, check_json_file, check_writable, new_console, removed_if_failed, status
from .options import WRITER, model_option, text_argument
from ..analysis.diff import KINDS
from ..runtime.errors import QkvError


@click.command(name="diff")
@text_argument()
@model_option(WRITER, "Model A: 'smollm2', a .gguf file, or a local Hugging Face directory.")
@click.option("--model-b", "source_b", default=None, metavar="MODEL",
              help="Model B, of A's architecture and tokenizer (base vs instruct, two training steps). Default: A "
                   "again, held as --weights-b says or re-quantised by --requantize-b.")
@click.option("--weights-a", type=click.Choice(WEIGHTS), default=None,
              help="How A holds its weights: 'stored' (a GGUF's blocks, qkv's stored kernels), 'float32' (dequantised "
                   "once), … Default: qkv --weights, else the file's own (float32 with --requantize-b, so that A and "
                   "B differ in their weights only).")
@click.option("--weights-b", type=click.Choice(WEIGHTS), default=None, help="How B holds its weights (as --weights-a).")
@click.option("--arith-a", type=click.Choice(ARITHS), default=None,
              help="How A computes: 'exact' (float32 activations) or 'llama.cpp' (a GGUF's stored blocks multiplied "
                   "as llama.cpp does, activations quantised to 8 bits per block). Default: qkv --arith, else exact.")
@click.option("--arith-b", type=click.Choice(ARITHS), default=None,
              help="How B computes (as --arith-a): --arith-b llama.cpp shows, head by head, what llama.cpp's 8-bit "
                   "activations change against exact arithmetic.")
@click.option("--requantize-b", type=click.Choice(KINDS), default=None,
              help="B's attention and FFN matrices quantised to this GGUF type by the gguf package and dequantised "
                   "(float32); its embeddings, W_vocab and norms kept.")
@click.option("--top", type=click.IntRange(1, 100), default=10, show_default=True,
              help="How many heads to list (largest JS first).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Write every number (L × H, (L+1) × n tables) as JSON.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the figure (diff.png, .svg), diff.json and the viewer of A's attention with the diff "
                   "panel open (diff.html) into this directory.")
def diff_cmd(text: str, source: str, source_b: str | None, weights_a: str | None, weights_b: str | None,
             arith_a: str | None, arith_b: str | None, requantize_b: str | None, top: int, json_path: str | None,
             out_dir: str | None) -> None:
    """How far model B reads TEXT differently from model A: per layer and head the attention pattern's
    Jensen–Shannon divergence (per query row, averaged; bits), per layer the residual stream's cosine and norm
    ratio, and the logit lens's KL(A‖B) (nats; the last row is the final logits'). The heads that moved most
    first. A model against itself is 0 everywhere."""
    from ..analysis.diff import diff, requantized
    from .common import _weights

    check_json_file(json_path, "diff.json")
    arith_a, arith_b = arith_a or _weights["arith"] or "exact", arith_b or _weights["arith"] or "exact"
    if requantize_b is not None and arith_b != "exact":
        raise QkvError("--requantize-b makes B's matrices float32, which llama.cpp's arithmetic does not multiply; "
                       "drop --arith-b llama.cpp (or --requantize-b)")
    if requantize_b is not None and weights_a is None:
        weights_a = "float32"                             # A and B then differ in their weights, not the kernels
    model_a, name_a = _load(source, weights_a, arith_a)
    same = source_b is None and weights_b in (None, weights_a) and arith_b == arith_a
    model_b, name_b = (model_a, name_a) if same else _load(source_b or source, weights_b, arith_b)
    if requantize_b is not None:
        with status(f"quantising {model_b.name}'s block matrices to {requantize_b} …"):
            model_b = requantized(model_b, requantize_b)
        name_b = f"{name_b} → {requantize_b}"
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        with status(f"diffing {name_a} and {name_b} …"):
            d = diff(model_a, model_b, text)
        d.model_a, d.model_b = name_a, name_b
        _print(d, top)
        data = json.dumps(d.to_json(top), ensure_ascii=False, indent=1)
        if json_path is not None:
            from ..runtime.io import write_text

            click.echo(f"wrote {write_text(json_path, data)}", err=True)
        if out_dir is not None:
            _write(out_dir, d, data, model_a, text)


def _load(source: str, weights: str | None, arith: str):
    """(the model, its name with how it holds its weights and, when not exact, computes: "smollm2 [float32]",
    "smollm2 [stored, llama.cpp]")."""
    from .common import _weights, load_model

    if weights is None:
        model = load_model(source, arith=arith)
        held = _weights["dtype"] or _held(model)
    else:
        from ..models.loading import load

        with status(f"loading {source} ({weights}) …"):
            model = load(source, dtype=weights, arith=arith)
        held = weights
    return model, f"{source} [{held}{'' if arith == 'exact' else ', ' + arith}]"


def _held(model) -> str:
    """How a model loaded with its file's default holds its weights: "stored" (a GGUF's blocks) or "float32"."""
    from ..runtime.stored import StoredMatrix

    box = next((b.attn for b in model.weights.blocks if b.attn is not None), None)   # a Mamba stack: its mixer
    box = box if box is not None else getattr(model.weights.blocks[0], "mixer", None)
    stored = any(isinstance(v, StoredMatrix) for v in vars(box).values()) if box is not None else False
    return "stored" if stored else str(np.dtype(model.dtype))


def _print(d, top: int) -> None:
    """The heads that moved most, then each layer's row."""
    from ..viz.diff_figures import diff_rows

    console = new_console()
    final = d.final_kl
    console.print(Text(f"A = {d.model_a}, B = {d.model_b}: {len(d.ids)} tokens, {d.seconds:.1f} s"
                       + ("" if final is None else f"; final logits KL(A‖B) mean {final.mean():.3g} nats, "
                                                    f"max {final.max():.3g} (at {d.tokens[int(final.argmax())]})")))
    console.print(Text("heads that moved most (attention pattern JS divergence, bits; mean over query rows):"))
    heads = Table(show_edge=False, pad_edge=False)
    for name in ("#", "head", "JS"):
        heads.add_column(name, justify="right")
    for r, (layer, head, value) in enumerate(d.top_heads(top)):
        heads.add_row(str(r + 1), f"L{layer}.H{head}", f"{value:.3g}")
    console.print(heads)
    console.print(Text("per layer (its heads' JS; the residual stream and logit lens after it, means over positions):"))
    layers = Table(show_edge=False, pad_edge=False)
    for name in ("layer", "JS max", "JS mean", "cos", "‖B‖/‖A‖", "lens KL"):
        layers.add_column(name, justify="right")
    for l, jmax, jmean, cos, ratio, kl in diff_rows(d.js, d.layers()):
        layers.add_row(str(l), f"{jmax:.3g}", f"{jmean:.3g}", f"{cos:.6f}", f"{ratio:.4f}",
                       "" if kl is None else f"{kl:.3g}")
    console.print(layers)


def _write(out_dir: str, d, data: str, model_a, text: str) -> None:
    """diff.png, .svg, diff.json and diff.html (A's viewer, the diff panel open), all or none."""
    from ..runtime.io import FileBatch
    from ..viz.diff_figures import diff_figure, diff_section
    from ..viz.drawing import save_all
    from ..viz.html import viewer_html

    page = viewer_html(model_a.run(text, keep=("attentions",)), sections={"diff": diff_section(d.to_json())},
                       view="diff")
    with FileBatch(out_dir) as batch:
        paths = save_all(batch, [("diff", lambda: diff_figure(d.js, d.layers(), model_a=d.model_a,
                                                              model_b=d.model_b))], ("png", "svg"))
        paths.append(batch.write_text("diff.json", data))
        paths.append(batch.write_text("diff.html", page))
    for path in paths:
        click.echo(f"wrote {path}")
