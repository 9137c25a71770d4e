"""RoBERTa and XLM-RoBERTa: BERT's blocks, positions counted over the ids that are not pads, a masked-LM head.

Its tensors: `ROWS` below, each checkpoint name (relative to RobertaModel) beside ours and how it is stored, read
both ways (loading and saving).
transformers numbers the positions from the ids (create_position_ids_from_input_ids), not from the
attention mask: a left-padded row reads the same rows as the row alone. RobertaForMaskedLM gives logits
(`qkv next` reads a masked token); RobertaModel gives hidden states. XLM-RoBERTa (model_type
"xlm-roberta") is the same model under the same names. A decoder (is_decoder, add_cross_attention:
RobertaForCausalLM) is refused. `hf_config` / `tensors` write a RobertaModel or RobertaForMaskedLM.
"""

from __future__ import annotations

from dataclasses import replace


from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from . import bert
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back
from .table import About, Head, How, Row, both_ways, linear

MODEL_TYPES = ("roberta", "xlm-roberta")

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("roberta", "xlm-roberta"), models="RoBERTa, XLM-RoBERTa",
          brings="BERT's blocks with positions counted over the ids that are not pads (from row pad + 1, so left "
                 "padding does not move a text), a masked-LM head (dense, GELU, LayerNorm, W_vocab + b)",
          kind="masked-LM encoder"),
)

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


class DecoderBias(How):
    """b_vocab: lm_head.decoder.bias, or (files that hold only the tied copy) lm_head.bias; written as the
    decoder's when untied, as lm_head.bias when tied (the head's own bias, which decoder.bias is)."""

    def read(self, store, name, shape, dtype, cfg):
        return store.get(name if store.has(name) else "lm_head.bias", shape, dtype)

    def write_all(self, name, value, cfg):
        return {"lm_head.bias" if cfg.tied_embeddings else name: value}


def masked_lm_head(cfg: ModelConfig) -> bool:
    return cfg.lm_head


HEAD = "lm_head.dense.weight"          # a checkpoint that holds it has the masked-LM head, whatever config.json says

# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. BERT's embeddings (the
# positions after the pad's rows) and blocks, then RobertaForMaskedLM's head (beside the encoder, "roberta.").
ROWS = [
    *bert.ROWS,
    *linear("W_head", "lm_head.dense", "d d", "b_head", when=masked_lm_head),
    *bert.layer_norm("head_norm", "lm_head.layer_norm", when=masked_lm_head),
    Row("W_vocab", "lm_head.decoder.weight", "d V", Head(), masked_lm_head),
    Row("b_vocab", "lm_head.decoder.bias", "V", DecoderBias(), masked_lm_head),
]
ROWS = [replace(r, root=True, also=HEAD) if r.hf.startswith("lm_head.") else r for r in ROWS]
weights, tensors = both_ways(ROWS, lambda w: "" if w.W_head is None else "roberta.")


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
