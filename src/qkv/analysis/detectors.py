"""Head detectors, as TransformerLens defines them (`transformer_lens.head_detector`).

A detector is a 0/1 pattern P (n × n, lower-triangular: only earlier keys count) of
where a head of that kind would look; a head's score is the "mul" measure

    score = Σ(A ⊙ P) / ΣA        (A: the head's attention on that text)

    previous-token  P[i, i−1] = 1
    duplicate-token P[i, j] = 1 where j < i and token j = token i
    induction       P[i, j] = 1 where j ≥ 1, j−1 < i and token j−1 = token i
                    (look at what followed the earlier copy of the current token)

Induction heads show on repeated random tokens (Olsson et al. 2022): a random sequence
followed by itself; in the second half an induction head looks one past the first copy,
a duplicate-token head at the first copy itself. Both are scored on the same sequences
(`repeated_scores`); on ordinary text few tokens repeat, so duplicate-token scores there
stay small even for a head that does nothing else. Only the second half can match either
pattern, so on a sequence of 2 × 25 tokens the largest possible score is about 0.5.
"""

from __future__ import annotations

import numpy as np

from ..runtime.errors import QkvError

DETECTORS = ("previous_token", "duplicate_token", "induction", "duplicate_token_repeated")
INDUCTION_HALF = 25          # random tokens per half of a repeated sequence
INDUCTION_BATCH = 4          # repeated sequences averaged over
INDUCTION_SEED = 0


def previous_token_pattern(n: int) -> np.ndarray:
    """P[i, i−1] = 1: a head that looks at the token before."""
    return np.eye(n, k=-1)                                        # (n, n)


def duplicate_token_pattern(ids: np.ndarray) -> np.ndarray:
    """P[i, j] = 1 where j < i holds the same token as i."""
    ids = np.asarray(ids)
    same = (ids[:, None] == ids[None, :]).astype(np.float64)      # (n, n)
    np.fill_diagonal(same, 0.0)                                   # a token is always its own duplicate
    return np.tril(same)


def induction_pattern(ids: np.ndarray) -> np.ndarray:
    """P[i, j] = 1 where token j−1 equals token i and j−1 < i: the duplicate pattern shifted right."""
    dup = duplicate_token_pattern(ids)                            # (n, n)
    shifted = np.zeros_like(dup)
    shifted[:, 1:] = dup[:, :-1]
    return np.tril(shifted)


def pattern_score(attn: np.ndarray, pattern: np.ndarray) -> np.ndarray:
    """Σ(A ⊙ P) / ΣA per head: the "mul" score of TransformerLens. attn (..., n, n) → (...)."""
    A = np.asarray(attn, dtype=np.float64)
    return (A * pattern).sum((-2, -1)) / A.sum((-2, -1))


def pattern_mass(attn: np.ndarray, pattern: np.ndarray) -> np.ndarray:
    """Σ(A ⊙ P) per head, the numerator of `pattern_score` (for pooling texts)."""
    return (np.asarray(attn, dtype=np.float64) * pattern).sum((-2, -1))


def ordinary_token_ids(model) -> np.ndarray:
    """Ids a random text may hold: the vocabulary without special tokens ([CLS], <s>, [unused0], …)."""
    V = model.config.vocab_size
    tok = model.tokenizer
    if tok is None:
        return np.arange(V)
    keep = []
    for i in range(min(V, tok.vocab_size)):
        t = tok.id_to_token(i)
        if len(t) > 2 and ((t[0] == "[" and t[-1] == "]") or (t[0] == "<" and t[-1] == ">")):
            continue
        keep.append(i)
    return np.asarray(keep, dtype=np.int64)


def repeated_random_tokens(model, half: int = INDUCTION_HALF, batch: int = INDUCTION_BATCH,
                           seed: int = INDUCTION_SEED, prefix=(), suffix=()) -> np.ndarray:
    """(batch, n) ids: `half` random ordinary tokens, then the same again, inside prefix/suffix.

    prefix / suffix: the special tokens the tokenizer puts around every text ([CLS] … [SEP]).
    """
    pool = ordinary_token_ids(model)
    if len(pool) < 2:
        raise QkvError(f"{model.name}'s vocabulary has no ordinary tokens to repeat; use another model")
    n = len(prefix) + 2 * half + len(suffix)
    if n > model.config.max_positions:
        half = (model.config.max_positions - len(prefix) - len(suffix)) // 2
        if half < 2:
            raise QkvError(f"{model.name} handles only {model.config.max_positions} positions, too few "
                           "for repeated sequences; use a model with a longer context")
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(batch):
        r = rng.choice(pool, size=half)                           # (half,)
        rows.append(np.concatenate([np.asarray(prefix, np.int64), r, r, np.asarray(suffix, np.int64)]))
    return np.stack(rows)                                         # (batch, n)


def repeated_scores(model, prefix=(), suffix=(), **kw) -> dict[str, np.ndarray]:
    """{"induction", "duplicate_token_repeated"} → (L, H): each head's score, averaged over the
    same repeated random sequences (one forward pass)."""
    ids = repeated_random_tokens(model, prefix=prefix, suffix=suffix, **kw)     # (B, n)
    att = model.forward(ids, attentions=True).attentions                        # (L, B, H, n, n)
    out = {}
    for name, pattern in (("induction", induction_pattern), ("duplicate_token_repeated", duplicate_token_pattern)):
        scores = [pattern_score(att[:, b], pattern(ids[b])) for b in range(len(ids))]   # B × (L, H)
        out[name] = np.mean(scores, axis=0)                                             # (L, H)
    return out


def induction_scores(model, prefix=(), suffix=(), **kw) -> np.ndarray:
    """(L, H): each head's induction score, averaged over repeated random sequences."""
    return repeated_scores(model, prefix, suffix, **kw)["induction"]


def induction_stripe(attn: np.ndarray, half: int, offset: int = 0) -> np.ndarray:
    """Olsson et al.'s induction score on a sequence [prefix (offset tokens)] r r: the mean attention
    from each token of the second copy to the token after its first occurrence, A[i, i − half + 1].

    attn (..., n, n) → (...). 1 is a perfect induction head. Unlike `pattern_score`, which divides
    by every row (so the first copy, where nothing can match, caps it at ~0.5), this averages the
    rows that can match only: the measure that shows a head forming while a model learns.
    """
    i = np.arange(offset + half, offset + 2 * half)               # the second copy's positions
    return np.asarray(attn, dtype=np.float64)[..., i, i - half + 1].mean(-1)


def top_heads(scores: np.ndarray, k: int = 3) -> list[tuple[int, int, float]]:
    """The k heads with the highest scores: [(layer, head, score)], best first."""
    flat = np.argsort(-np.asarray(scores), axis=None, kind="stable")[:k]
    return [(int(i // scores.shape[1]), int(i % scores.shape[1]), float(scores.flat[i])) for i in flat]
