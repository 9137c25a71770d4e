"""The commands that explain one token a model writes: `qkv dla` (each head's and FFN's direct part of its
logit), `qkv attribute` (each input token's part, by gradients) and `qkv patch` (each head's and position's part,
by activation patching) (README, "Beyond attention weights"). Each names the token with --token (and --other for a
difference) and reads an encoder–decoder's decoder after --prefix (cli/options.py). Registered in qkv.cli.app;
attribute and patch write the viewer opened on their panel beside their figures (cli/interpret.py's helpers)."""

from __future__ import annotations

import click
import numpy as np
from rich.table import Table
from rich.text import Text

from .common import (SEED, as_decoder, check_writable, new_console, progress_bar, removed_if_failed, status,
                     write_figure)
from .interpret import _decoder_stack
from .options import (WRITER, global_tokens_option, model_option, other_option, patching_metric, prefix_option,
                      text_argument, token_option)
from ..runtime.errors import QkvError


@click.command(name="dla")
@text_argument()
@model_option(WRITER, "A decoder: 'smollm2', a .gguf file, or a local Hugging Face directory; or a "
                   "pre-norm encoder–decoder (T5): its decoder's heads, cross-attention heads and FFNs.")
@token_option("The token whose logit to explain, one token (e.g. ' Mary'); required.", was="--target")
@prefix_option("Default: the start token alone (the first word).")
@other_option("Explain the logit difference token − other (one token).")
@click.option("--top", type=click.IntRange(1, 50), default=10, show_default=True,
              help="How many heads to list (largest |contribution| first).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the layers × heads map (dla.png, .svg) into this directory.")
@global_tokens_option()
def dla_cmd(text: str, source: str, token: str | None, other: str | None, top: int, prefix: str | None,
            out_dir: str | None) -> None:
    """Direct logit attribution: each head's and FFN's direct part of --token's logit (or of
    token − other) after TEXT, the final norm's scale frozen (as TransformerLens does)."""
    from ..analysis.attribution import KEEP, attribution_of_trace, check_attribution, token_id
    from .common import load_model as load
    from ..viz.interpret_figures import attribution_figure

    if token is None:
        raise QkvError("give --token, the token whose logit to explain (e.g. --token ' Mary')")
    model = as_decoder(load(source), prefix)
    check_attribution(model)
    model.encode(text)                                                        # bad input fails before DIR is touched
    t, o = token_id(model, token), None if other is None else token_id(model, other)
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        with status(f"computing direct logit attribution on {model.name} …"):
            a = attribution_of_trace(model, model.run(text, keep=KEEP), t, o)
        label = model.tokenizer.label
        what = f"logit({label(t)})" + ("" if o is None else f" − logit({label(o)})")
        console = new_console()
        console.print(Text(f"{model.name}: direct logit attribution of {what} = {a.logit:.3f} at the last position"))
        console.print(_head_table("contribution", a.top(top)))
        if a.cross is not None:
            console.print(Text(f"cross-attention heads {a.cross.sum():+.3f} (largest: {_largest(a.cross, top)})"))
        best = np.argsort(-np.abs(a.ffns))[:3]
        console.print(Text(f"heads {a.heads.sum():+.3f}, FFNs {a.ffns.sum():+.3f} (largest: "
                           + ", ".join(f"L{int(l)} {a.ffns[l]:+.3f}" for l in best) + "), "
                           + ", ".join(f"{k} {v:+.3f}" for k, v in a.rest.items() if v) + f"; sum {a.total():.3f}"))
        if out_dir is not None:
            write_figure(attribution_figure(a.heads, model_name=model.name, what=what), out_dir, "dla")


@click.command(name="attribute")
@text_argument()
@model_option(WRITER, "A decoder ('smollm2', a .gguf file, a local Hugging Face directory), a masked-LM encoder (its "
                   "token at the first mask token) or an encoder without an LM head ('minilm', with --compare).")
@token_option("The next token to explain, one token (e.g. ' Paris'); 'A-B' for the logit difference of two "
              "tokens. Default: the model's top-1 next token.", was="--target")
@click.option("--compare", default=None,
              help="Encoders: explain the cosine of TEXT's sentence embedding to this text's.")
@prefix_option("Default: the start token alone (the first target token is explained).")
@other_option("Explain logit(token) − logit(other) (one token).")
@click.option("--method", type=click.Choice(("saliency", "grad-x-input", "ig", "occlusion", "shapley")),
              default="grad-x-input", show_default=True,
              help="saliency ‖∂z/∂e‖, gradient × input, integrated gradients; or forward passes only: occlusion "
                   "(z − z with the token at the baseline) or Shapley values (exact up to 10 players, else sampled).")
@click.option("--spans", default="tokens", show_default=True,
              help="Occlusion, Shapley: the players: 'tokens', 'words', or groups of positions like '1-3,4,6-8' "
                   "(positions in no group stay themselves).")
@click.option("--samples", type=click.IntRange(1, 100_000), default=64, show_default=True,
              help="Sampled Shapley values: permutations (in antithetic pairs, each with its reverse).")
@click.option("--seed", type=SEED, default=0, show_default=True,
              help="Sampled Shapley values: the random generator's start; the same seed gives the same numbers.")
@click.option("--exact/--sampled", default=None,
              help="Shapley values: enumerate all 2^p coalitions, or sample permutations. Default: exact up to "
                   "10 players.")
@click.option("--steps", type=click.IntRange(1, 1024), default=64, show_default=True,
              help="Integrated gradients: nodes of the integral (batched).")
@click.option("--tolerance", type=click.FloatRange(0, 1, max_open=True), default=0.02, show_default=True,
              help="Integrated gradients: where the STEPS nodes' sum misses z(e) − z(baseline) by more than this "
                   "part of it, integrate again with adaptive nodes (at most 1024 more) and say so; 0: never, the "
                   "STEPS nodes as Captum sums them.")
@click.option("--baseline", type=click.Choice(("zero", "pad")), default="zero", show_default=True,
              help="Integrated gradients: start from the zero embedding or from the pad token's at every position; "
                   "occlusion, Shapley: what an absent token's embedding becomes (positions kept).")
@click.option("--keep-first/--vary-first", default=True, show_default=True,
              help="Integrated gradients, occlusion, Shapley: keep the first token (the attention sink of every later one) itself along "
                   "the path, so its score is 0 and the integral converges; or move it from the baseline too.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the tokens coloured by score (attribute.png, .svg), attribute.json and the viewer "
                   "with its attribution panel open (attribute.html) here.")
@global_tokens_option()
def attribute_cmd(text: str, source: str, token: str | None, compare: str | None, prefix: str | None,
                  other: str | None, method: str, spans: str, samples: int, seed: int, exact: bool | None, steps: int,
                  tolerance: float, baseline: str, keep_first: bool, as_json: bool, out_dir: str | None) -> None:
    """Which input tokens made the next token (a masked token; an encoder's similarity to --compare): the
    gradient of its logit z with respect to each token's embedding e_i (before positions are added), as
    saliency ‖∂z/∂e_i‖, gradient × input e_i·∂z/∂e_i, or integrated gradients from a baseline (their sum is
    z(e) − z(baseline); the gap is reported); or by forward passes alone: occlusion z(x) − z(x, token i at the
    baseline), or Shapley values over tokens or --spans (their sum is z(x) − z(baseline), checked)."""
    import json

    from ..analysis.attribution import token_id
    from ..analysis.input_attribution import attribute
    from ..runtime.io import FileBatch
    from ..viz.drawing import save_all
    from ..viz.interpret_figures import token_scores_figure
    from .common import load_model as load

    model = load(source)
    model.encode(text)                                                        # bad input fails before DIR is touched
    if compare is not None:
        model.encode(compare)
    target, other = _token_pair(model, token, other, token_id)
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        with status(f"computing {method} attributions on {model.name} …"):
            if method in ("occlusion", "shapley"):
                from ..analysis.occlusion import prompt_attribution

                if prefix is not None:
                    raise QkvError("--prefix is for an encoder–decoder; occlusion and Shapley values read one stack")
                a = prompt_attribution(model, text, target, other, method=method, baseline=baseline,
                                       keep_first=keep_first, spans=spans, samples=samples, seed=seed, exact=exact,
                                       compare=compare)
            else:
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
            if getattr(a, "spans", None) is not None:
                console.print(Text(_forward_summary(a)))
            elif a.baseline_logit is not None:
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


def _forward_summary(a) -> str:
    """One line under a forward attribution's table: its players, passes and (Shapley) sum against the gap."""
    players = f"{len(a.spans)} players ({'tokens' if all(len(s) == 1 for s in a.spans) else 'spans'})"
    if a.method == "occlusion":
        return f"occlusion of {players}, baseline {a.baseline}: {a.evaluations} rows"
    how = "exact (all coalitions)" if a.exact else f"{a.samples} permutations, seed {a.seed}"
    return (f"Shapley values of {players}, {how}, baseline {a.baseline}: sum {a.span_scores.sum():+.6f}; "
            f"z(x) − z(baseline) = {a.logit - a.baseline_logit:+.6f} (apart by {a.efficiency_error:.1e}); "
            f"{a.evaluations} rows")


def _token_pair(model, target: str | None, other: str | None, token_id) -> tuple[int | None, int | str | None]:
    """(token, other) token ids from --token and --other; --token 'A-B' is a difference when the whole is not
    one token and A and B each are."""

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
@click.argument("clean", metavar="TEXT")
@click.argument("corrupted")
@model_option(WRITER, "'smollm2', 'minilm', 'ko-en-tiny', a .gguf file, or a local Hugging Face directory. "
                      "A decoder's metric is logit(token) − logit(other); an encoder's (MiniLM) the cosine similarity "
                      "of the sentence embedding to TEXT's; an encoder–decoder's, its decoder's next token after "
                      "--prefix, TEXT and CORRUPTED being sources.")
@prefix_option("Default: the start token alone (the first word).")
@token_option("Decoders: the clean TEXT's answer, one token (e.g. ' Mary').", was="--answer")
@other_option("Decoders: CORRUPTED's answer, one token (e.g. ' John').", was="--wrong")
@click.option("--top", type=click.IntRange(1, 50), default=10, show_default=True, help="How many heads to list.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the heatmaps (patch.png, .svg), the tables (patch.json) and the viewer with its "
                   "patching panel open (patch.html) into this directory.")
@global_tokens_option()
def patch_cmd(clean: str, corrupted: str, source: str, token: str | None, other: str | None, top: int,
              prefix: str | None, out_dir: str | None) -> None:
    """Activation patching: copy each head's output, and each position of the residual stream,
    attention and FFN outputs, from TEXT (the clean run) into CORRUPTED, and measure how much of the metric
    comes back (0 = corrupted, 1 = clean): logit(token) − logit(other) for a decoder, the cosine
    similarity to TEXT's sentence embedding (mean-pooled, L2-normalised) for an encoder."""
    from ..analysis.patch import patch
    from ..analysis.sections import patch_payload
    from .common import load_model as load
    from ..viz.interpret_figures import save_patching

    model = as_decoder(load(source), prefix)
    metric = patching_metric(model, token, other)                            # bad input fails before DIR is touched
    with removed_if_failed(out_dir):
        if out_dir is not None:
            check_writable(out_dir)
        with progress_bar("patched", "copies") as progress:
            p = patch(model, clean, corrupted, metric, progress=progress)
        console = new_console()
        console.print(Text(f"{model.name}: {p.metric} = {p.clean:.3f} clean, {p.corrupted:.3f} corrupted; "
                           f"{p.runs} patched copies in {p.passes} batched passes, {p.seconds:.1f} s "
                           f"({p.skipped} equal to the corrupted run, not run)"))
        console.print(_head_table("effect", p.top_heads(top)))
        if p.cross is not None:
            console.print(Text("cross-attention heads: " + _largest(p.cross, top)))
        for name, t in (("residual", p.residual), ("attn_out", p.attn_out), ("ffn_out", p.ffn_out)):
            layer, pos = np.unravel_index(np.argmax(np.abs(t)), t.shape)
            console.print(Text(f"{name}: largest effect {t[layer, pos]:+.3f} at layer {layer}, {p.labels[pos]}"))
        if out_dir is not None:
            from ..viz.html import viewer_html

            page = viewer_html(_decoder_stack(model.run(clean, keep=("attentions",))), sections={"patch": patch_payload(p)},
                               view="patch")
            for f in save_patching(p, out_dir, pages={"patch.html": page}):
                click.echo(f"wrote {f}")


def _head_table(column: str, rows) -> Table:
    """The ranked (layer, head, value) ROWS as dla and patch print them: #, head, COLUMN."""
    table = Table(show_edge=False, pad_edge=False)
    for name in ("#", "head", column):
        table.add_column(name, justify="right")
    for r, (layer, head, value) in enumerate(rows):
        table.add_row(str(r + 1), f"L{layer}.H{head}", f"{value:+.3f}")
    return table


def _largest(cross: np.ndarray, top: int) -> str:
    """The TOP cross-attention heads of CROSS (layers × heads) by |value|: "L0.H2 +0.123, …"."""
    best = np.argsort(-np.abs(cross), axis=None)[:top]
    return ", ".join(f"L{int(i // cross.shape[1])}.H{int(i % cross.shape[1])} {cross.flat[i]:+.3f}" for i in best)
