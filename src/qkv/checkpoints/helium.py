"""Helium (Kyutai): Llama's blocks and names with RoPE on interleaved pairs and biases on q/k/v only.

    config.json knob        qkv knob                 what it does
    (always)                rope_interleaved         RoPE turns the pairs (0, 1), (2, 3), … of each head (GPT-J's)
    attention_bias          qkv_bias (out_bias off)  biases of q/k/v_proj; o_proj never has one
    head_dim (128), num_key_value_heads (20), rms_norm_eps (1e-8), max_position_embeddings (4096), pad/bos/eos ids
    (3, 1, 2): HeliumConfig's defaults when config.json leaves them out
    mlp_bias                ffn_bias                 biases of gate_proj, up_proj, down_proj (b_gate, b_in, b_out)

Everything else is Llama's (checkpoints/llama.py reads it and its tensor table: Helium's names are Llama's).
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from . import llama
from .common import need, reads_back
from .table import About

MODEL_TYPES = ("helium",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("helium",), models="Helium (Kyutai)",
          brings="Llama's boxes with RoPE on interleaved pairs (0, 1), (2, 3), … and biases on q/k/v only "
                 "(`attention_bias`; `o_proj` never has one)",
          kind="decoder"),
)

IGNORED = llama.IGNORED
weights = llama.weights
tensors = llama.tensors

DEFAULTS = {"head_dim": 128, "num_key_value_heads": 20, "rms_norm_eps": 1e-8, "max_position_embeddings": 4096,
            "pad_token_id": 3, "bos_token_id": 1, "eos_token_id": 2}          # HeliumConfig's own


def config(hf: dict) -> ModelConfig:
    hf = DEFAULTS | hf
    d, H, d_k = need(hf, "hidden_size"), need(hf, "num_attention_heads"), hf.get("head_dim")
    if isinstance(d_k, int) and isinstance(H, int) and H * d_k != d:
        raise QkvError(f"Helium's o_proj is hidden_size × hidden_size, so head_dim · num_attention_heads = "
                       f"{d_k} · {H} must equal hidden_size = {d}; restore the checkpoint's config.json")
    bias = bool(hf.get("attention_bias", False))
    base = llama.config({k: v for k, v in hf.items() if k != "attention_bias"} | {"model_type": "llama"})
    return base.with_(family="helium", rope_interleaved=True, qkv_bias=bias, out_bias=False)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a HeliumForCausalLM with these knobs: Llama's, attention_bias for q/k/v."""
    if not cfg.rope_interleaved or cfg.out_bias:
        raise QkvError("a helium config.json cannot hold rope_interleaved=False or out_bias=True; change those knobs "
                       "or the family")
    hf = llama.hf_dict(cfg.with_(family="llama", rope_interleaved=False, qkv_bias=False)) | {
        "model_type": "helium", "architectures": ["HeliumForCausalLM"], "attention_bias": cfg.qkv_bias,
        "mlp_bias": cfg.ffn_bias}
    return reads_back(cfg, hf, config)
