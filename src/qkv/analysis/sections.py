"""The viewer's tabs beyond attention weights for one trace: Rollout for every model, Logit lens for a
decoder — what `qkv show --out`, `qkv generate/chat --trace` and `qkv serve` put beside raw attention.

    keep = sections_keep(model, n)          what the pass must keep so that no second pass is needed
    sections = viewer_sections(model, trace)   → viz.html.save_viewer(trace, ..., sections=sections)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lens import KEEP as LENS_KEEP, TRACE_LENS_TOKENS, lens_payload
from .rollout import rollout_payload

if TYPE_CHECKING:
    from ..engine.model import Model
    from ..engine.trace import Trace


def shows_lens(model: "Model", n: int, lens_limit: int | None = TRACE_LENS_TOKENS) -> bool:
    """A Logit lens tab: the model has an LM head, and the text at most `lens_limit` tokens (None: any)."""
    return model.weights.W_vocab is not None and (lens_limit is None or n <= lens_limit)


def sections_keep(model: "Model", n: int, lens_limit: int | None = TRACE_LENS_TOKENS) -> tuple[str, ...]:
    """The intermediates a trace of n tokens must keep for `viewer_sections` (attention weights, and the
    residual stream's parts when the lens is shown)."""
    return ("attentions",) + (LENS_KEEP if shows_lens(model, n, lens_limit) else ())


def viewer_sections(model: "Model", trace: "Trace", lens_limit: int | None = TRACE_LENS_TOKENS) -> dict:
    """{"rollout": …, "lens": … or None} for `viz.html.save_viewer(sections=…)`: the lens of a decoder up
    to `lens_limit` tokens (its cost grows with n · V)."""
    lens = shows_lens(model, len(trace.ids), lens_limit)
    return {"rollout": rollout_payload(trace), "lens": lens_payload(model, trace) if lens else None}
