"""ELECTRA (discriminator and generator): BERT's blocks after embeddings of their own width E, projected.

Its tensors: `ROWS` below, each checkpoint name (relative to ElectraModel) beside ours and how it is stored, read
both ways (loading and saving).
The generator (ElectraForMaskedLM) gives logits over the vocabulary. The discriminator's head
(ElectraForPreTraining: discriminator_predictions) scores each token as replaced or not, one number
per token and no vocabulary, so qkv leaves it unread (IGNORED) and gives the discriminator's hidden
states, as for ElectraModel. `hf_config` / `tensors` write an ElectraModel or ElectraForMaskedLM.
"""

from __future__ import annotations

from dataclasses import replace


from ..core.config import ModelConfig
from . import bert
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back
from .roberta import masked_lm, refuse_decoder
from .table import About, Head, Row, both_ways, linear

MODEL_TYPES = ("electra",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("electra",), models="ELECTRA discriminator and generator",
          brings="embeddings of their own width E projected to d_model after their LayerNorm (`embeddings_project`); "
                 "the generator's masked-LM head back to E; the discriminator's replaced-token head (one score per "
                 "token) left unread",
          kind="masked-LM encoder"),
)

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


def projected(cfg: ModelConfig) -> bool:
    return cfg.embed_dim is not None


def masked_lm_head(cfg: ModelConfig) -> bool:
    return cfg.lm_head


HEAD = "generator_predictions.dense.weight"   # a checkpoint that holds it has the generator's head

# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. BERT's embeddings (E wide)
# and blocks, the embeddings projected to d_model when E ≠ d_model, then ElectraForMaskedLM's generator head
# (beside the encoder, "electra.").
ROWS = [
    *bert.ROWS,
    *linear("W_embed", "embeddings_project", "E d", "b_embed", when=projected),
    *linear("W_head", "generator_predictions.dense", "d E", "b_head", when=masked_lm_head),
    *bert.layer_norm("head_norm", "generator_predictions.LayerNorm", "E", when=masked_lm_head),
    Row("W_vocab", "generator_lm_head.weight", "E V", Head(), masked_lm_head),
    Row("b_vocab", "generator_lm_head.bias", "V", when=masked_lm_head),
]
ROWS = [replace(r, root=True, also=HEAD) if r.hf.startswith("generator_") else r for r in ROWS]
weights, tensors = both_ways(ROWS, lambda w: "" if w.W_head is None else "electra.")


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
