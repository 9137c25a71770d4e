"""Whisper: speech to text, an encoder–decoder whose encoder reads log-mel frames.

    checkpoint name (relative to WhisperModel)        qkv name
    encoder.conv1 (d, mels, 3), conv2 (d, d, 3)       encoder.front: two ConvWeights (stride 1, then 2), each + GELU
    encoder.embed_positions (S, d)                    encoder.pos_embed: a fixed sinusoidal table, stored
    decoder.embed_tokens (V, d)                       tok_embed (the decoder's; the encoder reads no tokens)
    decoder.embed_positions (P, d)                    decoder.pos_embed: learned, position p reads row p
    {stack}.layers.{i}.self_attn_layer_norm           attn_norm (before attention: pre-norm)
    {stack}.layers.{i}.self_attn.q_proj/k_proj/v_proj/out_proj   W_Q / W_K / W_V / W_O (k_proj has no bias)
    decoder.layers.{i}.encoder_attn_layer_norm, encoder_attn.*   cross_norm, cross_attn
    {stack}.layers.{i}.final_layer_norm, fc1, fc2     ffn_norm, W_in / W_out (GELU)
    {stack}.layer_norm                                final_norm of each stack
    proj_out (WhisperForConditionalGeneration)        W_vocab: the token table's transpose (tied), else its own
The input is S·2 frames of log-mel features (what WhisperFeatureExtractor makes: 80 or 128 mels, 3,000 frames for
30 s); the second convolution halves them to S positions, so encoder position i covers 20 ms of sound (i · 0.02 s).
Writing (the language and task prompt, suppressed tokens, timestamps) is qkv.writing.transcribe's, reading the
checkpoint's generation_config.json. What qkv leaves out, in one line each where it matters: training through
the convolutions, WhisperForAudioClassification (use_weighted_layer_sum). SpecAugment, dropout and LayerDrop act
only in training. scale_embedding is read as transformers reads it: its encoder and decoder compute √d_model and
never multiply by it, so neither does qkv.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import ConvWeights, Seq2SeqWeights
from . import bart
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .table import About
from .tensors import TensorStore

MODEL_TYPES = ("whisper",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("whisper",), models="Whisper (`WhisperForConditionalGeneration`, `WhisperModel`)",
          brings="log-mel frames through two GELU convolutions (stride 1, then 2) + a stored sinusoidal table, "
                 "pre-norm stacks with a final LayerNorm each, `k_proj` without bias, learned decoder positions, tied"
                 " `proj_out`; run and forward take a transcript, `transcribe` writes one (a sound file in, greedy under "
                 "its generation_config.json, timestamps, long-form); training refused in one line",
          kind="audio"),
)

IGNORED: dict[str, str] = {}
ARCHITECTURES = ("WhisperForConditionalGeneration", "WhisperModel")


def config(hf: dict) -> ModelConfig:
    kinds = [a for a in hf.get("architectures") or ["WhisperForConditionalGeneration"] if isinstance(a, str)]
    other = [a for a in kinds if a not in ARCHITECTURES]
    if other:
        raise QkvError(f"{other[0]} is not supported; qkv runs Whisper as {' or '.join(ARCHITECTURES)}")
    if hf.get("use_weighted_layer_sum"):
        raise QkvError("use_weighted_layer_sum (WhisperForAudioClassification) is not supported; qkv runs Whisper "
                       "as speech to text")
    d = need(hf, "d_model")
    heads, ffn = need(hf, "encoder_attention_heads"), need(hf, "encoder_ffn_dim")
    if hf.get("decoder_attention_heads", heads) != heads or hf.get("decoder_ffn_dim", ffn) != ffn:
        raise QkvError("whisper: encoder and decoder with different heads or FFN widths are not supported; "
                       "use a checkpoint whose two stacks have the same width")
    check_shapes({}, d, heads)
    return ModelConfig(
        family="whisper", vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "encoder_layers"),
        n_decoder_layers=hf.get("decoder_layers", hf["encoder_layers"]), n_heads=heads, d_ff=ffn,
        max_positions=hf.get("max_target_positions", 448), causal=True, norm="layer", norm_place="pre",
        norm_eps=1e-5, position="learned", activation=activation(hf.get("activation_function", "gelu")),
        final_norm=True,                 # scale_embedding: transformers computes √d_model and never applies it
        lm_head="WhisperForConditionalGeneration" in kinds, tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        encoder_decoder=True, pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"), decoder_start_token_id=hf.get("decoder_start_token_id"),
        audio_mels=hf.get("num_mel_bins", 80), source_positions=hf.get("max_source_positions", 1500))


def _conv(store: TensorStore, name: str, c_in: int, c_out: int, stride: int, dtype) -> ConvWeights:
    W = store.get(f"{name}.weight", (c_out, c_in, 3), dtype)                 # (C_out, C_in, kernel)
    return ConvWeights(W=np.ascontiguousarray(W.transpose(2, 1, 0)).reshape(3 * c_in, c_out),   # row j·C_in + c
                       b=store.get(f"{name}.bias", (c_out,), dtype), kernel=3, stride=stride, padding=1)


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Seq2SeqWeights:
    d = cfg.d_model
    tok = store.get("decoder.embed_tokens.weight", (cfg.vocab_size, d), dtype)
    encoder = bart.stack(store, cfg, dtype, "encoder", tok, store.get("encoder.embed_positions.weight",
                                                                      (cfg.source_positions, d), dtype), key_bias=False)
    encoder.front = [_conv(store, "encoder.conv1", cfg.audio_mels, d, 1, dtype), _conv(store, "encoder.conv2", d, d, 2, dtype)]
    decoder = bart.stack(store, cfg, dtype, "decoder", tok, store.get("decoder.embed_positions.weight",
                                                                      (cfg.max_positions, d), dtype), key_bias=False)
    if cfg.lm_head:
        own = store.has("proj_out.weight") and not cfg.tied_embeddings
        decoder.W_vocab = linear_T(store, "proj_out.weight", d, cfg.vocab_size, dtype) if own else tok.T
        if cfg.tied_embeddings and store.has("proj_out.weight"):
            store.get("proj_out.weight", (cfg.vocab_size, d), dtype)          # a tied copy: read, the table is used
    return Seq2SeqWeights(encoder, decoder)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a WhisperForConditionalGeneration (WhisperModel without a head) with these knobs."""
    return reads_back(cfg, {
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration" if cfg.lm_head else "WhisperModel"],
        "vocab_size": cfg.vocab_size, "num_mel_bins": cfg.audio_mels, "d_model": cfg.d_model,
        "encoder_layers": cfg.n_layers, "decoder_layers": cfg.n_decoder_layers, "encoder_attention_heads": cfg.n_heads,
        "decoder_attention_heads": cfg.n_heads, "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
        "max_source_positions": cfg.source_positions, "max_target_positions": cfg.max_positions,
        "activation_function": HF_ACTIVATIONS[cfg.activation], "scale_embedding": False,
        "tie_word_embeddings": cfg.tied_embeddings, "is_encoder_decoder": True, "dropout": 0.0,
        "attention_dropout": 0.0, "activation_dropout": 0.0, "pad_token_id": cfg.pad_token_id,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        "decoder_start_token_id": cfg.decoder_start_token_id}, config)


def tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under WhisperForConditionalGeneration's names ("model." + the table's), as its file stores them."""
    enc, dec = weights.encoder, weights.decoder
    t = bart.stack_tensors(enc, cfg, "encoder", True) | bart.stack_tensors(dec, cfg, "decoder", True)
    for name, conv in zip(("conv1", "conv2"), enc.front):
        c_in = conv.W.shape[0] // conv.kernel
        t[f"model.encoder.{name}.weight"] = conv.W.reshape(conv.kernel, c_in, -1).transpose(2, 1, 0)   # (C_out, C_in, k)
        t[f"model.encoder.{name}.bias"] = conv.b
    t["model.decoder.embed_tokens.weight"] = weights.tok_embed
    if dec.W_vocab is not None and not np.shares_memory(dec.W_vocab, weights.tok_embed):
        t["proj_out.weight"] = dec.W_vocab.T
    return c_arrays(t)
