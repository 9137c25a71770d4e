"""ModernBERT (global layers): a pre-norm encoder with RoPE, GeGLU, LayerNorms without bias, a masked-LM head.

    checkpoint name (relative to ModernBertModel)  qkv name
    embeddings.tok_embeddings                      tok_embed (no position table: RoPE turns q and k)
    embeddings.norm                                embed_norm (β only with norm_bias)
    layers.{i}.attn_norm (none in layer 0)         attn_norm (layer 0's attention reads the embeddings' norm)
    layers.{i}.attn.Wqkv (3·d, d), rows Q | K | V  W_Q / W_K / W_V (+ b with attention_bias)
    layers.{i}.attn.Wo                             W_O
    layers.{i}.mlp_norm                            ffn_norm
    layers.{i}.mlp.Wi (2·d_ff, d), rows in | gate  W_gate = the first half (act(x·W_gate)), W_in the second
    layers.{i}.mlp.Wo                              W_out
    final_norm                                     final_norm
    head.dense, head.norm                          W_head (+ b with classifier_bias), head_norm: Norm(act(Z·W_head))
    decoder (weight absent when tied)              W_vocab (tied: tok_embedᵀ), b_vocab (decoder_bias)
Positions are 0…n−1 whatever the mask, as transformers numbers them. ModernBERT's local layers
(layer_types "sliding_attention", from global_attn_every_n_layers > 1) attend within a window that reaches
both ways — key j is seen from query i when |i − j| ≤ local_attention // 2, the engine's window
w = local_attention // 2 + 1 (|i − j| < w) — with RoPE of their own base (local_rope_theta); the global
layers see everything, with rope_theta. `hf_config` /
`tensors` write a ModernBertModel or ModernBertForMaskedLM.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .roberta import masked_lm
from .tensors import TensorStore

IGNORED = {
    "classifier.*": "a sequence or token classification head",
    "head.*": "a classification model's pooling head (ModernBertForSequenceClassification), unread without an LM head",
}


def layer_types(hf: dict) -> list:
    """Each layer's kind: config.json's layer_types, else from global_attn_every_n_layers (default 3)."""
    L = need(hf, "num_hidden_layers")
    kinds = hf.get("layer_types")
    if kinds is None:
        every = hf.get("global_attn_every_n_layers", 3)
        kinds = ["sliding_attention" if i % every else "full_attention" for i in range(L)]
    return kinds


def rope_theta(hf: dict) -> float:
    """The global layers' RoPE base: rope_parameters.full_attention.rope_theta, else global_rope_theta (160000)."""
    params = (hf.get("rope_parameters") or {}).get("full_attention") or {}
    if not isinstance(params, dict) or params.get("rope_type", "default") != "default":
        raise QkvError(f"ModernBERT rope_parameters.full_attention {params!r:.60} is not supported; only the "
                       "default RoPE is")
    return float(params.get("rope_theta", hf.get("global_rope_theta", 160000.0)))


def local_rope_theta(hf: dict) -> float:
    """The local layers' RoPE base: rope_parameters.sliding_attention.rope_theta, else local_rope_theta (10000)."""
    params = (hf.get("rope_parameters") or {}).get("sliding_attention") or {}
    if not isinstance(params, dict) or params.get("rope_type", "default") != "default":
        raise QkvError(f"ModernBERT rope_parameters.sliding_attention {params!r:.60} is not supported; only the "
                       "default RoPE is")
    return float(params.get("rope_theta", hf.get("local_rope_theta", 10000.0)))


def config(hf: dict) -> ModelConfig:
    d, H = need(hf, "hidden_size"), need(hf, "num_attention_heads")
    check_shapes(hf, d, H)
    kinds = layer_types(hf)
    L = need(hf, "num_hidden_layers")
    if not isinstance(kinds, list) or len(kinds) != L or any(k not in ("full_attention", "sliding_attention")
                                                             for k in kinds):
        raise QkvError(f"ModernBERT layer_types {str(kinds)[:60]} must name each of the {L} layers full_attention or "
                       "sliding_attention; restore the checkpoint's config.json")
    local = hf.get("local_attention", 128)
    if isinstance(local, bool) or not isinstance(local, int) or local < 2:
        raise QkvError(f"ModernBERT local_attention={local!r:.20} must be a whole number ≥ 2; fix the model's config")
    windows = tuple(local // 2 + 1 if k == "sliding_attention" else None for k in kinds)   # |i − j| ≤ local // 2
    if hf.get("mlp_bias", False):
        raise QkvError("ModernBERT mlp_bias=true is not supported: the GeGLU's activated half would need a bias of "
                       "its own; use a checkpoint without it")
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        family="modernbert", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "num_hidden_layers"),
        n_heads=H, d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 8192),
        causal=False, norm="layer", norm_place="pre", norm_eps=hf.get("norm_eps", 1e-5), position="rope",
        rope_theta=rope_theta(hf), activation=activation(hf.get("hidden_activation", "gelu")), gated_ffn=True,
        qkv_bias=bias, out_bias=bias, ffn_bias=False, embed_norm=True, final_norm=True,
        layer_windows=windows if any(windows) else None,
        local_rope_theta=local_rope_theta(hf) if any(windows) else None,
        lm_head=masked_lm(hf), head_activation=activation(hf.get("classifier_activation", "gelu")),
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        pad_token_id=hf.get("pad_token_id", 50283), pad_embedding_frozen=True,
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f, V = cfg.d_model, cfg.d_ff, cfg.vocab_size

    def norm(name: str) -> NormWeights:
        bias = store.get(f"{name}.bias", (d,), dtype) if store.has(f"{name}.bias") else None   # norm_bias
        return NormWeights(store.get(f"{name}.weight", (d,), dtype), bias)

    def bias(name: str, n: int) -> np.ndarray | None:
        return store.get(name, (n,), dtype) if store.has(name) else None

    def block(i: int) -> BlockWeights:
        p = f"layers.{i}"
        qkv = linear_T(store, f"{p}.attn.Wqkv.weight", d, 3 * d, dtype)           # (d, 3·d) = [W_Q | W_K | W_V]
        b = bias(f"{p}.attn.Wqkv.bias", 3 * d)
        attn = AttentionWeights(W_Q=qkv[:, :d], W_K=qkv[:, d:2 * d], W_V=qkv[:, 2 * d:],
                                W_O=linear_T(store, f"{p}.attn.Wo.weight", d, d, dtype),
                                b_Q=None if b is None else b[:d], b_K=None if b is None else b[d:2 * d],
                                b_V=None if b is None else b[2 * d:], b_O=bias(f"{p}.attn.Wo.bias", d))
        wi = linear_T(store, f"{p}.mlp.Wi.weight", d, 2 * f, dtype)                 # (d, 2·d_ff) = [in | gate]
        ffn = FFNWeights(W_gate=wi[:, :f], W_in=wi[:, f:], W_out=linear_T(store, f"{p}.mlp.Wo.weight", f, d, dtype))
        return BlockWeights(attn_norm=norm(f"{p}.attn_norm") if i > 0 else None, attn=attn,
                            ffn_norm=norm(f"{p}.mlp_norm"), ffn=ffn)

    w = Weights(tok_embed=store.get("embeddings.tok_embeddings.weight", (V, d), dtype),
                embed_norm=norm("embeddings.norm"), blocks=[block(i) for i in range(cfg.n_layers)],
                final_norm=norm("final_norm"))
    if cfg.lm_head or store.has("decoder.weight") or store.has("decoder.bias"):   # ModernBertForMaskedLM
        w.W_head, w.b_head = linear_T(store, "head.dense.weight", d, d, dtype), bias("head.dense.bias", d)
        w.head_norm = norm("head.norm")
        w.W_vocab = w.tok_embed.T if cfg.tied_embeddings and not store.has("decoder.weight") else \
            linear_T(store, "decoder.weight", d, V, dtype)
        w.b_vocab = bias("decoder.bias", V)
    return w


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a ModernBertModel (or ModernBertForMaskedLM): its layers' kinds, the local window
    and both RoPE bases."""
    windows = [cfg.window(i) for i in range(cfg.n_layers)]
    local = next((w for w in windows if w is not None), None)
    return reads_back(cfg, {
        "model_type": "modernbert", "architectures": ["ModernBertForMaskedLM" if cfg.lm_head else "ModernBertModel"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_positions,
        "norm_eps": cfg.norm_eps, "hidden_activation": HF_ACTIVATIONS[cfg.activation],
        "classifier_activation": HF_ACTIVATIONS[cfg.head_activation], "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows],
        "local_attention": 128 if local is None else 2 * (local - 1),
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
                            "sliding_attention": {"rope_type": "default",
                                                  "rope_theta": cfg.local_rope_theta or 10000.0}},
        "attention_bias": cfg.qkv_bias, "mlp_bias": False, "tie_word_embeddings": cfg.tied_embeddings,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        "attention_dropout": 0.0, "embedding_dropout": 0.0, "mlp_dropout": 0.0,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under ModernBertModel's names ("model." + them, head.* and decoder.* with a head)."""
    def norm(name: str, w: NormWeights) -> dict:
        return {f"{name}.weight": w.weight, f"{name}.bias": w.bias}

    t = {"embeddings.tok_embeddings.weight": weights.tok_embed, **norm("embeddings.norm", weights.embed_norm),
         **norm("final_norm", weights.final_norm)}
    for i, b in enumerate(weights.blocks):
        p, a, f = f"layers.{i}", b.attn, b.ffn
        t[f"{p}.attn.Wqkv.weight"] = np.concatenate([a.W_Q, a.W_K, a.W_V], axis=1).T                  # (3·d, d)
        if a.b_Q is not None:
            t[f"{p}.attn.Wqkv.bias"] = np.concatenate([a.b_Q, a.b_K, a.b_V])
        t |= {f"{p}.attn.Wo.weight": a.W_O.T, f"{p}.attn.Wo.bias": a.b_O, f"{p}.mlp.Wo.weight": f.W_out.T,
              f"{p}.mlp.Wi.weight": np.concatenate([f.W_gate, f.W_in], axis=1).T,                         # (2·d_ff, d)
              **norm(f"{p}.mlp_norm", b.ffn_norm)}
        if b.attn_norm is not None:
            t |= norm(f"{p}.attn_norm", b.attn_norm)
    if weights.W_head is None:
        return c_arrays(t)
    t = {f"model.{k}": v for k, v in t.items()}
    t |= {"head.dense.weight": weights.W_head.T, "head.dense.bias": weights.b_head, **norm("head.norm", weights.head_norm),
          "decoder.bias": weights.b_vocab}
    if not cfg.tied_embeddings:
        t["decoder.weight"] = weights.W_vocab.T
    return c_arrays(t)
