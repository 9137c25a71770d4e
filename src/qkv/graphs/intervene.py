"""Interventions: scale, clamp or zero transcoder features and run the REAL model with those edits, beside what the
attribution graph predicted ("Circuit Tracing", Ameisen et al. 2025, §"Validating with interventions").

    edit      L12:F881@5=0     feature 881 of layer 12's transcoder set to 0 at position 5
              L12:F881@5*2     scaled by 2            L12:F881=3   at every position       several: comma-separated
    the pass  the real model, a hook on each edited layer's ffn_out:
                  ffn_out ← ffn_out + (new − old)·W_dec[f]     at the edited positions
              old = the transcoder's activation of f on THIS pass's ffn_in there (so an edit upstream moves what a
              later transcoder reads, and its old value with it); new = the value set, or old × the factor. The
              rest of the FFN's output (what the transcoder does not explain) is left as it is.
    predicted the graph's linearisation: the change each logit would see if everything the graph freezes stayed
              frozen (attention patterns, norm scales, error nodes) and every feature responded to its input
              linearly (an active feature moves with its pre-activation, an inactive one stays at 0, an edited one
              holds its new value) — the sum over every path of the unpruned graph from the edited features to the
              logit (direct effect plus the paths through downstream features: circuit-tracer's influence,
              (I − A)⁻¹ applied to the edit). It is computed in one frozen pass, not from a pruned graph's edges,
              and it is exact to first order for the replacement model; the real model moves its attention and
              norms too, which is what the two columns' difference shows.

    edits = parse_edits("L1:F3@2=0,L0:F7*2")
    intervene(model, "The cat sat", transcoders, edits).rows()   # the top logits before, after, predicted
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..core.hooks import Hooks
from ..core.stack import transformer
from ..features.sae import SAE, pre_acts
from ..runtime.errors import QkvError, check_index
from .files import token_text
from .replacement import Replacement, decoded, head_gate, prompt_ids, replacement, unembed

HOW = {"=": "set", "*": "scale"}
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_EDIT = re.compile(rf"L(-?\d+):F(\d+)(?:@(-?\d+))?\s*([=*])\s*({_NUMBER})")
EXAMPLE = "L12:F881@5=0 (set), L12:F881@5*2 (scale), L12:F881=0 (every position)"


@dataclass(frozen=True)
class Edit:
    """One feature's change: layer's transcoder feature, at one position (None: every position), set to value
    (how="set") or multiplied by it (how="scale")."""

    layer: int
    feature: int
    position: int | None
    how: str
    value: float

    def __str__(self) -> str:
        at = "" if self.position is None else f"@{self.position}"
        return f"L{self.layer}:F{self.feature}{at}{'=' if self.how == 'set' else '*'}{self.value:g}"

    def new(self, old: np.ndarray) -> np.ndarray:
        """The activation after the edit, from the one before it (any shape)."""
        return np.full_like(old, self.value) if self.how == "set" else old * self.value


def parse_edits(spec: str) -> list[Edit]:
    """'L12:F881@5=0,L3:F7*2' → [Edit, …] (unchecked against a model: `check_edits`), or one QkvError."""
    if not isinstance(spec, str) or not spec.strip():
        raise QkvError(f"no edit given; write LAYER:FEATURE[@POSITION]=VALUE or *FACTOR, e.g. {EXAMPLE}")
    edits = []
    for part in spec.split(","):
        m = _EDIT.fullmatch(part.strip())
        if m is None:
            raise QkvError(f"cannot read the edit {part.strip()!r}; write e.g. {EXAMPLE}")
        layer, feature, position, op, value = m.groups()
        if not np.isfinite(float(value)):
            raise QkvError(f"the edit {part.strip()!r} has no finite value; give a number, e.g. =0 or *2")
        edits.append(Edit(int(layer), int(feature), None if position is None else int(position), HOW[op], float(value)))
    return edits


def check_edits(edits: Sequence[Edit], transcoders: Mapping[int, SAE], n_layers: int, n: int) -> list[Edit]:
    """EDITS with negative layers and positions counted from the end, each layer's transcoder there, each feature
    one of its latents and each position one of the prompt's N; no (layer, feature, position) twice."""
    out, seen = [], set()
    for e in edits:
        layer = check_index("layer", e.layer, n_layers, "the model")
        if layer not in transcoders:
            have = ", ".join(map(str, sorted(transcoders))) or "none"
            raise QkvError(f"the edit {e} is at layer {layer}, which has no transcoder (loaded: {have}); "
                           "give an edit at a layer with one")
        d_sae = transcoders[layer].config.d_sae
        if not 0 <= e.feature < d_sae:
            raise QkvError(f"the edit {e}: feature {e.feature} does not exist, layer {layer}'s transcoder has "
                           f"features 0..{d_sae - 1}")
        position = None if e.position is None else check_index("position", e.position, n, "the prompt")
        key = (layer, e.feature, position)
        if key in seen or (layer, e.feature, None) in seen or (position is None and any(
                k[:2] == key[:2] for k in seen)):
            raise QkvError(f"the edit {e} changes a feature another edit already changes there; give each once")
        seen.add(key)
        out.append(Edit(layer, e.feature, position, e.how, e.value))
    if not out:
        raise QkvError(f"no edit given; write e.g. {EXAMPLE}")
    return out


def _positions(e: Edit, n: int, held: Sequence[int] = ()) -> np.ndarray:
    """The positions E edits: its own, or every position but the HELD ones (a graph's constants)."""
    return np.setdiff1d(np.arange(n), held) if e.position is None else np.array([e.position])


def edit_hooks(transcoders: Mapping[int, SAE], edits: Sequence[Edit], n: int,
               applied: list | None = None, held: Sequence[int] = ()) -> dict[str, Callable]:
    """The hooks that make EDITS in a pass of n positions: at each edited layer, "L.ffn_in" read (what its
    transcoder encodes) and "L.ffn_out" += (new − old)·W_dec[f] at the edited positions (an edit without a
    position: every position but the HELD ones). applied: a list that receives (edit, positions (k,),
    old (B, k), new (B, k)) as the pass makes each edit."""
    by_layer: dict[int, list[Edit]] = {}
    for e in edits:
        by_layer.setdefault(e.layer, []).append(e)
    seen: dict[int, np.ndarray] = {}

    def read(x, layer):
        seen[layer] = x                                                     # (B, n, d_model)
        return None

    def add(out, layer):
        sae = transcoders[layer]
        x = seen.pop(layer)
        z = sae.encode(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)   # (B, n, d_sae) this pass's
        out = out.copy()                                                    # (B, n, d_model)
        for e in by_layer[layer]:
            at = _positions(e, n, held)                                     # (k,)
            old = z[:, at, e.feature]                                       # (B, k)
            new = e.new(old)
            out[:, at] += (new - old)[..., None] * sae.params["W_dec"][e.feature]
            if applied is not None:
                applied.append((e, at, old, new))
        return out

    hooks = {}
    for layer in by_layer:
        hooks[f"{layer}.ffn_in"], hooks[f"{layer}.ffn_out"] = read, add
    return hooks


@dataclass
class Intervention:
    """A prompt's logits at one position before and after the edits, and the graph's predicted change."""

    tokens: list[str]                        # (n,) the prompt's tokens as text
    edits: list[Edit]
    position: int                            # whose logits (the last position's)
    before: np.ndarray                       # (V,) logits of the unedited pass
    after: np.ndarray                        # (V,) logits with the edits
    predicted: np.ndarray | None             # (V,) the graph's linearised change of each logit; None: not computed
    applied: list[tuple[Edit, np.ndarray, float, float]] = field(default_factory=list)   # (edit, position, old, new)
    frozen: bool = False                     # True: the replacement model was edited, not the real one
    spell: Callable[[int], str] = repr       # token id → its text
    graph_ids: np.ndarray | None = None      # (K,) the graph's logit nodes, when its edges' prediction is given
    graph_predicted: np.ndarray | None = None   # (K,) the change of their inputs (logit − mean logit) the graph's
                                                # kept edges predict (`graph_change`)

    @property
    def change(self) -> np.ndarray:
        """after − before (V,)."""
        return self.after - self.before

    def top(self, k: int = 10) -> np.ndarray:
        """The ids shown: the K largest logits before, then any of the K largest after not among them."""
        first = list(np.argsort(-self.before, kind="stable")[:k])
        return np.array(first + [t for t in np.argsort(-self.after, kind="stable")[:k] if t not in first])

    def rows(self, k: int = 10) -> list[dict]:
        """One dict per token shown (`top`): token, id, logit before and after, change, predicted change,
        probability before and after."""
        p0, p1 = _softmax(self.before), _softmax(self.after)
        return [{"token": self.spell(int(t)), "id": int(t), "before": float(self.before[t]),
                 "after": float(self.after[t]), "change": float(self.change[t]),
                 "predicted": None if self.predicted is None else float(self.predicted[t]),
                 "p_before": float(p0[t]), "p_after": float(p1[t])} for t in self.top(k)]

    def summary(self) -> str:
        """Each edit and what it changed: 'L1:F3@2=0 (was 1.25)', 'L0:F7*2 (moved at 3 of 5 positions)'."""
        parts = []
        for e in self.edits:
            done = [(p, old, new) for f, p, old, new in self.applied if f == e]
            if e.position is not None:
                parts.append(f"{e} (was {done[0][1]:.4g})")
            else:
                moved = sum(old != new for _, old, new in done)
                parts.append(f"{e} (moved at {moved} of {len(done)} positions)")
        return ", ".join(parts)

    def text(self, k: int = 10) -> str:
        """The table `qkv graph … --intervene` prints."""
        where = "the replacement model" if self.frozen else "the model"
        lines = [f"edits on {where}: {self.summary()}; the logits at position {self.position} "
                 f"({self.tokens[self.position]!r}):",
                 f"{'token':<16} {'logit':>9} {'after':>9} {'change':>9} {'predicted':>9} {'p':>7} {'p after':>7}"]
        for r in self.rows(k):
            pred = "" if r["predicted"] is None else _signed(r["predicted"])
            lines.append(f"{repr(r['token'])[:16]:<16} {r['before']:9.4f} {r['after']:9.4f} {_signed(r['change'])} "
                         f"{pred:>9} {r['p_before']:7.4f} {r['p_after']:7.4f}")
        if self.predicted is not None:
            lines.append("predicted: the graph's linear effect, every path (attention, norms and error nodes frozen, "
                         "features linear); the difference from 'change' is what the graph leaves out")
        if self.graph_ids is not None and self.graph_predicted is None:
            lines.append("the pruned graph predicts nothing here: an edited feature is not active there, so it is no "
                         "node of the graph")
        elif self.graph_predicted is not None:
            moved = self.change - self.change.mean()
            full = None if self.predicted is None else self.predicted - self.predicted.mean()
            lines.append("the logit nodes' inputs (logit − mean logit): change, predicted by every path, by the "
                         "pruned graph's edges")
            for t, g in zip(self.graph_ids, self.graph_predicted):
                every = "" if full is None else _signed(full[t])
                lines.append(f"  {repr(self.spell(int(t)))[:16]:<16} {_signed(moved[t])} {every:>9} {_signed(g)}")
        return "\n".join(lines)


def _signed(x: float) -> str:
    """x in 9 characters with its sign: 4 decimals, or 3 significant digits when smaller than 0.001."""
    return f"{x:+9.4f}" if x == 0 or abs(x) >= 1e-3 else f"{x:+9.2e}"


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def intervene(model, text_or_ids, transcoders: Mapping[int, SAE], edits: Sequence[Edit] | str, *,
              rep: Replacement | None = None, predict: bool = True, frozen: bool = False) -> Intervention:
    """Run MODEL on a prompt with EDITS (a spec string or parsed edits) and return the last position's logits
    before and after, with the graph's predicted change (`predicted_change`) when PREDICT and every layer has a
    transcoder (rep: the prompt's Replacement, if already built). frozen: edit the local replacement model
    instead of the real one (attention patterns, norm scales and error nodes held; its features respond to the
    edit through their transcoders, non-linearly): what the prediction is exact for, to first order."""
    if getattr(model.weights, "W_vocab", None) is None:
        raise QkvError(f"{model.name} has no LM head, so there are no logits to move; use a model with one")
    ids, _ = prompt_ids(model, text_or_ids)
    n = len(ids)
    edits = check_edits(parse_edits(edits) if isinstance(edits, str) else edits, transcoders,
                        model.config.n_layers, n)
    if (frozen or predict) and rep is None and len(transcoders) == model.config.n_layers:
        rep = replacement(model, ids, transcoders)
    if frozen and rep is None:
        raise QkvError("the replacement model needs a transcoder for every layer; give them all, or run the "
                       "edits on the real model")
    held = rep.held if rep is not None else ()
    for e in edits:
        if e.position in held:
            raise QkvError(f"the edit {e} is at position {e.position}, which this graph holds (its FFN output a "
                           "constant, the attention sink: no feature there); edit another position, or build the "
                           "graph with --keep-first")
    applied: list = []
    hooks = edit_hooks(transcoders, edits, n, applied, held)
    if frozen:
        before = model.forward(ids[None], attentions=False, hooks=rep.hooks()).logits[0, -1]
        after = model.forward(ids[None], attentions=False, hooks=rep.hooks(extra=hooks)).logits[0, -1]
    else:
        before = model.forward(ids[None], attentions=False).logits[0, -1]
        after = model.forward(ids[None], attentions=False, hooks=hooks).logits[0, -1]
    predicted = predicted_change(rep, edits) if predict and rep is not None else None
    flat = [(e, int(p), float(o), float(v)) for e, at, old, new in applied
            for p, o, v in zip(at, old[0], new[0])]
    return Intervention(tokens=[token_text(model, t) for t in ids], edits=list(edits), position=n - 1,
                        before=before, after=after, predicted=predicted, applied=flat, frozen=frozen,
                        spell=lambda t: token_text(model, t))


def predicted_change(rep: Replacement, edits: Sequence[Edit]) -> np.ndarray:
    """The graph's linearised change of the last position's logits (V,) under EDITS (checked).

    Two rows through the frozen replacement model (patterns, norm scales and errors held: rep.frozen_hooks), each
    FFN's output z·W_dec + b_dec (+ x·W_skip) + error with z = pre ⊙ [active]: pre the transcoder's
    pre-activation on that row's own ffn_in, [active] which features were active in the real pass. Row 0 is the
    real pass (z = the real activations there); row 1 holds the edited features at their new values. The
    system is affine in the edit, so row 1 − row 0 is exactly the sum over every path of the graph from the
    edited nodes to the logits (the edited nodes themselves do not respond to their inputs); a soft-capped head
    (Gemma 2) is linearised at the real logits, c·tanh(ℓ/c) → (1 − tanh²(ℓ/c))·Δℓ."""
    model, n = rep.model, len(rep.ids)
    seen: dict[int, np.ndarray] = {}

    def read(x, layer):
        seen[layer] = x                                                     # (2, n, d_model)
        return None

    def linear_ffn(out, layer):
        sae, x = rep.transcoders[layer], seen.pop(layer)
        rows = x.reshape(-1, x.shape[-1])                                   # (2·n, d_model)
        active = (rep.acts[layer] != 0)[None]                               # (1, n, d_sae)
        z = pre_acts(sae.params, sae.config, rows).reshape(2, n, -1) * active   # (2, n, d_sae)
        for e in edits:
            if e.layer == layer:
                at = _positions(e, n, rep.held)
                z[1, at, e.feature] = e.new(rep.acts[layer][at, e.feature])
        out = decoded(sae, z.reshape(2 * n, -1), rows).reshape(2, n, -1) + rep.errors[layer]   # (2, n, d_model)
        return rep.hold(layer, out)

    hooks = rep.frozen_hooks() | {"ffn_in": read, "ffn_out": linear_ffn}
    ids = np.repeat(rep.ids[None], 2, axis=0)                               # (2, n)
    hidden, _ = transformer(model.weights, model.config, ids, np.ones_like(ids), logits=None,
                            hooks=Hooks(hooks, model.config, model.name))
    gate = head_gate(rep)
    logits = unembed(rep, hidden[:, -1], n - 1, gate)                       # (2, V) before any soft-cap
    change = logits[1] - logits[0]                                          # (V,)
    cap = model.config.final_softcap
    if cap is not None:
        change = change * (1 - np.tanh(logits[0] / cap) ** 2)
    return change


def graph_change(graph, edits: Sequence[Edit], pruned=None) -> np.ndarray | None:
    """The change of each logit node's input (logit − mean logit) (K,) that GRAPH's edges predict for EDITS
    (checked): the edited features move by Δa, every other feature by the change of its pre-activation (an active
    feature's slope is 1), errors and embeddings hold; along the kept nodes and edges of PRUNED (a
    qkv.graphs.prune.Pruned; None: every edge). An edge A[t, s] is s's effect at its activation a_s, so per unit
    of s it is A[t, s]/a_s. None when an edit moves a feature that is not a node of the graph (inactive there:
    it has no edges; `predicted_change` still predicts it)."""
    at = graph.slices()
    F, n = graph.n_features, graph.n_pos
    index = {(int(l), int(p), int(f)): i for i, (l, p, f) in enumerate(graph.features)}
    delta, held = np.zeros(F), np.zeros(F, bool)
    for e in edits:
        for p in _positions(e, n):
            i = index.get((e.layer, int(p), e.feature))
            if i is None:
                if e.new(np.zeros(1))[0] != 0:
                    return None                                             # set to a value where inactive
                continue
            delta[i] = e.new(graph.activations[i:i + 1])[0] - graph.activations[i]
            held[i] = True
    A = graph.adjacency
    if pruned is not None:
        A = np.where(pruned.edge_mask & pruned.node_mask[:, None] & pruned.node_mask[None], A, 0)
    per_unit = A[:, :F] / graph.activations                                 # (N, F) effect per unit of activation
    v = delta.copy()
    for _ in range(graph.n_layers + 1):                                     # a DAG by layer: L + 1 steps reach all
        v = np.where(held, delta, per_unit[:F] @ v)                         # (F,)
    return per_unit[at["logit"]] @ v                                        # (K,)
