"""The tuned lens (Belrose et al. 2023): the logit lens with a learned affine translator per layer.

    translate    h ↦ h + h·A_l + b_l                 A_l (d_model, d_model), b_l (d_model,); A = 0, b = 0 is the
                                                      logit lens exactly (the residual form the tuned-lens package
                                                      uses, so weight decay pulls towards the identity)
    read         logits_l = read_out(translate_l(h_l))  the model's final norm and W_vocab (analysis.lens.read_out)
    loss         KL(p_L ‖ q_l) = Σ_v p_L,v·(log p_L,v − log q_l,v), the mean over positions: p_L the model's own
                 final distribution (row L of the lens), q_l = softmax(logits_l)
    gradient     dKL/dlogits_l = (q_l − p_L)/N, back through W_vocab (the logits' soft cap and scale), unembed_in
                 and the final norm (qkv.core.blocks_backward), then dA_l = h_lᵀ·dy, db_l = Σ_rows dy

Rows 0..L−1 of the residual stream (the embeddings, then each block's input) get a translator; row L, the
last block's output, is what the model reads out itself and has none (as in the package).

The files (the tuned-lens package's `TunedLens.save` layout, github AlignmentResearch/tuned-lens):

    DIR/config.json          {"base_model_name_or_path", "d_model", "num_hidden_layers", "bias": true,
                              "base_model_revision", "unembed_hash", "lens_type": "linear_tuned_lens"}
    DIR/params.safetensors   the package's `layer_translators.state_dict()`: "{l}.weight" (d_model, d_model),
                             torch's Linear y = h·Wᵀ + b, so W = A_lᵀ, and "{l}.bias" (d_model,), l = 0..L−1

The package itself writes params.pt, a torch pickle, which qkv never unpickles (a pickle runs code). qkv writes
and reads params.safetensors under the same names instead; the package reads it with
`lens.layer_translators.load_state_dict(safetensors.torch.load_file(DIR + "/params.safetensors"))`, and a
params.pt becomes one with `safetensors.torch.save_file(torch.load(DIR + "/params.pt"), DIR + "/params.safetensors")`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..checkpoints.tensors import TensorStore, write_safetensors
from ..core import blocks_backward as back
from ..core.blocks import logits_of, norm, unembed_in
from ..core.blocks_backward import Tape
from ..runtime.errors import QkvError
from ..runtime.io import FileBatch
from ..runtime.io_json import Fields, read_json
from .lens import KEEP, check_lens, residual_stream

if TYPE_CHECKING:
    from ..core.trace import Trace
    from ..models.model import Model

CONFIG_FILE, PARAMS_FILE, PICKLE_FILE = "config.json", "params.safetensors", "params.pt"
LENS_TYPE = "linear_tuned_lens"
FIX = "give a directory the tuned lens wrote (qkv tuned-lens train --out DIR), config.json + params.safetensors"


@dataclass
class TunedLens:
    """One affine translator per layer 0..L−1: h ↦ h + h·A[l] + b[l]."""

    A: np.ndarray                    # (L, d_model, d_model)
    b: np.ndarray                    # (L, d_model)
    base_model: str = ""             # the model it was trained for (config.json's base_model_name_or_path)

    @property
    def n_layers(self) -> int:
        return self.A.shape[0]

    @property
    def d_model(self) -> int:
        return self.A.shape[1]


def check_model(model: "Model") -> None:
    """The tuned lens trains through a decoder's final norm and W_vocab: a model without an LM head (analysis.lens
    says so), an encoder–decoder, a masked-LM head or T5's scaled read-out are refused in one line."""
    check_lens(model)
    w, cfg = model.weights, model.config
    if cfg.encoder_decoder or w.W_head is not None or cfg.scale_decoder_output:
        raise QkvError(f"{model.name} reads its logits through more than a final norm and W_vocab (an encoder–decoder "
                       "or a masked-LM head); the tuned lens is for a decoder-only model, e.g. --model smollm2")


def identity_lens(model: "Model", dtype=np.float32) -> TunedLens:
    """Every translator zero, A_l = 0, b_l = 0 (the package's initialisation): the logit lens itself."""
    L, d = model.config.n_layers, model.config.d_model
    return TunedLens(np.zeros((L, d, d), dtype), np.zeros((L, d), dtype), model.name)


def check_fits(model: "Model", lens: TunedLens) -> None:
    """A lens of another model's shape: one line naming both."""
    L, d = model.config.n_layers, model.config.d_model
    if (lens.n_layers, lens.d_model) != (L, d):
        raise QkvError(f"the tuned lens has {lens.n_layers} layers of width {lens.d_model} "
                       f"(trained for {lens.base_model or 'another model'}), {model.name} has {L} of width {d}; "
                       "give the lens trained for this model")


def translate(lens: TunedLens, layer: int, x: np.ndarray) -> np.ndarray:
    """h + h·A_l + b_l for rows x (…, d_model) of layer LAYER's residual stream (row L: x itself)."""
    if layer == lens.n_layers:
        return x
    A, b = lens.A[layer].astype(x.dtype, copy=False), lens.b[layer].astype(x.dtype, copy=False)
    return x + x @ A + b                                                   # (…, d_model)


def tuned_stream(lens: TunedLens, x: np.ndarray) -> np.ndarray:
    """The residual stream (L+1, n, d_model) with each row translated (row L unchanged)."""
    return np.stack([translate(lens, l, x[l]) for l in range(len(x))])    # (L+1, n, d_model)


def read(model: "Model", y: np.ndarray, tape: Tape | None = None) -> np.ndarray:
    """analysis.lens.read_out (the final norm, unembed_in, W_vocab), keeping what the backward reads in TAPE:
    the norm's input as (None, "final_norm"), unembed_in's as (None, "unembed_in"), the hidden as (None, "hidden")."""
    w, cfg = model.weights, model.config
    if tape is not None and w.final_norm is not None:
        tape.put(None, "final_norm", y)
    h = unembed_in(norm(y, w.final_norm, cfg) if w.final_norm is not None else y, w, tape)   # (…, d_embed)
    if tape is not None:
        tape.put(None, "hidden", h)
    return logits_of(h, w, cfg)                                            # (…, V)


def read_backward(model: "Model", dlogits: np.ndarray, logits: np.ndarray, tape: Tape) -> np.ndarray:
    """dY (…, d_model) of `read` from dlogits (…, V): back.logits_of's soft cap and logit scale, then dZ·W_vocabᵀ
    (back.logits_of without dW_vocab, as costly as the read and not wanted: W_vocab stays), back.unembed_in,
    back.norm (the final norm's dx)."""
    w, cfg = model.weights, model.config
    if cfg.final_softcap is not None:
        dlogits = dlogits * (1 - np.square(logits / cfg.final_softcap))
    if cfg.logit_scale != 1:
        dlogits = dlogits * cfg.logit_scale
    h = tape.pop(None, "hidden")
    # dZ = dlogits·W_vocabᵀ, computed as (W_vocab·dlogitsᵀ)ᵀ: the same numbers, 6× faster in OpenBLAS (measured,
    # SmolLM2's (576, 49152) W_vocab: a product summing over V = 49152 runs slowly with W_vocabᵀ on the right)
    dh = (w.W_vocab @ dlogits.reshape(-1, dlogits.shape[-1]).T).T.reshape(h.shape)   # (…, d_embed)
    dh, _ = back.unembed_in(dh, w, tape)                                   # (…, d_model)
    if w.final_norm is not None:
        dh, _ = back.norm(dh, tape.pop(None, "final_norm"), w.final_norm, model.config)
    return dh


def log_softmax(z: np.ndarray) -> np.ndarray:
    """log softmax over the last axis (…, V), in z's dtype, the sum of exponentials in float64."""
    top = z.max(axis=-1, keepdims=True)                                    # (…, 1)
    s = np.exp(z - top).sum(axis=-1, keepdims=True, dtype=np.float64)     # (…, 1)
    return z - (top + np.log(s).astype(z.dtype))                           # (…, V)


def kl_rows(log_p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """KL(p ‖ q) = Σ_v p_v·(log p_v − log q_v) per row (…,), float64 sums."""
    return (np.exp(log_p) * (log_p - log_q)).sum(axis=-1, dtype=np.float64)


@dataclass
class Target:
    """The model's final distribution over N positions, what every layer's loss compares with: log p, p and
    Σ_v p·log p per row (so a layer's KL costs one pass of p·z: KL = Σ p·log p − Σ p·z + logsumexp(z))."""

    log_p: np.ndarray                # (N, V)
    p: np.ndarray                    # (N, V)
    neg_entropy: np.ndarray          # (N,) float64

    @classmethod
    def of(cls, log_p: np.ndarray) -> "Target":
        p = np.exp(log_p)                                                  # (N, V)
        return cls(log_p, p, np.einsum("nv,nv->n", p, log_p, dtype=np.float64))


def layer_loss(model: "Model", lens: TunedLens, layer: int, x: np.ndarray, target: "Target | np.ndarray"
               ) -> tuple[float, np.ndarray, np.ndarray]:
    """(mean KL(p ‖ q_l) over the N rows, dA_l (d, d), db_l (d,)) for rows x (N, d_model) of layer LAYER's
    residual stream and the model's final distribution at the same positions (a Target, or log p (N, V)).

    Plain form: loss = kl_rows(log_p, log_softmax(z)).mean(), dz = (softmax(z) − p)/N; here the (N, V) arrays are
    made once and overwritten in place (z → e^(z − max) → q → dz), and Σ p·log q = Σ p·z − logsumexp(z) (Σ p = 1)."""
    t = target if isinstance(target, Target) else Target.of(target)
    tape = Tape()
    y = translate(lens, layer, x)                                          # (N, d)
    z = read(model, y, tape)                                               # (N, V)
    n = len(x)
    pz = np.einsum("nv,nv->n", t.p, z).astype(np.float64)                 # (N,) Σ p·z (in z's dtype: 50× faster)
    top = z.max(axis=-1, keepdims=True)                                    # (N, 1)
    q = np.exp(z - top)                                                    # (N, V) unnormalised; z kept (soft cap)
    s = q.sum(axis=-1, keepdims=True, dtype=np.float64)                    # (N, 1)
    loss = float((t.neg_entropy - pz + top[:, 0] + np.log(s[:, 0])).sum()) / n
    q /= s.astype(q.dtype)                                                 # q = softmax(z)
    q -= t.p
    q /= n                                                                 # dz = (q − p)/N
    dy = read_backward(model, q, z, tape)                                  # (N, d)
    return loss, x.T @ dy, dy.sum(axis=0)                                  # (d, d), (d,)


def layer_kl(model: "Model", lens: TunedLens | None, x: np.ndarray, log_p: np.ndarray) -> np.ndarray:
    """(L,) mean KL(final ‖ lens_l) over the N rows, for the residual stream x (L+1, N, d_model) and the final
    log-probabilities log_p (N, V); LENS None: the logit lens."""
    out = np.empty(len(x) - 1)
    for l in range(len(x) - 1):
        y = x[l] if lens is None else translate(lens, l, x[l])            # (N, d)
        out[l] = kl_rows(log_p, log_softmax(read(model, y))).mean()
    return out


def tuned_lens_of_trace(model: "Model", lens: TunedLens, trace: "Trace") -> np.ndarray:
    """(L+1, n, V): row l reads translate_l of the residual stream after l blocks; row L is the model's logits
    (analysis.lens.lens_of_trace with the translators; the trace kept analysis.lens.KEEP)."""
    check_model(model)
    check_fits(model, lens)
    x = tuned_stream(lens, residual_stream(model, trace))                  # (L+1, n, d)
    return np.stack([read(model, row) for row in x])                       # (L+1, n, V)


def tuned_lens(model: "Model", lens: TunedLens, text_or_ids: str | Sequence[int]) -> np.ndarray:
    """(L+1, n, V): the tuned lens of a text (see `tuned_lens_of_trace`)."""
    check_model(model)
    return tuned_lens_of_trace(model, lens, model.run(text_or_ids, keep=KEEP))


# ── the files ─────────────────────────────────────────────────────────────────────

def config_of(lens: TunedLens) -> dict:
    """config.json as the package's TunedLensConfig.to_dict() writes it."""
    return {"base_model_name_or_path": lens.base_model, "d_model": int(lens.d_model),
            "num_hidden_layers": int(lens.n_layers), "bias": True, "base_model_revision": None,
            "unembed_hash": None, "lens_type": LENS_TYPE}


def tensors_of(lens: TunedLens) -> dict[str, np.ndarray]:
    """The package's state_dict names: "{l}.weight" = A_lᵀ (torch's Linear (out, in)), "{l}.bias" = b_l."""
    out = {}
    for l in range(lens.n_layers):
        out[f"{l}.weight"] = np.ascontiguousarray(lens.A[l].T)
        out[f"{l}.bias"] = np.ascontiguousarray(lens.b[l])
    return out


def write_tuned_lens(batch: FileBatch, lens: TunedLens) -> None:
    """config.json and params.safetensors into BATCH's directory."""
    tensors = tensors_of(lens)
    batch.write(PARAMS_FILE, lambda f: write_safetensors(f, tensors, {"format": "pt"}))
    batch.write_text(CONFIG_FILE, json.dumps(config_of(lens), indent=1))


def save_tuned_lens(lens: TunedLens, directory: str | Path) -> Path:
    """DIRECTORY/config.json + DIRECTORY/params.safetensors, both or neither (FileBatch). Returns DIRECTORY."""
    with FileBatch(directory) as batch:
        write_tuned_lens(batch, lens)
    return Path(directory)


def load_tuned_lens(directory: str | Path) -> TunedLens:
    """The lens in DIRECTORY (config.json + params.safetensors), float32; one QkvError for a
    missing, malformed or pickled file."""
    directory = Path(directory)
    if not directory.is_dir():
        raise QkvError(f"{directory} is not a directory; {FIX}")
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise QkvError(f"{directory} has no {CONFIG_FILE}; {FIX}")
    cfg = Fields(read_json(path, fix=FIX), str(path), FIX)
    kind = cfg.text("lens_type", choices=(LENS_TYPE,), default=LENS_TYPE)
    d, L = cfg.integer("d_model", 1, 1 << 16), cfg.integer("num_hidden_layers", 1, 4096)
    bias = cfg.data.get("bias", True)
    if bias is not True:
        raise QkvError(f"{path}: bias must be true (a {kind} with biases), not {bias!r}; {FIX}")
    base = cfg.text("base_model_name_or_path", default="")
    params = directory / PARAMS_FILE
    if not params.is_file():
        pickled = (directory / PICKLE_FILE).exists()
        why = (f" ({PICKLE_FILE} is a torch pickle, which qkv never loads: convert it with safetensors.torch."
               f"save_file(torch.load('{PICKLE_FILE}'), '{PARAMS_FILE}'))") if pickled else ""
        raise QkvError(f"{directory} has no {PARAMS_FILE}{why}; {FIX}")
    A, b = _read_params(params, L, d)
    return TunedLens(A, b, str(base))


def _read_params(path: Path, L: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(A (L, d, d), b (L, d)) float32 from the "{l}.weight", "{l}.bias" tensors: exactly those, floats, finite."""
    try:
        store = TensorStore(path)
    except QkvError as e:                                                   # not safetensors, bad offsets
        raise QkvError(f"{e}; {FIX}") from None
    want = {f"{l}.weight": (d, d) for l in range(L)} | {f"{l}.bias": (d,) for l in range(L)}
    names = set(store.names())
    extra, missing = sorted(names - want.keys()), sorted(want.keys() - names, key=lambda s: (len(s), s))
    if extra or missing:
        what = f"holds {', '.join(extra[:3])}, not a translator" if extra else f"has no {', '.join(missing[:3])}"
        raise QkvError(f"{path} {what} (config.json says {L} layers of width {d}); {FIX}")
    try:
        for name, shape in want.items():
            if store.shape(name) != shape:
                raise QkvError(f"{name} has shape {store.shape(name)}, config.json implies {shape}")
        A = np.stack([store.get(f"{l}.weight", (d, d)).T for l in range(L)])      # (L, d, d)
        b = np.stack([store.get(f"{l}.bias", (d,)) for l in range(L)])            # (L, d)
    except QkvError as e:                                                   # not floats, not finite, truncated
        raise QkvError(f"{path}: {e}; {FIX}") from None
    return np.ascontiguousarray(A), b
