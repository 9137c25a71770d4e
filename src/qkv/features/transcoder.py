"""A transcoder's loss and its gradients, by hand: the SAE box of qkv.features.sae reading what the FFN reads
and predicting what the FFN writes (Dunefsky et al. 2024, "Transcoders find interpretable LLM feature circuits").

    x = ffn_in (B, d_in) ─·W_enc + b_enc─▶ pre (B, d_sae) ─TopK or JumpReLU─▶ z
      ─·W_dec + b_dec (+ x·W_skip)─▶ ŷ (B, d_out)
    y = ffn_out (B, d_out), the target: what the FFN really wrote

TopK (`topk_loss_and_grads`), the SAE's loss with the FFN's output as its target:
    L = (Σ‖y − ŷ‖² + α·Σ‖e − ê‖²) / (B·v_y)       v_y = Σ_i Var(y_i) per token: the first term is the batch's FVU
    AuxK as the SAE's: e = y − ŷ (constant), ê = z_aux·W_dec from the k_aux largest pre-activations of the dead
    latents (ReLU'd), no bias.

JumpReLU (`jumprelu_loss_and_grads`; Rajamanoharan et al. 2024, "Jumping Ahead"):
    z = pre ⊙ H(pre − θ)                           θ (d_sae,) a threshold per latent, H the step
    L = Σ‖y − ŷ‖² / (B·v_y) + λ·(1/B)·Σ_b Σ_j H(pre_bj − θ_j)       = FVU + λ·L0
    H has no derivative, so the paper's straight-through estimators (a rectangle kernel density estimate of the
    expected gradient, bandwidth ε, K(u) = 1 when −½ < u < ½):
        ð z_bj / ð pre_bj = H(pre_bj − θ_j)                  (the jump gives pre no gradient)
        ð z_bj / ð θ_j    = −(θ_j/ε)·K((pre_bj − θ_j)/ε)
        ð H(pre_bj − θ_j) / ð θ_j = −(1/ε)·K((pre_bj − θ_j)/ε)
    The gradient returned is ∂L/∂θ; the trainer keeps log θ as its parameter (the paper's): ∂L/∂log θ = θ·∂L/∂θ.

The fast TopK path: the encoder's product x·W_enc (B × d_in × d_sae) is the one dense product; everything after
it touches only the k latents each row keeps (found by a numba kernel without sorting every row, z a scipy sparse
matrix: ŷ, ∂W_dec, ∂W_enc are sparse × dense products, ∂z is taken at the kept latents only by another kernel:
transcoder_kernels.py), and AuxK works on the dead latents' columns only. Measured on SmolLM2's size (4096 rows,
576 → 4608, k 32): ~0.3 s a layer's step on 2 cores, two thirds of it the encoder's product. Plain forms are in
the comments; tests check the result against torch autograd.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.errors import QkvError
from .sae import AUX_COEF, SAEConfig
from .transcoder_kernels import rows_dot, top_k_rows


@dataclass
class TranscoderStep:
    """One forward and backward: the loss, its parts, the gradients, which latents fired."""

    loss: float
    fvu: float                     # Σ‖y − ŷ‖² / (B·v_y)
    aux: float                     # TopK: the AuxK term; JumpReLU: λ·L0
    grads: dict[str, np.ndarray]   # the params' names (JumpReLU: "threshold" is ∂L/∂θ)
    fired: np.ndarray              # (d_sae,) bool: latents non-zero in some row
    l0: float                      # mean non-zero latents per row


# ── the sparse pieces ───────────────────────────────────────────────────────────

def _csr(values: np.ndarray, idx: np.ndarray, n: int):
    """A (B, n) scipy CSR matrix with VALUES (B, k) at columns IDX (B, k): row b's k entries (scipy comes with
    scikit-learn, a dependency; its sparse × dense products are single loops over the B·k entries)."""
    from scipy.sparse import csr_matrix

    B, k = idx.shape
    return csr_matrix((values.ravel(), idx.ravel(), np.arange(0, B * k + 1, k)), shape=(B, n))


# ── TopK ────────────────────────────────────────────────────────────────────────

def check_pair(cfg: SAEConfig, x: np.ndarray, y: np.ndarray) -> None:
    if x.ndim != 2 or y.ndim != 2 or x.shape != (len(y), cfg.d_in) or y.shape[1] != cfg.width_out:
        raise QkvError(f"a transcoder of widths {cfg.d_in} → {cfg.width_out} takes x (B, {cfg.d_in}) and "
                       f"y (B, {cfg.width_out}), got {x.shape} and {y.shape}")


def topk_loss_and_grads(params: dict[str, np.ndarray], cfg: SAEConfig, x: np.ndarray, y: np.ndarray, *,
                        variance: float = 1.0, dead: np.ndarray | None = None, k_aux: int | None = None,
                        aux_coef: float = AUX_COEF) -> TranscoderStep:
    """L = (Σ‖y − ŷ‖² + α·Σ‖e − ê‖²) / (B·v_y) (the module docstring) and its gradients, by hand.

    Backward, c = 1/(B·v_y), M = [j kept and pre > 0]:
        dŷ = −2c·(y − ŷ)                   dê = −2cα·(e − ê)
        dW_dec = zᵀ·dŷ + z_auxᵀ·dê        db_dec = Σ_rows dŷ          dW_skip = xᵀ·dŷ
        dpre = M ⊙ (dŷ·W_decᵀ) + M_aux ⊙ (dê·W_decᵀ)
        db_enc = Σ_rows dpre               dW_enc = xᵀ·dpre
    """
    if cfg.architecture != "topk":
        raise QkvError(f"topk_loss_and_grads trains TopK transcoders, not {cfg.architecture}")
    check_pair(cfg, x, y)
    W_enc, b_enc, W_dec, b_dec = (params[n] for n in ("W_enc", "b_enc", "W_dec", "b_dec"))
    B, n = x.shape[0], cfg.d_sae
    c = 1.0 / (B * variance)
    pre = x @ W_enc                                                       # (B, n): the one dense product
    pre += b_enc
    idx, vals = top_k_rows(pre, cfg.k)                                    # (B, k) each; plain: sae.topk
    a = np.maximum(vals, 0)                                               # (B, k) z at the kept latents
    z = _csr(a, idx, n)                                                   # (B, n) sparse
    y_hat = np.asarray(z @ W_dec) + b_dec                                 # (B, d_out); plain: z_dense @ W_dec
    if "W_skip" in params:
        y_hat += x @ params["W_skip"]
    r = y - y_hat                                                         # (B, d_out)
    fvu = c * float(np.sum(r * r, dtype=np.float64))
    dy_hat = (-2 * c) * r                                                 # (B, d_out)
    dz = rows_dot(W_dec, idx, dy_hat)                                     # (B, k): (dŷ·W_decᵀ) at the kept
    dpre = np.where(a > 0, dz, 0).astype(pre.dtype, copy=False)           # (B, k)
    dW_dec = np.asarray(z.T @ dy_hat)                                      # (n, d_out)
    dW_enc = np.ascontiguousarray(np.asarray(_csr(dpre, idx, n).T @ x).T)  # (d_in, n); plain: x.T @ dpre_dense
    db_enc = np.bincount(idx.ravel(), weights=dpre.ravel(), minlength=n)   # (n,)
    aux = 0.0
    dead_at = np.flatnonzero(dead) if dead is not None and aux_coef else np.zeros(0, np.int64)
    if len(dead_at):
        ka = min(k_aux or max(1, cfg.d_in // 2), len(dead_at))
        pre_d = pre[:, dead_at]                                           # (B, n_dead)
        idx_d = top_k_rows(pre_d, ka)[0]                                  # (B, ka)
        z_aux = np.zeros_like(pre_d)                                      # (B, n_dead)
        np.put_along_axis(z_aux, idx_d, np.maximum(np.take_along_axis(pre_d, idx_d, axis=1), 0), axis=1)
        W_d = W_dec[dead_at]                                              # (n_dead, d_out)
        q = r - z_aux @ W_d                                               # (B, d_out): e − ê
        aux = c * aux_coef * float(np.sum(q * q, dtype=np.float64))
        de_hat = (-2 * c * aux_coef) * q                                  # (B, d_out)
        dpre_d = np.where(z_aux > 0, de_hat @ W_d.T, 0).astype(pre.dtype, copy=False)   # (B, n_dead)
        dW_dec[dead_at] += z_aux.T @ de_hat
        dW_enc[:, dead_at] += x.T @ dpre_d
        db_enc[dead_at] += dpre_d.sum(axis=0)
    grads = {"W_enc": dW_enc, "b_enc": db_enc, "W_dec": dW_dec, "b_dec": dy_hat.sum(axis=0)}
    if "W_skip" in params:
        grads["W_skip"] = x.T @ dy_hat                                    # (d_in, d_out)
    grads = {k: np.asarray(v).astype(params[k].dtype, copy=False) for k, v in grads.items()}
    on = a > 0                                                            # (B, k)
    fired = np.zeros(n, bool)
    fired[idx[on]] = True
    return TranscoderStep(fvu + aux, fvu, aux, grads, fired, float(on.sum()) / B)


# ── JumpReLU ───────────────────────────────────────────────────────────────────

def rectangle(u: np.ndarray) -> np.ndarray:
    """K(u) = 1 when −½ < u < ½, else 0: the paper's kernel."""
    return ((u > -0.5) & (u < 0.5)).astype(u.dtype)


def jumprelu_loss_and_grads(params: dict[str, np.ndarray], cfg: SAEConfig, x: np.ndarray, y: np.ndarray, *,
                            variance: float = 1.0, l0_coef: float = 1e-3, bandwidth: float = 1e-3) -> TranscoderStep:
    """L = FVU + λ·L0 (the module docstring) and its gradients with the straight-through estimators, θ =
    params["threshold"]; ε = BANDWIDTH in the pre-activations' units.

    Backward, c = 1/(B·v_y), A = H(pre − θ), K = K((pre − θ)/ε):
        dŷ = −2c·(y − ŷ)        dz = dŷ·W_decᵀ        dpre = A ⊙ dz
        dθ = Σ_rows (dz ⊙ (−θ/ε) ⊙ K) + (λ/B)·Σ_rows (−1/ε)·K
        dW_dec = zᵀ·dŷ   db_dec = Σ_rows dŷ   dW_enc = xᵀ·dpre   db_enc = Σ_rows dpre   dW_skip = xᵀ·dŷ
    """
    if cfg.architecture != "jumprelu":
        raise QkvError(f"jumprelu_loss_and_grads trains JumpReLU transcoders, not {cfg.architecture}")
    check_pair(cfg, x, y)
    W_enc, b_enc, W_dec, b_dec, theta = (params[n] for n in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"))
    B = x.shape[0]
    c = 1.0 / (B * variance)
    pre = x @ W_enc + b_enc                                               # (B, n)
    active = pre > theta                                                  # (B, n) H(pre − θ)
    z = np.where(active, pre, 0).astype(pre.dtype, copy=False)            # (B, n)
    y_hat = z @ W_dec + b_dec                                             # (B, d_out)
    if "W_skip" in params:
        y_hat += x @ params["W_skip"]
    r = y - y_hat
    fvu = c * float(np.sum(r * r, dtype=np.float64))
    l0 = float(active.sum()) / B
    dy_hat = (-2 * c) * r                                                 # (B, d_out)
    dz = dy_hat @ W_dec.T                                                 # (B, n)
    kern = rectangle((pre - theta) / bandwidth)                           # (B, n)
    dtheta = (-theta / bandwidth) * np.einsum("bn,bn->n", dz, kern) - (l0_coef / (B * bandwidth)) * kern.sum(axis=0)
    dpre = np.where(active, dz, 0).astype(pre.dtype, copy=False)          # (B, n)
    grads = {"W_enc": x.T @ dpre, "b_enc": dpre.sum(axis=0), "W_dec": z.T @ dy_hat, "b_dec": dy_hat.sum(axis=0),
             "threshold": dtheta}
    if "W_skip" in params:
        grads["W_skip"] = x.T @ dy_hat
    grads = {k: np.asarray(v).astype(params[k].dtype, copy=False) for k, v in grads.items()}
    sparsity = l0_coef * l0
    return TranscoderStep(fvu + sparsity, fvu, sparsity, grads, active.any(axis=0), l0)
