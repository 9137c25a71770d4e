"""RoBERTa and XLM-RoBERTa: BERT's blocks, positions counted over the ids that are not pads, a masked-LM head.

    checkpoint name (relative to RobertaModel)     qkv name
    embeddings.word_embeddings                     tok_embed
    embeddings.position_embeddings (P + pad + 1 rows)  pos_embed: the k-th non-pad token reads row pad + 1 + k,
                                                   a pad row pad (positions_from_ids, position_offset = pad + 1)
    embeddings.token_type_embeddings               type_embed
    embeddings.LayerNorm                           embed_norm
    encoder.layer.{i}.…                            BERT's names (bert.py): W_Q / W_K / W_V / W_O, attn_norm,
                                                   W_in / W_out, ffn_norm (post-norm)
    lm_head.dense, lm_head.layer_norm              W_head, b_head, head_norm: Norm(gelu(Z·W_head + b))
    lm_head.decoder.weight (absent when tied)      W_vocab (tied: tok_embedᵀ)
    lm_head.decoder.bias (else its tied copy lm_head.bias)   b_vocab
transformers numbers the positions from the ids (create_position_ids_from_input_ids), not from the
attention mask: a left-padded row reads the same rows as the row alone. RobertaForMaskedLM gives logits
(`qkv next` reads a masked token); RobertaModel gives hidden states. XLM-RoBERTa (model_type
"xlm-roberta") is the same model under the same names. A decoder (is_decoder, add_cross_attention:
RobertaForCausalLM) is refused. `hf_config` / `tensors` write a RobertaModel or RobertaForMaskedLM.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import Weights
from . import bert
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .tensors import TensorStore

IGNORED = {
    "embeddings.position_ids": "the positions 0…P−1, a buffer older transformers saved",
    "embeddings.token_type_ids": "a buffer of zeros older transformers saved",
    "pooler.*": "the pooler (a dense layer on <s>), not part of the encoder",
    "lm_head.bias": "lm_head.decoder.bias's copy (tied to it), in files that hold both",
    "classifier.*": "a sequence or token classification head",
    "qa_outputs.*": "RobertaForQuestionAnswering's head",
}
ARCHITECTURES = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta"}


def refuse_decoder(hf: dict, family: str) -> None:
    """An encoder's config.json that makes it a decoder (is_decoder, add_cross_attention) is refused in one line."""
    for knob in ("is_decoder", "add_cross_attention"):
        if hf.get(knob):
            raise QkvError(f"{family} {knob}=true (a causal or cross-attending decoder) is not supported; "
                           f"qkv runs {family} as the bidirectional encoder")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise QkvError(f"{family} position_embedding_type {hf['position_embedding_type']!r} is not supported; "
                       "only 'absolute' is")


def masked_lm(hf: dict) -> bool:
    """Whether config.json names a masked-LM model (its head is then read and gives logits)."""
    return any(str(a).endswith("ForMaskedLM") for a in hf.get("architectures") or [])


def config(hf: dict) -> ModelConfig:
    family = hf["model_type"]
    refuse_decoder(hf, family)
    check_shapes(hf, need(hf, "hidden_size"), need(hf, "num_attention_heads"))
    pad = hf.get("pad_token_id", 1)
    rows = hf.get("max_position_embeddings", 514)
    if rows <= pad + 1:
        raise QkvError(f"{family} max_position_embeddings {rows} leaves no position after the pad row {pad}; "
                       "restore the checkpoint's config.json")
    return ModelConfig(
        family=family, vocab_size=need(hf, "vocab_size"), d_model=need(hf, "hidden_size"),
        n_layers=need(hf, "num_hidden_layers"), n_heads=need(hf, "num_attention_heads"),
        d_ff=need(hf, "intermediate_size"), max_positions=rows - pad - 1,
        causal=False, norm="layer", norm_place="post", norm_eps=hf.get("layer_norm_eps", 1e-12),
        position="learned", position_offset=pad + 1, positions_from_ids=True,
        activation=activation(hf.get("hidden_act", "gelu")), type_vocab_size=hf.get("type_vocab_size", 2),
        embed_norm=True, final_norm=False, lm_head=masked_lm(hf), head_activation="gelu",
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        pad_token_id=pad, pad_embedding_frozen=True, bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
    )


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Weights:
    d, V = cfg.d_model, cfg.vocab_size
    w = bert.weights(store, cfg.with_(max_positions=cfg.max_positions + cfg.position_offset), dtype)
    if cfg.lm_head or store.has("lm_head.dense.weight"):          # RobertaForMaskedLM
        w.W_head, w.b_head = linear_T(store, "lm_head.dense.weight", d, d, dtype), store.get("lm_head.dense.bias", (d,), dtype)
        w.head_norm = bert.norm_of(store, "lm_head.layer_norm", d, dtype)
        w.W_vocab = w.tok_embed.T if cfg.tied_embeddings and not store.has("lm_head.decoder.weight") else \
            linear_T(store, "lm_head.decoder.weight", d, V, dtype)
        bias = "lm_head.decoder.bias" if store.has("lm_head.decoder.bias") else "lm_head.bias"   # what decoder adds
        w.b_vocab = store.get(bias, (V,), dtype)
    return w


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a RobertaModel (or RobertaForMaskedLM) with these knobs (no dropout)."""
    kind = ARCHITECTURES[cfg.family] + ("ForMaskedLM" if cfg.lm_head else "Model")
    return reads_back(cfg, {
        "model_type": cfg.family, "architectures": [kind],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions + cfg.position_offset, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation],
        "tie_word_embeddings": cfg.tied_embeddings, "is_decoder": False,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pad_token_id": cfg.pad_token_id,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }, config)


def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under RobertaModel's names ("roberta." + them and lm_head.* with a head); new arrays."""
    base = bert.tensors(weights, cfg)
    if weights.W_head is None:
        return base
    t = {f"roberta.{k}": v for k, v in base.items()}
    t |= {"lm_head.dense.weight": weights.W_head.T, "lm_head.dense.bias": weights.b_head,            # (d, d)
          "lm_head.layer_norm.weight": weights.head_norm.weight, "lm_head.layer_norm.bias": weights.head_norm.bias,
          "lm_head.bias": weights.b_vocab}                                           # tied: decoder.bias is it
    if not cfg.tied_embeddings:                                                       # untied: decoder's own bias
        t["lm_head.decoder.weight"], t["lm_head.decoder.bias"] = weights.W_vocab.T, t.pop("lm_head.bias")  # (V, d)
    return c_arrays(t)
