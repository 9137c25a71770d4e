"""What the HTML viewer receives: one trace as one compact JSON object.

Attention weights travel as one byte each, q = round(a · 255), so a value read back
as q / 255 is within 1/510 ≈ 0.002 of the weight the model computed (PRECISION).
The bytes, laid out (L, H, n_q, n_k) row-major (rows = queries), are zlib-compressed
(most weights are near zero, so this shrinks them several times) and base64-encoded:
an array of `viz.wire`, the one format every page's arrays take (assets/wire.js decodes it).

    {"version": 1, "title": str, "model": str, "family": str, "text": str | null,
     "tokens": [str] (n_q, as the tokenizer spells them: "Ġcapital"),
     "labels": [str] (n_q, as a reader sees them: "␣capital", `Trace.labels`; what the page shows),
     "key_tokens", "key_labels": [str] (n_k) | null (null: self-attention, the keys are the tokens),
     "causal": bool | null (key j > query i was masked; null = not known),
     "layers": [int] (L, model layer numbers), "heads": H,
     "prompt_length": int | null (tokens from here on were generated),
     "roles": [[str | null] (H)] (L) | null, "role_colours": {role: "#rrggbb"} (`palette`),
     "attention": {"dtype": "u8", "shape": [L, H, n_q, n_k], "scale": 255, "data": str}  (`wire`: every
                  weight, when L·H·n_q·n_k bytes fit the page's budget, BUDGET_MB)
                | {"format": "top", "shape": [L, H, n_q, n_k], "k": K, "rule": str (said on the page),
                   "index": [u16 | i32 (H, n_q, K)] (L) (each row's kept keys in ascending order, each written
                            as its distance from the one before; unused slots 0),
                   "weight": [u8 (H, n_q, K) scale 255] (L) (the key's weight; 0 = slot unused),
                   "rest": [u8 (H, n_q) scale 255] (L) (what the row's other keys hold together)}
                  one array per layer, so that the page inflates the layer it shows first and the others
                  after its first paint (a 4,096-token page: 1/30 of the work before it is seen)
                  (`attention_payload`: each query row's K largest weights, past the budget),
     "sinks": {"dtype": "u8", "shape": [L, H, n_q], "scale": 255, "data": str} | null  (`wire`: the share of each
                  attention row its head's sink took, 1 − Σ_j A_ij, a model with attention sinks (gpt-oss); the
                  matrix view draws it as a last column, "sink"; null: no sinks, every row sums to 1)
     "next": null | {"k": K, "vocab": V, "temperatures": [T] (t),
                     "steps": [{"position": i, "chosen": id, "rank": int,
                                "ids": [id], "tokens": [str], "logits": [float],
                                "rest": [float | null] (t), "entropy": [float] (t)}]},
     "view": "head" | "matrix" | "model" | "next" | a panel's id | null (shown first),
     "panels": [{"id", "title", "renderer", "layer"}] (`panels.PANELS`, in tab order),
     "lens" | "rollout" | "patch" | "attribute" | "causal_trace" | "features" | "router": null | {...}
                  (each panel's section, `panels`),
     "image": null | {...}}   (below; absent = null)

"image" (an image model's trace, ViT: tokens [CLS], "patch (0, 0)", … row by row; `image_payload`):
    {"png": "data:image/png;base64,…" (the image the model read, trace.image, as a PNG),
     "height", "width": pixels, "rows", "cols": the grid (trace.grid), "patch": [p_h, p_w] (pixels a patch
     covers: height // rows, width // cols, exact when the patches tile the image), "first": 1 (the token of
     patch (0, 0); patch (r, c) is token first + r·cols + c),
     "predicted": [{"label": str, "p": float}] (the classifier's top PREDICTED labels, softmax of [CLS]'s
     logits, 4 decimals) | []}. The page lays the attention of a query token over the image.

"next" (generation traces that kept their logits, given a tokenizer): for each generated
token i, the distribution it was drawn from, P = softmax(logits[i-1] / T). The page cannot
hold all V logits per token, so it gets the top K (NEXT_K) logits, plus the chosen token's
when it ranks lower (then last in "ids"), and for each temperature T of a fixed grid
(NEXT_TEMPERATURES: 0.1, 0.2, …, 2.0) rest(T) = log Σ exp(z_v / T) over every other token
(`qkv.writing.nexttoken.candidates`). The page's temperature slider moves on that grid (and to 0,
greedy: one-hot, needing no data) and computes
    P_v(T) = exp(z_v / T) / (Σ_kept exp(z_u / T) + exp(rest(T))),
the probability over the whole vocabulary, exactly (logits kept to 4 decimals), not a
renormalisation over the top K; exp(rest(T)) / (…) is the mass of the tokens not listed.
The entropy of the whole distribution (bits) comes precomputed per T for the same reason.
Sampling filters (top-k, top-p) are not applied: this is softmax(logits / T) itself.
About 0.6 kB of JSON per generated token.

The sections beyond attention weights, each a panel of the viewer: `panels.PANELS` declares them (id, title,
builder, renderer) and documents each section's format; the payload holds every panel's section under its id
(null: not shown) and the list of panels, "panels" (`panels.Panel.shipped`), which the page draws its tabs from.

An encoder–decoder's trace (`Seq2SeqModel.run`) becomes three such objects, one per kind of
attention (`viz.seq2seq`), under one title:

    {"version": 1, "title", "model", "family", "text" (the source), "kind": "cross" (shown first),
     "kinds": [{"kind": "encoder" | "decoder" | "cross", "name": str, "caption": str,
                ...every field above, of that kind's trace...}]}

encoder: source × source; decoder: target × target (with "next" when a tokenizer is given);
cross: target × source, its "tokens"/"labels" what each row WROTE (row t: target token t + 1)
and "read_tokens"/"read_labels" what it read (target token t), "key_tokens" the source.
"""

from __future__ import annotations

import json
from typing import Mapping, Sequence

import numpy as np

from ..core.attention import top_of
from ..runtime.errors import QkvError
from ..writing.nexttoken import candidates, token_text
from ..core.trace import Trace
from . import panels
from .image_payload import image_payload
from .palette import role_colours
from .pipeline_mixer import beside_trace
from .seq2seq import CAPTIONS, KINDS, NAMES, kind_traces
from .wire import BYTE_SCALE, encode

SCALE = BYTE_SCALE                 # a weight as one byte: q = round(a · 255)
PRECISION = 0.5 / SCALE            # largest |decoded - original| for weights in [0, 1]
MAX_VALUES = 150_000_000           # L·H·n² weights in one payload (~150 MB before compression)
NEXT_K = 10                                                   # candidates listed per generated token
NEXT_TEMPERATURES = tuple(round(0.1 * i, 1) for i in range(1, 21))   # the slider's grid, T > 0
ATTENTION_VIEWS = ("head", "matrix", "model", "next")          # the page's own views; the others: `panels`

# Characters that must not appear raw inside a <script> element (nor, for U+2028/9,
# inside older JavaScript string literals): written as JSON \u escapes instead.
_SCRIPT_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def encode_attention(attentions: np.ndarray) -> dict:
    """(L, H, n_q, n_k) weights in [0, 1] → a `wire` array of one byte each (see module doc), or one
    clear error for the wrong shape or more than MAX_VALUES weights."""
    a = np.asarray(attentions)
    if a.ndim != 4:
        raise QkvError(f"attention must have shape (L, H, n_q, n_k), got {a.shape}; pass trace.attentions")
    if a.size > MAX_VALUES:
        L, H, n_q, n_k = a.shape
        cells = f"{n_q}²" if n_q == n_k else f"{n_q} × {n_k}"
        raise QkvError(f"{L} layers × {H} heads × {cells} tokens is too much attention for one page "
                       f"({a.size:,} weights, limit {MAX_VALUES:,}); keep fewer layers, "
                       "e.g. model.run(text, layers=[0, -1], keep=('attentions',))")
    return encode(a, "u8", SCALE)                                           # q = round(clip(a, 0, 1) · 255)


BUDGET_MB = 80.0                   # attention bytes one page holds by default (before compression): every
                                   # weight of SmolLM2 up to 512 tokens (71 MB), each row's largest past it
MAX_TOP = 32                       # most weights a query row keeps in a long input's page
LONG_TOKENS = 1024                 # past this many tokens `qkv show --out` traces each row's largest weights only
                                   # (model.run(keep=("attention_top",))): A of every layer no longer fits memory


def check_budget(budget_mb: float | None, name: str = "budget_mb") -> float:
    """A page's attention budget in MB (None: BUDGET_MB), or one error naming NAME: above 0, at most MAX_VALUES."""
    budget = BUDGET_MB if budget_mb is None else float(budget_mb)
    if not (0 < budget <= MAX_VALUES / 1e6):
        raise QkvError(f"{name} must be above 0 and at most {MAX_VALUES / 1e6:g} (megabytes), got {budget_mb!r}")
    return budget


def attention_payload(trace: Trace, budget_mb: float | None = None) -> dict:
    """The page's "attention": every weight (a `wire` u8 array) when L·H·n_q·n_k bytes fit BUDGET_MB, else each
    query row's K largest (module doc, "top"), K the most that fit, at most MAX_TOP. The dense weights come from
    trace.attentions; the top rows from the trace's attention_top (a pass too long to hold A), else from A."""
    budget = check_budget(budget_mb)
    layers = [trace.layers[i] for i in trace.layer_ids]
    dense = trace.attentions                                                # (L, H, n_q, n_k) or None
    top = None if not layers or any(t.attention_top is None for t in layers) else [t.attention_top for t in layers]
    if dense is None and top is None:
        raise QkvError("this trace has no attention weights; run the model with keep=('attentions',) "
                       "(or, for a long input, keep=('attention_top',))")
    L, H, n_q = (dense.shape[:3] if dense is not None else (len(layers),) + top[0].index.shape[:2])
    n_k = dense.shape[3] if dense is not None else top[0].keys
    if dense is not None and L * H * n_q * n_k <= min(budget * 1e6, MAX_VALUES):
        return encode_attention(dense)
    per_row = 2 + 1 if n_k <= 65536 else 4 + 1                             # a key's index and its weight, bytes
    fit = int(budget * 1e6 - L * H * n_q) // (L * H * n_q * per_row)
    K = max(1, min(MAX_TOP, n_k, fit, top[0].k if top is not None else n_k))
    rows = [t if t.k == K else _fewer(t, K) for t in top] if top is not None else \
        [top_of(a, K) for a in dense]                                       # each (H, n_q, K)
    index = np.stack([r.index for r in rows]).astype(np.int64)              # (L, H, n_q, K)
    weight = np.stack([r.weight for r in rows])
    rest = np.stack([r.rest for r in rows]).astype(np.float64)              # (L, H, n_q)
    # What the page stores, for zlib: a weight that rounds to 0 is dropped into the rest (its key written as 0);
    # the kept keys of a row in ascending order, each as its distance from the key before it
    gone = weight * SCALE + 0.5 < 1                                         # q = 0: invisible at ±0.002
    rest += np.where(gone, weight, 0).sum(-1)
    weight = np.where(gone, 0, weight)
    index = np.where(gone, -1, index)
    order = np.argsort(np.where(gone, n_k, index), axis=-1, kind="stable")  # dropped ones last
    index, weight = np.take_along_axis(index, order, -1), np.take_along_axis(weight, order, -1)
    steps = np.diff(np.maximum(index, 0), axis=-1, prepend=0)
    steps[index < 0] = 0
    dense_mb = L * H * n_q * n_k / 1e6
    kind = "u16" if n_k <= 65536 else "i32"
    return {"format": "top", "shape": [L, H, n_q, n_k], "k": K,                # one array per layer (module doc)
            "index": [encode(steps[l], kind) for l in range(L)],
            "weight": [encode(weight[l], "u8", SCALE) for l in range(L)],
            "rest": [encode(rest[l], "u8", SCALE) for l in range(L)],
            "rule": (f"each query row's {K} largest weights (exact, ±0.002 as every weight here) and what the "
                     f"rest of the row holds: all {L} × {H} × {n_q} × {n_k} weights would take {dense_mb:,.1f} MB, "
                     f"more than this page's {budget:g} MB (save_viewer(..., budget_mb=) or qkv show --budget-mb "
                     "sets it; fewer layers or heads, model.run(layers=, heads=), keep every weight)")}


def sinks_payload(trace: Trace) -> dict | None:
    """The page's "sinks" (module doc): each attention row's sink share (L, H, n_q) as a `wire` u8 array, from the
    weights (Trace.sink_shares) or, for a long input's trace, from each row's kept weights and rest (Σ_j A_ij =
    their sum); None for a model without attention sinks."""
    if not trace.sinks:
        return None
    shares = trace.sink_shares                                              # (L, H, n_q) or None
    if shares is None:
        tops = [trace.layers[i].attention_top for i in trace.layer_ids]
        if any(t is None for t in tops):
            return None
        shares = np.stack([1 - t.weight.sum(axis=-1, dtype=np.float64) - t.rest for t in tops])
    return encode(np.clip(shares, 0, 1), "u8", SCALE)


def _fewer(t, K: int):
    """The first K of a TopAttention's kept weights (largest first), the rest of the row grown by the others."""
    from ..core.attention import TopAttention

    return TopAttention(t.index[..., :K], t.weight[..., :K], t.rest + t.weight[..., K:].sum(-1), t.keys)


def page_title(model_name: str | None, text: str | None, width: int = 80) -> str:
    """A page's title: the model's name · TEXT on one line (runs of whitespace as one space), cut after
    WIDTH characters with "…"; empty parts left out."""
    text = " ".join((text or "").split())
    return " · ".join(p for p in (model_name, text[:width] + ("…" if len(text) > width else "")) if p)


def check_roles(roles, n_layers: int, n_heads: int) -> list[list[str | None]] | None:
    """Roles as L × H names (None = no role), or a clear error for the wrong shape."""
    if roles is None:
        return None
    rows = [list(r) for r in roles]
    if len(rows) != n_layers or any(len(r) != n_heads for r in rows):
        shape = f"{len(rows)} × {sorted({len(r) for r in rows})}"
        raise QkvError(f"roles must be {n_layers} × {n_heads} (kept layers × heads), got {shape}; "
                       "give one role name (or None) per head of each kept layer")
    return [[None if r is None or str(r) == "" else str(r) for r in row] for row in rows]


def next_token_payload(trace: Trace, tokenizer) -> dict | None:
    """The "next" part of the payload (see the module doc), or None when the trace is not a
    generation, kept no logits, or no tokenizer is given to spell the candidates."""
    p = trace.prompt_length
    if trace.logits is None or p is None or tokenizer is None or p >= len(trace.ids) or p < 1:
        return None
    chosen = np.asarray(trace.ids[p:], dtype=np.int64)                      # (m,) the generated tokens
    c = candidates(trace.logits[p - 1:-1], chosen, NEXT_K, NEXT_TEMPERATURES)   # row i-1 predicts token i
    steps = []
    for r in range(len(chosen)):
        keep = c["ids"][r] >= 0
        ids = c["ids"][r][keep].tolist()
        steps.append({"position": p + r, "chosen": int(chosen[r]), "rank": int(c["rank"][r]), "ids": ids,
                      "tokens": [token_text(tokenizer, i) for i in ids],
                      "logits": [round(float(x), 4) for x in c["logits"][r][keep]],
                      "rest": [round(float(x), 4) if np.isfinite(x) else None for x in c["rest"][r]],
                      "entropy": [round(float(x), 4) for x in c["entropy"][r]]})
    return {"k": NEXT_K, "vocab": int(trace.logits.shape[-1]), "temperatures": list(NEXT_TEMPERATURES),
            "steps": steps}


def check_sections(sections: Mapping[str, dict | None] | None, view: str | None, n: int) -> dict:
    """The panels' sections (`panels`) and the view shown first, checked against n tokens: every panel's
    section under its id (None: not given), and "panels", the list the page draws its tabs from."""
    sections = {k: v for k, v in (sections or {}).items() if v is not None}
    known = [p.id for p in panels.PANELS]
    unknown = sorted(set(sections) - set(known))
    if unknown:
        raise QkvError(f"unknown viewer sections {unknown}; choose from {known}")
    if view is not None and view not in ATTENTION_VIEWS and view not in sections:
        raise QkvError(f"the viewer cannot open {view!r} first; choose from "
                       f"{list(ATTENTION_VIEWS) + [v for v in known if v in sections]}")
    for name, section in sections.items():
        size = panels.panel(name).tokens(section)
        if size != n:
            raise QkvError(f"the {name} section is about {size} tokens and the trace has {n}; "
                           "compute it from the same text")
    return {"view": view, "panels": [p.shipped() for p in panels.PANELS],
            **{p.id: sections.get(p.id) for p in panels.PANELS}}


def trace_payload(trace: Trace, *, model_name: str | None = None,
                  roles: Sequence[Sequence[str | None]] | None = None, title: str | None = None,
                  tokenizer=None, sections: Mapping[str, dict | None] | None = None,
                  view: str | None = None, budget_mb: float | None = None) -> dict:
    """The JSON object the viewer draws: tokens, kept layers, roles, compact attention, and for
    a generation with logits (and a tokenizer), each generated token's candidates.
    budget_mb: the attention bytes the page holds before compression (BUDGET_MB): past it, each query row's
    largest weights only (`attention_payload`).

    model_name: instead of the trace's own `model` (what the title and the page name).
    sections: {panel id: section} (`panels`: "lens", "rollout", "patch", "attribute", "causal_trace",
    "features"; the router's comes from the trace), each adding a view; view: the view shown first (default the
    head view).
    An encoder–decoder's trace gives its three kinds of attention (`seq2seq_payload`).
    tokenizer: None takes the trace's own (Model.run and generation keep it; Trace.load's has none)."""
    tokenizer = trace.tokenizer if tokenizer is None else tokenizer
    if trace.cross is not None:
        if roles is not None:
            raise QkvError("roles colour the heads of one stack; an encoder–decoder's trace takes none")
        if sections or view is not None:
            raise QkvError("lens, rollout and patching panels show one stack; an encoder–decoder's viewer takes none")
        return seq2seq_payload(trace, model_name=model_name, title=title, tokenizer=tokenizer, budget_mb=budget_mb)
    attention = attention_payload(trace, budget_mb)
    L, H, n_q, n_k = attention["shape"]
    if (n_q, n_k) != (len(trace.labels), len(trace.key_labels)):
        raise QkvError(f"the trace has {len(trace.labels)} × {len(trace.key_labels)} tokens but attention over "
                       f"{n_q} × {n_k}; use an unmodified trace")
    model_name = trace.model if model_name is None else model_name
    roles = check_roles(roles, L, H)
    cross = trace.source_tokens is not None
    sections = dict(sections or {})
    for p in panels.PANELS:                                             # a MoE model's router: from the trace
        if p.from_trace and not sections.get(p.id):
            sections[p.id] = p.build(trace)
    if title is None:
        title = page_title(model_name, trace.text)
    payload = {
        "version": 1,
        "title": title or "attention",
        "model": model_name,
        "family": trace.family,
        "text": trace.text,
        "tokens": [str(t) for t in trace.tokens],
        "labels": trace.labels,
        "key_tokens": [str(t) for t in trace.source_tokens] if cross else None,
        "key_labels": trace.key_labels if cross else None,
        "causal": trace.causal,
        "layers": [int(i) for i in trace.layer_ids],
        "heads": int(H),
        "prompt_length": None if trace.prompt_length is None else int(trace.prompt_length),
        "roles": roles,
        "role_colours": role_colours(roles),
        "attention": attention,
        "sinks": sinks_payload(trace),
        "next": next_token_payload(trace, tokenizer),
        "image": image_payload(trace),
        **check_sections(sections, view, n_q),
    }
    beside = beside_trace(trace)                  # Falcon-H1: the Mamba-2 mixer beside each layer's attention
    return payload if beside is None else beside_payload(payload, trace_payload(beside, title=title,
                                                                                 model_name=model_name))


def beside_payload(payload: dict, mixer: dict) -> dict:
    """PAYLOAD with two kinds of attention, each a whole payload as an encoder–decoder's three: "attention", its
    softmax heads (and the panels), and "mixer" (MIXER, no panels): the attention the Mamba-2 mixer beside them
    implies (Falcon-H1, `pipeline_mixer.beside_trace`), its own heads over the same tokens; attention shown first."""
    return {**payload, "kind": "attention", "kinds": [
        {**payload, "kind": "attention", "name": "Attention",
         "caption": "softmax attention: each head's A = softmax(Q·Kᵀ/√d_k + M)"},
        {**mixer, **{p["id"]: None for p in payload.get("panels", [])}, "kind": "mixer", "name": "Mamba-2 mixer",
         "caption": "the Mamba-2 mixer beside it: each Mamba head's implied attention |α|, rows divided by their sums "
                    "(Ali et al. 2024)"}]}


def seq2seq_payload(trace: Trace, *, model_name: str | None = None, title: str | None = None,
                    tokenizer=None, budget_mb: float | None = None) -> dict:
    """The JSON object of an encoder–decoder's trace: one payload per kind of attention (module doc).

    tokenizer: the model's, to spell what the last row would write and to add the decoder's
    next-token view; without it the last row of the cross view is labelled "…"."""
    kinds = kind_traces(trace, tokenizer)
    model_name = trace.model if model_name is None else model_name
    if title is None:
        target = " ".join((trace.text or "").split())
        title = page_title(model_name, (trace.encoder.text or "") + (f" → {target}" if target else ""), 120)
    parts = []
    for kind in KINDS:
        part = trace_payload(kinds[kind], model_name=model_name, title=title,
                             tokenizer=tokenizer if kind == "decoder" else None, budget_mb=budget_mb)
        part.update(kind=kind, name=NAMES[kind], caption=CAPTIONS[kind])
        if kind == "cross":
            part.update(read_tokens=[str(t) for t in trace.tokens], read_labels=trace.labels)
        parts.append(part)
    return {"version": 1, "title": title or "attention", "model": model_name, "family": trace.family,
            "text": trace.encoder.text, "kind": "cross", "kinds": parts}


def script_json(obj) -> str:
    """JSON that can sit inside <script>…</script>: no raw <, >, & or line separators."""
    text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    for char, escape in _SCRIPT_UNSAFE.items():
        text = text.replace(char, escape)
    return text
