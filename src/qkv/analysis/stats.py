"""Where each head looks, in numbers: Clark et al. (2019)'s statistics of one text.

For a text of n tokens and a head's attention A (n × n, rows = queries, each row sums to 1):

    self    = (1/n)·Σᵢ A[i,i]                   attention to the token itself
    prev    = (1/n)·Σ_{i≥1} A[i,i−1]             to the previous token
    next    = (1/n)·Σ_{i<n−1} A[i,i+1]           to the next token
    cls     = (1/n)·Σᵢ Σ_{j∈[CLS]} A[i,j]         to [CLS]            (None: tokenizer adds no [CLS])
    sep     = (1/n)·Σᵢ Σ_{j∈[SEP]} A[i,j]         to [SEP]            (None: tokenizer adds no [SEP])
    punct   = (1/n)·Σᵢ Σ_{j∈{".", ","}} A[i,j]   to full stops and commas
    first   = (1/n)·Σᵢ A[i,0]                   to position 0 (the attention sink of decoders)
    entropy = (1/n)·Σᵢ −Σⱼ A[i,j]·ln A[i,j]      in nats, with 0·ln 0 = 0

Cross-attention (n_q queries over n_k keys of another text, n_q ≠ n_k) has the same
definitions with (1/n_q)·Σᵢ over its queries and the tokens of its keys, except self, prev
and next: positions in two texts are not comparable, so those are None (not applicable).

Every function takes A with any leading axes, (..., n_q, n_k) — one head, a layer
(H, n_q, n_k) or a whole trace (L, H, n_q, n_k) — and returns one number per head, (...).
Sums run in float64 whatever the input's type.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.ops import entropy as row_entropy

STATS = ("self", "prev", "next", "cls", "sep", "punct", "first", "entropy")
DESCRIPTIONS = {
    "self": "attention to the token itself",
    "prev": "attention to the previous token",
    "next": "attention to the next token",
    "cls": "attention to [CLS]",
    "sep": "attention to [SEP]",
    "punct": 'attention to "." and ","',
    "first": "attention to the first position (the sink of decoders)",
    "entropy": "entropy of each attention row, in nats",
}
CLS, SEP = "[CLS]", "[SEP]"
PUNCTUATION = frozenset({".", ","})
BPE_SPACE = ("Ġ", "▁")          # the word-start markers of byte-level BPE and SentencePiece


def _f64(attn: np.ndarray) -> np.ndarray:
    attn = np.asarray(attn)
    if attn.ndim < 2 or 0 in attn.shape[-2:]:
        raise ValueError(f"attention must be (..., n_q, n_k) with n_q, n_k ≥ 1, got {attn.shape}")
    return attn.astype(np.float64, copy=False)


def diagonal(attn: np.ndarray, offset: int) -> np.ndarray:
    """(1/n)·Σᵢ A[i, i+offset]: offset 0 = self, −1 = prev, +1 = next (self-attention only, n × n)."""
    A = _f64(attn)
    n = A.shape[-1]
    if A.shape[-2] != n:
        raise ValueError(f"self/prev/next need self-attention (..., n, n), got {A.shape}")
    return np.diagonal(A, offset, axis1=-2, axis2=-1).sum(-1) / n      # (...)


def attention_to(attn: np.ndarray, positions: Sequence[int]) -> np.ndarray:
    """(1/n_q)·Σᵢ Σ_{j∈positions} A[i,j]: how much of the queries' attention goes to these keys."""
    A = _f64(attn)
    n_q = A.shape[-2]
    cols = sorted(set(int(j) for j in positions))
    return A[..., :, cols].sum((-2, -1)) / n_q                           # (...)


def entropy(attn: np.ndarray, sinks: bool = False) -> np.ndarray:
    """(1/n_q)·Σᵢ −Σⱼ A[i,j]·ln A[i,j], in nats; 0·ln 0 = 0 (masked keys count for nothing). sinks: each row's
    sink share p = 1 − Σⱼ A[i,j] is one more outcome of its softmax (gpt-oss): −p·ln p is added."""
    A = _f64(attn)
    rows = row_entropy(A)                                                # (..., n_q)
    if sinks:
        p = np.clip(1 - A.sum(axis=-1), 0, 1)                            # (..., n_q) the sink's share
        rows = rows - p * np.log(np.where(p > 0, p, 1.0))
    return rows.mean(-1)                                                 # (...)


def uniform_entropy(n: int, causal: bool) -> float:
    """The entropy of attention spread evenly over every visible key: the most a head can have.

    Encoders (and cross-attention, over n = n_k keys) see n keys from every row (ln n);
    decoders see i+1 keys from row i.
    """
    if not causal:
        return float(np.log(n))
    return float(np.log(np.arange(1, n + 1, dtype=np.float64)).mean())


def bare(token: str) -> str:
    """A token without its BPE word-start marker: "Ġ," → ","."""
    return token[1:] if token[:1] in BPE_SPACE else token


def positions_of(tokens: Sequence[str], spelled: str | None) -> list[int] | None:
    """Positions of a special token in the text, or None when the tokenizer has no such token."""
    if spelled is None:
        return None
    return [j for j, t in enumerate(tokens) if t == spelled]


def punctuation_positions(tokens: Sequence[str]) -> list[int]:
    """Positions of "." and "," (after removing "Ġ"/"▁")."""
    return [j for j, t in enumerate(tokens) if bare(t) in PUNCTUATION]


def head_stats(attn: np.ndarray, tokens: Sequence[str], *, cls: str | None = CLS,
               sep: str | None = SEP, sinks: bool = False) -> dict[str, np.ndarray | None]:
    """Every statistic of STATS for one text: name → (...) per head, None when it does not apply.

    tokens: the keys' tokens as the tokenizer spells them (n_k; "[CLS]", "Ġ,").
    cls / sep: how the tokenizer spells [CLS] / [SEP], or None when it adds no such token
    (GPT-2, Llama): then that statistic is None, never 0. Cross-attention (n_q ≠ n_k):
    self, prev and next are None.
    """
    A = _f64(attn)
    if A.shape[-1] != len(tokens):
        raise ValueError(f"attention is over {A.shape[-1]} tokens but {len(tokens)} tokens were given")
    square = A.shape[-2] == A.shape[-1]
    cls_at, sep_at = positions_of(tokens, cls), positions_of(tokens, sep)
    return {
        "self": diagonal(A, 0) if square else None,
        "prev": diagonal(A, -1) if square else None,
        "next": diagonal(A, 1) if square else None,
        "cls": None if cls_at is None else attention_to(A, cls_at),
        "sep": None if sep_at is None else attention_to(A, sep_at),
        "punct": attention_to(A, punctuation_positions(tokens)),
        "first": attention_to(A, [0]),
        "entropy": entropy(A, sinks),
    }
