"""The next-token distribution (guide: temperature): logits → softmax(logits / T) → next token.

    P(next = v) = softmax(z / T)_v = exp(z_v / T) / Σ_u exp(z_u / T)      z = logits[last], (V,)

T = 1 is the model's own distribution; T < 1 sharpens it, T > 1 flattens it, and T = 0
is greedy: all the mass on the argmax (one-hot). Dividing by T > 0 never changes the
order of the tokens, only how the mass is shared. The numbers are the ones sampling
draws from (`qkv.writing.sampling.distribution`, reused here, never copied).

    distribution(z, T)      softmax(z / T), float64, (..., V)
    top_tokens(p, k)        the k most probable ids and their probabilities
    entropy(p)              H = −Σ p·log₂ p, in bits
    candidates(z, chosen, k, temperatures)   what the viewer needs to re-normalise in the page
    masked_token_logits(model, ids)          a masked-LM encoder's (RoBERTa, DistilBERT, ELECTRA's
                                             generator) logits at its mask token instead of the last
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..runtime.errors import QkvError
from ..core.ops import entropy as ops_entropy
from .sampling import distribution  # noqa: F401  (re-exported: the views of the distribution sample draws from)
from ..core.labels import visible


def top_tokens(probs: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """The k most probable tokens of a (V,) distribution: (ids (k,), probabilities (k,)), most probable first.

    Ties go to the lower id.
    """
    p = np.asarray(probs)
    if p.ndim != 1:
        raise QkvError(f"top_tokens takes one distribution (V,), got shape {p.shape}")
    if int(k) != k or k < 1:
        raise QkvError(f"k must be a whole number ≥ 1, got {k}")
    ids = np.argsort(-p, kind="stable")[: int(k)]                        # (k,)
    return ids, p[ids]


def entropy(probs: np.ndarray) -> np.ndarray:
    """H(P) = −Σ_v P_v · log₂ P_v in bits (0 · log 0 = 0), over the last axis: (..., V) → (...)."""
    return ops_entropy(probs, bits=True)                                  # (...)


CANDIDATE_BLOCK = 1 << 18        # logits per block of rows in `candidates` (2 MiB of float64: in cache)


def candidates(logits: np.ndarray, chosen: Sequence[int], k: int, temperatures: Sequence[float]) -> dict:
    """For each row of logits (m, V) and the token chosen there: what a page needs to show
    softmax(z / T) for the top k tokens at any T of `temperatures`, exactly.

    The page cannot hold all V logits per token, so it gets the top k logits (plus the chosen
    token's when it is not among them), and, per temperature T > 0, the log-sum-exp of
    every other logit: rest(T) = log Σ_{v not kept} exp(z_v / T). Then for a kept token

        P_v(T) = exp(z_v / T) / (Σ_{u kept} exp(z_u / T) + exp(rest(T)))

    is the full-vocabulary probability, not a renormalisation over the top k, and
    exp(rest(T)) / (…) is the mass of the tokens not shown. Entropies (bits) come along,
    because they need every logit too. Arrays:

        ids (m, k+1)  logits (m, k+1) float32   the kept tokens, most probable first; slot k holds
                                                the chosen token when it is outside the top k, else -1 / 0
        rank (m,)     1 + how many tokens are more probable than the chosen one (any T > 0)
        rest (m, t)   entropy (m, t)            per temperature of `temperatures`
    """
    z = np.asarray(logits)                                                  # (m, V)
    chosen = np.asarray(chosen, dtype=np.int64)                             # (m,)
    temps = [float(t) for t in temperatures]
    if z.ndim != 2 or chosen.shape != (z.shape[0],):
        raise QkvError(f"candidates needs logits (m, V) and one chosen id per row, got {z.shape} and {chosen.shape}")
    if any(not np.isfinite(t) or t <= 0 for t in temps):
        raise QkvError(f"temperatures must be > 0 (T = 0, greedy, needs no data), got {temps}")
    m, V = z.shape
    k = min(int(k), V)
    ids = np.empty((m, k + 1), dtype=np.int64)
    kept_logits = np.zeros((m, k + 1))
    rank = np.empty(m, dtype=np.int64)
    rest = np.empty((m, len(temps)))
    ent = np.empty((m, len(temps)))
    # Rows a block at a time, so that the exps of every temperature stay in cache (plain form, the
    # whole (m, V) at once: x = (z - top) / T, e = exp(x), rest = log Σ_{not kept} e + top / T,
    # H = log Z − Σ P·x, one pass each); float64 throughout, an exp squared along a chain of halving
    # temperatures within 2^step·ε of its own exp.
    block = max(1, CANDIDATE_BLOCK // V)
    chains = halving_chains(temps)
    for r0 in range(0, m, block):
        zb = z[r0:r0 + block].astype(np.float64)                            # (b, V)
        b, at = len(zb), np.arange(len(zb))[:, None]
        c = chosen[r0:r0 + block]
        rank[r0:r0 + b] = 1 + (zb > zb[at[:, 0], c][:, None]).sum(axis=-1)   # (b,) ties do not count
        top = np.empty((b, k), dtype=np.int64)                               # the k largest, most probable
        w = zb.copy()                                                        # first, ties: lower id first
        for t in range(k):                                                   # (k argmaxes: faster than
            top[:, t] = best = np.argmax(w, axis=-1)                         # partitioning all V for small k)
            w[at[:, 0], best] = -np.inf
        inside = (top == c[:, None]).any(axis=-1)                           # (b,)
        ids[r0:r0 + b, :k], ids[r0:r0 + b, k] = top, np.where(inside, -1, c)
        kept = np.concatenate([top, np.where(inside, top[:, 0], c)[:, None]], axis=1)   # (b, k+1)
        kept_logits[r0:r0 + b] = np.where(ids[r0:r0 + b] < 0, 0.0, np.take_along_axis(zb, kept, axis=1))
        top_z = zb[at[:, 0], top[:, 0]][:, None]                             # (b, 1) the largest logit
        d = zb - top_z                                                       # (b, V) ≤ 0: exp never overflows
        e = np.empty_like(d)
        for chain in chains:                                                 # T, T/2, T/4, ...:
            for step, j in enumerate(chain):                                 # exp(d / (T/2)) = exp(d / T)²
                T = temps[j]
                if step == 0:
                    np.exp(np.multiply(d, 1.0 / T, out=e), out=e)            # e = exp(d / T)
                else:
                    np.square(e, out=e)                                      # (relative error 2^step · ε)
                Z = e.sum(axis=-1)                                           # (b,) ≥ 1
                ent[r0:r0 + b, j] = (np.log(Z) - np.vecdot(e, d) / T / Z) / np.log(2)   # bits
                held = e[at, kept]                                           # what is not kept:
                e[at, kept] = 0.0
                with np.errstate(divide="ignore"):                           # log 0 = -inf, nothing outside
                    rest[r0:r0 + b, j] = np.log(e.sum(axis=-1)) + top_z[:, 0] / T
                e[at, kept] = held                                           # (the chain squares it next)
    return {"ids": ids, "logits": kept_logits.astype(np.float32), "rank": rank, "rest": rest, "entropy": ent}


def halving_chains(temps: Sequence[float]) -> list[list[int]]:
    """Every index of TEMPS once, in chains T, T/2, T/4, … (at most 8 long: error ≤ 2^7 ε): one exp per chain,
    the rest squared (exp(x)² = exp(2x)), a tenth of an exp's cost. [0.1 … 2.0 by 0.1] → 10 chains."""
    index = {}
    for j, t in enumerate(temps):
        index.setdefault(round(t, 12), j)
    chains, covered = [], set()
    for j in sorted(range(len(temps)), key=lambda j: -temps[j]):          # the largest T first: chain heads
        if j in covered:
            continue
        chain = [j]
        while len(chain) < 8 and (half := index.get(round(temps[chain[-1]] / 2, 12))) is not None \
                and half not in covered and half != chain[-1]:
            chain.append(half)
        covered.update(chain)
        chains.append(chain)
    return chains


def token_text(tokenizer, token_id: int) -> str:
    """One token as a reader sees it: `Tokenizer.label` ("ĠParis" → "␣Paris", "Ċ" → "↵").

    Any other tokenizer (with decode and id_to_token): its decoded text, whitespace visible,
    or its spelling for a piece of a character (which decodes to U+FFFD).
    """
    if hasattr(tokenizer, "label"):
        return tokenizer.label(int(token_id))
    text = tokenizer.decode([int(token_id)])
    return tokenizer.id_to_token(int(token_id)) if "\ufffd" in text else visible(text)


def next_token_logits(model, ids: np.ndarray, ablate=None, how: str = "zero") -> np.ndarray:
    """logits[last] (V,) of a decoder for token ids (n,): the scores of every possible next token.
    ablate: (layer, head) pairs knocked out of the pass (see `Model.run`)."""
    cfg = model.config
    if not cfg.causal or model.weights.W_vocab is None:
        raise QkvError(f"{model.name} is an encoder ({cfg.family}): it has no next-token distribution; "
                       "use a decoder, e.g. --model smollm2" + (", or put its mask token in the text"
                                                                 if model.weights.W_vocab is not None else ""))
    ids, mask = model.check_ids(ids)                                        # (1, n)
    return model.last_logits(ids, mask, ablate=model.ablation(ablate, how))[0, -1]   # (V,) the last position only


MASK_TOKENS = ("<mask>", "[MASK]")            # RoBERTa / XLM-R's and BERT / DistilBERT / ELECTRA's spelling


def mask_position(model, ids: np.ndarray) -> int | None:
    """The position of the first mask token (MASK_TOKENS, or tokenizer_config.json's mask_token) in ids (n,);
    None when there is none or the model has no tokenizer to name it."""
    tok = model.tokenizer
    if tok is None:
        return None
    names = [tok.special_tokens.get("mask_token"), *MASK_TOKENS]
    mask_ids = [i for i in (tok.token_to_id(t) for t in names if t) if i is not None]
    at = np.flatnonzero(np.isin(np.asarray(ids).reshape(-1), mask_ids))
    return int(at[0]) if at.size else None


def masked_token_logits(model, ids: np.ndarray, ablate=None, how: str = "zero") -> tuple[np.ndarray, int]:
    """(logits (V,), position) of a masked-LM encoder at the first mask token of ids (n,): the scores of
    every token that could stand there, read through its masked-LM head. ablate: as `next_token_logits`."""
    cfg = model.config
    if cfg.causal or model.weights.W_vocab is None:
        raise QkvError(f"{model.name} has no masked-LM head ({cfg.family}); give an encoder with one "
                       "(RobertaForMaskedLM, DistilBertForMaskedLM, ELECTRA's generator)")
    ids, _ = model.check_ids(ids)                                           # (1, n)
    pos = mask_position(model, ids[0])
    if pos is None:
        tok = model.tokenizer
        shown = next((t for t in MASK_TOKENS if tok is not None and tok.token_to_id(t) is not None), "<mask>")
        raise QkvError(f"{model.name} is a masked-LM encoder: put its mask token {shown} where a word should be "
                       f'predicted, e.g. "The cat sat on the {shown}."')
    out = model.forward(ids, attentions=False, ablate=ablate, how=how)
    return out.logits[0, pos], pos                                          # (V,), its position
