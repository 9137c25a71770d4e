"""DistilBERT: BERT's post-norm blocks under their own names, no token types, a masked-LM head.

    checkpoint name (relative to DistilBertModel)  qkv name
    embeddings.word_embeddings                     tok_embed
    embeddings.position_embeddings                 pos_embed (positions 0…n−1; with sinusoidal_pos_embds the
                                                   file holds the sinusoids the table starts from: read as
                                                   stored and learned, as transformers 5 trains it)
    embeddings.LayerNorm                           embed_norm
    transformer.layer.{i}.attention.q_lin/k_lin/v_lin/out_lin   W_Q / W_K / W_V / W_O (+ b)
    transformer.layer.{i}.sa_layer_norm            attn_norm (after the residual)
    transformer.layer.{i}.ffn.lin1 / lin2          W_in / W_out
    transformer.layer.{i}.output_layer_norm        ffn_norm (after the residual)
    vocab_transform, vocab_layer_norm              W_head, b_head, head_norm: Norm(act(Z·W_head + b))
    vocab_projector (weight absent when tied)      W_vocab (tied: tok_embedᵀ), b_vocab
Every LayerNorm has eps 1e-12 (transformers fixes it; config.json has no eps). DistilBertForMaskedLM gives
logits; DistilBertModel hidden states. `hf_config` / `tensors` write a DistilBertModel or
DistilBertForMaskedLM.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .roberta import masked_lm
from .tensors import TensorStore

EPS = 1e-12                                      # every LayerNorm of DistilBERT (not a config knob)
IGNORED = {
    "embeddings.position_ids": "the positions 0…P−1, a buffer older transformers saved",
    "pre_classifier.*": "a sequence classification head",
    "classifier.*": "a sequence or token classification head",
    "qa_outputs.*": "DistilBertForQuestionAnswering's head",
}


def config(hf: dict) -> ModelConfig:
    check_shapes(hf, need(hf, "dim"), need(hf, "n_heads"))
    act = activation(hf.get("activation", "gelu"))
    return ModelConfig(
        family="distilbert", vocab_size=need(hf, "vocab_size"), d_model=need(hf, "dim"),
        n_layers=need(hf, "n_layers"), n_heads=need(hf, "n_heads"), d_ff=need(hf, "hidden_dim"),
        max_positions=hf.get("max_position_embeddings", 512), causal=False, norm="layer", norm_place="post",
        norm_eps=EPS, position="learned",               # sinusoidal_pos_embds: only the table's first values
        activation=act, embed_norm=True, final_norm=False, lm_head=masked_lm(hf), head_activation=act,
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        pad_token_id=hf.get("pad_token_id", 0), pad_embedding_frozen=True,
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, f, V = cfg.d_model, cfg.d_ff, cfg.vocab_size

    def lin(name: str, n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
        return linear_T(store, f"{name}.weight", n_in, n_out, dtype), store.get(f"{name}.bias", (n_out,), dtype)

    def norm(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype), store.get(f"{name}.bias", (d,), dtype))

    def block(i: int) -> BlockWeights:
        p = f"transformer.layer.{i}"
        (W_Q, b_Q), (W_K, b_K), (W_V, b_V), (W_O, b_O) = (lin(f"{p}.attention.{n}_lin", d, d)
                                                          for n in ("q", "k", "v", "out"))
        (W_in, b_in), (W_out, b_out) = lin(f"{p}.ffn.lin1", d, f), lin(f"{p}.ffn.lin2", f, d)
        return BlockWeights(
            attn_norm=norm(f"{p}.sa_layer_norm"),
            attn=AttentionWeights(W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, b_Q=b_Q, b_K=b_K, b_V=b_V, b_O=b_O),
            ffn_norm=norm(f"{p}.output_layer_norm"), ffn=FFNWeights(W_in=W_in, W_out=W_out, b_in=b_in, b_out=b_out))

    w = Weights(tok_embed=store.get("embeddings.word_embeddings.weight", (V, d), dtype),
                pos_embed=store.get("embeddings.position_embeddings.weight", (cfg.max_positions, d), dtype),
                embed_norm=norm("embeddings.LayerNorm"), blocks=[block(i) for i in range(cfg.n_layers)])
    if cfg.lm_head or store.has("vocab_transform.weight"):        # DistilBertForMaskedLM
        w.W_head, w.b_head = lin("vocab_transform", d, d)
        w.head_norm = norm("vocab_layer_norm")
        w.W_vocab = w.tok_embed.T if cfg.tied_embeddings and not store.has("vocab_projector.weight") else \
            linear_T(store, "vocab_projector.weight", d, V, dtype)
        w.b_vocab = store.get("vocab_projector.bias", (V,), dtype)
    return w


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a DistilBertModel (or DistilBertForMaskedLM) with these knobs (no dropout)."""
    return reads_back(cfg, {
        "model_type": "distilbert", "architectures": ["DistilBertForMaskedLM" if cfg.lm_head else "DistilBertModel"],
        "vocab_size": cfg.vocab_size, "dim": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "hidden_dim": cfg.d_ff, "max_position_embeddings": cfg.max_positions,
        "sinusoidal_pos_embds": False, "activation": HF_ACTIVATIONS[cfg.activation],    # the table is in the file
        "tie_word_embeddings": cfg.tied_embeddings, "dropout": 0.0, "attention_dropout": 0.0,
        "pad_token_id": cfg.pad_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under DistilBertModel's names ("distilbert." + them and the head's with one); new arrays."""
    e = "embeddings"
    t = {f"{e}.word_embeddings.weight": weights.tok_embed, f"{e}.position_embeddings.weight": weights.pos_embed,
         f"{e}.LayerNorm.weight": weights.embed_norm.weight, f"{e}.LayerNorm.bias": weights.embed_norm.bias}
    for i, b in enumerate(weights.blocks):
        p, a, f = f"transformer.layer.{i}", b.attn, b.ffn
        for n, W, bias in (("q", a.W_Q, a.b_Q), ("k", a.W_K, a.b_K), ("v", a.W_V, a.b_V), ("out", a.W_O, a.b_O)):
            t |= {f"{p}.attention.{n}_lin.weight": W.T, f"{p}.attention.{n}_lin.bias": bias}       # (d, d)
        t |= {f"{p}.ffn.lin1.weight": f.W_in.T, f"{p}.ffn.lin1.bias": f.b_in,                     # (d_ff, d)
              f"{p}.ffn.lin2.weight": f.W_out.T, f"{p}.ffn.lin2.bias": f.b_out,                   # (d, d_ff)
              f"{p}.sa_layer_norm.weight": b.attn_norm.weight, f"{p}.sa_layer_norm.bias": b.attn_norm.bias,
              f"{p}.output_layer_norm.weight": b.ffn_norm.weight, f"{p}.output_layer_norm.bias": b.ffn_norm.bias}
    if weights.W_head is None:
        return c_arrays(t)
    t = {f"distilbert.{k}": v for k, v in t.items()}
    t |= {"vocab_transform.weight": weights.W_head.T, "vocab_transform.bias": weights.b_head,
          "vocab_layer_norm.weight": weights.head_norm.weight, "vocab_layer_norm.bias": weights.head_norm.bias,
          "vocab_projector.bias": weights.b_vocab}
    if not cfg.tied_embeddings:
        t["vocab_projector.weight"] = weights.W_vocab.T                                          # (V, d)
    return c_arrays(t)
