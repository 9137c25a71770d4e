"""DistilBERT: BERT's post-norm blocks under their own names, no token types, a masked-LM head.

Its tensors: `ROWS` below, each checkpoint name (relative to DistilBertModel) beside ours and how it is stored, read
both ways (loading and saving).
Every LayerNorm has eps 1e-12 (transformers fixes it; config.json has no eps). DistilBertForMaskedLM gives
logits; DistilBertModel hidden states. `hf_config` / `tensors` write a DistilBertModel or
DistilBertForMaskedLM.
"""

from __future__ import annotations

from dataclasses import replace


from ..core.config import ModelConfig
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back
from .roberta import masked_lm
from .table import About, Head, Row, both_ways, layer_norm, linear

MODEL_TYPES = ("distilbert",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("distilbert",), models="DistilBERT",
          brings="BERT's blocks under its own names (`q_lin` …, `sa_layer_norm`), no token types, LayerNorm eps "
                 "1e-12, its sinusoidal table read as the learned table it starts, a masked-LM head",
          kind="masked-LM encoder"),
)

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


def masked_lm_head(cfg: ModelConfig) -> bool:
    return cfg.lm_head


HEAD = "vocab_transform.weight"        # a checkpoint that holds it has the masked-LM head

# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one; with the head, the encoder's
# names are under "distilbert." and the head's beside it.
ROWS = [
    Row("tok_embed", "embeddings.word_embeddings.weight", "V d"),
    Row("pos_embed", "embeddings.position_embeddings.weight", "P d"),
    *layer_norm("embed_norm", "embeddings.LayerNorm"),
    *linear("block.attn.W_Q", "transformer.layer.{i}.attention.q_lin", "d q", "block.attn.b_Q"),
    *linear("block.attn.W_K", "transformer.layer.{i}.attention.k_lin", "d kv", "block.attn.b_K"),
    *linear("block.attn.W_V", "transformer.layer.{i}.attention.v_lin", "d kv", "block.attn.b_V"),
    *linear("block.attn.W_O", "transformer.layer.{i}.attention.out_lin", "q d", "block.attn.b_O"),
    *layer_norm("block.attn_norm", "transformer.layer.{i}.sa_layer_norm"),
    *linear("block.ffn.W_in", "transformer.layer.{i}.ffn.lin1", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", "transformer.layer.{i}.ffn.lin2", "f d", "block.ffn.b_out"),
    *layer_norm("block.ffn_norm", "transformer.layer.{i}.output_layer_norm"),
    *linear("W_head", "vocab_transform", "d d", "b_head", when=masked_lm_head),
    *layer_norm("head_norm", "vocab_layer_norm", when=masked_lm_head),
    Row("W_vocab", "vocab_projector.weight", "d V", Head(), masked_lm_head),
    Row("b_vocab", "vocab_projector.bias", "V", when=masked_lm_head),
]
ROWS = [replace(r, root=True, also=HEAD) if r.hf.startswith("vocab_") else r for r in ROWS]
weights, tensors = both_ways(ROWS, lambda w: "" if w.W_head is None else "distilbert.")


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
