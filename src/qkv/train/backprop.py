"""The losses training learns from, and their gradients through the whole model (qkv.core.backward).

    loss:    L = mean −log softmax(logits)[next id]            dlogits = (softmax(logits) − onehot(next id)) / N
             (a masked-LM encoder: [labels[t]] at the labelled positions, through its head's backward)
    then     core.backward.taped (the pass inference runs, keeping a tape) and core.backward.backward
             (every box's backward in reverse, from dlogits)
"""

from __future__ import annotations

import numpy as np

from ..core.backward import backward, taped
from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import Weights


# ── the loss ─────────────────────────────────────────────────────────────────────

def token_loss(logits: np.ndarray, targets: np.ndarray, counted: np.ndarray) -> tuple[float, np.ndarray]:
    """(L, dL/dlogits) of L = mean over counted positions t of −log softmax(logits[t])[targets[t]].

    logits (B, n, V), targets and counted (B, n). The gradient is (softmax(logits[t]) − onehot(targets[t])) / N
    at each of the N counted positions, 0 elsewhere.
    """
    m = logits.max(axis=-1, keepdims=True)                # (B, n, 1)
    p = np.exp(logits - m)                                # (B, n, V)
    total = p.sum(axis=-1, keepdims=True)
    at = targets[..., None]                               # (B, n, 1)
    logp_target = (np.take_along_axis(logits, at, -1) - m - np.log(total))[..., 0]   # (B, n)
    N = int(counted.sum())
    loss = float(-(logp_target.astype(np.float64) * counted).sum() / N)
    p /= total                                            # softmax
    np.put_along_axis(p, at, np.take_along_axis(p, at, -1) - 1.0, -1)
    p *= (counted / N).astype(p.dtype)[..., None]
    return loss, p


def next_token_loss(logits: np.ndarray, ids: np.ndarray, counted: np.ndarray) -> tuple[float, np.ndarray]:
    """token_loss with position t predicting ids[t+1] (teacher forcing): counted (B, n − 1); the last
    position predicts nothing and gets no gradient."""
    loss, d = token_loss(logits[:, :-1], ids[:, 1:], counted)
    dlogits = np.zeros_like(logits)                       # (B, n, V)
    dlogits[:, :-1] = d
    return loss, dlogits


def counted_positions(attention_mask: np.ndarray, loss_mask: np.ndarray | None = None) -> np.ndarray:
    """(B, n − 1) bool: positions t whose next-token loss counts — t and t+1 both real tokens
    (transformers' labels=input_ids with padding labelled −100, padded on the right), and
    loss_mask[t] where given."""
    real = attention_mask.astype(bool)
    counted = real[:, :-1] & real[:, 1:]
    if loss_mask is not None:
        counted &= np.asarray(loss_mask, dtype=bool)[:, :-1]
    if not counted.any():
        raise QkvError("no position has a next token to learn from; give sequences of at least 2 real tokens")
    return counted


# ── the whole model ──────────────────────────────────────────────────────────────

def masked_lm_targets(labels: np.ndarray | None, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(targets, counted) (B, n) of a masked-LM encoder's labels: the token each position must give, −100
    where nothing is learned (transformers' labels for *ForMaskedLM: position t predicts labels[t], no shift)."""
    if labels is None:
        raise QkvError("a masked-LM encoder learns from labels: pass labels (B, n), the original token at each "
                       "masked position and −100 elsewhere")
    labels = np.asarray(labels).reshape(ids.shape)
    counted = labels != -100
    if not counted.any():
        raise QkvError("every label is −100: give at least one position a token to learn")
    return np.where(counted, labels, 0), counted


def loss_and_grads(weights: Weights, cfg: ModelConfig, ids: np.ndarray, attention_mask: np.ndarray | None = None,
                   loss_mask: np.ndarray | None = None, labels: np.ndarray | None = None) -> tuple[float, Weights]:
    """The mean next-token cross-entropy of ids (B, n) and its gradient for every weight; for a masked-LM
    encoder (RoBERTa, DistilBERT, ELECTRA's generator) the masked-LM cross-entropy of LABELS (B, n) instead:
    position t predicts labels[t] (−100: not learned), through the head Norm(act(Z·W_head + b_head)).

    The gradients come back as a Weights tree of the same shapes (None where there is no
    weight or no gradient: a sinusoidal table is fixed). A tied W_vocab's gradient is added
    into tok_embed's, and the tree's W_vocab is then its transposed view (one table, one
    gradient). ids and masks are checked by the caller (`gradients`, the training loop).
    """
    if weights.W_vocab is None:
        raise QkvError(f"training needs a decoder or a masked-LM encoder (with W_vocab); this {cfg.family} encoder "
                       "has no LM head")
    mask = np.ones(ids.shape, np.int64) if attention_mask is None else np.asarray(attention_mask)
    if cfg.causal:
        counted = counted_positions(mask, loss_mask)
    else:
        targets, counted = masked_lm_targets(labels, ids)

    h, logits, tape = taped(weights, cfg, ids, mask)        # (B, n, d_model), (B, n, V)
    loss, dlogits = next_token_loss(logits, ids, counted) if cfg.causal else token_loss(logits, targets, counted)
    return loss, backward(dlogits, h, logits, weights, cfg, tape)


def image_loss_and_grads(weights: Weights, cfg: ModelConfig, patches: np.ndarray, labels: np.ndarray
                         ) -> tuple[float, Weights]:
    """An image classifier's (ViT's) mean cross-entropy of its [CLS] logits against LABELS (B,), and every
    weight's gradient: transformers' ViTForImageClassification loss. patches (B, P, C·p·p) from
    qkv.inputs.images.patches_of; only position 0 ([CLS]) is scored, so dlogits is 0 at the patches."""
    if weights.W_patch is None or weights.W_vocab is None:
        raise QkvError("image_loss_and_grads trains an image classifier (a ViT with its classifier)")
    B, P = patches.shape[:2]
    ids = np.zeros((B, 1 + P), np.int64)                  # [CLS], then the patches (read from `patches`)
    targets = np.zeros_like(ids)
    targets[:, 0] = labels
    counted = np.zeros(ids.shape, bool)
    counted[:, 0] = True
    h, logits, tape = taped(weights, cfg, ids, np.ones_like(ids), tokens=patches)   # (B, 1 + P, d), (B, 1 + P, V)
    loss, dlogits = token_loss(logits, targets, counted)
    return loss, backward(dlogits, h, logits, weights, cfg, tape)
