"""The figure and the viewer's section of model diffing (`qkv diff`, qkv.analysis.diff), from its arrays (viz
comes before analysis: nothing here computes a diff).

    diff_figure    layers × heads: each head's attention-pattern JS divergence (bits), beside each layer's
                   logit-lens KL(A‖B) (nats) and residual-stream 1 − cos, means over positions
    diff_section   the viewer's "diff" section (its panel: viewer_diff.js)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from ..runtime.errors import QkvError
from .drawing import figure_title, new_figure, styled
from .palette import CAUSAL_STOPS, CMAP

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DIFF_STOPS = CAUSAL_STOPS["attn"]       # light (unchanged) → dark red (moved most), the page's ramp
DIGITS = 6                              # significant digits the page receives


@styled
def diff_figure(js: np.ndarray, layers: Mapping[str, np.ndarray], *, model_a: str, model_b: str) -> "Figure":
    """Left: JS (L, H) of each head's attention pattern, layer 0 at the bottom (bits, 0 = the same). Right: per
    row of the stream 0..L, the mean over positions of the logit lens's KL(A‖B) (nats) and of 1 − cos of the
    residual stream (LAYERS: "lens_kl", "cosine" (L+1,) each; lens_kl absent for an encoder)."""
    L, H = js.shape
    fig = new_figure(float(np.clip(6.0 + 0.45 * H, 8.0, 16.0)), float(np.clip(2.2 + 0.2 * L, 4.5, 10.0)))
    left, right = fig.subplots(1, 2, width_ratios=[max(H, 4), 5])
    im = left.imshow(js, cmap=CMAP, vmin=0.0, vmax=max(float(js.max()), 1e-12), aspect="auto", origin="lower")
    left.set_xticks(range(H), [str(h) for h in range(H)], fontsize=8)
    step = max(1, L // 16)
    left.set_yticks(range(0, L, step), [str(l) for l in range(0, L, step)], fontsize=8)
    left.set_xlabel("head")
    left.set_ylabel("layer")
    left.set_title("attention pattern: JS divergence (bits)", fontsize=9)
    fig.colorbar(im, ax=left, shrink=0.8, pad=0.02)
    rows = np.arange(L + 1)
    if "lens_kl" in layers:
        right.plot(layers["lens_kl"], rows, "o-", ms=3, color="#b2182b", label="logit lens KL(A‖B), nats")
    right.plot(1.0 - np.asarray(layers["cosine"]), rows, "s-", ms=3, color="#2166ac",
               label="residual stream 1 − cos")
    right.set_ylim(-0.5, L + 0.5)
    right.set_yticks(range(0, L + 1, step), [str(l) for l in range(0, L + 1, step)], fontsize=8)
    right.set_ylabel("stream after l blocks (0: embeddings)")
    right.set_xlabel("mean over positions")
    right.legend(fontsize=7, loc="best")
    right.set_title("per layer", fontsize=9)
    fig.suptitle(figure_title(model_a, f"A vs B: {model_b}"), fontsize=10)
    return fig


def diff_section(data: Mapping) -> dict:
    """The "diff" section from `ModelDiff.to_json()` (or any mapping with its keys): {"model_a", "model_b",
    "tokens": [str] (n), "js": [[float]] (L × H, bits), "js_max", "cosine", "norm_ratio": [[float]] (L+1 × n),
    "lens_kl": [[float]] (L+1 × n, nats) | null, "top_heads": [{"layer", "head", "js"}], "colours"
    (DIFF_STOPS)}; numbers to DIGITS significant digits."""
    js = np.asarray(data["js"], np.float64)
    tokens = [str(t) for t in data["tokens"]]
    n = len(tokens)
    cos, ratio = np.asarray(data["cosine"], np.float64), np.asarray(data["norm_ratio"], np.float64)
    if js.ndim != 2 or cos.shape != (js.shape[0] + 1, n) or ratio.shape != cos.shape:
        raise QkvError(f"a diff needs js (L × H) and cosine, norm_ratio ((L+1) × n) for its {n} tokens; got "
                       f"{js.shape}, {cos.shape}, {ratio.shape}: pass ModelDiff.to_json()")
    kl = data.get("lens_kl")
    rounded = lambda a: [[float(f"{x:.{DIGITS}g}") for x in r] for r in np.asarray(a, np.float64)]
    return {"model_a": str(data["model_a"]), "model_b": str(data["model_b"]), "tokens": tokens,
            "js": rounded(js), "js_max": float(js.max()), "cosine": rounded(cos), "norm_ratio": rounded(ratio),
            "lens_kl": None if kl is None else rounded(kl),
            "top_heads": [{"layer": int(t["layer"]), "head": int(t["head"]), "js": float(t["js"])}
                          for t in data.get("top_heads", [])],
            "colours": [list(c) for c in DIFF_STOPS]}


def diff_rows(js: np.ndarray, layers: Mapping[str, np.ndarray]) -> list[Sequence]:
    """Per layer l (0..L−1): (l, max JS of its heads, mean JS, cos, norm ratio, lens KL of the stream after it)."""
    out = []
    for l in range(js.shape[0]):
        kl = layers["lens_kl"][l + 1] if "lens_kl" in layers else None
        out.append((l, float(js[l].max()), float(js[l].mean()), float(layers["cosine"][l + 1]),
                    float(layers["norm_ratio"][l + 1]), kl))
    return out
