"""StarCoder2: pre-norm LayerNorm with biases, RoPE, GQA, a plain (not gated) GELU FFN, a sliding window.

    checkpoint name (relative to Starcoder2Model)   qkv name
    embed_tokens                                    tok_embed
    layers.{i}.input_layernorm                      attn_norm (LayerNorm with bias, before attention)
    layers.{i}.self_attn.q_proj/k_proj/v_proj       W_Q / W_K / W_V (use_bias: with biases)
    layers.{i}.self_attn.o_proj                     W_O (use_bias: with its bias)
    layers.{i}.post_attention_layernorm             ffn_norm
    layers.{i}.mlp.c_fc / c_proj                    W_in / W_out: act(x·W_in + b_in)·W_out + b_out
    norm                                            final_norm (LayerNorm)
    lm_head (absent when tied)                      W_vocab

Knobs: norm_epsilon (every LayerNorm's), use_bias (all six linear maps), hidden_act (gelu_pytorch_tanh),
sliding_window (every layer: each query sees its last `sliding_window` keys), tie_word_embeddings.
residual_dropout, embedding_dropout and attention_dropout are training's: qkv runs the model in eval.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import BlockWeights, FFNWeights, NormWeights, Weights
from .common import (HF_ACTIVATIONS, attention_linears, activation, c_arrays, check_shapes, linear_T, longrope_scaling,
                     need, partial_rope, reads_back, ROTARY_BUFFERS)
from .tensors import TensorStore

# Tensors a StarCoder2 checkpoint may hold that qkv never reads ({i}: a layer), relative to Starcoder2Model.
IGNORED = ROTARY_BUFFERS


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    d_head = hf.get("head_dim") or d // H
    theta, scaling, rotary = partial_rope(hf, d_head)
    if rotary is not None:          # Starcoder2Attention turns all of q, k with cos, sin of the narrower width
        raise QkvError("starcoder2 with partial_rotary_factor < 1 does not run in transformers either; "
                       "restore the checkpoint's config.json")
    bias = bool(hf.get("use_bias", True))
    return ModelConfig(
        family="starcoder2", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, d_head=d_head, d_ff=need(hf, "intermediate_size"),
        max_positions=hf.get("max_position_embeddings", 4096), causal=True, norm="layer", norm_place="pre",
        norm_eps=hf.get("norm_epsilon", 1e-5), position="rope", rope_theta=theta,
        rope_scaling=longrope_scaling(hf, scaling, rotary or d_head),
        activation=activation(hf.get("hidden_act", "gelu_pytorch_tanh")), gated_ffn=False,
        qkv_bias=bias, out_bias=bias, ffn_bias=bias, tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        final_norm=True, lm_head=True, sliding_window=hf.get("sliding_window"), pad_token_id=hf.get("pad_token_id"),
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"), pad_embedding_frozen=True,
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f = cfg.d_model, cfg.d_ff
    hq, hkv = cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head

    def norm(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype), store.get(f"{name}.bias", (d,), dtype))

    def bias(name: str, size: int):
        return store.get(name, (size,), dtype) if cfg.qkv_bias else None

    def block(i: int) -> BlockWeights:
        p, a, m = f"layers.{i}", f"layers.{i}.self_attn", f"layers.{i}.mlp"
        attn = attention_linears(store, a, d, hq, hkv, dtype, cfg.qkv_bias, cfg.qkv_bias)
        ffn = FFNWeights(W_in=linear_T(store, f"{m}.c_fc.weight", d, f, dtype), b_in=bias(f"{m}.c_fc.bias", f),
                         W_out=linear_T(store, f"{m}.c_proj.weight", f, d, dtype), b_out=bias(f"{m}.c_proj.bias", d))
        return BlockWeights(attn_norm=norm(f"{p}.input_layernorm"), attn=attn,
                            ffn_norm=norm(f"{p}.post_attention_layernorm"), ffn=ffn)

    tok = store.get("embed_tokens.weight", (cfg.vocab_size, d), dtype)
    W_vocab = tok.T if cfg.tied_embeddings and not store.has("lm_head.weight") else \
        linear_T(store, "lm_head.weight", d, cfg.vocab_size, dtype)
    return Weights(tok_embed=tok, blocks=[block(i) for i in range(cfg.n_layers)], final_norm=norm("norm"),
                   W_vocab=W_vocab)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a Starcoder2ForCausalLM with these knobs (transformers 5's rope_parameters)."""
    rope = {"rope_type": "default"} if cfg.rope_scaling is None else dict(cfg.rope_scaling)
    hf = {
        "model_type": "starcoder2", "architectures": ["Starcoder2ForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "norm_epsilon": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "use_bias": cfg.qkv_bias, "sliding_window": cfg.sliding_window,
        "rope_parameters": {**rope, "rope_theta": cfg.rope_theta}, "tie_word_embeddings": cfg.tied_embeddings,
        "residual_dropout": 0.0, "embedding_dropout": 0.0, "attention_dropout": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }
    if cfg.d_head != cfg.d_model // cfg.n_heads:
        hf["head_dim"] = cfg.d_head
    return reads_back(cfg, hf, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under Starcoder2ForCausalLM's names, as its file stores it (Linear: (out, in)); new arrays."""
    t = {"model.embed_tokens.weight": weights.tok_embed}                      # (V, d)
    for i, b in enumerate(weights.blocks):
        p, a, f = f"model.layers.{i}", b.attn, b.ffn
        t |= {
            f"{p}.input_layernorm.weight": b.attn_norm.weight, f"{p}.input_layernorm.bias": b.attn_norm.bias,
            f"{p}.self_attn.q_proj.weight": a.W_Q.T, f"{p}.self_attn.q_proj.bias": a.b_Q,
            f"{p}.self_attn.k_proj.weight": a.W_K.T, f"{p}.self_attn.k_proj.bias": a.b_K,
            f"{p}.self_attn.v_proj.weight": a.W_V.T, f"{p}.self_attn.v_proj.bias": a.b_V,
            f"{p}.self_attn.o_proj.weight": a.W_O.T, f"{p}.self_attn.o_proj.bias": a.b_O,
            f"{p}.post_attention_layernorm.weight": b.ffn_norm.weight,
            f"{p}.post_attention_layernorm.bias": b.ffn_norm.bias,
            f"{p}.mlp.c_fc.weight": f.W_in.T, f"{p}.mlp.c_fc.bias": f.b_in,
            f"{p}.mlp.c_proj.weight": f.W_out.T, f"{p}.mlp.c_proj.bias": f.b_out,
        }
    t["model.norm.weight"], t["model.norm.bias"] = weights.final_norm.weight, weights.final_norm.bias
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T                                # (V, d)
    return c_arrays(t)
