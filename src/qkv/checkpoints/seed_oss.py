"""Seed-OSS (ByteDance Seed): Llama's blocks and names with a switch of its own for o_proj's bias.

    config.json knob        qkv knob          what it does
    attention_bias (true)   qkv_bias          biases of q_proj, k_proj, v_proj
    attention_out_bias      out_bias          o_proj's bias (default false)
    mlp_bias (false)        ffn_bias          biases of gate_proj, up_proj, down_proj (b_gate, b_in, b_out)
    head_dim (128), num_key_value_heads (8), rms_norm_eps (1e-6), max_position_embeddings (524288), pad / bos / eos
    ids (1, 0, 2), untied: SeedOssConfig's defaults when config.json leaves them out
    attention_dropout, residual_dropout     training only (transformers' eval passes skip them; so does qkv)

Everything else is Llama's (checkpoints/llama.py reads it: RMSNorm before each box, RoPE with its scalings, GQA).
Its tensors, relative to SeedOssModel ("model."; the head is "lm_head"): ROWS below. llama.cpp's `seed_oss` files
(GGUF): Llama's tensors as stored (no Q/K permutation), post_attention_layernorm named post_attention_norm, q/k/v
biases and no others (its loader reads no o_proj or FFN bias).
"""

from __future__ import annotations

from ..core.config import ModelConfig
from . import llama
from .common import reads_back
from .llama import GAMMA
from .table import (LLAMA_LAYER, LLAMA_TOP, About, Arch, Row, attention, both_ways, ffn_bias, gated_ffn, lm_head,
                    out_bias, qkv_bias)

MODEL_TYPES = ("seed_oss",)

ABOUT = (                              # its row of the README's table of families (families.about)
    About(types=("seed_oss",), models="Seed-OSS",
          brings="Llama's blocks with q/k/v biases (`attention_bias`), o_proj's bias under a switch of its own "
                 "(`attention_out_bias`) and FFN biases (`mlp_bias`: b_gate, b_in, b_out)",
          kind="decoder"),
)

IGNORED = llama.IGNORED

DEFAULTS = {"head_dim": 128, "num_key_value_heads": 8, "rms_norm_eps": 1e-6, "max_position_embeddings": 524288,
            "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "tie_word_embeddings": False,
            "attention_bias": True, "attention_out_bias": False, "mlp_bias": False}      # SeedOssConfig's own


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | hf
    base = llama.config({k: v for k, v in hf.items() if k not in ("attention_bias", "mlp_bias")}
                        | {"model_type": "llama"})
    return base.with_(family="seed_oss", qkv_bias=bool(hf["attention_bias"]),
                      out_bias=bool(hf["attention_out_bias"]), ffn_bias=bool(hf["mlp_bias"]))


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a SeedOssForCausalLM with these knobs: Llama's, with its three bias switches."""
    hf = llama.hf_dict(cfg.with_(family="llama", qkv_bias=False, out_bias=False, ffn_bias=False)) | {
        "model_type": "seed_oss", "architectures": ["SeedOssForCausalLM"], "attention_bias": cfg.qkv_bias,
        "attention_out_bias": cfg.out_bias, "mlp_bias": cfg.ffn_bias}
    return reads_back(cfg, hf, config)


# The table, read both ways (Llama's, with each bias under its own switch).
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    Row("block.attn_norm", "layers.{i}.input_layernorm.weight", "d", GAMMA),
    *attention("layers.{i}.self_attn", qkv_bias, out_bias),
    Row("block.ffn_norm", "layers.{i}.post_attention_layernorm.weight", "d", GAMMA),
    *gated_ffn("layers.{i}.mlp"),
    *[Row(f"block.ffn.{b}", f"layers.{{i}}.mlp.{proj}.bias", size, when=ffn_bias)      # mlp_bias
      for b, proj, size in (("b_gate", "gate_proj", "f"), ("b_in", "up_proj", "f"), ("b_out", "down_proj", "d"))],
    Row("final_norm", "norm.weight", "d", GAMMA),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Seed-OSS's config.json of a llama.cpp file: q/k/v biases, no o_proj or FFN biases (llama.cpp's seed_oss)."""
    return hf | {"attention_bias": True, "attention_out_bias": False, "mlp_bias": False}


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "seed_oss": Arch("seed_oss", "SeedOssForCausalLM",
                     {k: v for k, v in LLAMA_LAYER.items() if k != "ffn_norm"}
                     | {"post_attention_norm": "post_attention_layernorm"},
                     LLAMA_TOP, biases="qkv", config=_gguf_config),
}
