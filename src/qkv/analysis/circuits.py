"""QK and OV circuits of one head (Elhage et al. 2021, "A Mathematical Framework for Transformer
Circuits"): what a head copies, and where it looks by position.

OV — what the head writes when it attends to a token. The full OV circuit

    W_E · W_V^h · W_O^h · W_U        (V × V)

has entry [s, t]: how much attending to token s raises the logit of token t (the direct path:
embedding → this head → unembedding). It is V² numbers (2.4·10⁹ for SmolLM2), so `ov_circuit`
computes it for a token set (k × k) and, row by row, each of those tokens' top outputs over the
whole vocabulary. Its copying score is Σλ / Σ|λ| over its eigenvalues λ, as TransformerLens's
FactoredMatrix computes them: the nonzero eigenvalues of A·B (A = W_E·W_V^h, V × d_k;
B = W_O^h·W_U, d_k × V) are those of B·A (d_k × d_k). +1: every eigenvalue positive, the head
copies what it reads; −1: it suppresses it.

QK — where the head looks by position. Learned (or sinusoidal) positions: the positional part of
its scores, W_pos·W_Q^h·(W_pos·W_K^h)ᵀ/√d_k (N × N, the first N positions), averaged over each
diagonal (relative distance Δ = i − j). RoPE has no position table: the positions live in the
rotation of q and k, so `qk_positions` measures the mean q_i·k_j/√d_k and the mean attention
A[i, j] at each Δ on a real text's activations (for every model).

Norms are folded in as TransformerLens's fold_ln does: the block's attention-norm γ multiplies
W_V's and W_Q's, W_K's rows, the final norm's γ W_U's rows; for LayerNorm, the writing weights
(W_E, W_pos, W_O) are centred over d_model and W_U over the vocabulary. Biases are left out.
An encoder without an LM head (MiniLM) reads out through W_Eᵀ, as BERT's MLM head is tied to it.
The figure of both: `viz.interpret_figures.circuits_figure`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..core.layer import norm_in_front
from ..core.context import QUIET, check_finite
from ..core.capabilities import INSTEAD, require, supports
from ..runtime.errors import QkvError

if TYPE_CHECKING:
    from ..models.model import Model

MAX_POSITIONS = 64          # the positional QK table's side N


@dataclass
class OVCircuit:
    """One head's OV circuit on a token set (see the module)."""

    layer: int
    head: int
    ids: np.ndarray                        # (k,) the token set
    labels: list[str]                      # (k,) as a reader sees them
    matrix: np.ndarray                     # (k, k) [s, t]: attending to ids[s] raises the logit of ids[t]
    top_outputs: list[list[tuple[str, float]]]   # (k,) each source's top outputs over the whole vocabulary
    copying_score: float                   # Σλ / Σ|λ| of the full V × V circuit, in [-1, 1]
    diagonal: float                        # the fraction of sources whose largest output in the set is themselves

    def top(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The k largest entries of the matrix: (source token, output token, value)."""
        order = np.argsort(-self.matrix, axis=None)[:k]
        n = self.matrix.shape[1]
        return [(self.labels[i // n], self.labels[i % n], float(self.matrix.flat[i])) for i in order]


@dataclass
class PositionQK:
    """Where one head looks by relative position Δ = i − j (query i, key j)."""

    layer: int
    head: int
    deltas: np.ndarray                     # (D,) relative distances, 0 = itself
    score: np.ndarray                      # (D,) mean q_i·k_j/√d_k on the text's activations
    attention: np.ndarray                  # (D,) mean attention weight A[i, j] at that distance
    table: np.ndarray | None               # (N, N) W_pos·W_Q^h·(W_pos·W_K^h)ᵀ/√d_k; None for RoPE
    table_by_delta: np.ndarray | None      # (D',) its mean over each diagonal, Δ = deltas_table
    deltas_table: np.ndarray | None        # (D',)


# ── the weights, folded ──────────────────────────────────────────────────────────

def _centred(W: np.ndarray, model: "Model", axis: int = -1) -> np.ndarray:
    """LayerNorm subtracts the mean over d_model: the writing weights' mean there is invisible."""
    return W - W.mean(axis=axis, keepdims=True) if model.config.norm == "layer" else W


def _gamma(model: "Model", layer: int, box: str) -> np.ndarray:
    """γ of the norm in front of BOX's input ("attn": the head's; the core's `norm_in_front`), (d_model,);
    ones where the box reads the stream itself (post-norm; no norm in front: OLMo 2)."""
    front = norm_in_front(model.weights.blocks[layer], box, model.config)
    return np.ones(model.config.d_model) if front is None else front.weight.astype(np.float64)


def head_weights(model: "Model", layer: int, head: int) -> dict[str, np.ndarray]:
    """W_Q^h, W_K^h, W_V^h (d_model, d_k), input γ folded in, and W_O^h (d_k, d_model), float64.
    GQA: query head h reads K/V head h // (H / Hkv)."""
    cfg = model.config
    layer, head = model.check_layer(layer), model.check_head(head)
    require(cfg, model.name, "a head's QK and OV circuits (W_Q·W_Kᵀ, W_V·W_O)", {"qkv_heads"}, layer,
            instead="a multi-head latent attention head has no fixed W_Q·W_Kᵀ or W_V·W_O circuit (its K and V come "
                    "from a normalised latent per token); use `qkv show` / `qkv heads` for its weights"
            if cfg.latent else INSTEAD)
    a, d_k = model.weights.blocks[layer].attn, cfg.d_head
    g = head // (cfg.n_heads // cfg.n_kv_heads)
    gamma = _gamma(model, layer, "attn")[:, None]                           # (d_model, 1)
    q, kv = slice(head * d_k, (head + 1) * d_k), slice(g * d_k, (g + 1) * d_k)
    return {"W_Q": gamma * a.W_Q[:, q], "W_K": gamma * a.W_K[:, kv], "W_V": gamma * a.W_V[:, kv],
            "W_O": _centred(a.W_O[q].astype(np.float64), model)}


def check_circuits(model: "Model") -> None:
    """W_E and W_U must be the stream's own ends: refused in one line where a masked-LM head (not linear) or
    ELECTRA's projected embeddings stand between them and the blocks."""
    w = model.weights
    if getattr(w, "W_head", None) is not None or getattr(w, "W_embed", None) is not None:
        raise QkvError(f"{model.name} has a masked-LM head before W_vocab or embeddings projected to d_model "
                       "(RoBERTa, DistilBERT, ELECTRA, ModernBERT): no W_E, W_U of the stream's width to read a circuit "
                       "through; use a decoder (--model smollm2) or BERT / MiniLM")


def embedding(model: "Model", table: np.ndarray | None = None) -> np.ndarray:
    """W_E (V, d_model), or another TABLE (W_pos), as the blocks read it: centred for LayerNorm,
    BERT's embedding-norm γ folded in (its 1/std scale, which depends on the whole input, is not)."""
    check_circuits(model)
    W = (model.weights.tok_embed if table is None else table).astype(np.float64)
    if table is None and model.weights.embed_in is not None:
        W = W @ model.weights.embed_in                                           # OPT-350m: (V, d_embed) → (V, d_model)
    W = _centred(W, model)
    if model.weights.embed_norm is not None:
        W = W * model.weights.embed_norm.weight
    return W


def unembedding(model: "Model") -> np.ndarray:
    """W_U (d_model, V) with the final norm's γ folded into its rows (centred over V for LayerNorm);
    an encoder without an LM head reads out through W_Eᵀ."""
    w = model.weights
    if w.W_vocab is None:
        return model.weights.tok_embed.astype(np.float64).T                      # (d_model, V)
    U = w.W_vocab.astype(np.float64)
    if w.unembed_in is not None:
        U = w.unembed_in.astype(np.float64) @ U                                  # OPT-350m: (d_model, d_embed)·(d_embed, V)
    if w.final_norm is not None:
        U = w.final_norm.weight.astype(np.float64)[:, None] * U
    return _centred(U, model, axis=1)


# ── OV ───────────────────────────────────────────────────────────────────────────

def copying_score(model: "Model", layer: int, head: int, *, UE: np.ndarray | None = None) -> float:
    """Σλ / Σ|λ| over the eigenvalues of the full OV circuit W_E·W_V^h·W_O^h·W_U, from the
    d_k × d_k matrix W_O^h·(W_U·W_E)·W_V^h that has the same nonzero ones. UE: W_U·W_E (d, d), reused."""
    h = head_weights(model, layer, head)
    UE = unembedding(model) @ embedding(model) if UE is None else UE              # (d_model, d_model)
    lam = np.linalg.eigvals(h["W_O"] @ UE @ h["W_V"])                             # (d_k,)
    size = np.abs(lam).sum()
    return float(lam.sum().real / size) if size > 0 else 0.0                     # a circuit of zeros copies nothing


def copying_scores(model: "Model") -> np.ndarray:
    """(L, H) every head's copying score (W_U·W_E computed once); NaN in a layer with no W_V·W_O heads (a Mamba or
    linear-attention layer: core/capabilities.py)."""
    UE = unembedding(model) @ embedding(model)                                    # (d_model, d_model)
    cfg = model.config
    return np.array([[copying_score(model, l, h, UE=UE) if supports(cfg, l, "qkv_heads") else np.nan
                      for h in range(cfg.n_heads)] for l in range(cfg.n_layers)])


def token_set(model: "Model", tokens: str | Sequence[int]) -> np.ndarray:
    """The distinct ids of a text (in order of first appearance), or ids given as a list."""
    if isinstance(tokens, str):
        ids = model.encode(tokens)[0]
    else:
        ids = model.check_ids(tokens)[0][0]
    return np.array(list(dict.fromkeys(int(i) for i in ids)), dtype=np.int64)


def ov_circuit(model: "Model", layer: int, head: int, tokens: str | Sequence[int], top: int = 3) -> OVCircuit:
    """The OV circuit of head HEAD of LAYER on the tokens of TOKENS (a text, or ids): the k × k
    matrix, each token's TOP outputs over the vocabulary, the copying score (see the module)."""
    layer, head = model.check_layer(layer), model.check_head(head)
    ids = token_set(model, tokens)
    h = head_weights(model, layer, head)
    with np.errstate(**QUIET):                                                   # weights near 3e38: one line, below
        E, U = embedding(model), unembedding(model)                              # (V, d_model), (d_model, V)
        rows = E[ids] @ h["W_V"] @ h["W_O"] @ U                                  # (k, V) full rows
        UE = U @ E
        check_finite(rows, f"the OV circuit of layer {layer}, head {head}")
        check_finite(UE, "W_U·W_E")
    matrix = rows[:, ids]                                                        # (k, k)
    label = model.tokenizer.label if model.tokenizer else str
    best = np.argsort(-rows, axis=1)[:, :top]                                   # (k, top)
    outputs = [[(label(int(t)), float(r[t])) for t in b] for r, b in zip(rows, best)]
    return OVCircuit(layer=layer, head=head, ids=ids, labels=[label(int(i)) for i in ids], matrix=matrix,
                     top_outputs=outputs, copying_score=copying_score(model, layer, head, UE=UE),
                     diagonal=float(np.mean(np.argmax(matrix, axis=1) == np.arange(len(ids)))))


# ── QK by position ──────────────────────────────────────────────────────────────

def by_delta(S: np.ndarray, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """(deltas (D,), mean of S (n, n) over each diagonal Δ = i − j): Δ ≥ 0 when causal, else all."""
    n = S.shape[0]
    deltas = np.arange(0, n) if causal else np.arange(-(n - 1), n)
    return deltas, np.array([np.diagonal(S, -d).mean() for d in deltas])


def qk_positions(model: "Model", layer: int, head: int, text: str | Sequence[int]) -> PositionQK:
    """Where head HEAD of LAYER looks by relative position: the mean score and attention at each
    distance on TEXT's activations, and for position tables the weights' own QK table (see the module)."""
    cfg = model.config
    layer, head = model.check_layer(layer), model.check_head(head)
    t = model.run(text, layers=[layer], keep=("q", "k", "attentions"), heads=[head])
    lt = t.layer(layer)
    q = lt.q[head].astype(np.float64)                                            # (n, d_k) after RoPE
    k = lt.k[head // (cfg.n_heads // cfg.n_kv_heads)].astype(np.float64)         # (n, d_k)
    S = q @ k.T / np.sqrt(cfg.d_head)                                            # (n, n); causal: Δ ≥ 0 read only
    deltas, score = by_delta(S, cfg.causal)
    _, attention = by_delta(lt.attentions[0].astype(np.float64), cfg.causal)
    table = by_table = deltas_table = None
    if model.weights.pos_embed is not None:
        P = embedding(model, model.weights.pos_embed[:MAX_POSITIONS])                # (N, d_model)
        h = head_weights(model, layer, head)
        table = (P @ h["W_Q"]) @ (P @ h["W_K"]).T / np.sqrt(cfg.d_head)            # (N, N)
        deltas_table, by_table = by_delta(table, cfg.causal)
    return PositionQK(layer=layer, head=head, deltas=deltas, score=score, attention=attention, table=table,
                      table_by_delta=by_table, deltas_table=deltas_table)
