"""The commands that look beyond attention weights: `qkv lens`, `rollout`, `dla`, `attribute`, `patch`, `circuits`
(README, "Beyond attention weights"). Registered in qkv.cli.app with `cli.add_command`; each reads a model,
computes with qkv.analysis, draws with qkv.viz.interpret_figures and writes the figure with
`cli_common.write_figure`; lens, rollout, attribute and patch also write a viewer page beside it (lens.html,
rollout.html, attribute.html, patch.html: the attention viewer of the text with that command's panel opened
first, its section from qkv.analysis.sections or viz.interpret_payload). `qkv trace-fact` is cli/causal.py's,
`qkv neurons` cli/neurons.py's."""

from __future__ import annotations

import click
import numpy as np
from rich.table import Table
from rich.text import Text

from .common import (MODEL_HELP, PREFIX_HELP, as_decoder, check_writable, new_console, progress_bar, status,
                     removed_if_failed, write_figure)


@click.command(name="lens")
@click.argument("text")
@click.option("--model", "source", default="smollm2", show_default=True,
              help="A decoder: 'smollm2', a .gguf file, or a local Hugging Face directory; or an "
                   "encoder–decoder (ko-en-tiny): the lens of its decoder.")
@click.option("--top", type=click.IntRange(1, 20), default=3, show_default=True,
              help="How many tokens to list per layer.")
@click.option("--prefix", default=None, help=PREFIX_HELP + " Default: the model's own translation.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the layers × positions map (lens.png, .svg) and the viewer with its logit-lens "
                   "panel open (lens.html) into this directory.")
def lens_cmd(text: str, source: str, top: int, prefix: str | None, out_dir: str | None) -> None:
    """The logit lens: what each layer would predict after TEXT, reading the residual stream
    after l blocks through the final norm and W_vocab (layer 0: the embeddings). An encoder–decoder
    translates TEXT (or reads --prefix) and shows its decoder's layers."""
    from ..analysis.lens import check_lens
    from .common import load_model as load

    model = as_decoder(load(source), prefix, default=None)
    check_lens(model)
    model.encode(text)                                                        # a bad text fails before DIR is touched
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        _lens(model, text, top, out_dir)


def _lens(model, text: str, top: int, out_dir: str | None) -> None:
    """`qkv lens`'s work: the table of the last position (a masked-LM encoder's: its mask token), and with
    OUT_DIR the map."""
    from ..analysis.lens import KEEP, final_prediction, lens_of_trace
    from ..writing.nexttoken import distribution, mask_position, top_tokens

    with status(f"computing the logit lens on {model.name} …"):
        trace = model.run(text, keep=KEEP + (("attentions",) if out_dir is not None else ()))
        lens = lens_of_trace(model, trace)                                    # (L+1, n, V)
    ids, probs = final_prediction(lens)                                       # (n,), (L+1, n)
    label = model.tokenizer.label
    at = mask_position(model, trace.ids) if not getattr(model.config, "causal", True) else None
    where = "the last position" if at is None else "the mask token"           # a masked-LM encoder: its mask
    at = -1 if at is None else at
    console = new_console()
    console.print(Text(f"{model.name}: the logit lens at {where} ({trace.labels[at]}), "
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
            write_figure(lens_figure(probs, trace.labels, [label(int(i)) for i in ids], model_name=model.name),
                         out_dir, "lens")
            _write_viewer(trace, out_dir, "lens", lens_payload(model, trace))


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
@click.argument("text")
@click.option("--model", "source", default="minilm", show_default=True, help=MODEL_HELP)
@click.option("--flow", is_flag=True,
              help="Also attention flow: one max-flow per (position, token) pair, so short texts only.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write raw attention, rollout (and flow) side by side (rollout.png, .svg) and the viewer "
                   "with its rollout panel open (rollout.html) into this directory.")
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


@click.command(name="dla")
@click.argument("text")
@click.option("--model", "source", default="smollm2", show_default=True,
              help="A decoder: 'smollm2', a .gguf file, or a local Hugging Face directory; or a "
                   "pre-norm encoder–decoder (T5): its decoder's heads, cross-attention heads and FFNs.")
@click.option("--target", required=True, help="The token whose logit to explain, one token (e.g. ' Mary').")
@click.option("--prefix", default=None, help=PREFIX_HELP + " Default: the start token alone (the first word).")
@click.option("--other", default=None, help="Explain the logit difference target − other (one token).")
@click.option("--top", type=click.IntRange(1, 50), default=10, show_default=True,
              help="How many heads to list (largest |contribution| first).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the layers × heads map (dla.png, .svg) into this directory.")
def dla_cmd(text: str, source: str, target: str, other: str | None, top: int, prefix: str | None,
            out_dir: str | None) -> None:
    """Direct logit attribution: each head's and FFN's direct part of TARGET's logit (or of
    target − other) after TEXT, the final norm's scale frozen (as TransformerLens does)."""
    from ..analysis.attribution import KEEP, attribution_of_trace, check_attribution, token_id
    from .common import load_model as load
    from ..viz.interpret_figures import attribution_figure

    model = as_decoder(load(source), prefix)
    check_attribution(model)
    model.encode(text)                                                        # bad input fails before DIR is touched
    t, o = token_id(model, target), None if other is None else token_id(model, other)
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        with status(f"computing direct logit attribution on {model.name} …"):
            a = attribution_of_trace(model, model.run(text, keep=KEEP), t, o)
        label = model.tokenizer.label
        what = f"logit({label(t)})" + ("" if o is None else f" − logit({label(o)})")
        console = new_console()
        console.print(Text(f"{model.name}: direct logit attribution of {what} = {a.logit:.3f} at the last position"))
        table = Table(show_edge=False, pad_edge=False)
        for name in ("#", "head", "contribution"):
            table.add_column(name, justify="right")
        for r, (layer, head, c) in enumerate(a.top(top)):
            table.add_row(str(r + 1), f"L{layer}.H{head}", f"{c:+.3f}")
        console.print(table)
        if a.cross is not None:
            best = np.argsort(-np.abs(a.cross), axis=None)[:top]
            console.print(Text(f"cross-attention heads {a.cross.sum():+.3f} (largest: " + ", ".join(
                f"L{int(i // a.cross.shape[1])}.H{int(i % a.cross.shape[1])} {a.cross.flat[i]:+.3f}" for i in best) + ")"))
        best = np.argsort(-np.abs(a.ffns))[:3]
        console.print(Text(f"heads {a.heads.sum():+.3f}, FFNs {a.ffns.sum():+.3f} (largest: "
                           + ", ".join(f"L{int(l)} {a.ffns[l]:+.3f}" for l in best) + "), "
                           + ", ".join(f"{k} {v:+.3f}" for k, v in a.rest.items() if v) + f"; sum {a.total():.3f}"))
        if out_dir is not None:
            write_figure(attribution_figure(a.heads, model_name=model.name, what=what), out_dir, "dla")


@click.command(name="attribute")
@click.argument("text")
@click.option("--model", "source", default="smollm2", show_default=True,
              help="A decoder ('smollm2', a .gguf file, a local Hugging Face directory), a masked-LM encoder (its "
                   "token at the first mask token) or an encoder without an LM head ('minilm', with --compare).")
@click.option("--target", default=None,
              help="The next token to explain, one token (e.g. ' Paris'); 'A-B' for the logit difference of two "
                   "tokens. Default: the model's top-1 next token.")
@click.option("--compare", default=None,
              help="Encoders: explain the cosine of TEXT's sentence embedding to this text's.")
@click.option("--prefix", default=None,
              help="Encoder–decoders (TEXT the source): the target written so far; default the start token alone "
                   "(the first target token is explained).")
@click.option("--other", default=None, help="Explain logit(target) − logit(other) (one token).")
@click.option("--method", type=click.Choice(("saliency", "grad-x-input", "ig")), default="grad-x-input",
              show_default=True, help="saliency ‖∂z/∂e‖, gradient × input, or integrated gradients.")
@click.option("--steps", type=click.IntRange(1, 1024), default=64, show_default=True,
              help="Integrated gradients: nodes of the integral (batched).")
@click.option("--tolerance", type=click.FloatRange(0, 1, max_open=True), default=0.02, show_default=True,
              help="Integrated gradients: where the STEPS nodes' sum misses z(e) − z(baseline) by more than this "
                   "part of it, integrate again with adaptive nodes (at most 1024 more) and say so; 0: never, the "
                   "STEPS nodes as Captum sums them.")
@click.option("--baseline", type=click.Choice(("zero", "pad")), default="zero", show_default=True,
              help="Integrated gradients: start from the zero embedding or from the pad token's at every position.")
@click.option("--keep-first/--vary-first", default=True, show_default=True,
              help="Integrated gradients: keep the first token (the attention sink of every later one) itself along "
                   "the path, so its score is 0 and the integral converges; or move it from the baseline too.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the tokens coloured by score (attribute.png, .svg), attribute.json and the viewer "
                   "with its attribution panel open (attribute.html) here.")
def attribute_cmd(text: str, source: str, target: str | None, compare: str | None, prefix: str | None,
                  other: str | None, method: str, steps: int, tolerance: float, baseline: str, keep_first: bool,
                  as_json: bool, out_dir: str | None) -> None:
    """Which input tokens made the next token (a masked token; an encoder's similarity to --compare): the
    gradient of its logit z with respect to each token's embedding e_i (before positions are added), as
    saliency ‖∂z/∂e_i‖, gradient × input e_i·∂z/∂e_i, or integrated gradients from a baseline (their sum is
    z(e) − z(baseline); the gap is reported)."""
    import json

    from ..analysis.attribution import token_id
    from ..analysis.input_attribution import attribute
    from ..runtime.io import FileBatch
    from ..viz.figures import save_all
    from ..viz.interpret_figures import token_scores_figure
    from .common import load_model as load

    model = load(source)
    model.encode(text)                                                        # bad input fails before DIR is touched
    if compare is not None:
        model.encode(compare)
    target, other = _target_pair(model, target, other, token_id)
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        with status(f"computing {method} attributions on {model.name} …"):
            a = attribute(model, text, target, other, method=method, steps=steps, baseline=baseline,
                          keep_first=keep_first, compare=compare, prefix=prefix, tolerance=tolerance)
        what = f"{method} of {a.what}"
        if as_json:
            click.echo(json.dumps(a.to_json(), ensure_ascii=False))
        else:
            console = new_console()
            console.print(Text(f"{model.name}: {what} = {a.logit:.3f}"))
            table = Table(show_edge=False, pad_edge=False)
            for name, justify in (("#", "right"), ("token", "left"), ("score", "right"), ("", "left")):
                table.add_column(name, justify=justify)
            top = float(np.abs(a.scores).max()) or 1.0
            for i, (label, score) in enumerate(zip(a.tokens, a.scores)):
                bar = "█" * int(round(12 * abs(score) / top))
                side = "" if a.sides is None else ("src " if a.sides[i] == "source" else "tgt ")
                table.add_row(str(i), side + label, f"{score:+.4f}", Text(bar, style="red" if score > 0 else "blue"))
            console.print(table)
            if a.baseline_logit is not None:
                console.print(Text(f"sum {a.scores.sum():+.4f}; z(e) − z(baseline) = {a.logit - a.baseline_logit:+.4f} "
                                   f"(baseline {a.baseline}, {a.steps} steps: {100 * a.completeness:.2f} % apart)"))
            if a.refinement is not None:
                console.print(Text(a.refinement))
        if out_dir is not None:                                               # all four files or none
            from ..analysis.sections import attribute_payload
            from ..viz.html import viewer_html

            # the viewer of the text (an encoder–decoder's: its decoder, the target's tokens) opened on the panel
            trace = _decoder_stack(as_decoder(model, prefix).run(text, keep=("attentions",)))
            page = viewer_html(trace, sections={"attribute": attribute_payload(a)}, view="attribute")
            with FileBatch(out_dir) as batch:
                paths = [batch.write_text("attribute.json", json.dumps(a.to_json(), ensure_ascii=False, indent=1))]
                paths += save_all(batch, [("attribute", lambda: token_scores_figure(
                    a.tokens, a.scores, model_name=model.name, what=what))], ("png", "svg"))
                paths.append(batch.write_text("attribute.html", page))
            if not as_json:
                for path in paths:
                    click.echo(f"wrote {path}")


def _target_pair(model, target: str | None, other: str | None, token_id) -> tuple[int | None, int | str | None]:
    """(target, other) token ids from --target and --other; --target 'A-B' is a difference when the whole is not
    one token and A and B each are."""
    from ..runtime.errors import QkvError

    if target is None:
        return None, other                                      # attribute says what --other alone lacks
    try:
        return token_id(model, target), None if other is None else token_id(model, other)
    except QkvError as whole:
        if other is not None or "-" not in target.strip("-"):
            raise
        for at in [i for i, c in enumerate(target) if c == "-" and 0 < i < len(target) - 1]:
            try:
                return token_id(model, target[:at]), token_id(model, target[at + 1:])
            except QkvError:
                continue
        raise whole


@click.command(name="patch")
@click.argument("clean")
@click.argument("corrupted")
@click.option("--model", "source", default="smollm2", show_default=True,
              help="'smollm2', 'minilm', 'ko-en-tiny', a .gguf file, or a local Hugging Face directory. "
                   "A decoder's metric is logit(answer) − logit(wrong); an encoder's (MiniLM) the cosine similarity "
                   "of the sentence embedding to CLEAN's; an encoder–decoder's, its decoder's next token after "
                   "--prefix, CLEAN and CORRUPTED being sources.")
@click.option("--prefix", default=None, help=PREFIX_HELP + " Default: the start token alone (the first word).")
@click.option("--answer", default=None, help="Decoders: CLEAN's answer, one token (e.g. ' Mary').")
@click.option("--wrong", default=None, help="Decoders: CORRUPTED's answer, one token (e.g. ' John').")
@click.option("--top", type=click.IntRange(1, 50), default=10, show_default=True, help="How many heads to list.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the heatmaps (patch.png, .svg), the tables (patch.json) and the viewer with its "
                   "patching panel open (patch.html) into this directory.")
def patch_cmd(clean: str, corrupted: str, source: str, answer: str | None, wrong: str | None, top: int,
              prefix: str | None, out_dir: str | None) -> None:
    """Activation patching: copy each head's output, and each position of the residual stream,
    attention and FFN outputs, from CLEAN into CORRUPTED, and measure how much of the metric comes
    back (0 = corrupted, 1 = clean): logit(answer) − logit(wrong) for a decoder, the cosine
    similarity to CLEAN's sentence embedding (mean-pooled, L2-normalised) for an encoder."""
    from ..analysis.patch import EMBEDDING, metric_of, patch
    from ..analysis.sections import patch_payload
    from .common import load_model as load
    from ..runtime.errors import QkvError
    from ..viz.interpret_figures import save_patching

    model = as_decoder(load(source), prefix)
    if model.weights.W_vocab is None or not getattr(model.config, "causal", True):
        if answer is not None or wrong is not None:           # a masked-LM head's logits are at a mask, not the end
            raise QkvError(f"{model.name} is an encoder: its patching metric is the cosine similarity of sentence "
                           "embeddings, so --answer/--wrong (the last position's logits) do not apply; drop them")
        metric = EMBEDDING
    elif answer is None or wrong is None:
        raise QkvError(f"{model.name} is a decoder: give --answer and --wrong, CLEAN's and CORRUPTED's next tokens "
                       "(e.g. --answer ' Mary' --wrong ' John')")
    else:
        metric = (answer, wrong)
    metric_of(model, metric)                                                  # bad input fails before DIR is touched
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        with progress_bar("patched", "copies") as progress:
            p = patch(model, clean, corrupted, metric, progress=progress)
        console = new_console()
        console.print(Text(f"{model.name}: {p.metric} = {p.clean:.3f} clean, {p.corrupted:.3f} corrupted; "
                           f"{p.runs} patched copies in {p.passes} batched passes, {p.seconds:.1f} s "
                           f"({p.skipped} equal to the corrupted run, not run)"))
        table = Table(show_edge=False, pad_edge=False)
        for name in ("#", "head", "effect"):
            table.add_column(name, justify="right")
        for r, (layer, head, e) in enumerate(p.top_heads(top)):
            table.add_row(str(r + 1), f"L{layer}.H{head}", f"{e:+.3f}")
        console.print(table)
        if p.cross is not None:
            best = np.argsort(-np.abs(p.cross), axis=None)[:top]
            console.print(Text("cross-attention heads: " + ", ".join(
                f"L{int(i // p.cross.shape[1])}.H{int(i % p.cross.shape[1])} {p.cross.flat[i]:+.3f}" for i in best)))
        for name, t in (("residual", p.residual), ("attn_out", p.attn_out), ("ffn_out", p.ffn_out)):
            layer, pos = np.unravel_index(np.argmax(np.abs(t)), t.shape)
            console.print(Text(f"{name}: largest effect {t[layer, pos]:+.3f} at layer {layer}, {p.labels[pos]}"))
        if out_dir is not None:
            from ..viz.html import viewer_html

            page = viewer_html(_decoder_stack(model.run(clean, keep=("attentions",))), sections={"patch": patch_payload(p)},
                               view="patch")
            for f in save_patching(p, out_dir, pages={"patch.html": page}):
                click.echo(f"wrote {f}")



CIRCUITS_TEXT = ("When Mary and John went to the store, John gave a drink to Mary. "
                 "The cat sat on the mat.")   # names repeat (copying), a sentence of its own

@click.command(name="circuits")
@click.option("--model", "source", default="smollm2", show_default=True, help=MODEL_HELP)
@click.option("--layer", type=int, required=True, help="Layer (negative counts from the end).")
@click.option("--head", type=int, required=True, help="Query head (negative counts from the end).")
@click.option("--text", default=None, show_default=CIRCUITS_TEXT,
              help="Its tokens are the OV circuit's token set; its activations give the QK pattern.")
@click.option("--top", type=click.IntRange(1, 50), default=10, show_default=True, help="How many entries to list.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the figure (circuits.png, .svg) into this directory.")
def circuits_cmd(source: str, layer: int, head: int, text: str | None, top: int, out_dir: str | None) -> None:
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
            click.echo(f"text (the default; choose another with --text): {text}", err=True)
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
