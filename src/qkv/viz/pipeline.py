"""The pipeline page: the whole model as its data flow, one self-contained HTML file (no network).

Tokens → embedding (+ positions) → L blocks (norm → Q, K, V → S = Q·Kᵀ/√d_k → mask → A = softmax
→ Z = A·V → Concat·W_O → residual → norm → FFN → residual) → final norm → logits →
softmax(logits/T) → next token, as Transformer Explainer draws GPT-2, but for any model qkv
runs, offline, in English and Korean. Every box opens to the real arrays of one forward pass
(`Model.run`) for the chosen token, layer and head: shape, a heatmap or bars, a few numbers,
and the guide's formula. The output end re-normalises in the page: a temperature slider, top-k
and top-p, computed from the last position's whole-vocabulary logits exactly as qkv.writing.sampling.
An encoder (MiniLM) ends at its final hidden states and their mean-pooled sentence embedding; an
encoder–decoder (ko-en-tiny) shows both stacks, its decoder blocks with cross-attention boxes.
A layer without softmax (Mamba, Mamba-2, Qwen3-Next's gated delta rule, MiniMax's lightning attention; Falcon-H1's
Mamba-2 mixer beside its attention) opens to its own steps instead, ending in the token-to-token matrix it implies
and that matrix times the values, the layer's output (`pipeline_mixer`).
What travels, and how precisely: `pipeline_payload`.

    save_pipeline(model, "The cat sat on the mat", "pipeline.html")          # runs the model
    save_pipeline(model, model.run(text), "pipeline.html", lang="ko")        # a trace you have
"""

from __future__ import annotations

import os
from pathlib import Path

from ..runtime.errors import QkvError
from ..core.trace import Trace
from .html import asset, page, pipeline_js, write_html
from .payload import script_json
from .pipeline_payload import PIPELINE_KEEP, is_seq2seq, pipeline_payload

__all__ = ["pipeline_payload", "pipeline_html", "save_pipeline", "pipeline_trace", "PIPELINE_KEEP"]


def pipeline_trace(model, text: str) -> Trace:
    """TEXT through MODEL with every intermediate kept (PIPELINE_KEEP: a scan's or a linear attention's own steps
    too). An encoder–decoder translates TEXT (greedy) and the trace stops before the translation's end-of-sequence
    token, so that the output end shows the model predicting it."""
    if not text.strip():
        raise QkvError("the text is empty; give some words to follow through the model")
    if is_seq2seq(model):
        trace = model.run(text)
    else:
        trace = model.run(text, keep=PIPELINE_KEEP)
    if is_seq2seq(model):
        eos = model.config.eos_token_id
        eos = {eos} if isinstance(eos, int) else set(eos or ())
        if len(trace.ids) > 2 and int(trace.ids[-1]) in eos:
            trace = model.run(text, [int(i) for i in trace.ids[:-1]])
    return trace


def pipeline_body(payload: dict) -> str:
    """The page's markup: its CSS, a root element and the payload as JSON (scripts come after)."""
    return (f"<style>\n{asset('pipeline.css')}</style>\n"
            "<div data-qkv-pipeline></div>\n"
            f"<script type=\"application/json\" class=\"qkv-pipeline-data\">{script_json(payload)}</script>")


def pipeline_html(model, trace: Trace, *, title: str | None = None, lang: str = "en", layer: int = 0,
                  head: int = 0, box: str | None = None) -> str:
    """One complete, self-contained HTML document: the pipeline page of TRACE through MODEL
    (lang, layer, head, box: what it shows first, see `pipeline_payload`)."""
    payload = pipeline_payload(model, trace, title=title, lang=lang, layer=layer, head=head, box=box)
    return page(payload["title"], pipeline_body(payload),
                [asset("wire.js") + "\n" + asset("export.js") + "\n" + pipeline_js(), "QKV_PIPELINE.boot();"])


def save_pipeline(model, text_or_trace: str | Trace, path: str | os.PathLike, lang: str = "en", *,
                  title: str | None = None, layer: int = 0, head: int = 0, box: str | None = None) -> Path:
    """Write the pipeline page of a text (run through MODEL now) or of a trace to PATH, atomically
    (lang, layer, head, box: what it shows first)."""
    if isinstance(text_or_trace, Trace):
        trace = text_or_trace
    elif isinstance(text_or_trace, str):
        trace = pipeline_trace(model, text_or_trace)
    else:
        raise QkvError(f"save_pipeline takes a text or a trace, got {type(text_or_trace).__name__}")
    return write_html(pipeline_html(model, trace, title=title, lang=lang, layer=layer, head=head, box=box), path)
