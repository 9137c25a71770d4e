"""UMT5: mT5's layout with a relative position bias in every layer's self-attention, not only the first.

Its tensors: T5's table (t5.stack_rows), with {stack}.block.{i}.layer.0.SelfAttention.relative_attention_bias
read as block i's own attn.rel_bias (buckets, H) (`bias_per_layer`), both ways.
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
from .common import reads_back
from .table import About
from .tensors import TensorStore

MODEL_TYPES = ("umt5",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("umt5",), models="UMT5",
          brings="mT5's blocks with a relative position bias table in every layer's self-attention (T5: one, shared)",
          kind="encoder–decoder"),
)

IGNORED = t5.IGNORED


def config(hf: dict) -> ModelConfig:
    return t5.config({"feed_forward_proj": "gated-gelu", **hf}).with_(family="umt5")


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Seq2SeqWeights:
    return t5.stacks(store, cfg, dtype, bias_per_layer=True)              # each block's own bias table


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a UMT5ForConditionalGeneration with these knobs (no dropout)."""
    return reads_back(cfg, {"model_type": "umt5", "architectures": ["UMT5ForConditionalGeneration"],
                            **t5.stack_hf_config(cfg), "tie_word_embeddings": cfg.tied_embeddings,
                            "scale_decoder_outputs": cfg.scale_decoder_output}, config)


def tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under UMT5ForConditionalGeneration's name: T5's, and each layer's bias table; new arrays."""
    return t5.stacks_tensors(weights, cfg, bias_per_layer=True)
