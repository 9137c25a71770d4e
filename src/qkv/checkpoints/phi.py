"""Phi (Phi-1, Phi-1.5, Phi-2): one LayerNorm read by a parallel attention and FFN, partial RoPE.

    checkpoint name (relative to PhiModel)        qkv name
    embed_tokens                                  tok_embed
    layers.{i}.input_layernorm                    attn_norm, read by both branches (ffn_norm None)
    layers.{i}.self_attn.q_proj/k_proj/v_proj     W_Q / W_K / W_V, with biases
    layers.{i}.self_attn.q_layernorm/k_layernorm  q_norm / k_norm (qk_layernorm: LayerNorm of each head's q, k)
    layers.{i}.self_attn.dense                    W_O
    layers.{i}.mlp.fc1 / fc2                      W_in / W_out
    final_layernorm                               final_norm
    lm_head (weight and bias, beside PhiModel)    W_vocab, b_vocab

A block: x + Attn(Norm(x)) + FFN(Norm(x)) (`parallel_residual`, one norm); RoPE turns the first
d_head·partial_rotary_factor numbers of each head (Phi-2: 0.4, `rotary_dim`). Dropouts are training's.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import BlockWeights, FFNWeights, NormWeights, Weights
from .common import (HF_ACTIVATIONS, attention_linears, ROTARY_BUFFERS, activation, c_arrays, check_shapes, linear_T,
                     need, partial_rope, reads_back)
from .tensors import TensorStore

# Tensors a Phi checkpoint may hold that qkv never reads ({i}: a layer), relative to PhiModel.
IGNORED = ROTARY_BUFFERS


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    theta, scaling, rotary = partial_rope(hf, d // H, default_factor=0.5)
    return ModelConfig(
        family="phi", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, d_ff=need(hf, "intermediate_size"),
        max_positions=hf.get("max_position_embeddings", 2048), causal=True, norm="layer", norm_place="pre",
        norm_eps=hf.get("layer_norm_eps", 1e-5), position="rope", rope_theta=theta, rope_scaling=scaling,
        rotary_dim=rotary, parallel_residual=True, shared_norm=True,
        qk_norm="head" if hf.get("qk_layernorm", False) else None, activation=activation(hf.get("hidden_act", "gelu_new")),
        gated_ffn=False, qkv_bias=True, out_bias=True, ffn_bias=True,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f, dk = cfg.d_model, cfg.d_ff, cfg.d_head
    hq, hkv = cfg.n_heads * dk, cfg.n_kv_heads * dk

    def norm(name: str, size: int = d) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (size,), dtype), store.get(f"{name}.bias", (size,), dtype))

    def block(i: int) -> BlockWeights:
        p, a = f"layers.{i}", f"layers.{i}.self_attn"
        attn = attention_linears(store, a, d, hq, hkv, dtype, True, True, out="dense")
        if cfg.qk_norm:                                              # one LayerNorm over d_k, shared by the heads
            attn.q_norm, attn.k_norm = norm(f"{a}.q_layernorm", dk), norm(f"{a}.k_layernorm", dk)
        m = f"{p}.mlp"
        ffn = FFNWeights(W_in=linear_T(store, f"{m}.fc1.weight", d, f, dtype), b_in=store.get(f"{m}.fc1.bias", (f,), dtype),
                         W_out=linear_T(store, f"{m}.fc2.weight", f, d, dtype), b_out=store.get(f"{m}.fc2.bias", (d,), dtype))
        return BlockWeights(attn_norm=norm(f"{p}.input_layernorm"), attn=attn, ffn_norm=None, ffn=ffn)

    tok = store.get("embed_tokens.weight", (cfg.vocab_size, d), dtype)
    W_vocab = tok.T if cfg.tied_embeddings and not store.has("lm_head.weight") else \
        linear_T(store, "lm_head.weight", d, cfg.vocab_size, dtype)
    return Weights(tok_embed=tok, blocks=[block(i) for i in range(cfg.n_layers)], final_norm=norm("final_layernorm"),
                   W_vocab=W_vocab, b_vocab=store.get("lm_head.bias", (cfg.vocab_size,), dtype))


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a PhiForCausalLM with these knobs."""
    factor = (cfg.rotary_dim or cfg.d_head) / cfg.d_head
    rope = {"rope_type": "default"} if cfg.rope_scaling is None else dict(cfg.rope_scaling)
    return reads_back(cfg, {
        "model_type": "phi", "architectures": ["PhiForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "layer_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "qk_layernorm": cfg.qk_norm == "head",
        "rope_parameters": {**rope, "rope_theta": cfg.rope_theta, "partial_rotary_factor": factor},
        "tie_word_embeddings": cfg.tied_embeddings, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under PhiForCausalLM's names, as its file stores it (Linear: (out, in)); new arrays."""
    t = {"model.embed_tokens.weight": weights.tok_embed}                      # (V, d)
    for i, b in enumerate(weights.blocks):
        p, a, f = f"model.layers.{i}", b.attn, b.ffn
        t |= {
            f"{p}.input_layernorm.weight": b.attn_norm.weight, f"{p}.input_layernorm.bias": b.attn_norm.bias,
            f"{p}.self_attn.q_proj.weight": a.W_Q.T, f"{p}.self_attn.q_proj.bias": a.b_Q,
            f"{p}.self_attn.k_proj.weight": a.W_K.T, f"{p}.self_attn.k_proj.bias": a.b_K,
            f"{p}.self_attn.v_proj.weight": a.W_V.T, f"{p}.self_attn.v_proj.bias": a.b_V,
            f"{p}.self_attn.dense.weight": a.W_O.T, f"{p}.self_attn.dense.bias": a.b_O,
            f"{p}.mlp.fc1.weight": f.W_in.T, f"{p}.mlp.fc1.bias": f.b_in,
            f"{p}.mlp.fc2.weight": f.W_out.T, f"{p}.mlp.fc2.bias": f.b_out,
        }
        for name, w in (("q_layernorm", a.q_norm), ("k_layernorm", a.k_norm)):
            if w is not None:
                t |= {f"{p}.self_attn.{name}.weight": w.weight, f"{p}.self_attn.{name}.bias": w.bias}
    t |= {"model.final_layernorm.weight": weights.final_norm.weight, "model.final_layernorm.bias": weights.final_norm.bias,
          "lm_head.bias": weights.b_vocab}
    if not cfg.tied_embeddings:                                                # tied: W_vocab is embed_tokensᵀ
        t["lm_head.weight"] = weights.W_vocab.T
    return c_arrays(t)
