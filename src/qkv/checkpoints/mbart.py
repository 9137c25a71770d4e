"""mBART: BART's blocks pre-norm, a final LayerNorm closing each stack, the language id written first.

    checkpoint name (relative to MBartModel)           qkv name
    shared                                             tok_embed (both stacks), read × √d_model if scale_embedding
                                                       (tie_word_embeddings=false: {stack}.embed_tokens, each its own)
    {stack}.embed_positions   (P + 2, d)               pos_embed: position p reads row p + 2 (as BART)
    {stack}.layernorm_embedding                        embed_norm
    {stack}.layers.{i}.self_attn_layer_norm            attn_norm (before attention: pre-norm)
    {stack}.layers.{i}.self_attn.q_proj/…/out_proj     W_Q / W_K / W_V / W_O (+ b)
    decoder.layers.{i}.encoder_attn_layer_norm         cross_norm (before the cross-attention)
    decoder.layers.{i}.encoder_attn.q_proj/…/out_proj  cross_attn: Q from the decoder, K, V from the encoder
    {stack}.layers.{i}.final_layer_norm                ffn_norm (before the FFN)
    {stack}.layers.{i}.fc1 / fc2                       W_in / W_out
    {stack}.layer_norm                                 final_norm: the encoder's output M, the decoder's Y
    lm_head (absent when tied)                         W_vocab (untied: its own, the decoder's table apart)
    final_logits_bias (1, V)                           b_vocab
The names are BART's (bart.py reads them) plus {stack}.layer_norm; what differs is the place of the
norms: x + Box(Norm(x)), then one more Norm at the end of each stack. Writing: the decoder reads
decoder_start_token_id first (absent: bos_token_id, as transformers' generate); forced_bos_token_id,
mBART-50's target language, is then the first token written. Training reads mBART's shift of the labels:
the decoder starts from each label row's last real token (its language id), not decoder_start_token_id.
`hf_config` / `tensors` write an MBartForConditionalGeneration ("model." + the names above).
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import Seq2SeqWeights
from . import bart
from .common import reads_back
from .table import About
from .tensors import TensorStore

MODEL_TYPES = ("mbart",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("mbart",), models="mBART, mBART-50",
          brings="BART's blocks pre-norm, an embedding LayerNorm and a final LayerNorm closing each stack, "
                 "√d_model-scaled embeddings; writing starts from `decoder_start_token_id` (absent: `bos_token_id`) "
                 "and `forced_bos_token_id` (the target language) is the first token written; training reads mBART's "
                 "shift of the labels (the language id first); untied embeddings (`tie_word_embeddings` false: each "
                 "stack its own table, `lm_head` its own)",
          kind="encoder–decoder"),
)

IGNORED = bart.IGNORED


def config(hf: dict) -> ModelConfig:
    knobs = bart.stacks_config(hf, "mbart", untied=True) | dict(norm_place="pre", final_norm=True, start_from_labels=True)
    return ModelConfig(**knobs, position="learned", position_offset=bart.OFFSET, embed_norm=True)


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Seq2SeqWeights:
    return bart.weights(store, cfg, dtype)          # bart.stack reads {stack}.layer_norm when cfg.final_norm


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an MBartForConditionalGeneration with these knobs."""
    return reads_back(cfg, {"model_type": "mbart", "architectures": ["MBartForConditionalGeneration"],
                            **bart.stacks_hf_config(cfg)}, config)


def tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under MBartForConditionalGeneration's name, as its file stores it; new arrays."""
    return bart.tensors(weights, cfg)
