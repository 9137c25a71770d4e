"""The viewer's panels beyond attention weights (`viz.panels` declares them): what qkv.analysis computes,
handed to their builders (`viz.interpret_payload`) as arrays — the one place the analysis methods meet the
viewer's payload. It stays in analysis, not viz: it runs the analyses (a lens pass, rollout, flow), and viz
comes before analysis in the folders' order.

    lens_payload(model, trace)     the "lens" section (a decoder's logit lens, `lens.lens_top`)
    rollout_payload(trace)         the "rollout" section (rollout, and flow when `rollout.flow_fits`)
    patch_payload(patching)        the "patch" section (`patch.Patching`'s tables)
    attribute_payload(attribution) the "attribute" section (`input_attribution.InputAttribution`)
    contact_payload(model, trace)  the "contacts" section (a protein's contact map, `contacts.contact_map`)

and which of them `qkv show --out`, `qkv generate/chat --trace` and `qkv serve` put beside raw
attention (Rollout for every model, Logit lens for a decoder, Contacts for ESM):

    keep = sections_keep(model, n)          what the pass must keep so that no second pass is needed (each
                                            panel's `keep`, `viz.panels`)
    sections = viewer_sections(model, trace)   → viz.html.save_viewer(trace, ..., sections=sections)
    save_generation(stream, directory)      --trace DIR of a generation: trace.npz + .json, attention.html
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..viz.contact_panel import contact_section
from ..viz.interpret_payload import attribute_section, lens_section, patch_section, rollout_section
from ..viz.panels import panel
from .contacts import contact_map
from .input_attribution import InputAttribution
from .lens import KEEP as LENS_KEEP, TRACE_LENS_TOKENS, lens_top
from .patch import WHAT, Patching
from .rollout import MAX_FLOW_WORK, attention_flow, attention_rollout, flow_fits

if TYPE_CHECKING:
    from pathlib import Path

    from ..models.model import Model
    from ..core.trace import Trace
    from .tuned_lens import TunedLens


def lens_payload(model: "Model", trace: "Trace", k: int = 5, tuned: "TunedLens | None" = None) -> dict:
    """The viewer's "lens" section of TRACE (`viz.interpret_payload.lens_section`): a trace that
    kept LENS_KEEP; a trace without them is run again on its ids (one forward pass). TUNED: a tuned lens
    (analysis.tuned_lens), whose cells go beside as the section's "tuned" (the panel's logit/tuned switch)."""
    L = model.config.n_layers
    if trace.layer_ids != list(range(L)) or any(getattr(trace.layers[i], w) is None
                                                 for i in range(L) for w in LENS_KEEP):
        trace = model.run(trace.ids, keep=LENS_KEEP)
    t = lens_top(model, trace, k)
    spell = model.tokenizer.label if model.tokenizer is not None else str
    section = lens_section(t.probs, t.ranks, t.predicted, t.top_ids, t.top_probs, spell, model.weights.W_vocab.shape[1])
    if tuned is not None:
        from .tuned_lens import translate

        u = lens_top(model, trace, k, translate=lambda l, x: translate(tuned, l, x))
        section["tuned"] = lens_section(u.probs, u.ranks, u.predicted, u.top_ids, u.top_probs, spell,
                                        model.weights.W_vocab.shape[1])
    return section


def rollout_payload(trace: "Trace") -> dict:
    """The viewer's "rollout" section of TRACE (`viz.interpret_payload.rollout_section`): rollout
    R_1..R_L always, attention flow too when `flow_fits` (else a note saying why it is absent)."""
    R = attention_rollout(trace)                                        # (L, n, n)
    L, n, _ = R.shape
    if flow_fits(L, n):
        return rollout_section(R, attention_flow(trace))
    return rollout_section(R, None, f"attention flow of {n} tokens through {L} layers is past the limit "
                                    f"qkv rollout --flow uses ({MAX_FLOW_WORK:,}: n⁴·L); shorten the text to see it")


def patch_payload(p: Patching, estimate=None) -> dict:
    """The viewer's "patch" section of P (`viz.interpret_payload.patch_section`): its tables unrounded; with
    ESTIMATE (`atp.AttributionPatching` of the same runs) its tables beside them, each map by its own."""
    beside = {} if estimate is None else {"estimate": {"method": estimate.method,
                                                       "tables": {name: getattr(estimate, name) for name in WHAT}}}
    return patch_section(p.as_json() | {name: getattr(p, name) for name in WHAT} | beside)


def attribute_payload(a: InputAttribution) -> dict:
    """The viewer's "attribute" section of A (`viz.interpret_payload.attribute_section`): its tokens and
    scores, what was attributed and how. An encoder–decoder's goes with its decoder's trace (the target's
    tokens; the source's are in the section)."""
    return attribute_section(a.to_json())


def contact_payload(model: "Model", trace: "Trace") -> dict | None:
    """The viewer's "contacts" section of TRACE (`viz.contact_panel.contact_section`): the contact map MODEL's
    contact head (ESM) predicts from the trace's attention, and each head's map; None for a model without one,
    or a trace that did not keep every layer's attention or holds no residue."""
    A = trace.attentions                                                 # (L, H, n, n) or None
    if (getattr(model.weights, "W_contact", None) is None or A is None or len(trace.ids) < 3
            or trace.layer_ids != list(range(model.config.n_layers)) or trace.head_ids is not None):
        return None
    cm = contact_map(model, trace.ids, trace.tokens, A)
    return contact_section(cm, positions=len(trace.ids))


def shows_lens(model: "Model", n: int, lens_limit: int | None = TRACE_LENS_TOKENS) -> bool:
    """A Logit lens tab: a single-stack model with an LM head, and the text at most `lens_limit` tokens
    (None: any; 0: none). An encoder–decoder's viewer shows its three kinds of attention, no lens."""
    if getattr(model.config, "encoder_decoder", False):
        return False
    return model.weights.W_vocab is not None and (lens_limit is None or n <= lens_limit)


def sections_keep(model: "Model", n: int, lens_limit: int | None = TRACE_LENS_TOKENS) -> tuple[str, ...]:
    """The intermediates a trace of n tokens must keep for `viewer_sections`: the rollout panel's (attention
    weights), the lens panel's (the residual stream's parts) when the lens is shown, and DeBERTa's three score
    tables (the Disentangled panel, built from the trace)."""
    return (panel("rollout").keep + (panel("lens").keep if shows_lens(model, n, lens_limit) else ())
            + (panel("disentangled").keep if getattr(model.config, "disentangled", None) is not None else ()))


def viewer_sections(model: "Model", trace: "Trace", lens_limit: int | None = TRACE_LENS_TOKENS) -> dict:
    """{"rollout": …, "lens": … or None} for `viz.html.save_viewer(sections=…)`: the lens of a decoder up
    to `lens_limit` tokens (its cost grows with n · V)."""
    if getattr(model.config, "encoder_decoder", False):
        return {}                                        # one stack's panels: none for an encoder–decoder
    lens = shows_lens(model, len(trace.ids), lens_limit)
    return {"rollout": rollout_payload(trace), "lens": lens_payload(model, trace) if lens else None,
            "contacts": contact_payload(model, trace)}


def save_generation(stream, directory, lens: bool = False) -> tuple["Trace", "Path", "Path"]:
    """`qkv generate/chat --trace DIR` of a finished TextStream: trace.npz + trace.json (reload with
    Trace.load) and attention.html, the viewer of what each token attended to, each generated token's
    candidates at any temperature, rollout (and flow on short texts) and, with LENS, the logit lens
    (its (L+1)·n·V multiply-adds cost about as much as the generation: asked for, not made by default).
    A stream that recorded (TextStream(record=True)) gives all but the lens without a second pass.
    Returns (trace, DIR, the viewer's path)."""
    from ..viz.html import save_viewer

    model = stream.model
    trace = stream.trace(("attentions",) + (LENS_KEEP if lens else ()))
    sections = viewer_sections(model, trace, lens_limit=None if lens else 0)
    out = trace.save(directory)
    return trace, out, save_viewer(trace, out / "attention.html", tokenizer=model.tokenizer, sections=sections)
