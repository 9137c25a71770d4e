"""BERT (and MiniLM, a small BERT): post-norm, learned positions, token types, erf GELU.

    checkpoint name (relative to BertModel)        qkv name
    embeddings.word_embeddings                     tok_embed
    embeddings.position_embeddings                 pos_embed
    embeddings.token_type_embeddings               type_embed
    embeddings.LayerNorm                           embed_norm
    encoder.layer.{i}.attention.self.query/key/value   W_Q / W_K / W_V (+ b)
    encoder.layer.{i}.attention.output.dense       W_O
    encoder.layer.{i}.attention.output.LayerNorm   attn_norm (after the residual)
    encoder.layer.{i}.intermediate.dense           W_in
    encoder.layer.{i}.output.dense                 W_out
    encoder.layer.{i}.output.LayerNorm             ffn_norm (after the residual)
The pooler and any task head are not part of the encoder: IGNORED lists them, with the buffers
older files carry; any other tensor the table does not read makes the checkpoint refused.
torch's Linear stores W (out, in): we read its transpose, a view. `config` / `weights` read a
checkpoint by this table; `hf_config` / `tensors` write one, a BertModel without a pooler.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .tensors import TensorStore

# Tensors a BERT checkpoint may hold that qkv never reads ({i}: a layer, *: anything), relative to BertModel.
IGNORED = {
    "embeddings.position_ids": "the positions 0…P−1, a buffer older transformers saved",
    "pooler.*": "the pooler (a dense layer on [CLS]), not part of the encoder",
    "cls.*": "BertForMaskedLM / BertForPreTraining's heads",
    "classifier.*": "a sequence or token classification head",
    "qa_outputs.*": "BertForQuestionAnswering's head",
}


def config(hf: dict) -> ModelConfig:
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise QkvError(f"BERT position_embedding_type {hf['position_embedding_type']!r} is not supported; "
                       "only 'absolute' is")
    check_shapes(hf, need(hf, "hidden_size"), need(hf, "num_attention_heads"))
    return ModelConfig(
        family="bert", vocab_size=need(hf, "vocab_size"), d_model=need(hf, "hidden_size"),
        n_layers=need(hf, "num_hidden_layers"), n_heads=need(hf, "num_attention_heads"),
        d_ff=need(hf, "intermediate_size"), max_positions=hf.get("max_position_embeddings", 512),
        causal=False, norm="layer", norm_place="post", norm_eps=hf.get("layer_norm_eps", 1e-12),
        position="learned", activation=activation(hf.get("hidden_act", "gelu")),
        type_vocab_size=hf.get("type_vocab_size", 2), embed_norm=True, final_norm=False, lm_head=False,
        pad_token_id=hf.get("pad_token_id"), pad_embedding_frozen=True,          # nn.Embedding's padding_idx
    )


def norm_of(store: TensorStore, prefix: str, d: int, dtype) -> NormWeights:
    """The LayerNorm at PREFIX. Checkpoints converted from TensorFlow call γ, β "gamma", "beta"."""
    w, b = ("weight", "bias") if store.has(f"{prefix}.weight") else ("gamma", "beta")
    return NormWeights(store.get(f"{prefix}.{w}", (d,), dtype), store.get(f"{prefix}.{b}", (d,), dtype))


def blocks(store: TensorStore, cfg: ModelConfig, dtype) -> list[BlockWeights]:
    """The L blocks under BERT's names (encoder.layer.{i}.…), which RoBERTa and ELECTRA share."""
    d, f = cfg.d_model, cfg.d_ff

    def block(i: int) -> BlockWeights:
        p = f"encoder.layer.{i}"
        attn = AttentionWeights(
            W_Q=linear_T(store, f"{p}.attention.self.query.weight", d, d, dtype),
            W_K=linear_T(store, f"{p}.attention.self.key.weight", d, d, dtype),
            W_V=linear_T(store, f"{p}.attention.self.value.weight", d, d, dtype),
            W_O=linear_T(store, f"{p}.attention.output.dense.weight", d, d, dtype),
            b_Q=store.get(f"{p}.attention.self.query.bias", (d,), dtype),
            b_K=store.get(f"{p}.attention.self.key.bias", (d,), dtype),
            b_V=store.get(f"{p}.attention.self.value.bias", (d,), dtype),
            b_O=store.get(f"{p}.attention.output.dense.bias", (d,), dtype),
        )
        ffn = FFNWeights(
            W_in=linear_T(store, f"{p}.intermediate.dense.weight", d, f, dtype),
            b_in=store.get(f"{p}.intermediate.dense.bias", (f,), dtype),
            W_out=linear_T(store, f"{p}.output.dense.weight", f, d, dtype),
            b_out=store.get(f"{p}.output.dense.bias", (d,), dtype),
        )
        return BlockWeights(attn_norm=norm_of(store, f"{p}.attention.output.LayerNorm", d, dtype), attn=attn,
                            ffn_norm=norm_of(store, f"{p}.output.LayerNorm", d, dtype), ffn=ffn)

    return [block(i) for i in range(cfg.n_layers)]


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d = cfg.d_model
    return Weights(
        tok_embed=store.get("embeddings.word_embeddings.weight", (cfg.vocab_size, d), dtype),
        pos_embed=store.get("embeddings.position_embeddings.weight", (cfg.max_positions, d), dtype),
        type_embed=store.get("embeddings.token_type_embeddings.weight", (cfg.type_vocab_size, d), dtype),
        embed_norm=norm_of(store, "embeddings.LayerNorm", d, dtype),
        blocks=blocks(store, cfg, dtype),
    )


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a BertModel with these knobs (no dropout: qkv trains without it)."""
    return reads_back(cfg, {
        "model_type": "bert", "architectures": ["BertModel"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation],
        "position_embedding_type": "absolute", "is_decoder": False,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pad_token_id": cfg.pad_token_id,
    }, config)


def block_tensors(weights: Weights) -> dict[str, np.ndarray]:
    """Every block's tensor under BERT's names (encoder.layer.{i}.…), as its file stores it (Linear: (out, in))."""
    t = {}
    for i, b in enumerate(weights.blocks):
        p, a, f = f"encoder.layer.{i}", b.attn, b.ffn
        t |= {
            f"{p}.attention.self.query.weight": a.W_Q.T, f"{p}.attention.self.query.bias": a.b_Q,   # (d, d)
            f"{p}.attention.self.key.weight": a.W_K.T, f"{p}.attention.self.key.bias": a.b_K,
            f"{p}.attention.self.value.weight": a.W_V.T, f"{p}.attention.self.value.bias": a.b_V,
            f"{p}.attention.output.dense.weight": a.W_O.T, f"{p}.attention.output.dense.bias": a.b_O,
            f"{p}.attention.output.LayerNorm.weight": b.attn_norm.weight,
            f"{p}.attention.output.LayerNorm.bias": b.attn_norm.bias,
            f"{p}.intermediate.dense.weight": f.W_in.T, f"{p}.intermediate.dense.bias": f.b_in,   # (d_ff, d)
            f"{p}.output.dense.weight": f.W_out.T, f"{p}.output.dense.bias": f.b_out,             # (d, d_ff)
            f"{p}.output.LayerNorm.weight": b.ffn_norm.weight, f"{p}.output.LayerNorm.bias": b.ffn_norm.bias,
        }
    return t


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under BertModel's name, as its file stores it (Linear: (out, in)); new arrays."""
    e = "embeddings"
    t = {f"{e}.word_embeddings.weight": weights.tok_embed,                     # (V, d)
         f"{e}.position_embeddings.weight": weights.pos_embed,                 # (P, d)
         f"{e}.token_type_embeddings.weight": weights.type_embed,              # (T, d)
         f"{e}.LayerNorm.weight": weights.embed_norm.weight, f"{e}.LayerNorm.bias": weights.embed_norm.bias}
    return c_arrays(t | block_tensors(weights))
