"""BLOOM: ALiBi instead of position embeddings, a LayerNorm right after the embeddings, tanh GELU.

    checkpoint name (relative to BloomModel)          qkv name
    word_embeddings                                   tok_embed
    word_embeddings_layernorm                         embed_norm
    h.{i}.input_layernorm                             attn_norm
    h.{i}.self_attention.query_key_value              W_Q / W_K / W_V with biases: rows by head, [q | k | v]
                                                      of each head in turn (H, 3, d_k), regrouped
    h.{i}.self_attention.dense                        W_O
    h.{i}.post_attention_layernorm                    ffn_norm
    h.{i}.mlp.dense_h_to_4h / dense_4h_to_h           W_in / W_out (d_ff = 4·d_model)
    ln_f                                              final_norm
    lm_head (beside BloomModel; absent when tied)     W_vocab

Attention: S = Q·Kᵀ/√d_k + m_h·p_j (position "alibi"; BLOOM's baddbmm with beta 1: the bias unscaled),
p_j key j's position over real tokens. Knobs read and why some are not: apply_residual_connection_post_layernorm
(residual taken after the norm) is refused in one line; pretraining_tp / slow_but_exact only split W_O and
W_out into slices whose products are summed (the same product: qkv computes it whole); the dropouts are
training's (qkv runs the model in eval).
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import c_arrays, check_shapes, linear_T, need, reads_back
from .tensors import TensorStore

# Tensors a BLOOM checkpoint may hold that qkv never reads, relative to BloomModel.
IGNORED = {
    "lm_head.weight": "a stored copy of word_embeddings when tie_word_embeddings (transformers ties it too)",
}


def config(hf: dict) -> ModelConfig:
    if hf.get("apply_residual_connection_post_layernorm"):
        raise QkvError("bloom with apply_residual_connection_post_layernorm=true (the residual taken after the "
                       "norm) is not supported; use a checkpoint with it false, as every released BLOOM")
    d = hf.get("hidden_size", hf.get("n_embed"))
    if d is None:
        need(hf, "hidden_size")
    H = need(hf, "n_head") if "n_head" in hf else need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    return ModelConfig(
        family="bloom", vocab_size=need(hf, "vocab_size"), d_model=d,
        n_layers=hf["n_layer"] if "n_layer" in hf else need(hf, "num_hidden_layers"), n_heads=H, d_ff=4 * d,
        max_positions=hf.get("max_position_embeddings", 2048),    # ALiBi has no table; a bound for qkv's checks
        causal=True, norm="layer", norm_place="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        position="alibi", activation="gelu_tanh", gated_ffn=False, qkv_bias=True, out_bias=True, ffn_bias=True,
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)), embed_norm=True, final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


def fused_qkv(store: TensorStore, name: str, H: int, dk: int, d: int, dtype, bias: bool = True
              ) -> tuple[np.ndarray, ...]:
    """W_Q, W_K, W_V (d, H·d_k) and b_Q, b_K, b_V of a fused Linear whose rows are head by head [q | k | v]
    (BLOOM, Falcon's multi-head layout, GPT-NeoX): (3·H·d_k, d) viewed (H, 3, d_k, d), each third copied out."""
    qkv = store.get(f"{name}.weight", (3 * H * dk, d), dtype).reshape(H, 3, dk, d)    # rows by head
    W = [np.ascontiguousarray(qkv[:, j].reshape(H * dk, d).T) for j in range(3)]      # (d, H·d_k) each
    b = [None] * 3
    if bias:
        qkv_b = store.get(f"{name}.bias", (3 * H * dk,), dtype).reshape(H, 3, dk)
        b = [np.ascontiguousarray(qkv_b[:, j].reshape(H * dk)) for j in range(3)]   # (H·d_k,) each
    return (*W, *b)


def fused_qkv_tensors(a: AttentionWeights, H: int, dk: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The fused (3·H·d_k, d) weight and (3·H·d_k,) bias of `fused_qkv`, back in its rows by head."""
    d = a.W_Q.shape[0]
    W = np.stack([M.T.reshape(H, dk, d) for M in (a.W_Q, a.W_K, a.W_V)], axis=1).reshape(3 * H * dk, d)
    b = None if a.b_Q is None else np.stack([x.reshape(H, dk) for x in (a.b_Q, a.b_K, a.b_V)], axis=1).reshape(-1)
    return W, b


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f, H, dk = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.d_head

    def norm(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype), store.get(f"{name}.bias", (d,), dtype))

    def block(i: int) -> BlockWeights:
        p, a, m = f"h.{i}", f"h.{i}.self_attention", f"h.{i}.mlp"
        W_Q, W_K, W_V, b_Q, b_K, b_V = fused_qkv(store, f"{a}.query_key_value", H, dk, d, dtype)
        attn = AttentionWeights(W_Q=W_Q, W_K=W_K, W_V=W_V, b_Q=b_Q, b_K=b_K, b_V=b_V,
                                W_O=linear_T(store, f"{a}.dense.weight", d, d, dtype),
                                b_O=store.get(f"{a}.dense.bias", (d,), dtype))
        ffn = FFNWeights(
            W_in=linear_T(store, f"{m}.dense_h_to_4h.weight", d, f, dtype), b_in=store.get(f"{m}.dense_h_to_4h.bias", (f,), dtype),
            W_out=linear_T(store, f"{m}.dense_4h_to_h.weight", f, d, dtype), b_out=store.get(f"{m}.dense_4h_to_h.bias", (d,), dtype),
        )
        return BlockWeights(attn_norm=norm(f"{p}.input_layernorm"), attn=attn,
                            ffn_norm=norm(f"{p}.post_attention_layernorm"), ffn=ffn)

    tok = store.get("word_embeddings.weight", (cfg.vocab_size, d), dtype)
    W_vocab = tok.T if cfg.tied_embeddings else linear_T(store, "lm_head.weight", d, cfg.vocab_size, dtype)
    return Weights(tok_embed=tok, embed_norm=norm("word_embeddings_layernorm"),
                   blocks=[block(i) for i in range(cfg.n_layers)], final_norm=norm("ln_f"), W_vocab=W_vocab)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a BloomForCausalLM with these knobs."""
    return reads_back(cfg, {
        "model_type": "bloom", "architectures": ["BloomForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
        "layer_norm_epsilon": cfg.norm_eps, "apply_residual_connection_post_layernorm": False,
        "tie_word_embeddings": cfg.tied_embeddings, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "pretraining_tp": 1, "slow_but_exact": False, "max_position_embeddings": cfg.max_positions,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under BloomForCausalLM's names, as its file stores it (Linear: (out, in); Q, K, V rows
    regrouped by head); new arrays. Tied: no lm_head."""
    t = {"transformer.word_embeddings.weight": weights.tok_embed,                            # (V, d)
         "transformer.word_embeddings_layernorm.weight": weights.embed_norm.weight,
         "transformer.word_embeddings_layernorm.bias": weights.embed_norm.bias}
    for i, b in enumerate(weights.blocks):
        p, a, f = f"transformer.h.{i}", b.attn, b.ffn
        W, bias = fused_qkv_tensors(a, cfg.n_heads, cfg.d_head)
        t |= {
            f"{p}.input_layernorm.weight": b.attn_norm.weight, f"{p}.input_layernorm.bias": b.attn_norm.bias,
            f"{p}.self_attention.query_key_value.weight": W, f"{p}.self_attention.query_key_value.bias": bias,
            f"{p}.self_attention.dense.weight": a.W_O.T, f"{p}.self_attention.dense.bias": a.b_O,
            f"{p}.post_attention_layernorm.weight": b.ffn_norm.weight,
            f"{p}.post_attention_layernorm.bias": b.ffn_norm.bias,
            f"{p}.mlp.dense_h_to_4h.weight": f.W_in.T, f"{p}.mlp.dense_h_to_4h.bias": f.b_in,
            f"{p}.mlp.dense_4h_to_h.weight": f.W_out.T, f"{p}.mlp.dense_4h_to_h.bias": f.b_out,
        }
    t |= {"transformer.ln_f.weight": weights.final_norm.weight, "transformer.ln_f.bias": weights.final_norm.bias}
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T                                              # (V, d)
    return c_arrays(t)
