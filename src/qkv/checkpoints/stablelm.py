"""StableLM (StableLM-2, StableLM-3B-4E1T, StableCode): pre-norm LayerNorm, partial RoPE, SwiGLU, GQA, optional
q/k LayerNorms of each head's own and a parallel residual.

    checkpoint name (relative to StableLmModel)     qkv name
    embed_tokens                                    tok_embed
    layers.{i}.input_layernorm                      attn_norm (LayerNorm, before attention; in a parallel block
                                                    read by both branches)
    layers.{i}.self_attn.q_proj/k_proj/v_proj       W_Q / W_K / W_V (use_qkv_bias: with biases)
    layers.{i}.self_attn.q_layernorm.norms.{h}      q_norm: row h of its weight (H, d_k), head h's LayerNorm
    layers.{i}.self_attn.k_layernorm.norms.{h}      k_norm: (Hkv, d_k) (qk_layernorm; no biases)
    layers.{i}.self_attn.o_proj                     W_O (no bias)
    layers.{i}.post_attention_layernorm             ffn_norm (absent in a parallel block)
    layers.{i}.mlp.gate_proj / up_proj / down_proj  W_gate / W_in / W_out: SiLU(x·W_gate) ⊙ x·W_in, then ·W_out
    norm                                            final_norm
    lm_head (absent when tied)                      W_vocab

Knobs: RoPE over the first d_head·partial_rotary_factor numbers of each head (default 0.25, `rotary_dim`);
use_parallel_residual: x + Attn(Norm(x)) + FFN(Norm(x)), one norm read by both (`parallel_residual`, as Phi);
qk_layernorm: each head's q and k normalised over d_k by a LayerNorm of that head's own (qk_norm "head",
weights (H, d_k)). hidden_dropout and attention_dropout are training's.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import BlockWeights, FFNWeights, NormWeights, Weights
from .common import (HF_ACTIVATIONS, attention_linears, activation, c_arrays, check_shapes, linear_T, longrope_scaling,
                     need, partial_rope, reads_back, ROTARY_BUFFERS)
from .tensors import TensorStore

# Tensors a StableLM checkpoint may hold that qkv never reads ({i}: a layer), relative to StableLmModel.
IGNORED = ROTARY_BUFFERS


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes({k: v for k, v in hf.items() if k != "head_dim"}, d, H)   # StableLmAttention: d_k = d_model / H
    theta, scaling, rotary = partial_rope(hf, d // H, default_factor=0.25)
    return ModelConfig(
        family="stablelm", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, d_ff=need(hf, "intermediate_size"),
        max_positions=hf.get("max_position_embeddings", 4096), causal=True, norm="layer", norm_place="pre",
        norm_eps=hf.get("layer_norm_eps", 1e-5), position="rope", rope_theta=theta,
        rope_scaling=longrope_scaling(hf, scaling, rotary or d // H),
        rotary_dim=rotary, parallel_residual=bool(hf.get("use_parallel_residual", False)),
        qk_norm="head" if hf.get("qk_layernorm", False) else None, activation=activation(hf.get("hidden_act", "silu")),
        gated_ffn=True, qkv_bias=bool(hf.get("use_qkv_bias", False)), out_bias=False, ffn_bias=False,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_embedding_frozen=True,
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f, dk = cfg.d_model, cfg.d_ff, cfg.d_head
    hq, hkv = cfg.n_heads * dk, cfg.n_kv_heads * dk

    def norm(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype), store.get(f"{name}.bias", (d,), dtype))

    def per_head(name: str, heads: int) -> NormWeights:                  # one LayerNorm (no bias) per head
        return NormWeights(np.stack([store.get(f"{name}.norms.{h}.weight", (dk,), dtype) for h in range(heads)]))

    def block(i: int) -> BlockWeights:
        p, a, m = f"layers.{i}", f"layers.{i}.self_attn", f"layers.{i}.mlp"
        attn = attention_linears(store, a, d, hq, hkv, dtype, cfg.qkv_bias, False)
        if cfg.qk_norm:                                                   # (H, d_k), (Hkv, d_k)
            attn.q_norm, attn.k_norm = per_head(f"{a}.q_layernorm", cfg.n_heads), per_head(f"{a}.k_layernorm", cfg.n_kv_heads)
        ffn = FFNWeights(W_gate=linear_T(store, f"{m}.gate_proj.weight", d, f, dtype),
                         W_in=linear_T(store, f"{m}.up_proj.weight", d, f, dtype),
                         W_out=linear_T(store, f"{m}.down_proj.weight", f, d, dtype))
        return BlockWeights(attn_norm=norm(f"{p}.input_layernorm"), attn=attn,
                            ffn_norm=None if cfg.parallel_residual else norm(f"{p}.post_attention_layernorm"), ffn=ffn)

    tok = store.get("embed_tokens.weight", (cfg.vocab_size, d), dtype)
    W_vocab = tok.T if cfg.tied_embeddings and not store.has("lm_head.weight") else \
        linear_T(store, "lm_head.weight", d, cfg.vocab_size, dtype)
    return Weights(tok_embed=tok, blocks=[block(i) for i in range(cfg.n_layers)], final_norm=norm("norm"),
                   W_vocab=W_vocab)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a StableLmForCausalLM with these knobs (transformers 5's rope_parameters)."""
    factor = (cfg.rotary_dim or cfg.d_head) / cfg.d_head
    rope = {"rope_type": "default"} if cfg.rope_scaling is None else dict(cfg.rope_scaling)
    return reads_back(cfg, {
        "model_type": "stablelm", "architectures": ["StableLmForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "layer_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "use_qkv_bias": cfg.qkv_bias, "qk_layernorm": cfg.qk_norm == "head",
        "use_parallel_residual": cfg.parallel_residual,
        "rope_parameters": {**rope, "rope_theta": cfg.rope_theta, "partial_rotary_factor": factor},
        "partial_rotary_factor": factor, "tie_word_embeddings": cfg.tied_embeddings,
        "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under StableLmForCausalLM's names, as its file stores it (Linear: (out, in); each head's
    q/k LayerNorm under its own name); new arrays. Tied: no lm_head."""
    t = {"model.embed_tokens.weight": weights.tok_embed}                      # (V, d)
    for i, b in enumerate(weights.blocks):
        p, a, f = f"model.layers.{i}", b.attn, b.ffn
        t |= {
            f"{p}.input_layernorm.weight": b.attn_norm.weight, f"{p}.input_layernorm.bias": b.attn_norm.bias,
            f"{p}.self_attn.q_proj.weight": a.W_Q.T, f"{p}.self_attn.q_proj.bias": a.b_Q,
            f"{p}.self_attn.k_proj.weight": a.W_K.T, f"{p}.self_attn.k_proj.bias": a.b_K,
            f"{p}.self_attn.v_proj.weight": a.W_V.T, f"{p}.self_attn.v_proj.bias": a.b_V,
            f"{p}.self_attn.o_proj.weight": a.W_O.T,
            f"{p}.mlp.gate_proj.weight": f.W_gate.T, f"{p}.mlp.up_proj.weight": f.W_in.T,
            f"{p}.mlp.down_proj.weight": f.W_out.T,
        }
        if b.ffn_norm is not None:
            t |= {f"{p}.post_attention_layernorm.weight": b.ffn_norm.weight,
                  f"{p}.post_attention_layernorm.bias": b.ffn_norm.bias}
        for name, w in (("q_layernorm", a.q_norm), ("k_layernorm", a.k_norm)):
            if w is not None:
                t |= {f"{p}.self_attn.{name}.norms.{h}.weight": g for h, g in enumerate(w.weight)}   # (d_k,) each
    t["model.norm.weight"], t["model.norm.bias"] = weights.final_norm.weight, weights.final_norm.bias
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T                                # (V, d)
    return c_arrays(t)
