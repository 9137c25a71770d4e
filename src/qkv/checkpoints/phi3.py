"""Phi-3 (Phi-3, Phi-3.5, Phi-4 mini): the Llama layout with Q, K, V and the SwiGLU's gate and up each stored as
one matrix, partial RoPE and LongRoPE.

Its tensors: `ROWS` below, each checkpoint name (relative to Phi3Model) beside ours and how it is stored, read
both ways (loading and saving).

Knobs: RoPE over the first d_head·partial_rotary_factor numbers of each head (`rotary_dim`); rope_parameters
"longrope" (older configs: rope_scaling "su" or "yarn", which transformers reads as longrope): each speed
divided by short_factor[i], or by long_factor[i] in a pass that reaches past original_max_position_embeddings,
and cos, sin multiplied by the attention factor (given, or √(1 + ln s / ln original) with s =
max_position_embeddings / original, as transformers computes it) — qkv.core.positions; sliding_window:
each query sees the last `sliding_window` keys (the mask). Dropouts (resid_pdrop, embd_pdrop,
attention_dropout) are training's: qkv runs the model as transformers does in eval.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .common import (HF_ACTIVATIONS, activation, check_shapes, longrope_scaling, need, partial_rope, reads_back,
                     rope_parameters, decoder_sizes, special_ids, ROTARY_BUFFERS)
from .table import LINEAR, LLAMA_TOP, About, Arch, Row, both_ways, fused_qkv, layer_norm, lm_head

MODEL_TYPES = ("phi3",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("phi3",), models="Phi-3, Phi-3.5, Phi-4 mini",
          brings="Q/K/V and SwiGLU's gate/up each stored as one matrix (`qkv_proj`, `gate_up_proj`, read as views), "
                 "partial RoPE, LongRoPE (short / long factor tables chosen by the pass's length, cos and sin times "
                 "the attention factor; the KV cache reads the sequence again when generation crosses the original "
                 "length), sliding window",
          kind="decoder"),
)

# Tensors a Phi-3 checkpoint may hold that qkv never reads ({i}: a layer), relative to Phi3Model.
IGNORED = ROTARY_BUFFERS


def _rope_scaling(hf: dict, scaling: dict | None, rotary: int) -> dict | None:
    """Phi-3's rope_scaling: None (plain RoPE) or LongRoPE resolved (`longrope_scaling`; older configs' "su" and
    "yarn" are read as longrope, as transformers does); any other kind refused in one line."""
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return None
    if kind not in ("longrope", "su", "yarn"):
        raise QkvError(f"phi3 rope_scaling type {kind!r} is not supported (Phi-3 has default and longrope); "
                       "restore the checkpoint's config.json")
    return longrope_scaling(hf, scaling | {"rope_type": "longrope"}, rotary)


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    d_head = hf.get("head_dim") or d // H
    theta, scaling, rotary = partial_rope(hf, d_head)
    return ModelConfig(
        family="phi3", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, d_head=d_head, d_ff=need(hf, "intermediate_size"),
        max_positions=hf.get("max_position_embeddings", 4096), causal=True, norm="rms", norm_place="pre",
        norm_eps=hf.get("rms_norm_eps", 1e-5), position="rope", rope_theta=theta,
        rope_scaling=_rope_scaling(hf, scaling, rotary or d_head), rotary_dim=rotary,
        activation=activation(hf.get("hidden_act", "silu")), gated_ffn=True, qkv_bias=False, out_bias=False,
        ffn_bias=False, tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        sliding_window=hf.get("sliding_window"), pad_token_id=hf.get("pad_token_id"),
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"), pad_embedding_frozen=True,
    )


# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. Q, K, V are one
# Linear (rows [Q; K; V]) and so are the FFN's gate and up (rows [gate; up]): each part a view of it.
ROWS = [
    Row("tok_embed", "embed_tokens.weight", "V d"),
    *layer_norm("block.attn_norm", "layers.{i}.input_layernorm", bias=False),
    *fused_qkv("layers.{i}.self_attn.qkv_proj"),
    Row("block.attn.W_O", "layers.{i}.self_attn.o_proj.weight", "q d", LINEAR),
    *layer_norm("block.ffn_norm", "layers.{i}.post_attention_layernorm", bias=False),
    Row(("block.ffn.W_gate", "block.ffn.W_in"), "layers.{i}.mlp.gate_up_proj.weight", "d f+f", LINEAR, parts="f f"),
    Row("block.ffn.W_out", "layers.{i}.mlp.down_proj.weight", "f d", LINEAR),
    *layer_norm("final_norm", "norm", bias=False),
    lm_head(),
]
weights, tensors = both_ways(ROWS, "model.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a Phi3ForCausalLM with these knobs (transformers 5's rope_parameters)."""
    factor = (cfg.rotary_dim or cfg.d_head) / cfg.d_head
    hf = {
        "model_type": "phi3", "architectures": ["Phi3ForCausalLM"],
        **decoder_sizes(cfg, head_dim=False), "rms_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "sliding_window": cfg.sliding_window,
        "rope_parameters": rope_parameters(cfg, partial_rotary_factor=factor),
        "tie_word_embeddings": cfg.tied_embeddings, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
        **special_ids(cfg),
    }
    if cfg.d_head != cfg.d_model // cfg.n_heads:
        hf["head_dim"] = cfg.d_head
    if cfg.rope_scaling is not None:
        hf["original_max_position_embeddings"] = cfg.rope_scaling["original_max_position_embeddings"]
    return reads_back(cfg, hf, config)


def _gguf_config(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """Phi-3's config.json of a llama.cpp file: LongRoPE refused (qkv does not read its factors from GGUF); every
    layer attends in full (llama.cpp's Phi-3 sliding window is disabled: the window is read and dropped)."""
    if meta.get(f"{a}.rope.scaling.attn_factor") is not None or meta.get(f"{a}.rope.scaling.type") not in (None, "none"):
        raise QkvError("the GGUF phi3 model uses LongRoPE (rope_factors_long / short), which qkv does not read from "
                       "GGUF; load the Hugging Face checkpoint instead")
    return hf | {"sliding_window": None}


# llama.cpp's architecture (gguf_archs reads it by this table).
GGUF = {
    "phi3": Arch("phi3", "Phi3ForCausalLM",
                 {"attn_norm": "input_layernorm", "attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj",
                  "ffn_norm": "post_attention_layernorm", "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"},
                 LLAMA_TOP, partial_rope=True, keys=("attention.sliding_window", "rope.scaling.attn_factor"),
                 config=_gguf_config),
}
