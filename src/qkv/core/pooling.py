"""A tower's pooling (CLIP, SigLIP): the last hidden states of a text or an image → one embedding per input, the
vector an image–text pair compares (cfg.pooling, Weights.pool).

    H (B, n, d_model) ─pick─▶ h (B, d_model)          "cls": row 0 (CLIP's image [CLS]), "last": row n − 1 (SigLIP's
                                                       text), "eos": the first eos_token_id of each row's ids (CLIP's
                                                       text; its argmax when eos_token_id is 2, the legacy configs)
                      ─probe─▶ h = r + MLP(LayerNorm(r)),  r = Attention(probe, H, H)     "probe" (SigLIP's image)
      h ─Norm?─▶ ·W_proj + b_proj ─▶ the embedding (B, p)     (no W_proj: h itself)

The probe's attention is a head like any other (one query, the learned probe, attending over every row): its weights
(B, H, n) are returned beside the embedding, one more attention row to draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .attention import merge_heads, split_heads
from .blocks import linear, norm
from .config import ModelConfig
from .ops import ACTIVATIONS, softmax
from .weights import PoolWeights
from ..runtime.errors import QkvError


@dataclass
class Pooled:
    """What a tower's pooling gives for B inputs."""

    pooled: np.ndarray                      # (B, d_model) the pooled row (CLIP's pooler_output, before W_proj)
    embeds: np.ndarray                      # (B, p) the embedding compared: after W_proj (CLIP's text_embeds and
                                            # image_embeds, SigLIP's pooler_output); = pooled without one
    probe_attentions: np.ndarray | None = None   # (B, H, n) the probe's attention over the rows (SigLIP's image)


def pooled_rows(hidden: np.ndarray, ids: np.ndarray | None, cfg: ModelConfig) -> np.ndarray:
    """h (B, d_model): the row of each input of HIDDEN (B, n, d_model) that cfg.pooling names (not "probe")."""
    B, n = hidden.shape[:2]
    if cfg.pooling == "cls":
        at = np.zeros(B, np.int64)
    elif cfg.pooling == "last":
        at = np.full(B, n - 1)
    elif cfg.pooling == "eos":                         # CLIPTextTransformer's two rules
        if ids is None:
            raise QkvError("pooling at the eos token needs the token ids; run the text, not its embeddings")
        if cfg.eos_token_id == 2:                      # configs before transformers' PR #24773: the largest id
            at = np.argmax(ids, axis=-1)
        else:                                          # the first eos (row 0 when a row has none, as torch's argmax)
            at = np.argmax(ids == cfg.eos_token_id, axis=-1)
    else:
        raise QkvError(f"pooling {cfg.pooling!r} picks no row; fix the model's config")
    return hidden[np.arange(B), at]                    # (B, d_model)


def probe_attention(hidden: np.ndarray, w: PoolWeights, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """SigLIP's attention-pooling head: r = softmax(q·Kᵀ/√d_k)·V·W_O + b_O with q = probe·W_Q + b_Q, K, V = H·W_K + b_K,
    H·W_V + b_V (torch's MultiheadAttention), then h = r + MLP(LayerNorm(r)) → (h (B, d_model), A (B, H, n))."""
    a = w.probe_attn
    q = split_heads(linear(w.probe[None, None], a.W_Q, a.b_Q), cfg.n_heads)             # (1, H, 1, d_k)
    k = split_heads(linear(hidden, a.W_K, a.b_K), cfg.n_heads)                          # (B, H, n, d_k)
    v = split_heads(linear(hidden, a.W_V, a.b_V), cfg.n_heads)                          # (B, H, n, d_k)
    A = softmax(q @ k.swapaxes(-1, -2) / math.sqrt(k.shape[-1]), axis=-1)              # (B, H, 1, n)
    r = linear(merge_heads(A @ v), a.W_O, a.b_O)                                        # (B, 1, d_model)
    f = w.probe_ffn
    u = ACTIVATIONS[cfg.activation](linear(norm(r, w.probe_norm, cfg), f.W_in, f.b_in))   # (B, 1, d_ff)
    return (r + linear(u, f.W_out, f.b_out))[:, 0], A[:, :, 0]                         # (B, d_model), (B, H, n)


def pool(hidden: np.ndarray, ids: np.ndarray | None, w: PoolWeights | None, cfg: ModelConfig) -> Pooled:
    """HIDDEN (B, n, d_model), the tower's last hidden states (and IDS (B, n), its text's) → Pooled."""
    if cfg.pooling is None:
        raise QkvError("this model pools no embedding (no pooling in its config); load a CLIP or SigLIP tower")
    attention = None
    if cfg.pooling == "probe":
        h, attention = probe_attention(hidden, w, cfg)
    else:
        h = pooled_rows(hidden, ids, cfg)
    if w is not None and w.norm is not None:
        h = norm(h, w.norm, cfg)                       # CLIP's image: post_layernorm on [CLS] alone
    embeds = h if w is None or w.W_proj is None else linear(h, w.W_proj, w.b_proj)   # (B, p)
    return Pooled(h, embeds, attention)
