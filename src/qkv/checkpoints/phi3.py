"""Phi-3 (Phi-3, Phi-3.5, Phi-4 mini): the Llama layout with Q, K, V and the SwiGLU's gate and up each stored as
one matrix, partial RoPE and LongRoPE.

    checkpoint name (relative to Phi3Model)   qkv name
    embed_tokens                              tok_embed
    layers.{i}.input_layernorm                attn_norm (RMSNorm, before attention)
    layers.{i}.self_attn.qkv_proj             [W_Q | W_K | W_V]: rows q (H·d_k), then k, then v (Hkv·d_k each),
                                              read as three views of its transpose
    layers.{i}.self_attn.o_proj               W_O
    layers.{i}.post_attention_layernorm       ffn_norm
    layers.{i}.mlp.gate_up_proj               [W_gate | W_in]: rows gate (d_ff), then up (d_ff), read as views
    layers.{i}.mlp.down_proj                  W_out: SiLU(x·W_gate) ⊙ x·W_in, then ·W_out
    norm                                      final_norm
    lm_head (absent when tied)                W_vocab

Knobs: RoPE over the first d_head·partial_rotary_factor numbers of each head (`rotary_dim`); rope_parameters
"longrope" (older configs: rope_scaling "su" or "yarn", which transformers reads as longrope): each speed
divided by short_factor[i], or by long_factor[i] in a pass that reaches past original_max_position_embeddings,
and cos, sin multiplied by the attention factor (given, or √(1 + ln s / ln original) with s =
max_position_embeddings / original, as transformers computes it) — qkv.core.positions; sliding_window:
each query sees the last `sliding_window` keys (the mask). Dropouts (resid_pdrop, embd_pdrop,
attention_dropout) are training's: qkv runs the model as transformers does in eval.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import (HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, longrope_scaling, need, partial_rope,
                     reads_back, ROTARY_BUFFERS)
from .tensors import TensorStore

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


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f = cfg.d_model, cfg.d_ff
    hq, hkv = cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head

    def rms(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype))

    def block(i: int) -> BlockWeights:
        p, a, m = f"layers.{i}", f"layers.{i}.self_attn", f"layers.{i}.mlp"
        qkv = linear_T(store, f"{a}.qkv_proj.weight", d, hq + 2 * hkv, dtype)        # (d, H·d_k + 2·Hkv·d_k)
        attn = AttentionWeights(W_Q=qkv[:, :hq], W_K=qkv[:, hq:hq + hkv], W_V=qkv[:, hq + hkv:],   # views
                                W_O=linear_T(store, f"{a}.o_proj.weight", hq, d, dtype))
        gate_up = linear_T(store, f"{m}.gate_up_proj.weight", d, 2 * f, dtype)       # (d, 2·d_ff): gate, then up
        ffn = FFNWeights(W_gate=gate_up[:, :f], W_in=gate_up[:, f:],
                         W_out=linear_T(store, f"{m}.down_proj.weight", f, d, dtype))
        return BlockWeights(attn_norm=rms(f"{p}.input_layernorm"), attn=attn,
                            ffn_norm=rms(f"{p}.post_attention_layernorm"), ffn=ffn)

    tok = store.get("embed_tokens.weight", (cfg.vocab_size, d), dtype)
    W_vocab = tok.T if cfg.tied_embeddings and not store.has("lm_head.weight") else \
        linear_T(store, "lm_head.weight", d, cfg.vocab_size, dtype)
    return Weights(tok_embed=tok, blocks=[block(i) for i in range(cfg.n_layers)], final_norm=rms("norm"),
                   W_vocab=W_vocab)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a Phi3ForCausalLM with these knobs (transformers 5's rope_parameters)."""
    factor = (cfg.rotary_dim or cfg.d_head) / cfg.d_head
    rope = {"rope_type": "default"} if cfg.rope_scaling is None else dict(cfg.rope_scaling)
    hf = {
        "model_type": "phi3", "architectures": ["Phi3ForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "rms_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "sliding_window": cfg.sliding_window,
        "rope_parameters": {**rope, "rope_theta": cfg.rope_theta, "partial_rotary_factor": factor},
        "tie_word_embeddings": cfg.tied_embeddings, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }
    if cfg.d_head != cfg.d_model // cfg.n_heads:
        hf["head_dim"] = cfg.d_head
    if cfg.rope_scaling is not None:
        hf["original_max_position_embeddings"] = cfg.rope_scaling["original_max_position_embeddings"]
    return reads_back(cfg, hf, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under Phi3ForCausalLM's names, as its file stores it (Linear: (out, in); Q, K, V and gate, up
    stacked by rows); new arrays. Tied: no lm_head."""
    t = {"model.embed_tokens.weight": weights.tok_embed}                      # (V, d)
    for i, b in enumerate(weights.blocks):
        p, a, f = f"model.layers.{i}", b.attn, b.ffn
        t |= {
            f"{p}.input_layernorm.weight": b.attn_norm.weight,
            f"{p}.self_attn.qkv_proj.weight": np.concatenate([a.W_Q.T, a.W_K.T, a.W_V.T]),   # (H·d_k + 2·Hkv·d_k, d)
            f"{p}.self_attn.o_proj.weight": a.W_O.T,                                        # (d, H·d_k)
            f"{p}.post_attention_layernorm.weight": b.ffn_norm.weight,
            f"{p}.mlp.gate_up_proj.weight": np.concatenate([f.W_gate.T, f.W_in.T]),         # (2·d_ff, d)
            f"{p}.mlp.down_proj.weight": f.W_out.T,                                         # (d, d_ff)
        }
    t["model.norm.weight"] = weights.final_norm.weight
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T                                # (V, d)
    return c_arrays(t)
