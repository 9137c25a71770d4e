"""Marian (MarianMT): an encoder–decoder, post-norm, sinusoidal positions, scaled embeddings.

    checkpoint name (relative to MarianModel)          qkv name
    shared                                             tok_embed (both stacks), read × √d_model
    (not stored: computed)                             pos_embed: [sin | cos] sinusoids, positions.sinusoidal_halves
    {stack}.layers.{i}.self_attn.q_proj/…/out_proj     W_Q / W_K / W_V / W_O (+ b)
    {stack}.layers.{i}.self_attn_layer_norm            attn_norm (after the residual)
    decoder.layers.{i}.encoder_attn.q_proj/…/out_proj  cross_attn: Q from the decoder, K, V from the encoder
    decoder.layers.{i}.encoder_attn_layer_norm         cross_norm
    {stack}.layers.{i}.fc1 / fc2                       W_in / W_out
    {stack}.layers.{i}.final_layer_norm                ffn_norm
    lm_head (absent when tied)                         W_vocab
    final_logits_bias (1, V)                           b_vocab
The blocks are BART's, under BART's names (bart.py reads them); Marian differs in what enters
them: E[ids]·√d_model + PE, no embedding LayerNorm. Its sinusoids put the sines of all
frequencies first and the cosines after (not interleaved as the first seed's table), and
transformers never saves them: they are computed here as MarianSinusoidalPositionalEmbedding does.
`hf_config` / `tensors` write a MarianMTModel ("model." + the names above).
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.positions import sinusoidal_halves
from ..core.weights import Seq2SeqWeights
from . import bart
from .common import c_arrays, reads_back
from .table import About
from .tensors import TensorStore

MODEL_TYPES = ("marian",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("marian",), models="Marian (ko-en-tiny)",
          brings="encoder–decoder with cross-attention; sinusoidal positions",
          kind="encoder–decoder"),
)

# Tensors a Marian checkpoint may hold that qkv never reads, relative to MarianModel.
IGNORED = {
    "encoder.embed_positions.weight": "the sinusoids, which qkv computes (older files saved them)",
    "decoder.embed_positions.weight": "likewise",
    "encoder.embed_tokens.weight": "a copy of shared (tied; transformers ties it to shared too)",
    "decoder.embed_tokens.weight": "likewise",
}


def config(hf: dict) -> ModelConfig:
    if hf.get("share_encoder_decoder_embeddings", True) is False:
        raise QkvError("Marian checkpoints with separate source and target embeddings "
                       "(share_encoder_decoder_embeddings=false) are not supported; use one with a shared vocabulary")
    if hf.get("decoder_vocab_size", hf.get("vocab_size")) != hf.get("vocab_size"):
        raise QkvError("Marian: decoder_vocab_size differs from vocab_size; "
                       "use a checkpoint with one shared vocabulary")
    return ModelConfig(**bart.stacks_config(hf, "marian"), position="sinusoidal", embed_norm=False)


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Seq2SeqWeights:
    tok = bart.shared_table(store, cfg, dtype)
    pos = sinusoidal_halves(cfg.max_positions, cfg.d_model).astype(dtype)        # (P, d), both stacks
    encoder = bart.stack(store, cfg, dtype, "encoder", tok, pos)
    decoder = bart.stack(store, cfg, dtype, "decoder", tok, pos)
    decoder.W_vocab, decoder.b_vocab = bart.head(store, cfg, dtype, tok)
    return Seq2SeqWeights(encoder, decoder)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a MarianMTModel with these knobs."""
    return reads_back(cfg, {"model_type": "marian", "architectures": ["MarianMTModel"],
                            **bart.stacks_hf_config(cfg), "decoder_vocab_size": cfg.vocab_size,
                            "share_encoder_decoder_embeddings": True}, config)


def tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under MarianMTModel's name, as its file stores it (no positions: computed); new arrays."""
    return c_arrays(bart.head_tensors(weights, cfg) | bart.stack_tensors(weights.encoder, cfg, "encoder", False)
                    | bart.stack_tensors(weights.decoder, cfg, "decoder", False))
