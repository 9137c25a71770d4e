"""mT5: T5 v1.1's layout under model_type "mt5" (t5.py reads it, under the same names).

    checkpoint name (relative to MT5ForConditionalGeneration)       qkv name
    shared                                                          tok_embed (both stacks)
    {stack}.block.0.layer.0.SelfAttention.relative_attention_bias   rel_bias (buckets, H), for every layer
    {stack}.block.{i}.layer.0.SelfAttention.q / k / v / o           W_Q / W_K / W_V / W_O
    {stack}.block.{i}.layer.0.layer_norm                            attn_norm (RMS, before attention)
    decoder.block.{i}.layer.1.EncDecAttention.q / k / v / o         cross_attn
    decoder.block.{i}.layer.1.layer_norm                            cross_norm
    {stack}.block.{i}.layer.{f}.DenseReluDense.wi_0 / wi_1 / wo     W_gate / W_in / W_out: GELU(x·W_gate) ⊙ x·W_in
    {stack}.block.{i}.layer.{f}.layer_norm                          ffn_norm
    {stack}.final_layer_norm                                        final_norm
    lm_head (absent when tied)                                      W_vocab
What differs from t5.py's reading: feed_forward_proj defaults to "gated-gelu" (tanh GELU), and the
decoder's output is never scaled by d_model^-0.5 before W_vocab (MT5ForConditionalGeneration has no
such step, whatever tie_word_embeddings says). The head is the file's lm_head when it has one (every
released mT5 does), else the embedding table. `hf_config` / `tensors` write an MT5ForConditionalGeneration.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import Seq2SeqWeights
from . import t5
from .common import reads_back
from .table import About
from .tensors import TensorStore

MODEL_TYPES = ("mt5",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("mt5",), models="mT5",
          brings="T5 v1.1 under its own `model_type`: gated GELU by default, an untied head, no d_model^-0.5 before "
                 "it",
          kind="encoder–decoder"),
)

IGNORED = t5.IGNORED


def config(hf: dict) -> ModelConfig:
    cfg = t5.config({"feed_forward_proj": "gated-gelu", **hf})
    return cfg.with_(family="mt5", scale_decoder_output=False)


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Seq2SeqWeights:
    return t5.weights(store, cfg, dtype)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of an MT5ForConditionalGeneration with these knobs (no dropout)."""
    return reads_back(cfg, {"model_type": "mt5", "architectures": ["MT5ForConditionalGeneration"],
                            **t5.stack_hf_config(cfg), "tie_word_embeddings": cfg.tied_embeddings}, config)


def tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under MT5ForConditionalGeneration's name (t5.tensors: the same names); new arrays."""
    return t5.tensors(weights, cfg)
