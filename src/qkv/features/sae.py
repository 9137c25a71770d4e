"""A TopK sparse autoencoder (Gao et al. 2024, "Scaling and evaluating sparse autoencoders"), forward and
backward by hand.

    x (B, d_in) ─(− b_dec)─▶ s ─·W_enc + b_enc─▶ pre (B, d_sae) ─TopK, ReLU─▶ z ─·W_dec + b_dec─▶ x̂ (B, d_in)

Rows are vectors, as everywhere in qkv (Q = X·W_Q) and as in SAELens: W_enc is (d_in, d_sae), W_dec is
(d_sae, d_in), and latent j's decoder direction is ROW j of W_dec (the paper writes column vectors,
z = TopK(W_enc(x − b_pre) + b_enc), x̂ = W_dec·z + b_pre, so its "columns of W_dec" are our rows).

    TopK:   keep the k largest entries of pre in each row (exactly k indices), then ReLU them; the rest 0.
            So z has at most k non-zeros, all > 0. This is SAELens's TopK (torch.topk, then relu on the
            kept values) and OpenAI's (relu(topk(...))).
    loss:   L = (Σ‖x − x̂‖² + α·Σ‖e − ê‖²) / (B·v)
            v = the data's variance Σ_i Var(x_i) (per token, from a sample): the first term is the batch's
            fraction of variance unexplained, so one learning rate fits activations of any scale.
    AuxK:   e = x − x̂ (a constant: no gradient through it); the k_aux largest pre-activations among the
            DEAD latents (ReLU'd, as the main TopK) reconstruct it without bias: ê = z_aux·W_dec.
            α = 1/32 and k_aux = d_in/2 (the paper's Appendix B.1); k_aux ≤ the number of dead latents.

Other activations, for dictionaries trained elsewhere (SAELens, Gemma Scope, sparsify, circuit-tracer) and transcoders:

    "jumprelu"  z = pre ⊙ [pre > θ], θ (d_sae,) a per-latent threshold (Rajamanoharan et al. 2024; Gemma Scope)
    "relu"      z = ReLU(pre) (the standard SAE)

A transcoder is the same box reading one point and writing another (Dunefsky et al. 2024): it reads what the FFN
reads and predicts what the FFN writes, so d_out (the output's width) may differ from d_in, b_dec lives in the
output's space (never subtracted from the input) and an optional W_skip (d_in, d_out) adds x·W_skip to x̂ (a "skip
transcoder"). An SAE is a transcoder whose output is its input (d_out = d_in, site_out = site).

The decoder's rows stay unit-norm (as OpenAI's code does): before each optimiser step the gradient's
component along each row is removed (`project_decoder_grad`), after it each row is divided by its norm
(`normalize_decoder`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..runtime.errors import QkvError

NAMES = ("W_enc", "b_enc", "W_dec", "b_dec")     # SAELens's names, shapes below
OPTIONAL = ("threshold", "W_skip")               # JumpReLU's θ (d_sae,); a skip transcoder's (d_in, d_out)
ARCHITECTURES = ("topk", "jumprelu", "relu")
AUX_COEF = 1 / 32                                 # α, the paper's
MAX_D_IN = 1 << 17                                # widths: the widest LLM streams are ~2^14
MAX_LATENTS = 1 << 27                             # d_sae: OpenAI's largest SAE had 2^24; memory is checked too


@dataclass
class SAEConfig:
    """Every knob of an SAE or a transcoder, and where its inputs come from (the rest is metadata)."""

    d_in: int                                    # the activations' width (576 for SmolLM2's residual stream)
    d_sae: int                                   # latents
    k: int | None = None                         # latents kept per token (TopK; None for the others)
    apply_b_dec_to_input: bool = True            # s = x − b_dec (SAELens's knob; False: s = x; a transcoder: False)
    model: str | None = None                     # what the activations are of (metadata)
    layer: int | None = None
    site: str | None = None                      # "resid" (entering block `layer`), "attn_out", "ffn_out", "ffn_in"
    architecture: str = "topk"                   # one of ARCHITECTURES: how pre-activations become latents
    d_out: int | None = None                     # a transcoder's output width (None: an SAE, d_out = d_in)
    site_out: str | None = None                  # what a transcoder writes ("ffn_out"); None: an SAE, `site`

    def check(self) -> "SAEConfig":
        if self.architecture not in ARCHITECTURES:
            raise QkvError(f"unknown architecture {self.architecture!r}; give one of {', '.join(ARCHITECTURES)}")
        if self.architecture == "topk" and self.k is None:
            raise QkvError("a TopK dictionary needs k, the latents kept per token; give k, e.g. 32")
        for name, most in (("d_in", MAX_D_IN), ("d_sae", MAX_LATENTS), ("k", MAX_LATENTS), ("d_out", MAX_D_IN)):
            value = getattr(self, name)
            if value is None and name in ("k", "d_out"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= most:
                raise QkvError(f"{name} must be a whole number from 1 to {most:,}, got {value!r}")
        if self.k is not None and self.k > self.d_sae:
            raise QkvError(f"k ({self.k}) is more than the latents ({self.d_sae}); give k ≤ latents, e.g. 32")
        if self.transcoder and self.apply_b_dec_to_input:
            raise QkvError("a transcoder's b_dec is in its output's space, so it is never subtracted from the input; "
                           "give apply_b_dec_to_input false")
        return self

    @property
    def transcoder(self) -> bool:
        """True for a transcoder (it writes another point than it reads), False for an SAE."""
        return self.d_out is not None or self.site_out is not None

    @property
    def width_out(self) -> int:
        """What x̂ is as wide as: d_out for a transcoder, d_in for an SAE."""
        return self.d_in if self.d_out is None else self.d_out

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The required arrays' shapes (threshold for JumpReLU; W_skip is optional, `optional_shapes`)."""
        d, n, o = self.d_in, self.d_sae, self.width_out
        shapes = {"W_enc": (d, n), "b_enc": (n,), "W_dec": (n, o), "b_dec": (o,)}
        if self.architecture == "jumprelu":
            shapes["threshold"] = (n,)
        return shapes

    def optional_shapes(self) -> dict[str, tuple[int, ...]]:
        """Arrays a dictionary may have besides `shapes`: a skip transcoder's W_skip (d_in, d_out)."""
        return {"W_skip": (self.d_in, self.width_out)} if self.transcoder else {}


@dataclass
class SAE:
    """A config and its four arrays (name → float array of `config.shapes()`)."""

    config: SAEConfig
    params: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self):
        self.config.check()
        shapes = self.config.shapes()
        optional = self.config.optional_shapes()
        if not set(shapes) <= set(self.params) <= set(shapes) | set(optional):
            raise QkvError(f"a {self.config.architecture} {'transcoder' if self.config.transcoder else 'SAE'} needs "
                           f"exactly {', '.join(shapes)}{' (and optionally W_skip)' if optional else ''}, got "
                           f"{', '.join(sorted(self.params))}")
        shapes.update({name: shape for name, shape in optional.items() if name in self.params})
        for name, shape in shapes.items():
            if self.params[name].shape != shape:
                raise QkvError(f"{name} is {self.params[name].shape}, the config implies {shape}; "
                               "the weights and the config disagree")

    def __getattr__(self, name: str) -> np.ndarray:
        if name in NAMES or (name in OPTIONAL and name in self.__dict__.get("params", {})):
            return self.params[name]
        raise AttributeError(name)

    def encode(self, x: np.ndarray) -> np.ndarray:
        """x (B, d_in) → z (B, d_sae): TopK at most k non-zeros per row; JumpReLU the pre-activations above
        their thresholds; ReLU the positive ones."""
        return activate(pre_acts(self.params, self.config, x), self.config, self.params.get("threshold"))

    def decode(self, z: np.ndarray, x: np.ndarray | None = None) -> np.ndarray:
        """z (B, d_sae) → x̂ = z·W_dec + b_dec (B, d_out), plus x·W_skip for a skip transcoder (x its input)."""
        out = z @ self.params["W_dec"] + self.params["b_dec"]
        if "W_skip" in self.params:
            if x is None:
                raise QkvError("a skip transcoder's output needs its input too: give decode(z, x)")
            out = out + x @ self.params["W_skip"]
        return out

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x (B, d_in) → (x̂ (B, d_out), z (B, d_sae))."""
        z = self.encode(x)
        return self.decode(z, x), z

    def copy(self) -> "SAE":
        return SAE(SAEConfig(**vars(self.config)), {k: v.copy() for k, v in self.params.items()})


# ── forward ──────────────────────────────────────────────────────────────────────

def pre_acts(params: dict[str, np.ndarray], cfg: SAEConfig, x: np.ndarray) -> np.ndarray:
    """pre = (x − b_dec)·W_enc + b_enc (B, d_sae); without apply_b_dec_to_input, x·W_enc + b_enc."""
    s = x - params["b_dec"] if cfg.apply_b_dec_to_input else x           # (B, d_in)
    return s @ params["W_enc"] + params["b_enc"]                          # (B, d_sae)


def activate(pre: np.ndarray, cfg: SAEConfig, threshold: np.ndarray | None = None) -> np.ndarray:
    """pre (B, d_sae) → z (B, d_sae) by cfg.architecture: ReLU(TopK(pre)); pre ⊙ [pre > θ] (JumpReLU, θ
    THRESHOLD (d_sae,)); ReLU(pre)."""
    if cfg.architecture == "topk":
        return topk(pre, cfg.k)[0]
    if cfg.architecture == "jumprelu":
        return np.where(pre > threshold, pre, 0).astype(pre.dtype, copy=False)
    return np.maximum(pre, 0)


def topk(pre: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """z = ReLU(TopK(pre)) (B, d_sae) and the kept indices (B, k): each row's k largest entries of pre
    (among the ALLOWED latents (d_sae,) bool, if given; k ≤ their number), ReLU'd, the rest 0."""
    cand = pre if allowed is None else np.where(allowed, pre, -np.inf)   # (B, d_sae)
    idx = np.argpartition(cand, -k, axis=-1)[:, -k:]                     # (B, k), in no order
    vals = np.take_along_axis(pre, idx, axis=-1)                          # (B, k)
    z = np.zeros_like(pre)                                                # (B, d_sae)
    np.put_along_axis(z, idx, np.maximum(vals, 0), axis=-1)
    return z, idx


# ── loss and its backward ────────────────────────────────────────────────────────

@dataclass
class Step:
    """What one forward and backward of the loss gives: the loss, its two parts, the gradients, and
    which latents fired (for the dead-latent counts)."""

    loss: float
    mse: float                      # Σ‖x − x̂‖² / (B·v): the batch's FVU when v is the data's variance
    aux: float                      # α·Σ‖e − ê‖² / (B·v) (0 with no dead latents)
    grads: dict[str, np.ndarray]
    fired: np.ndarray               # (d_sae,) bool: latents with a non-zero z in some row
    l0: float                       # mean non-zeros of z per row


def loss_and_grads(params: dict[str, np.ndarray], cfg: SAEConfig, x: np.ndarray, *, variance: float = 1.0,
                   dead: np.ndarray | None = None, k_aux: int | None = None,
                   aux_coef: float = AUX_COEF) -> Step:
    """L = (Σ‖x − x̂‖² + α·Σ‖e − ê‖²) / (B·v) (the module docstring) and ∂L/∂(W_enc, b_enc, W_dec, b_dec),
    by hand. dead (d_sae,) bool: the latents the AuxK term may use (None or none dead: no AuxK term).

    Backward, c = 1/(B·v), a = 1 if apply_b_dec_to_input else 0, M = [j kept and pre > 0]:
        dx̂ = −2c·(x − x̂)                 dê = −2cα·(e − ê)
        dW_dec = zᵀ·dx̂ + z_auxᵀ·dê       db_dec = Σ_rows dx̂ − a·W_enc·db_enc
        dpre = M ⊙ (dx̂·W_decᵀ) + M_aux ⊙ (dê·W_decᵀ)
        db_enc = Σ_rows dpre               dW_enc = sᵀ·dpre
    (s = x − a·b_dec; the last term of db_dec is −a·Σ_rows(dpre·W_encᵀ), summed before the product.)
    """
    if cfg.architecture != "topk" or cfg.transcoder:
        raise QkvError(f"this loss trains TopK SAEs; a {cfg.architecture} "
                       f"{'transcoder' if cfg.transcoder else 'SAE'} is trained by its own")
    W_enc, b_enc, W_dec, b_dec = (params[n] for n in NAMES)
    B = x.shape[0]
    c = 1.0 / (B * variance)
    a = 1.0 if cfg.apply_b_dec_to_input else 0.0
    s = x - a * b_dec                                                     # (B, d_in)
    pre = s @ W_enc + b_enc                                               # (B, d_sae)
    z, _ = topk(pre, cfg.k)                                               # (B, d_sae)
    x_hat = z @ W_dec + b_dec                                             # (B, d_in)
    r = x - x_hat                                                         # (B, d_in)
    mse = c * float(np.sum(r * r, dtype=np.float64))
    dx_hat = (-2 * c) * r                                                 # (B, d_in)
    dz = dx_hat @ W_dec.T                                                 # (B, d_sae)
    dpre = np.where(z > 0, dz, 0)                                         # (B, d_sae)
    dW_dec = z.T @ dx_hat                                                 # (d_sae, d_in)
    aux = 0.0
    n_dead = 0 if dead is None else int(dead.sum())
    if n_dead and aux_coef:
        ka = min(k_aux or max(1, cfg.d_in // 2), n_dead)
        z_aux, _ = topk(pre, ka, allowed=dead)                            # (B, d_sae)
        e_hat = z_aux @ W_dec                                             # (B, d_in)
        q = r - e_hat                                                     # (B, d_in): e − ê
        aux = c * aux_coef * float(np.sum(q * q, dtype=np.float64))
        de_hat = (-2 * c * aux_coef) * q                                  # (B, d_in)
        dpre += np.where(z_aux > 0, de_hat @ W_dec.T, 0)                  # (B, d_sae)
        dW_dec += z_aux.T @ de_hat
    db_enc = dpre.sum(axis=0)                                             # (d_sae,)
    dW_enc = s.T @ dpre                                                   # (d_in, d_sae)
    db_dec = dx_hat.sum(axis=0) - a * (W_enc @ db_enc)                    # (d_in,)
    grads = {"W_enc": dW_enc, "b_enc": db_enc, "W_dec": dW_dec, "b_dec": db_dec}
    grads = {k: v.astype(params[k].dtype, copy=False) for k, v in grads.items()}
    nonzero = z > 0                                                       # (B, d_sae)
    return Step(mse + aux, mse, aux, grads, nonzero.any(axis=0), float(nonzero.sum()) / B)


# ── the unit-norm decoder ────────────────────────────────────────────────────────

def project_decoder_grad(W_dec: np.ndarray, g: np.ndarray) -> None:
    """g_j ← g_j − (g_j·w_j)·w_j for each row w_j of W_dec (unit-norm): the step no longer changes the
    rows' norms to first order (OpenAI's unit_norm_decoder_grad_adjustment_). In place."""
    g -= np.einsum("nd,nd->n", W_dec, g)[:, None] * W_dec                # (d_sae, d_in)


def normalize_decoder(W_dec: np.ndarray) -> None:
    """w_j ← w_j / ‖w_j‖ for each row of W_dec, in place (a zero row stays 0)."""
    norms = np.linalg.norm(W_dec, axis=1, keepdims=True)                 # (d_sae, 1)
    W_dec /= np.where(norms > 0, norms, 1).astype(W_dec.dtype)


# ── a fresh SAE ──────────────────────────────────────────────────────────────────

def geometric_median(x: np.ndarray, iters: int = 100, tol: float = 1e-6) -> np.ndarray:
    """argmin_m Σ_i ‖x_i − m‖ (Weiszfeld's iteration from the mean), float64 inside; x (N, d) → (d,)."""
    x = np.asarray(x, dtype=np.float64)                                   # (N, d)
    m = x.mean(axis=0)                                                    # (d,)
    for _ in range(iters):
        dist = np.maximum(np.linalg.norm(x - m, axis=1), 1e-12)          # (N,)
        w = 1.0 / dist
        new = (w[:, None] * x).sum(axis=0) / w.sum()                      # (d,)
        moved = np.linalg.norm(new - m)
        m = new
        if moved <= tol * max(1.0, np.linalg.norm(m)):
            break
    return m


def init_sae(cfg: SAEConfig, sample: np.ndarray, seed: int = 0, *, median: bool = True) -> SAE:
    """A fresh SAE as the paper starts one: W_dec's rows random unit directions, W_enc = W_decᵀ, b_enc = 0,
    b_dec = the geometric median of SAMPLE (N, d_in) (median=False: its mean). float32."""
    cfg.check()
    if sample.ndim != 2 or sample.shape[1] != cfg.d_in:
        raise QkvError(f"the sample is {sample.shape}, not (N, {cfg.d_in}); give activations of width d_in")
    rng = np.random.default_rng(seed)
    W_dec = rng.standard_normal((cfg.d_sae, cfg.d_in)).astype(np.float32)   # (d_sae, d_in)
    normalize_decoder(W_dec)
    b_dec = geometric_median(sample) if median else sample.astype(np.float64).mean(axis=0)
    params = {"W_enc": np.ascontiguousarray(W_dec.T), "b_enc": np.zeros(cfg.d_sae, np.float32),
              "W_dec": W_dec, "b_dec": b_dec.astype(np.float32)}
    return SAE(cfg, params)


def variance(sample: np.ndarray) -> float:
    """v = Σ_i Var(x_i) = mean ‖x − mean(x)‖² over SAMPLE (N, d) (float64): FVU's denominator per token."""
    x = np.asarray(sample, dtype=np.float64)
    return float(((x - x.mean(axis=0)) ** 2).sum(axis=1).mean())
