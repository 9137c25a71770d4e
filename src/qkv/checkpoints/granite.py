"""Granite (IBM): the Llama layout and names (checkpoints/llama.py's table) with four multipliers.

    config.json knob        qkv knob                 what it does
    embedding_multiplier    embedding_multiplier     X = E[ids]·m
    residual_multiplier     residual_multiplier      x + Box(Norm(x))·m, for attention and the FFN
    attention_multiplier    attn_scale               S = Q·Kᵀ·m (in place of 1/√d_k; the default is 1)
    logits_scaling          logit_scale = 1 / s      logits = H·W_vocab / s
    mlp_bias                ffn_bias                 biases of gate_proj, up_proj, down_proj (Llama's table)

The tensors are Llama's: embed_tokens, layers.{i}.input_layernorm, self_attn.q_proj/k_proj/v_proj/o_proj,
post_attention_layernorm, mlp.gate_proj/up_proj/down_proj, norm, lm_head (`llama.weights` / `llama.tensors`).
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import Weights
from . import llama
from .common import reads_back
from .table import LLAMA_LAYER, LLAMA_TOP, About, Arch
from .tensors import TensorStore

MODEL_TYPES = ("granite",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("granite",), models="Granite",
          brings="Llama's boxes with four multipliers: embeddings × `embedding_multiplier`, each box's output × "
                 "`residual_multiplier` before it joins the stream, scores × `attention_multiplier`, logits ÷ "
                 "`logits_scaling`",
          kind="decoder"),
)

IGNORED = llama.IGNORED


def config(hf: dict) -> ModelConfig:
    base = llama.config({**hf, "model_type": "llama"})
    return base.with_(family="granite", embedding_multiplier=float(hf.get("embedding_multiplier", 1.0)),
                      residual_multiplier=float(hf.get("residual_multiplier", 1.0)),
                      attn_scale=float(hf.get("attention_multiplier", 1.0)),
                      logit_scale=1.0 / float(hf.get("logits_scaling", 1.0)))


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    return llama.weights(store, cfg, dtype)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a GraniteForCausalLM with these knobs: Llama's, plus the multipliers."""
    plain = cfg.with_(family="llama", embedding_multiplier=1.0, residual_multiplier=1.0, attn_scale=None,
                      logit_scale=1.0)
    hf = llama.hf_config(plain) | {
        "model_type": "granite", "architectures": ["GraniteForCausalLM"],
        "embedding_multiplier": cfg.embedding_multiplier, "residual_multiplier": cfg.residual_multiplier,
        "attention_multiplier": 1.0 if cfg.attn_scale is None else cfg.attn_scale,
        "logits_scaling": 1.0 / cfg.logit_scale,
    }
    hf.pop("rope_theta", None)             # GraniteConfig reads rope_parameters only
    return reads_back(cfg, hf, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under GraniteForCausalLM's names: Llama's."""
    return llama.tensors(weights, cfg)


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Granite's multipliers from a llama.cpp file: attention.scale (Q·Kᵀ's factor; absent or 0: llama.cpp's
    1/√d_k), embedding_scale, residual_scale and logit_scale (1 when absent)."""
    scale = {k: meta.get(f"{a}.{k}") for k in ("attention.scale", "embedding_scale", "residual_scale", "logit_scale")}
    for key, value in scale.items():
        zero_ok = key == "attention.scale"                       # 0: llama.cpp's 1/√d_k
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not np.isfinite(value) or value < 0 or (value == 0 and not zero_ok)):
            raise QkvError(f"the GGUF value {a}.{key} = {value!r:.30} is not a positive number; the file is "
                           "damaged")
    hf |= {"attention_multiplier": float(scale["attention.scale"] or 1 / np.sqrt(dims["d_head"])),
           "embedding_multiplier": float(scale["embedding_scale"] or 1.0),
           "residual_multiplier": float(scale["residual_scale"] or 1.0),
           "logits_scaling": float(scale["logit_scale"] or 1.0), "mlp_bias": False, "attention_bias": False}
    hf.pop("rope_theta")
    return hf


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "granite": Arch("granite", "GraniteForCausalLM", LLAMA_LAYER, LLAMA_TOP, permuted=True,
                    keys=("attention.scale", "embedding_scale", "residual_scale", "logit_scale"),
                    config=_gguf_config),
}
