"""MPNet: RoBERTa's post-norm blocks and positions, and T5's bucketed relative bias added to every layer's scores.

Its tensors: `ROWS` below, each checkpoint name (relative to MPNetModel) beside ours and how it is stored, read
both ways (loading and saving).
    embeddings.word_embeddings / position_embeddings   tok_embed / pos_embed: positions counted over the ids that
                                                       are not pads, from row pad + 1 = 2 (as RoBERTa's)
    embeddings.LayerNorm                               embed_norm (no token types)
    encoder.layer.{i}.attention.attn.q / k / v / o     W_Q / W_K / W_V / W_O (+ b)
    encoder.layer.{i}.attention.LayerNorm              attn_norm (after attention's residual: post-norm)
    encoder.layer.{i}.intermediate.dense / output.dense   W_in / W_out (+ b)
    encoder.layer.{i}.output.LayerNorm                 ffn_norm
    encoder.relative_attention_bias    (32, H)         rel_bias: S += B[h, bucket(j − i)] in every layer, T5's
                                                       buckets both ways over the positions 0…n−1 (pads counted)
    lm_head.dense / layer_norm / decoder (+ bias)      MPNetForMaskedLM's head (RoBERTa's), beside "mpnet."
transformers' MPNetEmbeddings pads with id 1 and MPNetEncoder computes 32 buckets up to distance 128, whatever
config.json says: a pad_token_id or relative_attention_num_buckets other than those is refused (the file's table
would not be the one read). `hf_config` / `tensors` write an MPNetModel or MPNetForMaskedLM.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from . import roberta
from .common import HF_ACTIVATIONS, activation, check_shapes, need, reads_back, special_ids
from .roberta import masked_lm
from .table import About, Row, both_ways, layer_norm, linear

MODEL_TYPES = ("mpnet",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("mpnet",), models="MPNet",
          brings="RoBERTa's blocks and positions (counted over the ids that are not pads) with T5's bucketed relative "
                 "bias, one table added to every layer's scores both ways; a masked-LM head",
          kind="masked-LM encoder"),
)

PAD = 1                  # MPNetEmbeddings.padding_idx: the pad id, and the position rows start after it
BUCKETS = 32             # MPNetEncoder.compute_position_bias's num_buckets (max_distance 128, T5's default)

IGNORED = {
    "embeddings.position_ids": "the positions 0…P−1, a buffer older transformers saved",
    "pooler.*": "the pooler (a dense layer on <s>), not part of the encoder",
    "lm_head.bias": "lm_head.decoder.bias's copy (tied to it), in files that hold both",
    "classifier.*": "a sequence or token classification head",
    "qa_outputs.*": "MPNetForQuestionAnswering's head",
}


def config(hf: dict) -> ModelConfig:
    if hf.get("pad_token_id", PAD) != PAD:
        raise QkvError(f"mpnet pad_token_id {hf['pad_token_id']} is not supported: transformers' MPNet pads with id 1 "
                       "whatever config.json says (its positions count from row 2); set pad_token_id to 1")
    if hf.get("relative_attention_num_buckets", BUCKETS) != BUCKETS:
        raise QkvError(f"mpnet relative_attention_num_buckets {hf['relative_attention_num_buckets']} is not supported: "
                       f"transformers' MPNetEncoder computes {BUCKETS} buckets whatever it says; use {BUCKETS}")
    check_shapes(hf, need(hf, "hidden_size"), need(hf, "num_attention_heads"))
    rows = hf.get("max_position_embeddings", 512)
    if rows <= PAD + 1:
        raise QkvError(f"mpnet max_position_embeddings {rows} leaves no position after the pad row {PAD}; "
                       "restore the checkpoint's config.json")
    return ModelConfig(
        family="mpnet", vocab_size=need(hf, "vocab_size"), d_model=need(hf, "hidden_size"),
        n_layers=need(hf, "num_hidden_layers"), n_heads=need(hf, "num_attention_heads"),
        d_ff=need(hf, "intermediate_size"), max_positions=rows - PAD - 1,
        causal=False, norm="layer", norm_place="post", norm_eps=hf.get("layer_norm_eps", 1e-12),
        position="learned", position_offset=PAD + 1, positions_from_ids=True,
        activation=activation(hf.get("hidden_act", "gelu")), embed_norm=True, final_norm=False,
        lm_head=masked_lm(hf), head_activation="gelu",                    # MPNetLMHead: gelu (erf) whatever hidden_act
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)), relative_buckets=BUCKETS, relative_max_distance=128,
        pad_token_id=PAD, pad_embedding_frozen=True, bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
    )


BLOCK = "encoder.layer.{i}"

# The table, read both ways: `weights` reads a checkpoint by it, `tensors` writes one. The embeddings (no token
# types), the blocks, the relative bias table every layer reads, then RoBERTa's masked-LM head (beside "mpnet.").
ROWS = [
    Row("tok_embed", "embeddings.word_embeddings.weight", "V d"),
    Row("pos_embed", "embeddings.position_embeddings.weight", "P+o d"),
    *layer_norm("embed_norm", "embeddings.LayerNorm"),
    *linear("block.attn.W_Q", f"{BLOCK}.attention.attn.q", "d q", "block.attn.b_Q"),
    *linear("block.attn.W_K", f"{BLOCK}.attention.attn.k", "d kv", "block.attn.b_K"),
    *linear("block.attn.W_V", f"{BLOCK}.attention.attn.v", "d kv", "block.attn.b_V"),
    *linear("block.attn.W_O", f"{BLOCK}.attention.attn.o", "q d", "block.attn.b_O"),
    *layer_norm("block.attn_norm", f"{BLOCK}.attention.LayerNorm"),
    *linear("block.ffn.W_in", f"{BLOCK}.intermediate.dense", "d f", "block.ffn.b_in"),
    *linear("block.ffn.W_out", f"{BLOCK}.output.dense", "f d", "block.ffn.b_out"),
    *layer_norm("block.ffn_norm", f"{BLOCK}.output.LayerNorm"),
    Row("rel_bias", "encoder.relative_attention_bias.weight", "R H"),
    *[r for r in roberta.ROWS if r.hf.startswith("lm_head.")],
]
weights, tensors = both_ways(ROWS, lambda w: "" if w.W_head is None else "mpnet.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an MPNetModel (or MPNetForMaskedLM) with these knobs (no dropout)."""
    return reads_back(cfg, {
        "model_type": "mpnet", "architectures": ["MPNetForMaskedLM" if cfg.lm_head else "MPNetModel"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions + cfg.position_offset, "layer_norm_eps": cfg.norm_eps,
        "hidden_act": HF_ACTIVATIONS[cfg.activation], "relative_attention_num_buckets": cfg.relative_buckets,
        "tie_word_embeddings": cfg.tied_embeddings, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        **special_ids(cfg),
    }, config)
