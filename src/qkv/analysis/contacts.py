"""Contact maps from a protein language model's attention (Rao et al. 2020, "Transformer protein language models
are unsupervised structure learners"), exactly as transformers' `EsmModel.predict_contacts` computes them:

    A         every layer's attention weights (L, H, n, n), pads' and <eos>'s rows and columns zeroed,
              <cls> (first) and the last column dropped: (L·H, m, m) over the m residues
    F_c       = APC(A_c + A_cᵀ)                    each head's map symmetrised, then average-product corrected:
    APC(X)    = X − (X·1)(1ᵀ·X) / (1ᵀ·X·1)         the part of X that a row's and a column's totals do not explain
    P[i, j]   = σ(Σ_c w_c·F_c[i, j] + b)           a logistic regression over the L·H heads (Weights.W_contact, b)

Which single heads draw the contacts (`best_heads`): each head's F_c against the predicted map P, by Pearson's r
over the residue pairs i < j at least `separation` apart (the short and medium range Rao et al. score contacts at;
neighbours along the chain touch trivially).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.errors import QkvError

SEPARATION = 6          # residue pairs |i − j| ≥ this are scored (Rao et al.: contacts of sequence separation ≥ 6)
EOS_ID = 2              # the contact head's eos_idx (EsmContactPredictionHead's default, ESM's <eos>)


def symmetrize(x: np.ndarray) -> np.ndarray:
    """X + Xᵀ over the last two axes (…, m, m)."""
    return x + np.swapaxes(x, -1, -2)


def apc(x: np.ndarray) -> np.ndarray:
    """Average product correction (Dunn et al. 2008): X − (row sums)(column sums) / total, over the last two axes
    (…, m, m) → (…, m, m)."""
    rows = x.sum(-1, keepdims=True)                                  # (…, m, 1)
    cols = x.sum(-2, keepdims=True)                                  # (…, 1, m)
    total = x.sum((-1, -2), keepdims=True)                           # (…, 1, 1)
    return x - rows * cols / total


def contact_features(attentions: np.ndarray, ids: np.ndarray, mask: np.ndarray | None = None,
                     eos_id: int = EOS_ID) -> np.ndarray:
    """(L, B, H, n, n) attention weights of ids (B, n) → (B, L·H, n − 2, n − 2), each head's map over the residues
    symmetrised and APC-corrected: the rows and columns of pads (MASK 0) and of <eos> zeroed, the last column and
    <cls>'s dropped (transformers' EsmModel.predict_contacts and EsmContactPredictionHead, step by step)."""
    A = np.asarray(attentions, dtype=np.float64)                     # (L, B, H, n, n)
    ids = np.asarray(ids)
    if A.ndim != 5 or A.shape[1] != ids.shape[0] or A.shape[-1] != ids.shape[1] or ids.shape[1] < 3:
        raise QkvError(f"contacts need every layer's attention (L, B, H, n, n) over ids (B, n) with n ≥ 3 "
                       f"(<cls>, a residue, <eos>), not {A.shape} over {ids.shape}")
    L, B, H, n, _ = A.shape
    keep = (ids != eos_id) if mask is None else (ids != eos_id) & np.asarray(mask, dtype=bool)   # (B, n)
    A = A.transpose(1, 0, 2, 3, 4) * (keep[:, None, None, :, None] & keep[:, None, None, None, :])  # (B, L, H, n, n)
    A = A[..., 1:-1, 1:-1].reshape(B, L * H, n - 2, n - 2)          # (B, L·H, m, m) the residues
    return apc(symmetrize(A))                                        # (B, L·H, m, m)


def predict(features: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(B, L·H, m, m) features → (B, m, m) contact probabilities σ(Σ_c w_c·F_c + b) (the contact head's
    regression, W (L·H,), b (1,))."""
    z = np.einsum("bcij,c->bij", features, np.asarray(W, dtype=np.float64)) + float(np.asarray(b).reshape(-1)[0])
    return 1.0 / (1.0 + np.exp(-z))                                  # (B, m, m)


def pairs(m: int, separation: int = SEPARATION) -> tuple[np.ndarray, np.ndarray]:
    """The residue pairs (i, j), i < j, j − i ≥ SEPARATION, of an m-residue map (all i < j when none is that far)."""
    i, j = np.triu_indices(m, k=max(1, separation))
    return (i, j) if len(i) else np.triu_indices(m, k=1)


def head_scores(features: np.ndarray, predicted: np.ndarray, separation: int = SEPARATION) -> np.ndarray:
    """(L·H, m, m) one sequence's head maps, (m, m) its predicted map → (L·H,) each head's Pearson r with the
    prediction over `pairs` (0 for a head constant there)."""
    i, j = pairs(predicted.shape[-1], separation)
    if len(i) < 2:                                                   # one residue, or two: no r to speak of
        return np.zeros(len(features))
    x = features[:, i, j]                                            # (L·H, p)
    y = predicted[i, j]                                              # (p,)
    x = x - x.mean(-1, keepdims=True)
    y = y - y.mean()
    norm = np.sqrt((x * x).sum(-1) * (y * y).sum())                  # (L·H,)
    return np.where(norm > 0, (x @ y) / np.where(norm > 0, norm, 1.0), 0.0)


@dataclass
class ContactMap:
    """One protein's contacts as the model predicts them, and the heads that draw them."""

    residues: list[str]                  # the m residues, in order (the tokens between <cls> and <eos>)
    predicted: np.ndarray                # (m, m) P[i, j], the contact head's probability, symmetric
    features: np.ndarray                 # (L, H, m, m) each head's symmetrised, APC-corrected map
    scores: np.ndarray                   # (L, H) each head's Pearson r with `predicted` over the scored pairs
    separation: int                      # the pairs scored: |i − j| ≥ this

    def best_heads(self, k: int = 3) -> list[tuple[int, int, float]]:
        """The K heads whose map best matches the prediction: (layer, head, r), best first."""
        H = self.scores.shape[1]
        order = np.argsort(-self.scores, axis=None, kind="stable")[:k]
        return [(int(c // H), int(c % H), float(self.scores.flat[c])) for c in order]

    def top_contacts(self, k: int = 5) -> list[tuple[int, int, float]]:
        """The K residue pairs (i, j), i < j at least `separation` apart, the model is surest of: (i, j, P)."""
        i, j = pairs(len(self.residues), self.separation)
        p = self.predicted[i, j]
        order = np.argsort(-p, kind="stable")[:k]
        return [(int(i[c]), int(j[c]), float(p[c])) for c in order]


def contacts(model, sequence: str, separation: int = SEPARATION) -> ContactMap:
    """SEQUENCE (one-letter amino acids) through MODEL (an ESM checkpoint: its contact head) → its ContactMap."""
    _check_head(model)
    ids, tokens = model.encode(sequence)
    if len(ids) < 3:
        raise QkvError("the sequence gives no residue between <cls> and <eos>; give a protein's sequence")
    return contact_map(model, ids, tokens, model.forward(ids[None]).attentions[:, 0], separation)


def _check_head(model) -> None:
    """One error for a model without a contact head."""
    if getattr(model.weights, "W_contact", None) is None:
        raise QkvError(f"{model.name} has no contact head (contact_head.regression); contacts need an ESM "
                       "checkpoint (model_type esm)")


def contact_map(model, ids, tokens: list[str], attentions: np.ndarray, separation: int = SEPARATION) -> ContactMap:
    """The ContactMap of one sequence's IDS (n,) (TOKENS: their spelling, <cls> … <eos>) from every layer's
    attention weights ATTENTIONS (L, H, n, n) through MODEL (its contact head): what `contacts` computes after its
    pass, and the viewer's Contacts panel from a trace that kept every layer (`analysis.sections`)."""
    _check_head(model)
    w, ids, A = model.weights, np.asarray(ids), np.asarray(attentions)                # A: (L, H, n, n)
    if A.shape[0] * A.shape[1] != len(np.asarray(w.W_contact).reshape(-1)):
        raise QkvError(f"the contact head reads every layer's heads ({len(np.asarray(w.W_contact).reshape(-1))}); "
                       f"got attention of {A.shape[0]} layers × {A.shape[1]} heads: keep every layer")
    features = contact_features(A[:, None], ids[None])              # (1, L·H, m, m)
    predicted = predict(features, w.W_contact, w.b_contact)[0]       # (m, m)
    L, H = A.shape[:2]
    scores = head_scores(features[0], predicted, separation)         # (L·H,)
    m = len(ids) - 2
    return ContactMap(residues=list(tokens[1:-1]), predicted=predicted,
                      features=features[0].reshape(L, H, m, m), scores=scores.reshape(L, H), separation=separation)
