"""Falcon: a fused Q/K/V in three layouts, parallel attention and FFN, RoPE or ALiBi, biases or none.

    checkpoint name (relative to FalconModel)        qkv name
    word_embeddings                                  tok_embed
    h.{i}.input_layernorm                            attn_norm (one norm: read by both parallel branches,
                                                     ffn_norm None; or the first of a sequential block)
    h.{i}.ln_attn / ln_mlp                           attn_norm / ffn_norm (new architecture, two norms)
    h.{i}.post_attention_layernorm                   ffn_norm (sequential: parallel_attn false)
    h.{i}.self_attention.query_key_value             W_Q / W_K / W_V (b_Q, b_K, b_V with bias), rows:
        new_decoder_architecture: per K/V head g, its G query heads, then k, then v: (Hkv, G + 2, d_k)
        multi_query: the H query heads, then one k and one v: (H + 2, d_k)   (Hkv = 1)
        else: per head [q | k | v]: (H, 3, d_k)                                (Hkv = H)
    h.{i}.self_attention.dense                       W_O
    h.{i}.mlp.dense_h_to_4h / dense_4h_to_h          W_in / W_out (d_ff = ffn_hidden_size)
    ln_f                                             final_norm
    lm_head (beside FalconModel; absent when tied)   W_vocab

A block: x + Attn(Norm₁ x) + FFN(Norm₂ x) (new architecture, num_ln_in_parallel_attn 2), x + Attn(N x) + FFN(N x)
(one norm: Falcon-7B's parallel_attn, or num_ln_in_parallel_attn 1), or sequential (parallel_attn false).
Positions: RoPE (rope_parameters / rope_theta), or with alibi S = (Q·Kᵀ + m_h·p_j)/√d_k, m_h·p_j in bfloat16
as Falcon computes it (alibi_scaled, alibi_bfloat16). The three layouts are one rule: the new architecture's
rows with Hkv = 1 are multi_query's, with Hkv = H the per-head ones; `tensors` writes them so, and `hf_config`
a parallel model as the new architecture. Dropouts are training's.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .tensors import TensorStore

# Tensors a Falcon checkpoint may hold that qkv never reads, relative to FalconModel.
IGNORED = {
    "lm_head.weight": "a stored copy of word_embeddings when tie_word_embeddings (transformers ties it too)",
    "h.{i}.self_attention.rotary_emb.inv_freq": "RoPE's frequencies, a buffer older transformers saved",
}


def _layout(hf: dict, H: int) -> tuple[bool, int, bool, bool]:
    """(new architecture, K/V heads, parallel, one shared norm) of a Falcon config.json, or one error naming a
    combination transformers' FalconDecoderLayer cannot run."""
    new = bool(hf.get("new_decoder_architecture", False))
    parallel = bool(hf.get("parallel_attn", True))
    kv = hf.get("num_kv_heads") or H
    n_ln = hf.get("num_ln_in_parallel_attn")
    if n_ln not in (None, 1, 2):
        raise QkvError(f"falcon num_ln_in_parallel_attn = {n_ln} is not 1 or 2; restore the checkpoint's config.json")
    if new:
        if not parallel:
            raise QkvError("falcon with new_decoder_architecture=true and parallel_attn=false cannot run (transformers' "
                           "layer lacks its norms); use parallel_attn=true")
        if H % kv:
            raise QkvError(f"falcon num_kv_heads {kv} does not divide num_attention_heads {H}; "
                           "restore the checkpoint's config.json")
        return True, kv, True, n_ln == 1
    if n_ln == 2:
        raise QkvError("falcon num_ln_in_parallel_attn=2 needs new_decoder_architecture=true (transformers' layer "
                       "reads input_layernorm otherwise); use 1 or the new architecture")
    if hf.get("multi_query", True):
        return False, 1, parallel, parallel
    if kv != H:
        raise QkvError(f"falcon num_kv_heads {kv} ≠ num_attention_heads {H} needs new_decoder_architecture=true "
                       "(or multi_query=true for one K/V head); restore the checkpoint's config.json")
    return False, H, parallel, parallel


def config(hf: dict) -> ModelConfig:
    d = hf.get("hidden_size", hf.get("n_embed"))
    if d is None:
        need(hf, "hidden_size")
    H = hf["n_head"] if "n_head" in hf else need(hf, "num_attention_heads")
    check_shapes({}, d, H)
    _, kv, parallel, shared = _layout(hf, H)
    alibi = bool(hf.get("alibi", False))
    params = hf.get("rope_parameters") or {}
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    bias = bool(hf.get("bias", False))
    return ModelConfig(
        family="falcon", vocab_size=need(hf, "vocab_size"), d_model=d,
        n_layers=hf["n_layer"] if "n_layer" in hf else need(hf, "num_hidden_layers"), n_heads=H, n_kv_heads=kv,
        d_ff=hf.get("ffn_hidden_size") or 4 * d, max_positions=hf.get("max_position_embeddings", 2048),
        causal=True, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="alibi" if alibi else "rope", rope_theta=float(theta), rope_scaling=None if alibi else scaling,
        alibi_scaled=alibi, alibi_bfloat16=alibi, parallel_residual=parallel, shared_norm=shared,
        activation=activation(hf.get("activation", "gelu")), gated_ffn=False,
        qkv_bias=bias, out_bias=bias, ffn_bias=bias,
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)), final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f, H, Hkv, dk = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    G = H // Hkv

    def norm(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype), store.get(f"{name}.bias", (d,), dtype))

    def bias(name: str, size: int) -> np.ndarray | None:
        return store.get(name, (size,), dtype) if cfg.qkv_bias else None

    def block(i: int) -> BlockWeights:
        p, a, m = f"h.{i}", f"h.{i}.self_attention", f"h.{i}.mlp"
        qkv = store.get(f"{a}.query_key_value.weight", ((H + 2 * Hkv) * dk, d), dtype).reshape(Hkv, G + 2, dk, d)
        W_Q = np.ascontiguousarray(qkv[:, :G].reshape(H * dk, d).T)                   # (d, H·d_k)
        W_K, W_V = (np.ascontiguousarray(qkv[:, j].reshape(Hkv * dk, d).T) for j in (G, G + 1))   # (d, Hkv·d_k)
        b_Q = b_K = b_V = None
        if cfg.qkv_bias:
            qkv_b = bias(f"{a}.query_key_value.bias", (H + 2 * Hkv) * dk).reshape(Hkv, G + 2, dk)
            b_Q = np.ascontiguousarray(qkv_b[:, :G].reshape(H * dk))
            b_K, b_V = (np.ascontiguousarray(qkv_b[:, j].reshape(Hkv * dk)) for j in (G, G + 1))
        attn = AttentionWeights(W_Q=W_Q, W_K=W_K, W_V=W_V, b_Q=b_Q, b_K=b_K, b_V=b_V,
                                W_O=linear_T(store, f"{a}.dense.weight", H * dk, d, dtype), b_O=bias(f"{a}.dense.bias", d))
        ffn = FFNWeights(W_in=linear_T(store, f"{m}.dense_h_to_4h.weight", d, f, dtype), b_in=bias(f"{m}.dense_h_to_4h.bias", f),
                         W_out=linear_T(store, f"{m}.dense_4h_to_h.weight", f, d, dtype), b_out=bias(f"{m}.dense_4h_to_h.bias", d))
        if not cfg.parallel_residual:
            return BlockWeights(attn_norm=norm(f"{p}.input_layernorm"), attn=attn,
                                ffn_norm=norm(f"{p}.post_attention_layernorm"), ffn=ffn)
        if cfg.shared_norm:
            return BlockWeights(attn_norm=norm(f"{p}.input_layernorm"), attn=attn, ffn_norm=None, ffn=ffn)
        return BlockWeights(attn_norm=norm(f"{p}.ln_attn"), attn=attn, ffn_norm=norm(f"{p}.ln_mlp"), ffn=ffn)

    tok = store.get("word_embeddings.weight", (cfg.vocab_size, d), dtype)
    W_vocab = tok.T if cfg.tied_embeddings else linear_T(store, "lm_head.weight", d, cfg.vocab_size, dtype)
    return Weights(tok_embed=tok, blocks=[block(i) for i in range(cfg.n_layers)], final_norm=norm("ln_f"),
                   W_vocab=W_vocab)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a FalconForCausalLM with these knobs: a parallel block as the new architecture
    (num_kv_heads, num_ln_in_parallel_attn 1 or 2), a sequential one as multi_query (one K/V head) or not."""
    if cfg.position not in ("rope", "alibi"):
        raise QkvError(f"a falcon config.json cannot hold position={cfg.position!r}; use rope or alibi")
    rope = {"rope_type": "default"} if cfg.rope_scaling is None else dict(cfg.rope_scaling)
    hf = {
        "model_type": "falcon", "architectures": ["FalconForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_kv_heads": cfg.n_kv_heads, "ffn_hidden_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "layer_norm_epsilon": cfg.norm_eps,
        "activation": HF_ACTIVATIONS[cfg.activation], "alibi": cfg.position == "alibi",
        "rope_parameters": {**rope, "rope_theta": cfg.rope_theta}, "bias": cfg.qkv_bias,
        "new_decoder_architecture": cfg.parallel_residual, "parallel_attn": cfg.parallel_residual,
        "multi_query": cfg.n_kv_heads == 1, "tie_word_embeddings": cfg.tied_embeddings,
        "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }
    if cfg.parallel_residual:
        hf["num_ln_in_parallel_attn"] = 1 if cfg.shared_norm else 2
    return reads_back(cfg, hf, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under FalconForCausalLM's names, as its file stores it (Linear: (out, in); Q/K/V rows
    grouped by K/V head: the G query heads, k, v); new arrays. Tied: no lm_head."""
    H, Hkv, dk, d = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    G = H // Hkv
    t = {"transformer.word_embeddings.weight": weights.tok_embed}                             # (V, d)
    for i, b in enumerate(weights.blocks):
        p, a, f = f"transformer.h.{i}", b.attn, b.ffn
        qkv = np.concatenate([a.W_Q.T.reshape(Hkv, G, dk, d), a.W_K.T.reshape(Hkv, 1, dk, d),
                              a.W_V.T.reshape(Hkv, 1, dk, d)], axis=1)                          # (Hkv, G + 2, d_k, d)
        t |= {
            f"{p}.self_attention.query_key_value.weight": qkv.reshape(-1, d),
            f"{p}.self_attention.dense.weight": a.W_O.T, f"{p}.self_attention.dense.bias": a.b_O,
            f"{p}.mlp.dense_h_to_4h.weight": f.W_in.T, f"{p}.mlp.dense_h_to_4h.bias": f.b_in,
            f"{p}.mlp.dense_4h_to_h.weight": f.W_out.T, f"{p}.mlp.dense_4h_to_h.bias": f.b_out,
        }
        if a.b_Q is not None:
            t[f"{p}.self_attention.query_key_value.bias"] = np.concatenate(
                [a.b_Q.reshape(Hkv, G, dk), a.b_K.reshape(Hkv, 1, dk), a.b_V.reshape(Hkv, 1, dk)], axis=1).reshape(-1)
        names = (("input_layernorm", "post_attention_layernorm") if not cfg.parallel_residual else
                 ("input_layernorm", None) if cfg.shared_norm else ("ln_attn", "ln_mlp"))
        for name, w in zip(names, (b.attn_norm, b.ffn_norm)):
            if name is not None:
                t |= {f"{p}.{name}.weight": w.weight, f"{p}.{name}.bias": w.bias}
    t |= {"transformer.ln_f.weight": weights.final_norm.weight, "transformer.ln_f.bias": weights.final_norm.bias}
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T                                                # (V, d)
    return c_arrays(t)
