"""EleutherAI sparsify's layout: one folder per hookpoint, each cfg.json + sae.safetensors.

    cfg.json          d_in, num_latents (0: d_in · expansion_factor), k, activation ("topk"), transcode,
                      skip_connection, ...  (SparseCoderConfig.to_dict plus d_in)
    sae.safetensors   encoder.weight (d_sae, d_in)   — nn.Linear's layout: qkv's W_enc TRANSPOSED
                      encoder.bias (d_sae,)          — qkv's b_enc
                      W_dec (d_sae, d_in), b_dec (d_in,)   — as qkv's
                      W_skip (d_in, d_in)            added as x·W_skipᵀ — qkv's W_skip TRANSPOSED

sparsify's SparseCoder: an SAE subtracts b_dec from its input, a transcoder (transcode true) does not; then
pre = x·encoder.weightᵀ + encoder.bias, z = TopK(ReLU(pre)) (fused_encoder: ReLU first, then the k largest —
the same z as qkv's ReLU of the k largest), x̂ = z·W_dec + b_dec (+ x·W_skipᵀ). Its transcoders predict an
output as wide as their input (d_out = d_in). "groupmax" activations are refused.

Hookpoints (the folder names, the model's own module names): "layers.L" (or "h.L", with any prefix such as
"model.") is what block L outputs — qkv's resid at L+1; "layers.L.mlp" an SAE on the FFN's output (ffn_out) or,
with transcode, a transcoder from what the FFN reads (ffn_in) to what it writes (ffn_out); "layers.L.self_attn"
(or ".attn") attention's output (attn_out).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..checkpoints.tensors import write_safetensors
from ..runtime.errors import QkvError
from ..runtime.io import FileBatch
from ..runtime.io_json import Fields, read_json
from .sae import MAX_D_IN, MAX_LATENTS, SAE, SAEConfig
from .saelens import read_weights

CFG_FILE, WEIGHTS_FILE = "cfg.json", "sae.safetensors"
FIX = f"give a sparsify hookpoint folder ({CFG_FILE} + {WEIGHTS_FILE})"
_HOOKPOINT = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?:layers|h|blocks)\.(\d{1,6})(?:\.(mlp|self_attn|attn|attention))?$")


def where(hookpoint: str, transcode: bool) -> tuple[int | None, str | None, str | None]:
    """(layer, site, site_out) of a hookpoint name in qkv's terms (module docstring); Nones if unknown."""
    m = _HOOKPOINT.match(hookpoint)
    if m is None:
        return None, None, None
    layer, module = int(m.group(1)), m.group(2)
    if module is None:
        return (None, None, None) if transcode else (layer + 1, "resid", None)
    if module == "mlp":
        return (layer, "ffn_in", "ffn_out") if transcode else (layer, "ffn_out", None)
    return (None, None, None) if transcode else (layer, "attn_out", None)


def is_sparsify(directory: Path) -> bool:
    return (directory / CFG_FILE).is_file() and (directory / WEIGHTS_FILE).is_file()


def load_sparsify(directory: str | Path, *, hookpoint: str | None = None, model: str | None = None) -> SAE:
    """The SAE or transcoder in DIRECTORY; HOOKPOINT (default: the folder's name) says where it reads."""
    directory = Path(directory)
    if not is_sparsify(directory):
        raise QkvError(f"{directory} has no {CFG_FILE} and {WEIGHTS_FILE}; {FIX}")
    cfg = Fields(read_json(directory / CFG_FILE, fix=FIX), str(directory / CFG_FILE), FIX)
    activation = cfg.text("activation", "topk")
    if activation != "topk":
        raise QkvError(f"{cfg.source}: activation {activation!r} is not one qkv computes; give a TopK sparse coder")
    d = cfg.integer("d_in", 1, MAX_D_IN)
    n = cfg.integer("num_latents", 0, MAX_LATENTS, 0) or d * cfg.integer("expansion_factor", 1, MAX_LATENTS // d, 32)
    k = cfg.integer("k", 1, n)
    transcode = cfg.boolean("transcode", False)
    skip = cfg.boolean("skip_connection", False)
    required = {"encoder.weight": (n, d), "encoder.bias": (n,), "W_dec": (n, d), "b_dec": (d,)}
    if skip:
        required["W_skip"] = (d, d)
    sizes = f"{CFG_FILE} (d_in {d}, latents {n})"
    raw = read_weights(directory / WEIGHTS_FILE, required, {}, FIX, sizes)
    layer, site, site_out = where(hookpoint or directory.name, transcode)
    params = {"W_enc": np.ascontiguousarray(raw["encoder.weight"].T), "b_enc": raw["encoder.bias"],   # (d, n)
              "W_dec": raw["W_dec"], "b_dec": raw["b_dec"]}
    if skip:
        params["W_skip"] = np.ascontiguousarray(raw["W_skip"].T)                                      # (d, d)
    config = SAEConfig(d_in=d, d_sae=n, k=k, apply_b_dec_to_input=not transcode, model=model, layer=layer,
                       site=site, architecture="topk", d_out=d if transcode else None,
                       site_out=(site_out or "ffn_out") if transcode else None)
    return SAE(config, params)


def hookpoint(sae: SAE, prefix: str = "layers") -> str:
    """Where SAE reads as a sparsify hookpoint: "layers.L" (resid at L+1), "layers.L.mlp", "layers.L.self_attn"."""
    c = sae.config
    if c.layer is None or c.site is None:
        raise QkvError("the dictionary does not say which layer and site it reads; give them before saving")
    if c.transcoder:
        if (c.site, c.site_out) != ("ffn_in", "ffn_out"):
            raise QkvError(f"sparsify's transcoders read the FFN's input and write its output; this one reads {c.site}")
        return f"{prefix}.{c.layer}.mlp"
    names = {"ffn_out": f"{prefix}.{c.layer}.mlp", "attn_out": f"{prefix}.{c.layer}.self_attn"}
    if c.site == "resid":
        if c.layer < 1:
            raise QkvError("sparsify names what a block outputs; the stream entering block 0 (the embeddings) has no "
                           "hookpoint there")
        return f"{prefix}.{c.layer - 1}"
    if c.site not in names:
        raise QkvError(f"sparsify has no hookpoint for site {c.site!r}")
    return names[c.site]


def save_sparsify(sae: SAE, parent: str | Path, *, name: str | None = None) -> Path:
    """PARENT/HOOKPOINT/cfg.json + sae.safetensors (HOOKPOINT: `hookpoint(sae)` unless NAME). A TopK box whose
    b_dec is subtracted from its input (an SAE) or not (a transcoder with d_out = d_in): what sparsify holds."""
    c = sae.config
    if c.architecture != "topk":
        raise QkvError(f"sparsify holds TopK sparse coders; this is a {c.architecture} one: save it in SAELens's layout")
    if c.transcoder == c.apply_b_dec_to_input or c.width_out != c.d_in:
        raise QkvError("sparsify's SAEs subtract b_dec from their input and its transcoders do not, and both write "
                       "d_in wide; this one does not fit: save it in SAELens's layout")
    directory = Path(parent) / (name or hookpoint(sae))
    tensors = {"encoder.weight": sae.W_enc.T, "encoder.bias": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
    if "W_skip" in sae.params:
        tensors["W_skip"] = sae.params["W_skip"].T
    tensors = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
    cfg = {"activation": "topk", "expansion_factor": max(1, c.d_sae // c.d_in), "normalize_decoder": True,
           "num_latents": c.d_sae, "k": c.k, "multi_topk": False, "skip_connection": "W_skip" in sae.params,
           "transcode": c.transcoder, "d_in": c.d_in}
    with FileBatch(directory) as batch:
        batch.write(WEIGHTS_FILE, lambda f: write_safetensors(f, tensors, {"format": "pt"}))
        batch.write_text(CFG_FILE, json.dumps(cfg))
    return directory
