"""Arcee (AFM): Llama's blocks and names with a plain FFN of squared ReLU in place of SwiGLU.

    config.json knob        qkv knob                 what it does
    hidden_act (relu2)      activation "relu2"       FFN(x) = ReLU(x·W_in + b_in)²·W_out + b_out, no gate
    mlp_bias                ffn_bias                 the FFN's two biases (up_proj, down_proj)
    attention_bias          qkv_bias, out_bias       biases of q/k/v_proj and o_proj

Everything else is Llama's (checkpoints/llama.py reads it: RMSNorm before each box, RoPE with its scalings, GQA,
head_dim). Its tensors, relative to ArceeModel ("model."; the head is "lm_head"): ROWS below. llama.cpp's `arcee`
files (GGUF): Llama's tensors without ffn_gate, Q/K rows permuted as llama's, no biases, ReLU² implied.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from . import llama
from .common import activation, reads_back
from .llama import GAMMA
from .table import (LLAMA_LAYER, LLAMA_TOP, Arch, Row, attention, both_ways, ffn_bias, linear, lm_head, out_bias,
                    qkv_bias)
from .table import About

MODEL_TYPES = ("arcee",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("arcee",), models="Arcee (AFM)",
          brings="Llama's boxes with a plain FFN of squared ReLU, ReLU(x·W_in + b)²·W_out + b (`up_proj`, "
                 "`down_proj`, no gate; `mlp_bias`)",
          kind="decoder"),
)

IGNORED = llama.IGNORED

DEFAULTS = {"hidden_act": "relu2", "rms_norm_eps": 1e-5, "max_position_embeddings": 4096}   # ArceeConfig's own


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | hf
    act = activation(hf["hidden_act"])
    base = llama.config({k: v for k, v in hf.items() if k != "mlp_bias"} | {"model_type": "llama"})
    return base.with_(family="arcee", activation=act, gated_ffn=False, ffn_bias=bool(hf.get("mlp_bias", False)))


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an ArceeForCausalLM with these knobs: Llama's, with the plain FFN's activation and
    mlp_bias."""
    hf = llama.hf_dict(cfg.with_(family="llama")) | {
        "model_type": "arcee", "architectures": ["ArceeForCausalLM"], "mlp_bias": cfg.ffn_bias}
    return reads_back(cfg, hf, config)


# The table, read both ways (Llama's, with up_proj / down_proj and no gate).
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    Row("block.attn_norm", "layers.{i}.input_layernorm.weight", "d", GAMMA),
    *attention("layers.{i}.self_attn", qkv_bias, out_bias),
    Row("block.ffn_norm", "layers.{i}.post_attention_layernorm.weight", "d", GAMMA),
    *linear("block.ffn.W_in", "layers.{i}.mlp.up_proj", "d f", "block.ffn.b_in", ffn_bias),
    *linear("block.ffn.W_out", "layers.{i}.mlp.down_proj", "f d", "block.ffn.b_out", ffn_bias),
    Row("final_norm", "norm.weight", "d", GAMMA),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Arcee's config.json of a llama.cpp file: no biases (llama.cpp's arcee has none)."""
    return hf | {"attention_bias": False, "mlp_bias": False}


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "arcee": Arch("arcee", "ArceeForCausalLM", {k: v for k, v in LLAMA_LAYER.items() if k != "ffn_gate"}, LLAMA_TOP,
                  permuted=True, activation="relu2", config=_gguf_config),
}
