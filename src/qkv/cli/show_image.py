"""`qkv show IMAGE --model digits-vit`: an image model's prediction and where its [CLS] looks among the
patches; with --out, the overlays of `viz.image_figures` and the viewer in its image mode.

    image ─ImageModel.run─▶ trace: tokens [CLS], patch (0, 0), …; attentions (L, H, n, n), n = 1 + rows·cols
      [CLS]'s row at layer l, head h:  A[l, h, 0, 1:]  reshaped (rows, cols)  → the overlay of head h
      rollout R_L[0, 1:] (analysis.rollout)                                     → the rollout figure
      softmax(logits[0])  ([CLS]'s row, the classifier)                         → the predicted labels
"""

from __future__ import annotations

import os
from pathlib import Path

import click
import numpy as np
from rich.table import Table
from rich.text import Text

from ..runtime.errors import QkvError
from ..models.image_model import top_labels
from .common import check_writable, head_pairs, new_console, removed_if_failed

TOP_LABELS = 3            # predicted labels printed
TOP_PATCHES = 3           # patches printed per head


def show_image(model, image: str, layer: int | None, head: int | None, out_dir: str | None,
               ablate: tuple[str, ...], target: str | None, budget_mb: float | None) -> None:
    """`qkv show` on an image model: IMAGE's top labels and, at LAYER (default the last: the one whose [CLS]
    the classifier reads), where each head's [CLS] looks most (--head: its weights over the grid);
    with OUT_DIR the figures and the viewer."""
    if target is not None:
        raise QkvError(f"--prefix is the target text of an encoder–decoder; {model.name} reads an image: drop --prefix")
    if budget_mb is not None:
        raise QkvError(f"--budget-mb limits a long text's viewer; every weight of {model.name}'s images fits: "
                       "drop --budget-mb")
    from ..lessons.vit import example_image, shipped_digit

    if model.name == "digits-vit" and shipped_digit(image) and not os.path.exists(image):
        image = str(example_image(shipped_digit(image)))            # "7": the shipped example digit-7.png
        click.echo(f"(the example digit shipped with digits-vit: {image})", err=True)
    model.check_image(image)                                        # text given: one line, before anything
    if not model.config.class_token and out_dir is not None:
        raise QkvError(f"{model.name} has no [CLS] (SigLIP) whose attention the image views draw; drop --out "
                       "(qkv show prints where its pooling head's probe looks among the patches)")
    layer = model.check_layer(-1 if layer is None else layer)
    if head is not None:
        head = model.check_head(head)
    knocked_out = head_pairs(ablate)
    model.ablation(knocked_out)                                     # bad heads fail before DIR is touched
    trace = model.run(image, ablate=knocked_out)                    # a bad image fails before DIR is touched
    trace.text = Path(image).name                                   # the page's title names the file, not its folder
    if out_dir is not None:
        check_writable(out_dir)
    if not model.config.class_token:
        return _print_probe(trace, model, head, knocked_out)
    with removed_if_failed(out_dir):
        _print_image(trace, model, layer, head, knocked_out)
        if out_dir is not None:
            files = save_image_views(trace, out_dir, layer, model.config.patch_size)
    if out_dir is None:
        click.echo("(--out DIR draws each head's attention over the image, every layer's, attention rollout, "
                   "and writes the interactive viewer)")
        return
    click.echo(f"wrote {len(files)} files to {out_dir} (layer {layer}'s heads over the image):")
    for f in files:
        click.echo(f"  {f}")
    click.echo(f"open {files[0]} in a browser: click a patch to see where it looks, every layer and head")


def show_pair(model, image: str, texts: str | None, layer: int | None, head: int | None, out_dir: str | None,
              ablate: tuple[str, ...], target: str | None, budget_mb: float | None) -> None:
    """`qkv show IMAGE --model PAIR --texts "a cat,a dog"`: the image through the pair's image tower (as
    `show_image`), then its similarity to each text: CLIP's e^s·cos and softmax over the texts, SigLIP's e^s·cos + b
    and σ of each."""
    from ..models.contrastive import PairModel

    if not isinstance(model, PairModel):
        raise QkvError(f"--texts scores an image against texts with a CLIP or SigLIP pair; {model.name} is "
                       f"{model.config.family}: drop --texts, or give a CLIPModel / SiglipModel checkpoint")
    phrases = None if texts is None else [t.strip() for t in texts.split(",")]
    if phrases is not None and not all(phrases):
        raise QkvError(f"--texts {texts!r} has an empty text; give texts separated by commas, e.g. \"a cat,a dog\"")
    model.vision.check_image(image)
    if phrases is not None:
        scores = model.similarity(image, phrases)              # a bad text or image fails before DIR is touched
    show_image(model.vision, image, layer, head, out_dir, ablate, target, budget_mb)
    if phrases is None:
        click.echo("(--texts \"a cat,a dog\" scores the image against each text)")
        return
    what = "softmax over the texts" if scores.kind == "softmax" else "σ of each pair alone"
    console = new_console()
    console.print(Text(f"similarity to each text (logit: e^s·cos{' + b' if scores.kind == 'sigmoid' else ''}; "
                       f"probability: {what})"))
    table = Table(show_edge=False, pad_edge=False)
    for column in ("text", "logit", "probability"):
        table.add_column(column, justify="left" if column == "text" else "right")
    for phrase, logit, p in zip(phrases, scores.logits_per_image[0], scores.probs[0]):
        table.add_row(phrase, f"{logit:.3f}", f"{p:.3f}")
    console.print(table)


def predictions(trace, k: int = TOP_LABELS) -> list[tuple[str, float]]:
    """The K most probable labels: softmax over [CLS]'s logits (trace.logits[0]), most probable first."""
    return top_labels(trace.logits[0], trace.label_names, k)


def cls_lens(model, trace) -> list[tuple[str, str, float]]:
    """What [CLS] would be classified as after each layer: (where, label, probability), "embeddings" first, then
    "after L0", …; the last is the prediction (qkv.analysis.lens on row 0)."""
    from ..analysis.lens import lens_of_trace

    rows = lens_of_trace(model, trace)[:, 0]                        # (L + 1, labels): [CLS] at each depth
    return [("embeddings" if i == 0 else f"after L{i - 1}", *top_labels(z, trace.label_names, 1)[0])
            for i, z in enumerate(rows)]


def cls_cells(trace, layer: int) -> np.ndarray:
    """[CLS]'s attention to each patch at LAYER, every head, as the grid: A[l, :, 0, 1:] → (H, rows, cols)."""
    a = trace.layer(layer).attentions                               # (H, n, n)
    return a[:, 0, 1:].reshape(a.shape[0], *trace.grid)             # (H, rows, cols)


def _print_image(trace, model, layer: int, head: int | None, knocked_out) -> None:
    """The terminal part: the image and its patches, the top labels, then each head's most-attended patches
    from [CLS] (or one head's weights laid out as the grid)."""
    c, console = model.config, new_console()
    (rows, cols), (ph, pw) = trace.grid, c.patch_size
    H_px, W_px = trace.image.shape[:2]
    console.print(Text(f"{model.name}: an image of {H_px} × {W_px} pixels in {rows} × {cols} patches of {ph} × {pw} pixels "
                       f"({len(trace.tokens)} tokens: [CLS] + {rows * cols} patches), {c.n_layers} layers × "
                       f"{c.n_heads} heads"))
    if knocked_out:
        console.print(Text("heads knocked out: " + ", ".join(f"{l}.{h}" for l, h in knocked_out)))
    if trace.logits is None or trace.label_names is None:
        console.print(Text("no classifier (a ViTModel): no labels to predict"))
    else:
        console.print(Text("predicted: ") + Text(", ".join(f"{label} ({p:.3f})" for label, p in predictions(trace))))
        console.print(Text("the logit lens on [CLS] (each layer's stream read by the final norm and the classifier): ")
                      + Text(", ".join(f"{where} {label} ({p:.2f})" for where, label, p in cls_lens(model, trace))))
    cells = cls_cells(trace, layer)                                 # (H, rows, cols)
    kept = trace.layer(layer).attentions[:, 0, 0]                   # (H,) [CLS] → itself
    last = " (the last, whose [CLS] the classifier reads; choose another with --layer)" \
        if layer == c.n_layers - 1 else ""
    if head is not None:
        console.print(Text(f"layer {layer}{last}, head {head}: attention from [CLS] to each patch (row r, column "
                           f"c of the image; [CLS] → itself {kept[head]:.2f})"))
        console.print(_grid_table(cells[head]))
        return
    console.print(Text(f"layer {layer}{last}: where [CLS] looks most, each head"))
    for h in range(len(cells)):
        console.print(Text(f"  head {h}: {_top_patches(cells[h])}   [CLS] itself {kept[h]:.2f}"))


def _print_probe(trace, model, head: int | None, knocked_out) -> None:
    """An image tower without [CLS] (SigLIP): where its attention-pooling head's probe looks among the patches, each
    head (or HEAD's weights laid out as the grid): the attention that makes the image's embedding."""
    from ..core.pooling import probe_attention

    c, console = model.config, new_console()
    rows, cols = trace.grid
    console.print(Text(f"{model.name}: an image of {trace.image.shape[0]} × {trace.image.shape[1]} pixels in {rows} × "
                       f"{cols} patches (no [CLS]), {c.n_layers} layers × {c.n_heads} heads"))
    if knocked_out:
        console.print(Text("heads knocked out: " + ", ".join(f"{l}.{h}" for l, h in knocked_out)))
    if c.pooling != "probe":
        console.print(Text("no pooling head (vision_use_head false): nothing pools the patches into one embedding"))
        return
    _, A = probe_attention(trace.hidden[None], model.weights.pool, c)           # (1, H, P)
    cells = A[0].reshape(c.n_heads, rows, cols)                                 # (H, rows, cols)
    if head is not None:
        console.print(Text(f"the pooling head's probe, head {head}: its attention to each patch"))
        console.print(_grid_table(cells[head]))
        return
    console.print(Text("where the pooling head's probe looks most (the attention that makes the image's embedding), "
                       "each head"))
    for h in range(len(cells)):
        console.print(Text(f"  head {h}: {_top_patches(cells[h])}"))


def _grid_table(cells: np.ndarray) -> Table:
    """One head's weights on the patches (rows, cols) as a table laid out like the image."""
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("row", justify="right", style="grey50")
    for j in range(cells.shape[1]):
        table.add_column(f"c{j}", justify="right")
    for r, row in enumerate(cells):
        table.add_row(str(r), *(f"{w:.2f}" for w in row))
    return table


def _top_patches(cells: np.ndarray) -> str:
    """The TOP_PATCHES patches of most weight in one head's (rows, cols) grid: "patch (r, c) w  …"."""
    flat, cols = cells.ravel(), cells.shape[1]                      # (rows·cols,)
    top = np.argsort(-flat, kind="stable")[:TOP_PATCHES]
    return "  ".join(f"patch ({i // cols}, {i % cols}) {flat[i]:.2f}" for i in top)


def save_image_views(trace, out_dir: str, layer: int, patch: tuple[int, int]) -> list[Path]:
    """image_heads.png/.svg, image_layers.png, image_rollout.png and attention.html into OUT_DIR, all or
    nothing (`io.FileBatch`); PATCH: a patch's (p_h, p_w) in pixels (model.config.patch_size)."""
    from ..analysis.rollout import attention_rollout
    from ..analysis.sections import rollout_payload
    from ..runtime.io import FileBatch
    from ..viz.drawing import save_all
    from ..viz.html import viewer_html
    from ..viz.image_figures import image_heads, image_layers, image_rollout

    image, name = trace.image, trace.model
    layers = trace.layer_ids
    every = np.stack([cls_cells(trace, l) for l in layers])          # (L, H, rows, cols)
    rolled = attention_rollout(trace)[-1][0, 1:].reshape(trace.grid)  # (rows, cols) R_L's [CLS] row, patches
    label, prob = predictions(trace, 1)[0] if trace.logits is not None and trace.label_names else ("no classifier", 0.0)
    kept = trace.layer(layer).attentions[:, 0, 0]                    # (H,)
    out = Path(out_dir)
    try:
        with FileBatch(out) as files:
            files.write_text("attention.html", viewer_html(trace, sections={"rollout": rollout_payload(trace)}))
            save_all(files, [("image_heads", lambda: image_heads(image, cls_cells(trace, layer), patch, layer,
                                                                 self_weights=kept, model_name=name))],
                     ("png", "svg"))
            save_all(files, [("image_layers", lambda: image_layers(image, every, patch, layers, model_name=name)),
                             ("image_rollout", lambda: image_rollout(image, rolled, patch, label, prob,
                                                                     model_name=name))], ("png",))
    except OSError as e:
        raise QkvError(f"cannot write to {out}: {e.strerror or e}; choose a writable directory") from None
    return files.paths

