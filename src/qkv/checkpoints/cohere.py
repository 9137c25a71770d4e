"""Cohere (Command-R): one bias-free LayerNorm read by both parallel branches, interleaved RoPE, SwiGLU,
optional q/k LayerNorms with weights per head, a tied head and logits × logit_scale.

    checkpoint name (relative to CohereModel)    qkv name
    embed_tokens                                 tok_embed
    layers.{i}.input_layernorm                   attn_norm (LayerNorm without β, read by attention and the FFN)
    layers.{i}.self_attn.q_proj/k_proj/v_proj    W_Q / W_K / W_V (biases with attention_bias)
    layers.{i}.self_attn.o_proj                  W_O (a bias with attention_bias)
    layers.{i}.self_attn.q_norm / k_norm         q_norm / k_norm (use_qk_norm): LayerNorm of each head's d_k,
                                                 γ (H, d_k) / (Hkv, d_k), one row per head (as StableLM's)
    layers.{i}.mlp.gate_proj / up_proj           W_gate / W_in: SiLU(x·W_gate) ⊙ x·W_in
    layers.{i}.mlp.down_proj                     W_out
    norm                                         final_norm (LayerNorm without β)
    lm_head (absent when tied)                   W_vocab

A block: x + Attn(Norm(x)) + FFN(Norm(x)) (`parallel_residual`, ffn_norm None); RoPE over all of each head
by pairs (0, 1), (2, 3), … (`rope_interleaved`); logits = H·W_vocab·logit_scale (`logit_scale`).
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import BlockWeights, FFNWeights, NormWeights, Weights
from .common import (HF_ACTIVATIONS, attention_linears, activation, c_arrays, check_shapes, linear_T, need, reads_back,
                     ROTARY_BUFFERS)
from .tensors import TensorStore

# Tensors a Cohere checkpoint may hold that qkv never reads ({i}: a layer), relative to CohereModel.
IGNORED = ROTARY_BUFFERS


def _rope(hf: dict) -> tuple[float, dict | None]:
    """rope_theta and rope_scaling, from transformers 5's rope_parameters or the older keys."""
    params = hf.get("rope_parameters") or {}
    if params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise QkvError("Cohere with partial_rotary_factor ≠ 1 is not what transformers' CohereForCausalLM runs "
                       "(it turns all of each head); restore the checkpoint's config.json")
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    return float(theta), scaling


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    theta, scaling = _rope(hf)
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        family="cohere", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, d_head=hf.get("head_dim") or d // H,
        d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 8192), causal=True,
        norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_eps", 1e-5),
        position="rope", rope_theta=theta, rope_scaling=scaling, rope_interleaved=True, parallel_residual=True,
        qk_norm="head" if hf.get("use_qk_norm", False) else None,
        activation=activation(hf.get("hidden_act", "silu")), gated_ffn=True,
        qkv_bias=bias, out_bias=bias, ffn_bias=False, logit_scale=float(hf.get("logit_scale", 0.0625)),
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_embedding_frozen=True,                                          # nn.Embedding's padding_idx
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f, dk = cfg.d_model, cfg.d_ff, cfg.d_head
    hq, hkv = cfg.n_heads * dk, cfg.n_kv_heads * dk

    def norm(name: str, shape: tuple[int, ...] = (d,)) -> NormWeights:    # LayerNorm with no β
        return NormWeights(store.get(f"{name}.weight", shape, dtype))

    def block(i: int) -> BlockWeights:
        p, a, m = f"layers.{i}", f"layers.{i}.self_attn", f"layers.{i}.mlp"
        attn = attention_linears(store, a, d, hq, hkv, dtype, cfg.qkv_bias, cfg.qkv_bias)
        if cfg.qk_norm:                                   # γ per head (H, d_k): head h normalised by its row
            attn.q_norm, attn.k_norm = norm(f"{a}.q_norm", (cfg.n_heads, dk)), norm(f"{a}.k_norm", (cfg.n_kv_heads, dk))
        ffn = FFNWeights(W_gate=linear_T(store, f"{m}.gate_proj.weight", d, f, dtype),
                         W_in=linear_T(store, f"{m}.up_proj.weight", d, f, dtype),
                         W_out=linear_T(store, f"{m}.down_proj.weight", f, d, dtype))
        return BlockWeights(attn_norm=norm(f"{p}.input_layernorm"), attn=attn, ffn_norm=None, ffn=ffn)

    tok = store.get("embed_tokens.weight", (cfg.vocab_size, d), dtype)
    W_vocab = tok.T if cfg.tied_embeddings and not store.has("lm_head.weight") else \
        linear_T(store, "lm_head.weight", d, cfg.vocab_size, dtype)
    return Weights(tok_embed=tok, blocks=[block(i) for i in range(cfg.n_layers)], final_norm=norm("norm"),
                   W_vocab=W_vocab)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a CohereForCausalLM with these knobs."""
    rope = {"rope_type": "default"} if cfg.rope_scaling is None else dict(cfg.rope_scaling)
    return reads_back(cfg, {
        "model_type": "cohere", "architectures": ["CohereForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.d_head,
        "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_positions, "layer_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "use_qk_norm": cfg.qk_norm == "head",
        "rope_parameters": {**rope, "rope_theta": cfg.rope_theta}, "attention_bias": cfg.qkv_bias,
        "logit_scale": cfg.logit_scale, "tie_word_embeddings": cfg.tied_embeddings, "attention_dropout": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under CohereForCausalLM's names, as its file stores it (Linear: (out, in); q/k norms
    (H, d_k)); new arrays. Tied: no lm_head (W_vocab is embed_tokens)."""
    t = {"model.embed_tokens.weight": weights.tok_embed}                       # (V, d)
    for i, b in enumerate(weights.blocks):
        p, a, f = f"model.layers.{i}", b.attn, b.ffn
        t |= {
            f"{p}.input_layernorm.weight": b.attn_norm.weight,
            f"{p}.self_attn.q_proj.weight": a.W_Q.T, f"{p}.self_attn.q_proj.bias": a.b_Q,
            f"{p}.self_attn.k_proj.weight": a.W_K.T, f"{p}.self_attn.k_proj.bias": a.b_K,
            f"{p}.self_attn.v_proj.weight": a.W_V.T, f"{p}.self_attn.v_proj.bias": a.b_V,
            f"{p}.self_attn.o_proj.weight": a.W_O.T, f"{p}.self_attn.o_proj.bias": a.b_O,
            f"{p}.mlp.gate_proj.weight": f.W_gate.T, f"{p}.mlp.up_proj.weight": f.W_in.T,
            f"{p}.mlp.down_proj.weight": f.W_out.T,
        }
        for name, w in (("q_norm", a.q_norm), ("k_norm", a.k_norm)):
            if w is not None:
                t[f"{p}.self_attn.{name}.weight"] = w.weight                   # (H, d_k)
    t["model.norm.weight"] = weights.final_norm.weight
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T                                # (V, d)
    return c_arrays(t)
