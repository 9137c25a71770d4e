"""The builders of the viewer's panels beyond attention weights: the optional "lens", "rollout", "patch",
"attribute", "causal_trace", "features" (an SAE's latents on each token) and "router" sections of the payload
(`panels` declares each panel and documents its section), built from plain arrays (or the JSON) that
qkv.analysis (and qkv.features) computes (viz comes before analysis, so nothing here computes a lens or a
patch), and the router's from the trace itself.

Big arrays travel as attention does, as `wire` arrays: probabilities u16 with scale 65535
(±0.5/65535 ≈ 7.6e-6, PROB_PRECISION), rollout and flow u8 with scale 255 (±0.002, as attention:
`payload.PRECISION`), ranks and token ids i32 as they are.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from ..core.trace import Trace
from ..runtime.errors import QkvError
from .palette import CAUSAL_STOPS, DIVERGING_STOPS
from .wire import BYTE_SCALE as SCALE, encode

LENS_K = 5                              # top tokens kept per (layer, position) cell of the lens
PROB_SCALE = 65535                      # probabilities as u16: q = round(p · 65535)
PROB_PRECISION = 0.5 / PROB_SCALE       # largest |decoded - original| of a probability
PATCH_DECIMALS = 5                      # patching effects, rounded in the JSON
PATCH_TABLES = ("heads", "residual", "attn_out", "ffn_out", "cross")   # cross: encoder–decoders
SCORE_DIGITS = 6                        # input attribution's scores: significant digits in the JSON
CAUSAL_KINDS = ("hidden", "ffn", "attn")    # causal tracing's tables: the state restored
CAUSAL_DECIMALS = 6                     # causal tracing's probabilities, rounded in the JSON


def lens_section(probs: np.ndarray, ranks: np.ndarray, predicted: np.ndarray, top_ids: np.ndarray,
                 top_probs: np.ndarray, spell: Callable[[int], str], vocab: int) -> dict:
    """The "lens" section: rows 0..L (row 0: the embeddings) × n positions.

    probs (L+1, n): P(final prediction) read at each layer; ranks (L+1, n): its rank there (1 = top);
    predicted (n,): each position's final prediction (its top token at row L); top_ids, top_probs
    (L+1, n, k): each cell's k most likely tokens and their probabilities; spell(id) → the token
    as a reader sees it; vocab: V."""
    probs, ranks = np.asarray(probs), np.asarray(ranks)                         # (L+1, n)
    top_ids, top_probs = np.asarray(top_ids), np.asarray(top_probs)             # (L+1, n, k)
    rows, n = probs.shape
    if ranks.shape != (rows, n) or top_ids.shape[:2] != (rows, n) or top_probs.shape != top_ids.shape \
            or len(predicted) != n:
        raise QkvError(f"lens arrays disagree: probs {probs.shape}, ranks {ranks.shape}, top {top_ids.shape}, "
                       f"{len(predicted)} predictions; compute them together (analysis.lens.lens_top)")
    ids = sorted({int(i) for i in top_ids.ravel()} | {int(i) for i in predicted})
    return {"rows": int(rows), "positions": int(n), "k": int(top_ids.shape[2]), "vocab": int(vocab),
            "predicted": [int(i) for i in predicted],
            "prob": encode(probs, "u16", PROB_SCALE),
            "rank": encode(ranks, "i32"),
            "top_ids": encode(top_ids, "i32"),
            "top_prob": encode(top_probs, "u16", PROB_SCALE),
            "spelling": {"ids": ids, "tokens": [spell(i) for i in ids]}}


def rollout_section(rollout: np.ndarray, flow: np.ndarray | None = None, flow_note: str | None = None) -> dict:
    """The "rollout" section: rollout (L, n, n), R_l after layers 1..l (row = position, column =
    input token), and attention flow (n, n) after all L layers, or None with FLOW_NOTE saying why."""
    R = np.asarray(rollout)
    if R.ndim != 3 or R.shape[1] != R.shape[2]:
        raise QkvError(f"rollout must be (L, n, n), got {R.shape}; pass analysis.attention_rollout(trace)")
    if flow is not None and np.shape(flow) != R.shape[1:]:
        raise QkvError(f"flow must be (n, n) = {R.shape[1:]}, got {np.shape(flow)}; pass analysis.attention_flow(trace)")
    return {"rollout": encode(R, "u8", SCALE),
            "flow": None if flow is None else encode(flow, "u8", SCALE),
            "flow_note": None if flow is not None else flow_note}


def patch_section(tables: Mapping) -> dict:
    """The "patch" section from `Patching.as_json()` (or any mapping with its keys): the metric,
    the two texts, m(clean), m(corrupted), labels (n) and the tables heads (L, H), residual,
    attn_out, ffn_out (L, n), each rounded to PATCH_DECIMALS (null: not computed). An estimate's
    (`analysis.atp.AttributionPatching.as_json()`) has a "method" ("attribution patching (AtP)"); exact tables
    may carry one beside them: "estimate" {"method", "tables"} (the panel draws each estimate map by its own)."""
    def rounded(source: Mapping) -> dict:
        return {name: None if source.get(name) is None else
                np.round(np.asarray(source[name], dtype=np.float64), PATCH_DECIMALS).tolist() for name in PATCH_TABLES}
    labels: Sequence[str] = tables["labels"]
    estimate = tables.get("estimate")
    return {"metric": str(tables["metric"]), "normalised": bool(tables.get("normalised", True)),
            "clean": str(tables.get("clean", "")), "corrupted": str(tables.get("corrupted", "")),
            "metric_clean": float(tables["metric_clean"]), "metric_corrupted": float(tables["metric_corrupted"]),
            "labels": [str(x) for x in labels], "tables": rounded(tables),
            "method": None if tables.get("method") is None else str(tables["method"]),
            "estimate": None if estimate is None else {"method": str(estimate["method"]),
                                                       "tables": rounded(estimate["tables"])}}


def _optional(data: Mapping) -> Callable[[str, Callable], object]:
    """optional(key, kind): kind(DATA[key]), or None when DATA lacks it (or holds null)."""
    return lambda key, kind: None if data.get(key) is None else kind(data[key])


def attribute_section(data: Mapping) -> dict:
    """The "attribute" section from `InputAttribution.to_json()` (or any mapping with its keys): the n input
    tokens, their ids and scores (SCORE_DIGITS significant digits), "sides" (an encoder–decoder's: "source" or
    "target" per token; null otherwise), what was attributed ("output", "method", "logit", "target",
    "target_token", "other") and, for integrated gradients, "baseline", "steps", "baseline_logit" and
    "completeness_error"; "sum" (Σ scores) and "max" (max |score|, the colour scale's end) computed here, and
    "colours" the DIVERGING_STOPS the page interpolates (`palette`: the figures' map)."""
    tokens, ids = [str(t) for t in data["tokens"]], [int(i) for i in data["ids"]]
    scores = np.asarray(data["scores"], dtype=np.float64)                     # (n,)
    n = len(tokens)
    if n == 0 or len(ids) != n or scores.shape != (n,):
        raise QkvError(f"an attribution needs one id and one score per token: {n} tokens, {len(ids)} ids, "
                       f"scores {scores.shape}; pass InputAttribution.to_json()")
    if not np.isfinite(scores).all():
        raise QkvError("the attribution's scores are not all finite; compute them again (a smaller --steps "
                       "or another method)")
    sides = data.get("sides")
    if sides is not None:
        sides = [str(x) for x in sides]
        if len(sides) != n or set(sides) - {"source", "target"} or "target" not in sides:
            raise QkvError(f"an encoder–decoder's attribution gives 'source' or 'target' for each of its {n} tokens "
                           "(the target's at least one); pass InputAttribution.to_json()")
    optional = _optional(data)
    return {"method": str(data["method"]), "output": str(data.get("output", "")), "target": optional("target", int),
            "target_token": str(data.get("target_token", "")), "other": optional("other", int),
            "logit": float(data["logit"]), "baseline_logit": optional("baseline_logit", float),
            "steps": optional("steps", int), "baseline": optional("baseline", str),
            "completeness_error": optional("completeness_error", float),
            "tokens": tokens, "ids": ids, "scores": [float(f"{x:.{SCORE_DIGITS}g}") for x in scores], "sides": sides,
            "sum": float(scores.sum()), "max": float(np.abs(scores).max()),
            "colours": [list(c) for c in DIVERGING_STOPS]}


def causal_scale(table: np.ndarray, p_clean: float, p_corrupted: float) -> float:
    """The top of a causal-tracing map's colour scale: max(p_clean − p_corrupted, max(table) − p_corrupted),
    the indirect effect p − p_corrupted drawn from 0 (1 when neither is above 0: nothing to show)."""
    top = max(p_clean - p_corrupted, float(np.max(table)) - p_corrupted)
    return top if top > 0 else 1.0


def causal_tables(data: Mapping) -> tuple[dict[str, np.ndarray], int, int]:
    """The tables {kind: (L, n) P(answer) with the clean state restored at (layer, token)} of causal
    tracing's JSON (`causal_section`), those of CAUSAL_KINDS it holds, checked; and (L, n)."""
    n = len(data["tokens"])
    given = data.get("tables") or {}
    tables = {k: np.asarray(given[k], dtype=np.float64) for k in CAUSAL_KINDS if given.get(k) is not None}
    if not tables:
        raise QkvError(f"causal tracing's JSON has no tables; it needs 'tables' with {list(CAUSAL_KINDS)} "
                       "(qkv trace-fact --out writes them)")
    first = next(iter(tables.values()))
    L = first.shape[0] if first.ndim == 2 else 0
    for kind, t in tables.items():
        if t.ndim != 2 or t.shape != (L, n) or L == 0 or n == 0:
            raise QkvError(f"causal tracing's {kind} table is {t.shape}, not layers × tokens ({L}, {n}); "
                           "pass every table of one run")
        if not np.isfinite(t).all():
            raise QkvError(f"causal tracing's {kind} table holds non-finite probabilities; run it again")
    return tables, L, n


def causal_section(data: Mapping) -> dict:
    """The "causal_trace" section from causal tracing's JSON (Meng et al. 2022; `qkv trace-fact --out`'s): "model",
    "text", "subject", "subject_span" [s, e] (its tokens s..e−1), "tokens" (n labels), "answer" (an id),
    "answer_token", "p_clean", "p_corrupted", "noise", "draws", "seed", "window", "layers" (L) and
    "tables" {"hidden" | "ffn" | "attn": (L × n) P(answer) with that state restored at (layer l, token t)
    into the corrupted run, rounded to CAUSAL_DECIMALS; null when absent}; computed here: "top" {kind: the
    colour scale's end, `causal_scale`} and "colours" {kind: `palette.CAUSAL_STOPS`}. Other keys are left out."""
    tables, L, n = causal_tables(data)
    s, e = (int(x) for x in data["subject_span"])
    if not 0 <= s < e <= n:
        raise QkvError(f"the subject's tokens [{s}, {e}) are not inside the text's {n} tokens; pass the "
                       "subject_span of the same run")
    p_clean, p_corrupted = float(data["p_clean"]), float(data["p_corrupted"])
    optional = _optional(data)
    return {"model": str(data.get("model", "")), "text": str(data.get("text", "")),
            "subject": str(data.get("subject", "")), "subject_span": [s, e],
            "tokens": [str(t) for t in data["tokens"]], "answer": int(data["answer"]),
            "answer_token": str(data.get("answer_token", "")), "p_clean": p_clean, "p_corrupted": p_corrupted,
            "noise": optional("noise", float), "draws": optional("draws", int), "seed": optional("seed", int),
            "window": optional("window", int), "layers": L,
            "tables": {k: np.round(tables[k], CAUSAL_DECIMALS).tolist() if k in tables else None
                       for k in CAUSAL_KINDS},
            "top": {k: causal_scale(t, p_clean, p_corrupted) for k, t in tables.items()},
            "colours": {k: [list(c) for c in CAUSAL_STOPS[k]] for k in tables}}


FEATURE_DIGITS = 5                      # SAE feature activations: significant digits in the JSON


def features_section(data: Mapping) -> dict:
    """The "features" section (`features.pages.text_features`): which SAE latents fire on each of n tokens.
    "tokens" (n labels), "ids" (n), "features" [[j]] (n lists, each token's non-zero latents, the largest
    activation first; at most the SAE's k), "acts" [[z]] (the same shape, FEATURE_DIGITS significant digits),
    "skipped" [t] (positions the SAE does not read: a decoder's first, the attention sink; their lists
    empty), "top" (latents listed per token on hover), "layer", "site", "d_sae", "k", "sae" (its name);
    "max" (the largest z, the colour scale's end) computed here, and "colours" the DIVERGING_STOPS."""
    tokens, ids = [str(t) for t in data["tokens"]], [int(i) for i in data["ids"]]
    feats, acts = data["features"], data["acts"]
    n = len(tokens)
    if n == 0 or len(ids) != n or len(feats) != n or len(acts) != n \
            or any(len(f) != len(a) for f, a in zip(feats, acts)):
        raise QkvError(f"a features section needs one id, one list of latents and one of activations per token: "
                       f"{n} tokens, {len(ids)} ids, {len(feats)} and {len(acts)} lists; pass text_features(...)")
    d_sae = int(data["d_sae"])
    flat = [float(a) for row in acts for a in row]
    if any(not 0 <= int(j) < d_sae for row in feats for j in row) or not np.isfinite(flat).all():
        raise QkvError(f"the features section holds latents outside 0..{d_sae - 1} or activations that are not finite")
    return {"sae": str(data.get("sae", "")), "layer": int(data["layer"]), "site": str(data["site"]), "d_sae": d_sae,
            "k": None if data.get("k") is None else int(data["k"]), "top": int(data.get("top", 5)), "tokens": tokens, "ids": ids,
            "features": [[int(j) for j in row] for row in feats],
            "acts": [[float(f"{a:.{FEATURE_DIGITS}g}") for a in row] for row in acts],
            "skipped": [int(t) for t in data.get("skipped", [])], "max": max(flat, default=0.0),
            "colours": [list(c) for c in DIVERGING_STOPS]}


def router_section(trace: Trace) -> dict | None:
    """The "router" section from a MoE model's trace: for each kept layer that routes, which experts each token
    went to with their weights, and the router's probability of every expert; None when no kept layer recorded
    its router (a dense model, or a trace made without keep "experts")."""
    routed = [i for i in trace.layer_ids if trace.layers[i].experts is not None and trace.layers[i].router is not None]
    if not routed:
        return None
    probs = np.stack([trace.layers[i].router for i in routed])                 # (Lm, n, E)
    return {"layers": [int(i) for i in routed], "positions": int(probs.shape[1]), "experts": int(probs.shape[2]),
            "k": int(trace.layers[routed[0]].experts.shape[-1]),
            "chosen": [trace.layers[i].experts.astype(int).tolist() for i in routed],          # (Lm, n, k)
            "weights": [np.round(trace.layers[i].expert_weights.astype(np.float64), 4).tolist()
                        for i in routed],                                                   # (Lm, n, k)
            "probs": encode(np.clip(probs, 0, 1), "u8", SCALE)}                             # (Lm, n, E) ±0.002
