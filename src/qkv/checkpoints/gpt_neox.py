"""GPT-NeoX (Pythia): pre-norm LayerNorm, partial RoPE, a parallel residual, one fused Q/K/V per head.

    checkpoint name (relative to GPTNeoXModel)     qkv name
    embed_in                                       tok_embed
    layers.{i}.input_layernorm                     attn_norm (LayerNorm, before attention)
    layers.{i}.attention.query_key_value           [W_Q | W_K | W_V]: its rows go by head, q, k, v of
                                                   head 0, then of head 1, …: regrouped into W_Q, W_K, W_V
    layers.{i}.attention.dense                     W_O
    layers.{i}.post_attention_layernorm            ffn_norm
    layers.{i}.mlp.dense_h_to_4h / dense_4h_to_h   W_in / W_out
    final_layer_norm                               final_norm
    embed_out (beside GPTNeoXModel, no prefix)     W_vocab

Knobs: RoPE turns the first d_head·partial_rotary_factor numbers of each head (rotary_pct in older
configs; Pythia: 0.25, `rotary_dim`); use_parallel_residual (Pythia: true) computes
x + Attn(Norm₁(x)) + FFN(Norm₂(x)), both branches reading the block's input (`parallel_residual`).
Dropouts are training's: qkv runs the model as transformers does in eval.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, partial_rope, reads_back
from .tensors import TensorStore

# Tensors a GPT-NeoX checkpoint may hold that qkv never reads ({i}: a layer), relative to GPTNeoXModel.
IGNORED = {
    "layers.{i}.attention.bias": "the causal mask, a buffer older transformers saved",
    "layers.{i}.attention.masked_bias": "the mask's fill value, likewise",
    "layers.{i}.attention.rotary_emb.inv_freq": "RoPE's frequencies, a buffer older transformers saved "
                                                "(qkv computes them from the rotary base)",
    "rotary_emb.inv_freq": "the same, kept once for the model",
    "embed_out.weight": "a stored copy of embed_in when tie_word_embeddings",
}


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    theta, scaling, rotary = partial_rope(hf, d // H)
    bias = bool(hf.get("attention_bias", True))
    return ModelConfig(
        family="gpt_neox", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 2048),
        causal=True, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_eps", 1e-5),
        position="rope", rope_theta=theta, rope_scaling=scaling, rotary_dim=rotary,
        parallel_residual=bool(hf.get("use_parallel_residual", True)),
        activation=activation(hf.get("hidden_act", "gelu")), gated_ffn=False,
        qkv_bias=bias, out_bias=bias, ffn_bias=True,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f, H, dk = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.d_head

    def norm(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype), store.get(f"{name}.bias", (d,), dtype))

    def block(i: int) -> BlockWeights:
        p = f"layers.{i}"
        a = f"{p}.attention"
        qkv = store.get(f"{a}.query_key_value.weight", (3 * d, d), dtype).reshape(H, 3, dk, d)   # rows by head
        W_Q, W_K, W_V = (np.ascontiguousarray(qkv[:, j].reshape(H * dk, d).T) for j in range(3))   # (d, H·d_k)
        b_Q = b_K = b_V = None
        if cfg.qkv_bias:
            qkv_b = store.get(f"{a}.query_key_value.bias", (3 * d,), dtype).reshape(H, 3, dk)
            b_Q, b_K, b_V = (np.ascontiguousarray(qkv_b[:, j].reshape(H * dk)) for j in range(3))
        attn = AttentionWeights(W_Q=W_Q, W_K=W_K, W_V=W_V, b_Q=b_Q, b_K=b_K, b_V=b_V,
                                W_O=linear_T(store, f"{a}.dense.weight", d, d, dtype),
                                b_O=store.get(f"{a}.dense.bias", (d,), dtype) if cfg.out_bias else None)
        m = f"{p}.mlp"
        ffn = FFNWeights(
            W_in=linear_T(store, f"{m}.dense_h_to_4h.weight", d, f, dtype), b_in=store.get(f"{m}.dense_h_to_4h.bias", (f,), dtype),
            W_out=linear_T(store, f"{m}.dense_4h_to_h.weight", f, d, dtype), b_out=store.get(f"{m}.dense_4h_to_h.bias", (d,), dtype),
        )
        return BlockWeights(attn_norm=norm(f"{p}.input_layernorm"), attn=attn,
                            ffn_norm=norm(f"{p}.post_attention_layernorm"), ffn=ffn)

    tok = store.get("embed_in.weight", (cfg.vocab_size, d), dtype)
    if cfg.tied_embeddings:
        W_vocab = tok.T                                                  # tied: W_vocab = Eᵀ
    else:
        W_vocab = linear_T(store, "embed_out.weight", d, cfg.vocab_size, dtype)
    return Weights(tok_embed=tok, blocks=[block(i) for i in range(cfg.n_layers)], final_norm=norm("final_layer_norm"),
                   W_vocab=W_vocab)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a GPTNeoXForCausalLM with these knobs (transformers 5's rope_parameters, and
    the older rotary_pct / rotary_emb_base)."""
    factor = (cfg.rotary_dim or cfg.d_head) / cfg.d_head
    rope = {"rope_type": "default"} if cfg.rope_scaling is None else dict(cfg.rope_scaling)
    return reads_back(cfg, {
        "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "layer_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "use_parallel_residual": cfg.parallel_residual,
        "rope_parameters": {**rope, "rope_theta": cfg.rope_theta, "partial_rotary_factor": factor},
        "rotary_pct": factor, "rotary_emb_base": cfg.rope_theta, "attention_bias": cfg.qkv_bias,
        "tie_word_embeddings": cfg.tied_embeddings, "attention_dropout": 0.0, "hidden_dropout": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under GPTNeoXForCausalLM's names, as its file stores it (Linear: (out, in); Q, K, V
    rows regrouped by head); new arrays. Tied: no embed_out."""
    H, dk, d = cfg.n_heads, cfg.d_head, cfg.d_model
    t = {"gpt_neox.embed_in.weight": weights.tok_embed}                        # (V, d)
    for i, b in enumerate(weights.blocks):
        p, a, f = f"gpt_neox.layers.{i}", b.attn, b.ffn
        qkv = np.stack([W.T.reshape(H, dk, d) for W in (a.W_Q, a.W_K, a.W_V)], axis=1)   # (H, 3, d_k, d)
        t |= {
            f"{p}.input_layernorm.weight": b.attn_norm.weight, f"{p}.input_layernorm.bias": b.attn_norm.bias,
            f"{p}.attention.query_key_value.weight": qkv.reshape(3 * d, d),
            f"{p}.attention.dense.weight": a.W_O.T, f"{p}.attention.dense.bias": a.b_O,
            f"{p}.post_attention_layernorm.weight": b.ffn_norm.weight,
            f"{p}.post_attention_layernorm.bias": b.ffn_norm.bias,
            f"{p}.mlp.dense_h_to_4h.weight": f.W_in.T, f"{p}.mlp.dense_h_to_4h.bias": f.b_in,
            f"{p}.mlp.dense_4h_to_h.weight": f.W_out.T, f"{p}.mlp.dense_4h_to_h.bias": f.b_out,
        }
        if a.b_Q is not None:
            t[f"{p}.attention.query_key_value.bias"] = np.stack(
                [x.reshape(H, dk) for x in (a.b_Q, a.b_K, a.b_V)], axis=1).reshape(3 * d)
    t["gpt_neox.final_layer_norm.weight"] = weights.final_norm.weight
    t["gpt_neox.final_layer_norm.bias"] = weights.final_norm.bias
    if not cfg.tied_embeddings:
        t["embed_out.weight"] = weights.W_vocab.T                              # (V, d)
    return c_arrays(t)
