"""MPT: ALiBi with its own slopes, LayerNorms without β, no biases anywhere, erf GELU, tied head.

    checkpoint name (relative to MptModel)      qkv name
    wte                                         tok_embed
    blocks.{i}.norm_1                           attn_norm (γ only)
    blocks.{i}.attn.Wqkv  [W_Q | W_K | W_V]     split in three row blocks
    blocks.{i}.attn.out_proj                    W_O
    blocks.{i}.norm_2                           ffn_norm (γ only)
    blocks.{i}.ffn.up_proj / down_proj          W_in / W_out (d_ff = 4·d_model)
    norm_f                                      final_norm (γ only)
    lm_head (beside MptModel; absent when tied) W_vocab

Attention: S = Q·Kᵀ·softmax_scale + m_h·p_j (position "alibi"); softmax_scale None is 1/√d_k. MPT writes its
slopes as 2^(-8·(i+1)/P') over P' = 2^⌈log₂H⌉ heads, the odd-numbered first, then the even, the first H kept:
the same series as BLOOM's (alibi_slopes), which is what qkv computes; its bias m_h·(j − m + 1) differs from
m_h·p_j by a constant per row, which softmax does not see. transformers' MptModel reads few knobs: clip_qkv
(clamping Q, K, V) is refused in one line; what it never reads — expansion_ratio (its FFN is 4·d_model),
no_bias (no biases), attn_type, qk_ln, prefix_lm, alibi_bias_max, learned_pos_emb, logit_scale — qkv does
not read either, so both run the same model. Dropouts are training's.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import c_arrays, linear_T, need, reads_back
from .tensors import TensorStore

# Tensors an MPT checkpoint may hold that qkv never reads, relative to MptModel.
IGNORED = {
    "lm_head.weight": "a stored copy of wte when tie_word_embeddings (transformers ties it too)",
}


def config(hf: dict) -> ModelConfig:
    attn = hf.get("attn_config") or {}
    if attn.get("clip_qkv"):
        raise QkvError(f"mpt with attn_config.clip_qkv = {attn['clip_qkv']!r} (Q, K, V clamped) is not supported; "
                       "use a checkpoint without it")
    scale = attn.get("softmax_scale")
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0):
        raise QkvError(f"config.json attn_config.softmax_scale = {scale!r} is not a positive number; "
                       "restore the checkpoint's config.json")
    d, H = need(hf, "d_model"), need(hf, "n_heads")
    if d % H:
        raise QkvError(f"config.json: d_model {d} is not divisible by {H} heads; restore the checkpoint's config.json")
    return ModelConfig(
        family="mpt", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "n_layers"), n_heads=H,
        d_ff=4 * d, max_positions=hf.get("max_seq_len", 2048), causal=True, norm="layer", norm_place="pre",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), position="alibi",
        attn_scale=None if scale is None else float(scale), activation="gelu", gated_ffn=False,
        qkv_bias=False, out_bias=False, ffn_bias=False, tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        final_norm=True, lm_head=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f = cfg.d_model, cfg.d_ff

    def norm(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype))              # LayerNorm without β

    def block(i: int) -> BlockWeights:
        p = f"blocks.{i}"
        qkv = store.get(f"{p}.attn.Wqkv.weight", (3 * d, d), dtype)               # rows [Q | K | V]
        attn = AttentionWeights(W_Q=qkv[:d].T, W_K=qkv[d:2 * d].T, W_V=qkv[2 * d:].T,   # (d, d) views
                                W_O=linear_T(store, f"{p}.attn.out_proj.weight", d, d, dtype))
        ffn = FFNWeights(W_in=linear_T(store, f"{p}.ffn.up_proj.weight", d, f, dtype),
                         W_out=linear_T(store, f"{p}.ffn.down_proj.weight", f, d, dtype))
        return BlockWeights(attn_norm=norm(f"{p}.norm_1"), attn=attn, ffn_norm=norm(f"{p}.norm_2"), ffn=ffn)

    tok = store.get("wte.weight", (cfg.vocab_size, d), dtype)
    W_vocab = tok.T if cfg.tied_embeddings else linear_T(store, "lm_head.weight", d, cfg.vocab_size, dtype)
    return Weights(tok_embed=tok, blocks=[block(i) for i in range(cfg.n_layers)], final_norm=norm("norm_f"),
                   W_vocab=W_vocab)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an MptForCausalLM with these knobs."""
    return reads_back(cfg, {
        "model_type": "mpt", "architectures": ["MptForCausalLM"],
        "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "expansion_ratio": 4, "max_seq_len": cfg.max_positions, "layer_norm_epsilon": cfg.norm_eps,
        "attn_config": {"softmax_scale": cfg.attn_scale, "clip_qkv": None, "alibi": True,
                        "alibi_bias_max": 8, "attn_pdrop": 0},
        "no_bias": True, "tie_word_embeddings": cfg.tied_embeddings, "resid_pdrop": 0.0, "emb_pdrop": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under MptForCausalLM's names, as its file stores it (Linear: (out, in)); new arrays.
    Tied: no lm_head."""
    t = {"transformer.wte.weight": weights.tok_embed}                                        # (V, d)
    for i, b in enumerate(weights.blocks):
        p, a, f = f"transformer.blocks.{i}", b.attn, b.ffn
        t |= {
            f"{p}.norm_1.weight": b.attn_norm.weight, f"{p}.norm_2.weight": b.ffn_norm.weight,
            f"{p}.attn.Wqkv.weight": np.concatenate([a.W_Q.T, a.W_K.T, a.W_V.T]),                # (3d, d)
            f"{p}.attn.out_proj.weight": a.W_O.T,
            f"{p}.ffn.up_proj.weight": f.W_in.T, f"{p}.ffn.down_proj.weight": f.W_out.T,
        }
    t["transformer.norm_f.weight"] = weights.final_norm.weight
    if not cfg.tied_embeddings:
        t["lm_head.weight"] = weights.W_vocab.T                                                  # (V, d)
    return c_arrays(t)
