"""An attribution graph of one prompt: the direct effects between the nodes of its local replacement model
(qkv.graphs.replacement), computed by the engine's own backward run as that frozen linear system's.

    nodes     features (layer, position, feature) active on the prompt, with their activation a;
              errors (layer, position): the transcoder's miss, a constant vector e;
              embeddings (position): the stream entering block 0, x₀;
              logits: the most probable next tokens (those covering 95 % of the probability, at most 10, and
              the target token if given), at the last position
    inputs    a feature's is its pre-activation; a logit's is its logit minus the mean logit (before any
              soft-cap: Gemma 2's logit nodes are pre-cap)
    edges     A[t, s] = (what s writes) · ∂input_t/∂(where s writes), through the frozen system only:
              a feature writes a·W_dec[f] and an error e at its layer's FFN output, an embedding x₀ at block 0

The gradients come from one backward sweep per batch of targets (`sweep`): qkv.core.blocks_backward.block
with the FROZEN boxes (norms by their real scales, attention through V with its pattern held, the FFN cut:
`Cut` records the gradient of every layer's FFN output, and injects each feature target's encoder row at
its layer's FFN input, and a transcoder's skip W_skip carries gradient back like any linear path). What no
edge carries (biases b_V, b_O, β, b_dec, b_enc, b_vocab) is each target's constant: its input in the frozen
pass with every node set to 0 (`constants`), so that Σ_s A[t, s] + constant_t = input_t, exactly.

Held positions (`Replacement.held`; by default a causal model's first token, the attention sink): their FFN
outputs are the real pass's, constants like the biases, so no feature or error node there has an edge (the error
nodes keep their places, zero), and no gradient crosses a transcoder's skip at them.

Adjacency rows are targets, columns sources, nodes in the order [features, errors (layer-major), embeddings,
logits] (circuit-tracer's).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from ..core import blocks_backward as back
from ..core.hooks import Hooks
from ..core.stack import transformer
from ..core.trace import Recorder
from ..features.sae import SAE, pre_acts
from ..runtime.errors import QkvError
from .replacement import Replacement, head_gate, prompt_ids, replacement, sink_positions, unembed

CHUNK = 256            # targets per backward sweep: B·n·d_model numbers per layer's gradient
COVER = 0.95           # the logits kept cover this much of the probability
MAX_LOGITS = 10


@dataclass
class Graph:
    """An attribution graph: its nodes (in adjacency order), the direct effects between them, and what the
    nodes are. F features, E = L·n errors, n embeddings, K logits; N = F + E + n + K."""

    rep: Replacement = field(repr=False)
    features: np.ndarray          # (F, 3) layer, position, feature
    activations: np.ndarray       # (F,)
    logit_ids: np.ndarray         # (K,) token ids
    probabilities: np.ndarray     # (K,) their probabilities at the last position
    adjacency: np.ndarray         # (N, N) A[target, source]: direct effects
    inputs: np.ndarray            # (N,) each node's input (features: pre-activation; logits: logit − mean); 0 else
    constants: np.ndarray         # (N,) what no edge carries: Σ_s A[t, s] + constants[t] = inputs[t]
    target: int | None = None     # the target token's id, if one was asked for

    @property
    def n_layers(self) -> int:
        return self.rep.n_layers

    @property
    def n_pos(self) -> int:
        return len(self.rep.ids)

    @property
    def n_features(self) -> int:
        return len(self.features)

    def slices(self) -> dict[str, slice]:
        """Where each kind of node sits in the adjacency order."""
        F, E, n = self.n_features, self.n_layers * self.n_pos, self.n_pos
        return {"feature": slice(0, F), "error": slice(F, F + E), "embedding": slice(F + E, F + E + n),
                "logit": slice(F + E + n, F + E + n + len(self.logit_ids))}

    def logit_weights(self) -> np.ndarray:
        """(N,) the logits' probabilities at their nodes, 0 elsewhere: what influence is measured against."""
        w = np.zeros(len(self.adjacency))
        w[self.slices()["logit"]] = self.probabilities
        return w


# ── which logits ─────────────────────────────────────────────────────────────────

def top_logits(probs: np.ndarray, cover: float = COVER, most: int = MAX_LOGITS, target: int | None = None
               ) -> np.ndarray:
    """The ids of the most probable tokens until they cover COVER of the probability, at most MOST, most probable
    first; TARGET added (last) if it is not among them. probs (V,)."""
    order = np.argsort(-probs, kind="stable")[:most]                         # (≤ most,)
    reach = np.searchsorted(np.cumsum(probs[order]), cover) + 1              # tokens to reach the cover
    ids = order[:max(1, min(reach, most))]
    if target is not None and target not in ids:
        ids = np.append(ids, target)
    return ids.astype(np.int64)


def logit_directions(rep: Replacement, ids: np.ndarray) -> np.ndarray:
    """(K, d_model) ∂(logit_t − mean logit)/∂(the last position's final hidden states) for each t in IDS: through
    W_vocab (× logit_scale), and a masked-LM head's frozen gate and norm (`head_gate`). Constant: the logits
    are affine in the final hidden states once the head's non-linearities are held."""
    w, cfg = rep.model.weights, rep.model.config
    W = np.asarray(w.W_vocab)                                                  # (d, V) (a stored one dequantised)
    g = (W[:, ids] - W.mean(axis=1, dtype=np.float64, keepdims=True)).T * cfg.logit_scale   # (K, d or E)
    del W
    gate = head_gate(rep)
    if gate is not None:                                                       # back through Norm(r ⊙ (H·W_head + b))
        r, s = gate
        g = g * w.head_norm.weight / s[-1]
        if cfg.norm != "rms":
            g = g - g.mean(axis=-1, keepdims=True)
        g = (g * r[-1]) @ w.W_head.T                                           # (K, d)
    return g


# ── the backward sweep of the frozen system ──────────────────────────────────────

class Cut:
    """The FFN box of the frozen backward (`Boxes.ffn`): it passes nothing through the FFN, writes the edges from
    LAYER's sources (its features and errors) into the target rows, and returns what goes back to the FFN's
    input: the feature targets' encoder rows at their layer (`inject`) and d·W_skipᵀ (a transcoder's skip)."""

    def __init__(self, sources: "Sources", rows: np.ndarray, adjacency: np.ndarray, inject: dict[int, np.ndarray]):
        self.sources, self.rows, self.adjacency, self.inject = sources, rows, adjacency, inject

    def __call__(self, layer: int, d: np.ndarray) -> tuple[np.ndarray, None]:
        self.sources.write(layer, d, self.rows, self.adjacency)                # (B, n, d): ∂targets/∂ffn_out
        skip = self.sources.rep.transcoders[layer].params.get("W_skip")
        d_in = np.zeros_like(d) if skip is None else self.sources.rep.release(d) @ skip.T   # (B, n, d_model)
        if layer in self.inject:
            d_in += self.inject[layer]
        return d_in, None


@dataclass
class Sources:
    """The source nodes' vectors, grouped for the products with a sweep's gradients: per layer, its features
    sorted by position (their a·W_dec[f] rows) and their columns; its errors' columns; the embeddings'."""

    rep: Replacement
    decoder: list[np.ndarray]               # L × (F_l, d) a·W_dec[f] of layer l's features
    spans: list[list[tuple[int, int, int]]] # L × [(position, first column, end column)] of them
    error_columns: np.ndarray               # (L, n) each error node's column
    embedding_columns: np.ndarray           # (n,)

    def write(self, layer: int, d: np.ndarray, rows: np.ndarray, adjacency: np.ndarray) -> None:
        """adjacency[rows, layer's sources] = each source's vector · d at its position; d (B, n, d_model)."""
        vectors, spans = self.decoder[layer], self.spans[layer]
        first = spans[0][1] if spans else 0                                    # the layer's first column
        for p, lo, hi in spans:
            adjacency[rows, lo:hi] = d[:, p] @ vectors[lo - first:hi - first].T    # (B, F_lp)
        adjacency[rows[:, None], self.error_columns[layer][None]] = np.einsum("bpd,pd->bp", d, self.rep.errors[layer])

    def embed(self, d: np.ndarray, rows: np.ndarray, adjacency: np.ndarray) -> None:
        adjacency[rows[:, None], self.embedding_columns[None]] = np.einsum("bpd,pd->bp", d, self.rep.embeddings)


def sources_of(rep: Replacement, features: np.ndarray, activations: np.ndarray) -> Sources:
    """The Sources of REP with FEATURES (F, 3) sorted by (layer, position, feature), their ACTIVATIONS (F,)."""
    L, n = rep.n_layers, len(rep.ids)
    F = len(features)
    decoder, spans = [], []
    for layer in range(L):
        cols = np.flatnonzero(features[:, 0] == layer)                         # (F_l,) contiguous
        W = rep.transcoders[layer].params["W_dec"]
        decoder.append(activations[cols, None] * W[features[cols, 2]])          # (F_l, d)
        positions = features[cols, 1]
        spans.append([(int(p), int(cols[positions == p][0]), int(cols[positions == p][-1]) + 1)
                      for p in np.unique(positions)])
    errors = F + np.arange(L * n).reshape(L, n)
    return Sources(rep, decoder, spans, errors, F + L * n + np.arange(n))


def dense_blocks(model) -> list:
    """The model's blocks with W_V and W_O as plain arrays (a checkpoint's stored 16-bit or quantised matrices
    dequantised once: the backward multiplies by their transposes), the rest as they are."""
    out = []
    for b in model.weights.blocks:
        attn = replace(b.attn, W_V=np.asarray(b.attn.W_V, dtype=model.dtype),
                       W_O=np.asarray(b.attn.W_O, dtype=model.dtype))
        out.append(replace(b, attn=attn))
    return out


def sweep(rep: Replacement, sources: Sources, adjacency: np.ndarray, rows: np.ndarray, top: int,
          d_hidden: np.ndarray | None, inject: dict[int, np.ndarray], blocks: list) -> None:
    """One backward sweep for a batch of B targets (their adjacency ROWS (B,)): from the final hidden states'
    gradient D_HIDDEN (B, n, d) (logit targets; None: no logit in the batch) back through the final norm, or from
    0 above block TOP, down through blocks TOP..0 with the FROZEN boxes; INJECT: layer → (B, n, d) the gradient
    the feature targets of that layer put at its FFN's input; BLOCKS: `dense_blocks`. Fills the batch's rows of
    ADJACENCY."""
    model = rep.model
    w, cfg = model.weights, model.config
    boxes = replace(back.FROZEN, ffn=Cut(sources, rows, adjacency, inject))
    B, n, d = len(rows), len(rep.ids), cfg.d_model
    if d_hidden is not None:
        dx = d_hidden
        if w.final_norm is not None:
            dx, _ = back.frozen_norm(dx, rep.tape.pop(None, "final_norm"), w.final_norm, cfg)
    else:
        dx = np.zeros((B, n, d), dtype=model.dtype)
    for layer in reversed(range(top + 1)):
        dx, _, _ = back.block(dx, blocks[layer], rep.tape, layer, cfg, boxes=boxes)
    sources.embed(dx, rows, adjacency)


def constants(rep: Replacement, features: np.ndarray, logit_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the features' constants (F,), the logits' (K,)): their inputs in the frozen pass with every node set to 0
    (the stream entering block 0, every feature and every error): only biases drive it, through the same frozen
    patterns and scales. Independent of the backward: the check Σ edges + constant = input is not circular."""
    model = rep.model
    n = len(rep.ids)

    def zero_stream(x, layer):
        return np.zeros_like(x)

    def biases_only(out, layer):
        bias = np.broadcast_to(decoded_bias(rep, layer, seen.pop(layer)), out.shape)
        return rep.hold(layer, bias)                                            # (1, n, d) no feature, no error

    seen: dict[int, np.ndarray] = {}

    def read(x, layer):
        seen[layer] = x

    spec = rep.frozen_hooks() | {"0.residual": zero_stream, "ffn_in": read, "ffn_out": biases_only}
    rec = Recorder(keep=("ffn_in",))
    hidden, _ = transformer(model.weights, model.config, rep.ids[None], np.ones((1, n), np.int64), rec=rec,
                            hooks=Hooks(spec, model.config), logits=None)
    ffn_in = [rec.store[i]["ffn_in"][0] for i in range(rep.n_layers)]           # L × (n, d)
    logits = logit_inputs(rep, hidden[0, -1], logit_ids) if len(logit_ids) else np.zeros(0)
    return feature_inputs(rep, features, ffn_in), logits


def decoded_bias(rep: Replacement, layer: int, x: np.ndarray) -> np.ndarray:
    """A transcoder's output with no feature active: b_dec (+ x·W_skip, linear in its input) (…, d)."""
    p = rep.transcoders[layer].params
    return p["b_dec"] + (0 if p.get("W_skip") is None else x @ p["W_skip"])


def feature_inputs(rep: Replacement, features: np.ndarray, ffn_in: list[np.ndarray]) -> np.ndarray:
    """(F,) each feature's pre-activation on FFN_IN (L × (n, d))."""
    out = np.empty(len(features))
    for layer in range(rep.n_layers):
        idx = np.flatnonzero(features[:, 0] == layer)
        if len(idx):
            sae = rep.transcoders[layer]
            pre = pre_acts(sae.params, sae.config, ffn_in[layer][features[idx, 1]])   # (F_l, d_sae)
            out[idx] = pre[np.arange(len(idx)), features[idx, 2]]
    return out


def logit_inputs(rep: Replacement, hidden_last: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """(K,) logit_t − mean logit (before any soft-cap) of the last position's final hidden states (d,)."""
    logits = unembed(rep, hidden_last, -1, head_gate(rep))                      # (V,)
    return logits[ids] - logits.mean()


# ── the graph ────────────────────────────────────────────────────────────────────

def active_features(rep: Replacement) -> tuple[np.ndarray, np.ndarray]:
    """(features (F, 3) layer, position, feature, sorted so; activations (F,)): every non-zero activation."""
    found = [np.column_stack([np.full(len(p), layer), p, f]) for layer, z in enumerate(rep.acts)
             for p, f in [np.nonzero(z)]]
    features = np.concatenate(found).astype(np.int64) if found else np.zeros((0, 3), np.int64)
    acts = np.array([rep.acts[l][p, f] for l, p, f in features], dtype=np.float64)
    return features, acts


def target_id(model, target) -> int | None:
    """The target token's id: an int, or a text that is one token of the model's tokenizer; None for None."""
    if target is None:
        return None
    V = model.config.vocab_size
    if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
        if not 0 <= target < V:
            raise QkvError(f"the target token id {target} is outside the vocabulary [0, {V}); "
                           "give a token of the model")
        return int(target)
    if not isinstance(target, str) or not target:
        raise QkvError("the target must be a token (text, e.g. ' Austin') or a token id")
    tok = model.tokenizer
    found = None if tok is None else tok.token_to_id(target)                   # as the vocabulary spells it
    if found is None and tok is not None:
        ids = tok.encode(target, add_special_tokens=False)[0]                  # as text: " Austin"
        found = int(ids[0]) if len(ids) == 1 else None
    if found is None:
        raise QkvError(f"the target {target!r} is not one token of {model.name}'s vocabulary; give a single token "
                       "(with its leading space, e.g. ' Austin') or its id")
    return int(found)


def build_graph(model, text, transcoders: Mapping[int, SAE], target=None, *, max_logits: int = MAX_LOGITS,
                cover: float = COVER, chunk: int = CHUNK, progress=None, held: Sequence[int] | None = None) -> Graph:
    """The attribution graph of TEXT (or a row of ids) on MODEL read through TRANSCODERS ({layer: SAE}, one per
    layer): nodes, the dense adjacency of direct effects (rows targets, columns sources), each node's input and
    constant. target: a token (text or id) whose logit node is kept whatever its probability. chunk: targets
    per backward sweep (memory: chunk·n·d_model numbers per gradient). progress(done, total): called per sweep.
    held: positions whose FFN outputs are constants (qkv.graphs.replacement.replacement); None: the attention
    sink of a causal model (`sink_positions`), () for none."""
    if isinstance(max_logits, bool) or not isinstance(max_logits, (int, np.integer)) or not 1 <= max_logits <= 1000:
        raise QkvError(f"max_logits must be a whole number from 1 to 1000, got {max_logits!r}")
    if held is None:
        held = sink_positions(model, len(prompt_ids(model, text)[0]))
    rep = replacement(model, text, transcoders, held)
    if rep.logits is None:
        raise QkvError(f"{model.name} has no LM head, so there are no logits to explain; use a model with one "
                       "(qkv.graphs.graph.direct_effects gives an encoder's graph of its features)")
    tid = target_id(model, target)
    logits = rep.logits[-1].astype(np.float64)                                 # (V,) as the model gives them
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    logit_ids = top_logits(probs, cover, int(max_logits), tid)
    features, acts, adjacency = direct_effects(rep, logit_ids, chunk, progress)
    F, N, K = len(features), len(adjacency), len(logit_ids)
    inputs = np.zeros(N)
    consts = np.zeros(N)
    inputs[:F] = feature_inputs(rep, features, rep.ffn_in)
    inputs[N - K:] = logit_inputs(rep, rep.hidden[-1], logit_ids)
    consts[:F], consts[N - K:] = constants(rep, features, logit_ids)
    return Graph(rep=rep, features=features, activations=acts, logit_ids=logit_ids, probabilities=probs[logit_ids],
                 adjacency=adjacency, inputs=inputs, constants=consts, target=tid)


def direct_effects(rep: Replacement, logit_ids: np.ndarray, chunk: int = CHUNK, progress=None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features (F, 3), activations (F,), adjacency (N, N)) of REP's replacement model with the logit nodes
    LOGIT_IDS (K,) (none: an encoder's graph of its features only): every direct effect, rows targets."""
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise QkvError(f"chunk must be a whole number of targets ≥ 1, got {chunk!r}")
    features, acts = active_features(rep)
    F, L, n, K = len(features), rep.n_layers, len(rep.ids), len(logit_ids)
    N = F + L * n + n + K
    adjacency = np.zeros((N, N), dtype=rep.model.dtype)
    run_sweeps(rep, sources_of(rep, features, acts), adjacency, features, logit_ids, int(chunk), progress)
    return features, acts, adjacency


def run_sweeps(rep: Replacement, sources: Sources, adjacency: np.ndarray, features: np.ndarray,
               logit_ids: np.ndarray, chunk: int, progress=None) -> None:
    """Every target's row of ADJACENCY: the logits first (one sweep from the top), then the features from the
    highest layer down, CHUNK at a time, each sweep starting at its highest target's block."""
    cfg = rep.model.config
    n, d, L = len(rep.ids), cfg.d_model, rep.n_layers
    F = len(features)
    N = len(adjacency)
    order = np.argsort(-features[:, 0], kind="stable")                         # highest layer first
    batches = [("logit", np.arange(N - len(logit_ids), N))] + [
        ("feature", order[i:i + chunk]) for i in range(0, F, chunk)]
    directions = logit_directions(rep, logit_ids) if len(logit_ids) else None   # (K, d)
    blocks = dense_blocks(rep.model)
    for done, (kind, rows) in enumerate(batches):
        if kind == "logit":
            for lo in range(0, len(rows), chunk):
                part = rows[lo:lo + chunk]
                d_hidden = np.zeros((len(part), n, d), dtype=rep.model.dtype)
                d_hidden[:, -1] = directions[lo:lo + chunk]
                sweep(rep, sources, adjacency, part, L - 1, d_hidden, {}, blocks)
        else:
            inject: dict[int, np.ndarray] = {}
            for b, t in enumerate(rows):
                layer, p, f = features[t]
                x = inject.setdefault(int(layer), np.zeros((len(rows), n, d), dtype=rep.model.dtype))
                x[b, p] = rep.transcoders[int(layer)].params["W_enc"][:, f]
            sweep(rep, sources, adjacency, rows, int(features[rows[0], 0]), None, inject, blocks)
        if progress is not None:
            progress(done + 1, len(batches))
