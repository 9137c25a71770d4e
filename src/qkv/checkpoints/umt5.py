"""UMT5: mT5's layout with a relative position bias in every layer's self-attention, not only the first.

    checkpoint name (relative to UMT5ForConditionalGeneration)          qkv name
    {stack}.block.{i}.layer.0.SelfAttention.relative_attention_bias     attn.rel_bias (buckets, H) of layer i
    (every other name)                                                  as t5.py / mt5.py read it
T5 computes one bias B from block 0's table and adds it in every layer; UMT5 gives each layer its own
table, B_i[h, q, k] = T_i[bucket(k − q), h], over the same buckets (the pass computes them once:
Context.rel_buckets). The cross-attention has none. As T5 in transformers 5, the decoder's output is
scaled by d_model^-0.5 before W_vocab unless config.json says tie_word_embeddings false (released
UMT5 checkpoints do); feed_forward_proj defaults to "gated-gelu". `hf_config` / `tensors` write a
UMT5ForConditionalGeneration.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import Seq2SeqWeights
from . import t5
from .common import c_arrays, reads_back
from .tensors import TensorStore

IGNORED = t5.IGNORED
BIAS = "{which}.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight"


def config(hf: dict) -> ModelConfig:
    return t5.config({"feed_forward_proj": "gated-gelu", **hf}).with_(family="umt5")


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Seq2SeqWeights:
    w = t5.weights(store, cfg, dtype)                      # block 0's table read as the stack's: moved to its layer
    for which, stack in (("encoder", w.encoder), ("decoder", w.decoder)):
        for i, b in enumerate(stack.blocks):
            b.attn.rel_bias = stack.rel_bias if i == 0 else store.get(
                BIAS.format(which=which, i=i), (cfg.relative_buckets, cfg.n_heads), dtype)
        stack.rel_bias = None
    return w


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a UMT5ForConditionalGeneration with these knobs (no dropout)."""
    return reads_back(cfg, {"model_type": "umt5", "architectures": ["UMT5ForConditionalGeneration"],
                            **t5.stack_hf_config(cfg), "tie_word_embeddings": cfg.tied_embeddings,
                            "scale_decoder_outputs": cfg.scale_decoder_output}, config)


def tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under UMT5ForConditionalGeneration's name: T5's, and each layer's bias table; new arrays."""
    t = t5.tensors(weights, cfg)
    for which, stack in (("encoder", weights.encoder), ("decoder", weights.decoder)):
        t |= c_arrays({BIAS.format(which=which, i=i): b.attn.rel_bias for i, b in enumerate(stack.blocks)})
    return t
