"""Steering with a feature: add a latent's decoder direction, times α, to the stream while the model runs.

    x ← x + Σ_f α_f · W_dec[f]          at the SAE's layer and site, at every position

W_dec[f] (d_in,) is latent f's direction (row f, unit norm: `features.sae`); α is in the activation's own
units, so α = 10 writes the direction as strongly as the latent firing at 10 would. The hook point is the
SAE's site (`features.saelens` for how SAELens's hook names map to them):

    resid at layer L      "L.residual"   the residual stream entering block L
    attn_out at layer L   "L.attn_out"   what attention adds to it (so the stream after it moves the same)
    ffn_out at layer L    "L.ffn_out"    what the FFN adds

A transcoder's decoder writes where it writes (its site_out: the FFN's output), not where it reads (the FFN's
input), so its features steer at "L.ffn_out"; its input point ("L.ffn_in", or "L.residual_mid") is where pages
and eval read it.

Hooks run on the positions a pass adds (core.hooks): the prompt's positions in the first pass, then
each new token's with a KV cache; the keys and values the cache keeps were made from the steered stream,
so generating with the cache gives what generating without it gives.

    hooks = steering_hooks(sae, {12: 8.0})
    model.generate("The weather today", 20, hooks=hooks)         # or model.with_hooks(hooks).chat(...)
    parse_steer("12:8,40:-4")  → {12: 8.0, 40: -4.0}             (`qkv generate|chat --steer`)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from ..runtime.errors import QkvError

if TYPE_CHECKING:
    from ..models.model import Model
    from .sae import SAE

POINTS = {"resid": "residual", "attn_out": "attn_out", "ffn_out": "ffn_out",   # SAE site → qkv's hook point
          "ffn_in": "ffn_in", "resid_mid": "residual_mid"}                    # (a transcoder's inputs)


def hook_point(sae: "SAE", layer: int | None = None, site: str | None = None) -> tuple[int, str, str]:
    """(layer, site, hook name "L.point") the SAE reads, from its config (or LAYER, SITE if given)."""
    cfg = sae.config
    layer = cfg.layer if layer is None else layer
    site = cfg.site if site is None else site
    if layer is None or site is None:
        raise QkvError("the SAE's cfg.json does not say which layer and site it reads (its hook_name); "
                       "give layer= and site= (resid, attn_out or ffn_out)")
    if site not in POINTS:
        raise QkvError(f"unknown site {site!r}; give one of {', '.join(POINTS)}")
    return int(layer), site, f"{int(layer)}.{POINTS[site]}"


def check_model(model: "Model", sae: "SAE", layer: int | None = None, site: str | None = None) -> tuple[int, str, str]:
    """hook_point, checked against MODEL: its width is the SAE's d_in (and d_out) and it has the layer."""
    layer, site, name = hook_point(sae, layer, site)
    d = model.config.d_model
    for verb, width in (("reads", sae.config.d_in), ("writes", sae.config.width_out)):
        if d != width:
            trained = f" ({sae.config.model})" if sae.config.model else ""
            raise QkvError(f"the SAE {verb} {width}-wide activations and {model.name}'s stream is {d} wide; "
                           f"give the model the SAE was trained on{trained}")
    if not 0 <= layer < model.config.n_layers:
        raise QkvError(f"the SAE reads layer {layer} ({site}) and {model.name} has layers "
                       f"0..{model.config.n_layers - 1}; give the model the SAE was trained on")
    return layer, site, name


def check_features(sae: "SAE", features: Mapping[int, float]) -> dict[int, float]:
    """{feature: α} with every feature in 0..d_sae-1 and every α finite, or one error."""
    if not features:
        raise QkvError("no feature to steer with; give FEATURE:ALPHA, e.g. --steer 12:8")
    out = {}
    n = sae.config.d_sae
    for f, a in features.items():
        if isinstance(f, bool) or not isinstance(f, (int, np.integer)) or not 0 <= f < n:
            raise QkvError(f"feature {f!r} is not one of the SAE's latents 0..{n - 1}; give an index in that range")
        if not np.isfinite(float(a)):
            raise QkvError(f"the α of feature {f} is {a!r}; give a finite number, e.g. 8 or -4")
        out[int(f)] = out.get(int(f), 0.0) + float(a)
    return out


def steering_vector(sae: "SAE", features: Mapping[int, float]) -> np.ndarray:
    """Σ_f α_f · W_dec[f] (d_out,) float32: what steering adds to each position."""
    features = check_features(sae, features)
    idx = np.array(list(features), dtype=np.int64)                              # (m,)
    alpha = np.array(list(features.values()), dtype=np.float64)                 # (m,)
    v = alpha @ sae.W_dec[idx].astype(np.float64)                               # (d_in,) float64
    top = float(np.abs(v).max(initial=0.0))
    if not top < float(np.finfo(np.float32).max):
        raise QkvError(f"the steering vector Σ α·W_dec reaches {top:.3g}, beyond float32; give smaller α "
                       "(a few times the feature's typical activation, e.g. 8)")
    return v.astype(np.float32)                                                 # (d_in,)


def steering_hooks(sae: "SAE", features: Mapping[int, float], *, layer: int | None = None,
                   site: str | None = None) -> dict:
    """{"L.point": fn}: a hook that adds Σ_f α_f · W_dec[f] to every position at the SAE's layer and site
    (module doc; a transcoder's at the point it writes, site_out), for model.generate(hooks=...),
    model.run(hooks=...) or model.with_hooks(...)."""
    layer, _, name = hook_point(sae, layer, site)
    if sae.config.transcoder:
        name = f"{layer}.{POINTS[sae.config.site_out or 'ffn_out']}"
    v = steering_vector(sae, features)                                          # (d_in,)

    def steer(value: np.ndarray, layer: int) -> np.ndarray:
        if value.shape[-1] != v.shape[0]:
            raise QkvError(f"the SAE's direction is {v.shape[0]} wide and the stream at {name} is "
                           f"{value.shape[-1]}; give the model the SAE was trained on")
        return value + v.astype(value.dtype)                                    # (B, n, d_model)

    return {name: steer}


def parse_steer(text: str) -> dict[int, float]:
    """"12:8,40:-4.5" → {12: 8.0, 40: -4.5}, or one error saying the syntax (`--steer`)."""
    out: dict[int, float] = {}
    items = [p.strip() for p in str(text).split(",")]
    for item in items:
        f, sep, a = item.partition(":")
        try:
            if not sep:
                raise ValueError
            feature, alpha = int(f.strip()), float(a.strip())
        except ValueError:
            raise QkvError(f"--steer {text!r}: {item!r} is not FEATURE:ALPHA; give e.g. --steer 12:8 or "
                           "--steer 12:8,40:-4") from None
        if not np.isfinite(alpha):
            raise QkvError(f"--steer {text!r}: the α of feature {feature} is not a finite number; give e.g. 12:8")
        out[feature] = out.get(feature, 0.0) + alpha
    return out
