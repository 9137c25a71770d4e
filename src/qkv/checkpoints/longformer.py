"""Longformer: RoBERTa's encoder whose layers attend within a sliding window, plus global tokens with their own Q, K, V.

Its tensors: `ROWS` below, each checkpoint name (relative to LongformerModel) beside ours and how it is stored, read
both ways (loading and saving): RoBERTa's table, and in every layer the global projections query_global,
key_global, value_global (AttentionWeights.W_Qg, W_Kg, W_Vg and their biases).

The maths, as transformers' LongformerSelfAttention computes it (its sliding chunks are a band of the n × n scores):
  - layer l's attention_window W_l (one number, or one per layer): query i sees keys with |i − j| ≤ W_l / 2 — the
    engine's encoder window w = W_l / 2 + 1 (|i − j| < w, ModelConfig.layer_windows)
  - global tokens (transformers' global_attention_mask; ModelConfig.global_tokens, `--global-tokens` of every command
    that runs a pass: show, next, heads, rollout, lens, patch, path-patch, attribute --method occlusion, neurons,
    activations, explain): every query sees them beside its window, through K and V; their own rows read every key
    through the global projections, Z[G] = softmax(Q_g·K_gᵀ/√d_k + M)·V_g (core/sparse_layers.py: sparse_mask,
    global_rows). Gradients through them (training, gradient attributions) are refused in one line: the global
    projections have no backward.
    LongformerForMaskedLM gives none unless asked (its sequence-classification head would give the first token):
    qkv's default is none.
  - transformers pads the input to a multiple of the window with pad tokens it masks and drops: the real tokens'
    numbers are the same without it, so qkv does not pad
  - positions counted over the ids that are not pads, from padding_idx + 1, as RoBERTa
Each layer's attentions are the full n × n weights it used (zeros outside its window, the global rows and columns
in place): transformers returns them banded, (n, W + 1 + |G|), and the global rows apart. A pass with global tokens
that keeps no weight, or only each row's largest (keep=("attention_top",): what `qkv show --out` keeps past 1024
tokens), computes each block of 64 queries from its band and the global keys only (core/sparse_layers.py:
sparse_layer_attention), O(n·(W + |G|)) numbers per head as transformers' sliding chunks, never n × n: 4096 tokens on
a tiny model (W = 512, one global token) peak at 10 MiB of NumPy arrays instead of 579 (41 MiB instead of 1355 with
each row's 64 largest weights; tracemalloc). Without global tokens a long input runs the same kernel when padded,
core/sparse.py's tiled band when not.
A decoder (is_decoder, add_cross_attention) is refused. `hf_config` / `tensors` write a LongformerModel or
LongformerForMaskedLM.
"""

from __future__ import annotations

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from . import roberta
from .common import HF_ACTIVATIONS, need, reads_back
from .table import About, both_ways, linear

MODEL_TYPES = ("longformer",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("longformer",), models="Longformer",
          brings="RoBERTa's encoder attending within a sliding window per layer (`attention_window`: |i − j| ≤ W/2), "
                 "global tokens (`--global-tokens`) seen by every query and reading every key through their own "
                 "query/key/value_global; each layer's full n × n weights, the mask drawn (`qkv explain sparse`)",
          kind="masked-LM encoder"),
)

IGNORED = dict(roberta.IGNORED)


def windows(hf: dict) -> tuple[int, ...]:
    """Each layer's engine window w = W/2 + 1 from attention_window W (one even number ≥ 2, or one per layer)."""
    L = need(hf, "num_hidden_layers")
    W = hf.get("attention_window", 512)
    W = [W] * L if isinstance(W, int) and not isinstance(W, bool) else W
    if not isinstance(W, list) or len(W) != L or any(isinstance(w, bool) or not isinstance(w, int) or w < 2 or w % 2
                                                     for w in W):
        raise QkvError(f"Longformer attention_window {str(hf.get('attention_window'))[:60]} must be an even number ≥ 2 "
                       f"or a list of {L} (one per layer), as transformers asserts; fix the model's config")
    return tuple(w // 2 + 1 for w in W)


def config(hf: dict) -> ModelConfig:
    """config.json → the knobs: RoBERTa's, and each layer's window (onnx_export and sep_token_id change no number)."""
    return roberta.config(hf).with_(layer_windows=windows(hf))     # family "longformer": config.json's model_type


# The table, read both ways: RoBERTa's (its encoder under "longformer." beside a masked-LM head), and each layer's
# global projections.
GLOBAL_ROWS = [
    *linear("block.attn.W_Qg", "encoder.layer.{i}.attention.self.query_global", "d q", "block.attn.b_Qg"),
    *linear("block.attn.W_Kg", "encoder.layer.{i}.attention.self.key_global", "d q", "block.attn.b_Kg"),
    *linear("block.attn.W_Vg", "encoder.layer.{i}.attention.self.value_global", "d q", "block.attn.b_Vg"),
]
ROWS = roberta.ROWS + GLOBAL_ROWS
weights, tensors = both_ways(ROWS, lambda w: "" if w.W_head is None else "longformer.")


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a LongformerModel (or LongformerForMaskedLM) with these knobs (no dropout; global tokens
    are an input, not a knob config.json holds)."""
    cfg = cfg.with_(global_tokens=())
    hf = {
        "model_type": "longformer", "architectures": ["LongformerForMaskedLM" if cfg.lm_head else "LongformerModel"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions + cfg.position_offset, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "hidden_act": HF_ACTIVATIONS[cfg.activation],
        "attention_window": [2 * (w - 1) for w in cfg.layer_windows or ()],
        "tie_word_embeddings": cfg.tied_embeddings, "is_decoder": False,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pad_token_id": cfg.pad_token_id,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
    }
    return reads_back(cfg, hf, config)

