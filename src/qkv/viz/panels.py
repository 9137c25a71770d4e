"""The viewer's panels beyond attention weights, each declared once: the Python payload and the page's script
both read PANELS (the payload ships it to the page as "panels"; viewer.js draws the tabs from that list).

A panel is a section of the payload under its id, built by one function, drawn by one JS renderer:

    Panel(id="router",                   the section's key in the payload and the view's name
          title="panel_router",          its tab's name: a key of `viz.words` (VIEWER: "Experts")
          build=router_section,          the function that builds the section (its docstring: the format)
          tokens=lambda s: s["positions"],   how many of the trace's tokens the section is about (= n, checked)
          renderer="router",             QKV.panels[renderer] = {decode?, meta, build}, registered by
          script="viewer_panels.js",     this asset (inlined after viewer.js; `html.viewer_js`)
          layer=True,                    its view follows the Layer selector
          keep=(),                       what a pass must keep for it (model.run(keep=…)); () = nothing more
          from_trace=True)               build(trace) makes it from the trace itself when not given

A new panel: its entry below, its builder (`interpret_payload`, or here), its renderer (an asset that registers
`QKV.panels[renderer]`: the interface is at the top of viewer_panels.js) and its title in `words.en`.

The sections, as the page receives them (`payload` documents the rest). Big arrays are `wire` arrays, as
attention is: {"dtype": "u8" | "u16" | "i32", "shape", "scale" (quantised ones only), "data"}, value = q / scale
(or the integer itself without a scale), little-endian.

    "lens" (decoders, `analysis.sections.lens_payload`): the logit lens, rows 0..L (row 0: the
      embeddings; row l: the residual stream after l blocks through the final norm and W_vocab)
      × n positions. {"rows": L+1, "positions": n, "k": K, "vocab": V,
      "predicted": [id] (n, each position's final prediction: the argmax of row L),
      "prob": uint16 (L+1, n) scale 65535 (P(final prediction) at row l, ±7.6e-6),
      "rank": int32 (L+1, n) (its rank there, 1 = top),
      "top_ids": int32 (L+1, n, K), "top_prob": uint16 (L+1, n, K) scale 65535 (each cell's K most
      likely tokens, most likely first: LENS_K = 5), "spelling": {"ids": [id], "tokens": [str]}
      (every id above, as a reader sees it)}. About 0.8 kB per token for SmolLM2 (31 rows). With a tuned lens
      (`qkv lens --tuned DIR --out DIR`) also "tuned": the same keys, each row read through its translator
      (analysis.tuned_lens), what the panel's logit/tuned switch shows.
    "rollout" (`analysis.sections.rollout_payload`, self-attention of every layer):
      {"rollout": uint8 (L, n, n) scale 255 (R_l after layers 1..l; row = position, column =
      input token; ±0.002 as attention), "flow": uint8 (n, n) scale 255 | null (attention flow
      after all L layers; null past `analysis.rollout.MAX_FLOW_WORK`, with "flow_note" saying so)}.
    "patch" (`analysis.sections.patch_payload`: `analysis.patch.Patching`'s tables):
      {"metric": str, "normalised": bool, "clean": str, "corrupted": str, "metric_clean": float,
      "metric_corrupted": float, "labels": [str] (n), "tables": {"heads": [[float]] (L × H) | null,
      "residual" | "attn_out" | "ffn_out": [[float]] (L × n) | null}} (effects rounded to 5 decimals:
      0 = corrupted, 1 = clean when normalised), "method": str | null (the tables are an estimate:
      "attribution patching (AtP)", `analysis.atp`), "estimate": {"method", "tables"} | null (an estimate of
      the same tables, each map drawn beside the exact one: `patch_payload(p, estimate)`, `qkv atp --exact`).
    "attribute" (`analysis.sections.attribute_payload`: `InputAttribution.to_json()` through
      `interpret_payload.attribute_section`): {"tokens": [str] (n), "ids": [int] (n), "scores": [float] (n,
      6 significant digits), "sides": ["source" | "target"] (n) | null (an encoder–decoder's: its source's
      tokens, then its target's; the viewer's trace is the decoder's, the target's tokens), "method",
      "output" (z in words), "logit" (z), "target", "target_token", "other", "baseline", "steps",
      "baseline_logit", "completeness_error" (integrated gradients; null otherwise), "sum" (Σ scores),
      "max" (max |score|), "colours": [[r, g, b]] (`palette.DIVERGING_STOPS`)}.
    "causal_trace" (`interpret_payload.causal_section` of causal tracing's JSON, Meng et al. 2022; not
      "causal", the attention's mask): {"model",
      "text", "subject", "subject_span": [s, e], "tokens": [str] (n), "answer": id, "answer_token",
      "p_clean", "p_corrupted", "noise", "draws", "seed", "window", "layers": L,
      "tables": {"hidden" | "ffn" | "attn": [[float]] (L × n) | null} (P(answer) with the clean state
      restored at layer l, token t; 6 decimals), "top": {kind: float} (each map's colour scale: 0 .. top
      of the indirect effect p − p_corrupted), "colours": {kind: [[r, g, b]]} (`palette.CAUSAL_STOPS`)}.
    "features" (`interpret_payload.features_section` of `features.pages.text_features`: an SAE's latents on
      each token, `qkv sae show`): {"sae", "layer", "site", "d_sae", "k", "top", "tokens": [str] (n),
      "ids": [int] (n), "features": [[int]] (n lists: each token's non-zero latents, largest first, ≤ k),
      "acts": [[float]] (their activations, 5 significant digits), "skipped": [int] (positions the SAE does
      not read), "max" (the largest activation), "colours": [[r, g, b]] (`palette.DIVERGING_STOPS`)}.
    "router" (mixtures of experts, `interpret_payload.router_section`, from the trace itself): {"layers": [int]
      (Lm, the kept layers that route), "positions": n, "experts": E, "k": k, "chosen": [[[e] (k)] (n)] (Lm) (the
      experts each token went to, most probable first), "weights": same shape, floats (their weights in the sum,
      4 decimals), "probs": uint8 (Lm, n, E) scale 255 (the router's probability of every expert, ±0.002)}.

    "diff" (`viz.diff_figures.diff_section` of `analysis.diff.ModelDiff.to_json()`, `qkv diff`): {"model_a",
      "model_b", "tokens": [str] (n), "js": [[float]] (L × H, bits: each head's attention-pattern JS divergence,
      the mean over query rows), "js_max", "cosine", "norm_ratio": [[float]] ((L+1) × n: the residual stream
      after l blocks), "lens_kl": [[float]] ((L+1) × n, nats, KL(A‖B)) | null, "top_heads": [{"layer", "head",
      "js"}], "colours": [[r, g, b]] (`diff_figures.DIFF_STOPS`)} (6 significant digits).
    "path_patch" (`viz.path_patch_panel.path_patch_section` of `analysis.path_patch.PathTable.as_json()`, `qkv
      path-patch`): {"model", "metric", "normalised", "clean", "corrupted", "metric_clean", "metric_corrupted",
      "channel": "q" | "k" | "v" | "all", "positions": [int] | null, "receivers": str ("L.H,L.H"), "labels": [str]
      (n), "heads": [[float | null]] (L × H: each sender head's effect on the receivers), "ffn": [float | null] (L),
      "embed": float | null (null: no path, or not a sender), "max" (max |effect|: one scale for the three),
      "top": [{"sender", "effect"}], "set": {"senders", "effect"} | null (--senders together), "colours": [[r, g,
      b]] (`palette.DIVERGING_STOPS`)} (effects to 6 decimals).
    "probe" (`viz.probe_panel.probe_section` of `analysis.probes.ProbeReport.as_json()`, `qkv probe`): {"model",
      "labels": [str], "n_train", "n_test", "position", "point", "majority", "control" (the control task in
      words), "layers": [int], "accuracy", "control_accuracy", "selectivity", "train_accuracy": [float] (one per
      layer, 6 decimals), "text" (the text whose attention the other tabs show), "positions": n (its tokens)}.

    "disentangled" (DeBERTa's disentangled attention, `viz.disentangled_panel.disentangled_section`, from the trace
      itself): {"layers": [int] (the kept layers), "positions": n, "heads": H, "terms": ["c2c", "c2p", "p2c"] (those
      the model has), "tables": {term: f16 (Lt, H, n, n)} (each term's scores: S = their sum)}.
    "contacts" (a protein's contact map, ESM-2's contact head: `viz.contact_panel.contact_section` of
      `analysis.contacts.ContactMap`, through `analysis.sections.contact_payload`): {"positions": n, "first": 1,
      "residues": [str] (m = n − 2), "layers": L, "heads": H, "separation", "predicted": f32 (m, m) (P),
      "scores": [[float]] (L × H, each head's r with P), "best": [{"layer", "head", "r"}], "top": [{"i", "j", "p"}],
      "maps": {"heads": [[layer, head]] (k), "values": f16 (k, m, m)} (each head's symmetrised, APC-corrected map)}.

And the list itself, in the payload: "panels": [{"id", "title" (its words, English), "renderer", "layer"}]
(every panel, in tab order: a section added later on the page, as the web app's late lens, finds its tab).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .interpret_payload import (attribute_section, causal_section, features_section, lens_section, patch_section,
                                rollout_section, router_section)
from .diff_figures import diff_section
from .path_patch_panel import path_patch_section
from .probe_panel import probe_section
from .disentangled_panel import disentangled_section
from .contact_panel import contact_section
from ..core.trace import DISENTANGLED
from .words import texts


@dataclass(frozen=True)
class Panel:
    """One tab of the viewer beyond attention weights (module doc: each field)."""
    id: str
    title: str
    build: Callable[..., dict | None]
    tokens: Callable[[dict], int]
    renderer: str
    script: str
    layer: bool = False
    keep: tuple[str, ...] = ()
    from_trace: bool = False

    def shipped(self) -> dict:
        """What the page receives of it: {"id", "title" (its words), "renderer", "layer"}."""
        return {"id": self.id, "title": texts("viewer")["en"][self.title], "renderer": self.renderer,
                "layer": self.layer}


def _attribute_tokens(s: dict) -> int:
    """The trace's tokens an attribution is about: all of them, or an encoder–decoder's target's."""
    return len(s["tokens"]) if s["sides"] is None else s["sides"].count("target")


PANELS = (                                                                      # in tab order
    Panel("lens", title="panel_lens", build=lens_section, tokens=lambda s: s["positions"],
          renderer="lens", script="viewer_panels.js",
          keep=("residual", "residual_out")),                                   # = analysis.lens.KEEP (a test)
    Panel("rollout", title="panel_rollout", build=rollout_section, tokens=lambda s: s["rollout"]["shape"][-1],
          renderer="rollout", script="viewer_panels.js", layer=True, keep=("attentions",)),
    Panel("patch", title="panel_patch", build=patch_section, tokens=lambda s: len(s["labels"]),
          renderer="patch", script="viewer_panels.js"),
    Panel("attribute", title="panel_attribute", build=attribute_section, tokens=_attribute_tokens,
          renderer="attribute", script="viewer_causes.js"),
    Panel("causal_trace", title="panel_causal_trace", build=causal_section, tokens=lambda s: len(s["tokens"]),
          renderer="causal_trace", script="viewer_causes.js"),
    Panel("features", title="panel_features", build=features_section, tokens=lambda s: len(s["tokens"]),
          renderer="features", script="viewer_features.js"),
    Panel("router", title="panel_router", build=router_section, tokens=lambda s: s["positions"],
          renderer="router", script="viewer_panels.js", layer=True,
          from_trace=True),                              # every pass of a mixture of experts records its router
    Panel("diff", title="panel_diff", build=diff_section, tokens=lambda s: len(s["tokens"]),
          renderer="diff", script="viewer_diff.js"),     # `qkv diff`: model B against model A on the text
    Panel("path_patch", title="panel_path_patch", build=path_patch_section, tokens=lambda s: len(s["labels"]),
          renderer="path_patch", script="viewer_path_patch.js"),       # `qkv path-patch`: senders → receivers
    Panel("probe", title="panel_probe", build=probe_section, tokens=lambda s: s["positions"],
          renderer="probe", script="viewer_probe.js"),   # `qkv probe`: per layer; the attention of one text beside
    Panel("disentangled", title="panel_disentangled", build=disentangled_section, tokens=lambda s: s["positions"],
          renderer="disentangled", script="viewer_disentangled.js", layer=True, keep=tuple(DISENTANGLED),
          from_trace=True),                              # DeBERTa: S's three tables (c2c, c2p, p2c) and their sum
    Panel("contacts", title="panel_contacts", build=contact_section, tokens=lambda s: s["positions"],
          renderer="contacts", script="viewer_contacts.js", layer=True),  # ESM: the contact map beside a head's
)


def panel(name: str) -> Panel | None:
    """The panel whose section is NAME, or None (read at call time: a test may declare one more)."""
    return next((p for p in PANELS if p.id == name), None)


def scripts() -> tuple[str, ...]:
    """The assets that register the panels' renderers, each once, in the order of their first panel."""
    return tuple(dict.fromkeys(p.script for p in PANELS))
