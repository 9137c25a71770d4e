"""Pegasus: BART's blocks pre-norm, Marian's sinusoids without an offset, a final LayerNorm per stack.

    checkpoint name (relative to PegasusModel)         qkv name
    shared                                             tok_embed (both stacks), read × √d_model if scale_embedding
                                                       (tie_word_embeddings=false: {stack}.embed_tokens, each its own)
    {stack}.embed_positions   (P, d)                   pos_embed: [sin | cos] sinusoids, position p reads row p
                                                       (computed as positions.sinusoidal_halves when absent)
    {stack}.layers.{i}.self_attn_layer_norm            attn_norm (before attention: pre-norm)
    {stack}.layers.{i}.self_attn.q_proj/…/out_proj     W_Q / W_K / W_V / W_O (+ b)
    decoder.layers.{i}.encoder_attn_layer_norm         cross_norm (before the cross-attention)
    decoder.layers.{i}.encoder_attn.q_proj/…/out_proj  cross_attn: Q from the decoder, K, V from the encoder
    {stack}.layers.{i}.final_layer_norm                ffn_norm (before the FFN)
    {stack}.layers.{i}.fc1 / fc2                       W_in / W_out
    {stack}.layer_norm                                 final_norm: the encoder's output M, the decoder's Y
    lm_head (absent when tied)                         W_vocab (untied: its own, the decoder's table apart)
    final_logits_bias (1, V)                           b_vocab
No embedding LayerNorm. PegasusSinusoidalPositionalEmbedding is Marian's table (the sines of all
frequencies in the first ⌈d/2⌉ columns, the cosines after, not interleaved as the first seed's), read
from row p itself (BART's learned table starts at row 2). transformers saves the table: qkv reads the
stored one, as transformers loads it. The decoder starts from decoder_start_token_id, Pegasus's pad.
`hf_config` / `tensors` write a PegasusForConditionalGeneration ("model." + the names above).
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..core.positions import sinusoidal_halves
from ..core.weights import Seq2SeqWeights
from . import bart
from .common import c_arrays, reads_back
from .table import About
from .tensors import TensorStore

MODEL_TYPES = ("pegasus",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("pegasus",), models="Pegasus",
          brings="pre-norm with a final LayerNorm per stack, Marian's sinusoids (sines first, cosines after) from row"
                 " 0, without BART's offset, scaled embeddings; the decoder starts from the pad token; untied embeddings "
                 "(`tie_word_embeddings` false: each stack its own table, `lm_head` its own)",
          kind="encoder–decoder"),
)

IGNORED = {k: v for k, v in bart.IGNORED.items() if "version" not in k}


def config(hf: dict) -> ModelConfig:
    knobs = bart.stacks_config(hf, "pegasus", untied=True) | dict(norm_place="pre", final_norm=True)
    return ModelConfig(**knobs, position="sinusoidal", embed_norm=False)


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Seq2SeqWeights:
    enc_tok, dec_tok = bart.tables(store, cfg, dtype)
    P, d = cfg.max_positions, cfg.d_model

    def pos(which: str) -> np.ndarray:                              # (P, d)
        name = f"{which}.embed_positions.weight"
        return store.get(name, (P, d), dtype) if store.has(name) else sinusoidal_halves(P, d).astype(dtype)

    encoder = bart.stack(store, cfg, dtype, "encoder", enc_tok, pos("encoder"))
    decoder = bart.stack(store, cfg, dtype, "decoder", dec_tok, pos("decoder"))
    decoder.W_vocab, decoder.b_vocab = bart.head(store, cfg, dtype, dec_tok)
    return Seq2SeqWeights(encoder, decoder)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a PegasusForConditionalGeneration with these knobs."""
    return reads_back(cfg, {"model_type": "pegasus", "architectures": ["PegasusForConditionalGeneration"],
                            **bart.stacks_hf_config(cfg)}, config)


def tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under PegasusForConditionalGeneration's name, the sinusoids too (transformers saves
    them); new arrays."""
    return c_arrays(bart.head_tensors(weights, cfg) | bart.stack_tensors(weights.encoder, cfg, "encoder", True)
                    | bart.stack_tensors(weights.decoder, cfg, "decoder", True))
