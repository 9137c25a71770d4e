"""What the HTML viewer receives: one trace as one compact JSON object.

Attention weights travel as one byte each, q = round(a · 255), so a value read back
as q / 255 is within 1/510 ≈ 0.002 of the weight the model computed (PRECISION).
The bytes, laid out (L, H, n, n) row-major (rows = queries), are zlib-compressed
(most weights are near zero, so this shrinks them several times) and base64-encoded;
the browser inflates them with its built-in DecompressionStream("deflate").

    {"version": 1, "title": str, "model": str, "text": str | null,
     "tokens": [str] (n), "layers": [int] (L, model layer numbers), "heads": H,
     "prompt_length": int | null (tokens from here on were generated),
     "roles": [[str | null] (H)] (L) | null,
     "attention": {"encoding": "uint8-deflate-base64", "shape": [L, H, n, n],
                   "scale": 255, "data": str}}
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import Sequence

import numpy as np

from ..errors import QkvError
from ..trace import Trace

ENCODING = "uint8-deflate-base64"
SCALE = 255
PRECISION = 0.5 / SCALE            # largest |decoded - original| for weights in [0, 1]
MAX_VALUES = 150_000_000           # L·H·n² weights in one payload (~150 MB before compression)

# Characters that must not appear raw inside a <script> element (nor, for U+2028/9,
# inside older JavaScript string literals): written as JSON \u escapes instead.
_SCRIPT_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def encode_attention(attentions: np.ndarray) -> dict:
    """(L, H, n, n) weights in [0, 1] → {"encoding", "shape", "scale", "data"} (see module doc)."""
    a = np.asarray(attentions)
    if a.ndim != 4 or a.shape[2] != a.shape[3]:
        raise QkvError(f"attention must have shape (L, H, n, n), got {a.shape}; pass trace.attentions")
    if a.size > MAX_VALUES:
        L, H, n, _ = a.shape
        raise QkvError(f"{L} layers × {H} heads × {n}² tokens is too much attention for one page "
                       f"({a.size:,} weights, limit {MAX_VALUES:,}); keep fewer layers, "
                       "e.g. model.run(text, layers=[0, -1], keep=('attentions',))")
    # Plain form: q = uint8(round(clip(a, 0, 1) · 255)); this one makes fewer copies (and NaN → 0).
    x = np.multiply(a, SCALE, dtype=np.float32)                           # (L, H, n, n)
    np.fmax(x, 0.0, out=x)
    np.fmin(x, SCALE, out=x)
    x += 0.5
    q = x.astype(np.uint8)                                                  # (L, H, n, n)
    data = base64.b64encode(zlib.compress(q.tobytes(), 6)).decode("ascii")
    return {"encoding": ENCODING, "shape": list(q.shape), "scale": SCALE, "data": data}


def decode_attention(encoded: dict) -> np.ndarray:
    """The inverse of `encode_attention`: (L, H, n, n) float32, within PRECISION of the original."""
    if encoded.get("encoding") != ENCODING:
        raise QkvError(f"unknown attention encoding {encoded.get('encoding')!r}; expected {ENCODING!r}")
    raw = zlib.decompress(base64.b64decode(encoded["data"]))
    q = np.frombuffer(raw, dtype=np.uint8).reshape(encoded["shape"])       # (L, H, n, n)
    return q.astype(np.float32) / encoded["scale"]


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


def trace_payload(trace: Trace, *, model_name: str = "", roles: Sequence[Sequence[str | None]] | None = None,
                  title: str | None = None) -> dict:
    """The JSON object the viewer draws: tokens, kept layers, roles and compact attention."""
    att = trace.attentions                                                  # (L, H, n, n)
    if att is None:
        raise QkvError("this trace has no attention weights; run the model with keep=('attentions',)")
    L, H, n, _ = att.shape
    if n != len(trace.tokens):
        raise QkvError(f"the trace has {len(trace.tokens)} tokens but attention over {n}; use an unmodified trace")
    if title is None:
        text = " ".join(trace.text.split()) if trace.text else ""
        title = " · ".join(p for p in (model_name, text[:80] + ("…" if len(text) > 80 else "")) if p)
    return {
        "version": 1,
        "title": title or "attention",
        "model": model_name,
        "text": trace.text,
        "tokens": [str(t) for t in trace.tokens],
        "layers": [int(i) for i in trace.layer_ids],
        "heads": int(H),
        "prompt_length": None if trace.prompt_length is None else int(trace.prompt_length),
        "roles": check_roles(roles, L, H),
        "attention": encode_attention(att),
    }


def script_json(obj) -> str:
    """JSON that can sit inside <script>…</script>: no raw <, >, & or line separators."""
    text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    for char, escape in _SCRIPT_UNSAFE.items():
        text = text.replace(char, escape)
    return text
