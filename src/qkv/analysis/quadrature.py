"""Integrated gradients' integral over the path b + α(e − b), α from 0 to 1: Gauss–Legendre nodes (Captum's
rule), and an adaptive composite of them (`refined`) for paths with a sharp part.

Where a token's stream starts at zero (IG's zero baseline on a model that adds no positions: RoPE, ALiBi),
its norms' inputs are below their ε near α = 0; z(α) and each token's ∂z/∂e turn there within
α ≈ 10⁻⁵–10⁻² (attention moving between tokens), below or between the smallest of 64 nodes on [0, 1]
(3·10⁻⁴). The gradient is right there (torch autograd agrees); a fixed rule misses it. `refined` halves
panels until two checks pass: each token's coarse sum against its finer one, and Σ over tokens against z's
own change across the panel (the fundamental theorem of calculus, exact).

`gradient(points (b, n, d))` → (∂z/∂points, z (b,)) and `value(points)` → z (b,) are the model's passes
(qkv.analysis.input_attribution); points are float32 rows of token embeddings, in batches of PER.
"""

from __future__ import annotations

import numpy as np

REFINE_NODES = 1024          # the most gradient nodes a refinement evaluates
PANELS = 8                   # a refinement's first panels, equal parts of [0, 1]
PANEL_NODES = 4              # Gauss–Legendre nodes on each half of a panel


def ig_nodes(steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(α, weights) of STEPS-node Gauss–Legendre on [0, 1], Captum's "gausslegendre"."""
    x, w = np.polynomial.legendre.leggauss(steps)
    return (x + 1) / 2, w / 2


def node_scores(alphas: np.ndarray, rows: np.ndarray, start: np.ndarray, per: int, gradient) -> np.ndarray:
    """(K, n) float64: (e − b)_i · ∂z/∂e_i at the point b + α_k (e − b) of the path, for each of the K nodes
    α_k, in batches of PER; IG's scores are Σ_k w_k of them."""
    step = (rows - start)[0].astype(np.float64)                              # (n, d) e − b
    parts = []
    for a0 in range(0, len(alphas), per):
        a = alphas[a0:a0 + per].astype(np.float32)[:, None, None]            # (b, 1, 1)
        g, _ = gradient(start + a * (rows - start))                         # (b, n, d)
        parts.append(np.einsum("bnd,nd->bn", g.astype(np.float64), step))
    return np.concatenate(parts)                                             # (K, n)


def path_values(alphas: np.ndarray, rows: np.ndarray, start: np.ndarray, per: int, value) -> np.ndarray:
    """z (K,) float64 at the points b + α_k (e − b), in batches of PER."""
    parts = []
    for a0 in range(0, len(alphas), per):
        a = alphas[a0:a0 + per].astype(np.float32)[:, None, None]            # (b, 1, 1)
        parts.append(np.asarray(value(start + a * (rows - start)), np.float64))
    return np.concatenate(parts)                                             # (K,)


def refined(rows: np.ndarray, start: np.ndarray, per: int, gradient, value, z_start: float, z_end: float,
             goal: float) -> tuple[np.ndarray, int]:
    """IG's scores (n,) by adaptive composite Gauss–Legendre, and the nodes they sum. [0, 1] starts as PANELS
    equal panels; each panel [α, β] is summed by PANEL_NODES nodes on each of its halves, and what it may
    miss is the larger of two checks:

        each token's    |its m-node sum on [α, β] − its halves' sums|    (the coarser sum's error: far
                                                                         above the finer one's, which is kept)
        all tokens'     |Σ_i of the halves' sums − (z(β) − z(α))|        (the fundamental theorem of calculus:
                                                                         exact, a forward pass at each end)

    The first sees an attention weight moving from one token to another (their parts cancel in the sum),
    the second a sharp turn the nodes step over. Round by round, every panel at least half as far off as
    the worst is replaced by its halves (their own halves summed), until the panels' misses add up to at
    most GOAL or REFINE_NODES gradient nodes are evaluated. Bisection finds the sharp part wherever it is;
    near α = 0 (the zero baseline, where the norms' inputs are below their ε) the panels shrink one halving
    a round."""
    x, w = ig_nodes(PANEL_NODES)                                             # (m,) on [0, 1]
    evaluated = 0

    def sums(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """(P, n) each panel's m-node sum of (e − b)·∂z/∂e over [lo, hi] (P,)."""
        nonlocal evaluated
        alphas = (lo[:, None] + (hi - lo)[:, None] * x).ravel()              # (P·m,)
        evaluated += len(alphas)
        c = node_scores(alphas, rows, start, per, gradient).reshape(len(lo), len(x), -1)   # (P, m, n)
        return (hi - lo)[:, None] * np.einsum("m,pmn->pn", w, c)

    def halved(lo, hi, coarse, z_lo, z_hi) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Panels [lo, hi] (P,) whose m-node sums are COARSE (P, n), z at their ends z_lo, z_hi (P,): their
        left and right halves' sums (P, n) each, and what each panel may miss (P,)."""
        mid = (lo + hi) / 2
        left, right = np.split(sums(np.concatenate([lo, mid]), np.concatenate([mid, hi])), 2)
        fine = left + right                                                  # (P, n)
        miss = np.maximum(np.abs(coarse - fine).max(axis=1), np.abs(fine.sum(axis=1) - (z_hi - z_lo)))
        return left, right, miss

    ends = np.linspace(0.0, 1.0, PANELS + 1)                                 # (P + 1,)
    z = np.concatenate([[z_start], path_values(ends[1:-1], rows, start, per, value), [z_end]])
    lo, hi, z_lo, z_hi = ends[:-1], ends[1:], z[:-1], z[1:]                  # (P,) each: the panels [lo, hi]
    left, right, miss = halved(lo, hi, sums(lo, hi), z_lo, z_hi)
    while True:
        room = (REFINE_NODES - evaluated) // (4 * PANEL_NODES)               # panels that can still be halved
        if miss.sum() <= goal or room <= 0:
            return (left + right).sum(axis=0), 2 * PANEL_NODES * len(lo)
        worst = np.argsort(-miss)[:room]
        split = worst[miss[worst] >= miss[worst[0]] / 2]                     # (S,) the panels to halve
        keep = np.setdiff1d(np.arange(len(lo)), split)
        mid = (lo[split] + hi[split]) / 2                                    # (S,)
        z_mid = path_values(mid, rows, start, per, value)                   # (S,)
        new = (np.concatenate([lo[split], mid]), np.concatenate([mid, hi[split]]),      # (2S,) the halves
               np.concatenate([left[split], right[split]]),                 # (2S, n) their sums: now coarse
               np.concatenate([z_lo[split], z_mid]), np.concatenate([z_mid, z_hi[split]]))
        new_left, new_right, new_miss = halved(*new)
        lo, hi = np.concatenate([lo[keep], new[0]]), np.concatenate([hi[keep], new[1]])
        z_lo, z_hi = np.concatenate([z_lo[keep], new[3]]), np.concatenate([z_hi[keep], new[4]])
        left, right = np.concatenate([left[keep], new_left]), np.concatenate([right[keep], new_right])
        miss = np.concatenate([miss[keep], new_miss])
