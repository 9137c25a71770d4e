"""ELECTRA (discriminator and generator): BERT's blocks after embeddings of their own width E, projected.

    checkpoint name (relative to ElectraModel)     qkv name
    embeddings.word_embeddings / position_embeddings / token_type_embeddings   tok_embed / pos_embed / type_embed (E wide)
    embeddings.LayerNorm                           embed_norm (over E)
    embeddings_project (when E ≠ hidden_size)      W_embed, b_embed: (E, d_model), after the norm
    encoder.layer.{i}.…                            BERT's names (bert.py), post-norm
    generator_predictions.dense, .LayerNorm        W_head (d_model, E), b_head, head_norm: Norm(gelu(Z·W_head + b))
    generator_lm_head (weight absent when tied)    W_vocab (E, V) (tied: tok_embedᵀ), b_vocab
The generator (ElectraForMaskedLM) gives logits over the vocabulary. The discriminator's head
(ElectraForPreTraining: discriminator_predictions) scores each token as replaced or not, one number
per token and no vocabulary, so qkv leaves it unread (IGNORED) and gives the discriminator's hidden
states, as for ElectraModel. `hf_config` / `tensors` write an ElectraModel or ElectraForMaskedLM.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import Weights
from . import bert
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .roberta import masked_lm, refuse_decoder
from .tensors import TensorStore

IGNORED = {
    "embeddings.position_ids": "the positions 0…P−1, a buffer older transformers saved",
    "embeddings.token_type_ids": "a buffer of zeros older transformers saved",
    "discriminator_predictions.*": "the discriminator's replaced-token head: one score per token, no vocabulary",
    "classifier.*": "a sequence or token classification head",
    "qa_outputs.*": "ElectraForQuestionAnswering's head",
    "sequence_summary.*": "ElectraForMultipleChoice's head",
}


def config(hf: dict) -> ModelConfig:
    refuse_decoder(hf, "electra")
    d = need(hf, "hidden_size")
    check_shapes(hf, d, need(hf, "num_attention_heads"))
    E = hf.get("embedding_size", 128)
    return ModelConfig(
        family="electra", vocab_size=need(hf, "vocab_size"), d_model=d,
        n_layers=need(hf, "num_hidden_layers"), n_heads=need(hf, "num_attention_heads"),
        d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 512),
        causal=False, norm="layer", norm_place="post", norm_eps=hf.get("layer_norm_eps", 1e-12),
        position="learned", activation=activation(hf.get("hidden_act", "gelu")),
        type_vocab_size=hf.get("type_vocab_size", 2), embed_norm=True, final_norm=False,
        embed_dim=None if E == d else E, lm_head=masked_lm(hf), head_activation="gelu",
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        pad_token_id=hf.get("pad_token_id", 0), pad_embedding_frozen=True,
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, V, E = cfg.d_model, cfg.vocab_size, cfg.embed_dim or cfg.d_model
    w = Weights(
        tok_embed=store.get("embeddings.word_embeddings.weight", (V, E), dtype),
        pos_embed=store.get("embeddings.position_embeddings.weight", (cfg.max_positions, E), dtype),
        type_embed=store.get("embeddings.token_type_embeddings.weight", (cfg.type_vocab_size, E), dtype),
        embed_norm=bert.norm_of(store, "embeddings.LayerNorm", E, dtype),
        blocks=bert.blocks(store, cfg, dtype),
    )
    if cfg.embed_dim is not None:
        w.W_embed = linear_T(store, "embeddings_project.weight", E, d, dtype)          # (E, d_model)
        w.b_embed = store.get("embeddings_project.bias", (d,), dtype)
    if cfg.lm_head or store.has("generator_predictions.dense.weight"):             # ElectraForMaskedLM
        w.W_head = linear_T(store, "generator_predictions.dense.weight", d, E, dtype)   # (d_model, E)
        w.b_head = store.get("generator_predictions.dense.bias", (E,), dtype)
        w.head_norm = bert.norm_of(store, "generator_predictions.LayerNorm", E, dtype)
        w.W_vocab = w.tok_embed.T if cfg.tied_embeddings and not store.has("generator_lm_head.weight") else \
            linear_T(store, "generator_lm_head.weight", E, V, dtype)                    # (E, V)
        w.b_vocab = store.get("generator_lm_head.bias", (V,), dtype)
    return w


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an ElectraModel (or ElectraForMaskedLM) with these knobs (no dropout)."""
    return reads_back(cfg, {
        "model_type": "electra", "architectures": ["ElectraForMaskedLM" if cfg.lm_head else "ElectraModel"],
        "vocab_size": cfg.vocab_size, "embedding_size": cfg.embed_dim or cfg.d_model, "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation],
        "tie_word_embeddings": cfg.tied_embeddings, "is_decoder": False,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pad_token_id": cfg.pad_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under ElectraModel's names ("electra." + them and the generator head's with one); new arrays."""
    t = dict(bert.tensors(weights, cfg))
    if weights.W_embed is not None:
        t |= {"embeddings_project.weight": weights.W_embed.T, "embeddings_project.bias": weights.b_embed}   # (d, E)
    if weights.W_head is None:
        return c_arrays(t)
    t = {f"electra.{k}": v for k, v in t.items()}
    t |= {"generator_predictions.dense.weight": weights.W_head.T, "generator_predictions.dense.bias": weights.b_head,
          "generator_predictions.LayerNorm.weight": weights.head_norm.weight,
          "generator_predictions.LayerNorm.bias": weights.head_norm.bias, "generator_lm_head.bias": weights.b_vocab}
    if not cfg.tied_embeddings:
        t["generator_lm_head.weight"] = weights.W_vocab.T                                  # (V, E)
    return c_arrays(t)
