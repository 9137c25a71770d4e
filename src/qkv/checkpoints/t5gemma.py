"""T5Gemma: Gemma 2's blocks as an encoder–decoder (T5GemmaForConditionalGeneration).

Its tensors: `stack_rows` below, each checkpoint name (relative to T5GemmaModel) beside ours and how it is
stored, read both ways (loading and saving). {which} is "encoder" or "decoder":

    {which}.embed_tokens                        tok_embed: each stack its own table (× √d_model, as Gemma)
    {which}.layers.{i}.pre_self_attn_layernorm  attn_norm       RMSNorm·(1 + w), as every norm here
    {which}.layers.{i}.self_attn.q/k/v/o_proj   attn.W_Q / W_K / W_V / W_O   (GQA, RoPE, soft-capped scores)
    {which}.layers.{i}.post_self_attn_layernorm attn_out_norm   (attention's output, before the stream)
    decoder.layers.{i}.pre_cross_attn_layernorm cross_norm
    decoder.layers.{i}.cross_attn.q/k/v/o_proj  cross_attn.W_Q / W_K / W_V / W_O  (K, V of the encoder's output)
    decoder.layers.{i}.post_cross_attn_layernorm cross_out_norm
    {which}.layers.{i}.pre/post_feedforward_layernorm   ffn_norm / ffn_out_norm
    {which}.layers.{i}.mlp.gate_proj/up_proj/down_proj  W_gate / W_in / W_out: GeGLU
    {which}.norm                                final_norm
    lm_head.out_proj (absent when tied)         W_vocab: tied to the decoder's table (tie_word_embeddings)

config.json holds two Gemma 2 module configs, "encoder" and "decoder" (absent keys: T5GemmaModuleConfig's
defaults, a soft-cap written null: none). Each stack reads its own: sliding and full layers (layer_types;
default every other layer sliding), query_pre_attn_scalar, attn_logit_softcapping (the cross-attention
soft-caps its scores too), the decoder's final_logit_softcapping on the logits. The encoder attends both
ways and its sliding layers see |i − j| ≤ sliding_window (transformers' bidirectional sliding mask: the
engine's window sliding_window + 1, encoder_layer_windows), the decoder's i − j < sliding_window. Positions
are 0..n−1 whatever the padding (RoPE, both stacks, as transformers numbers them); the decoder starts
from bos_token_id. A pass given no attention mask reads every id (transformers' T5Gemma then masks the ids
equal to pad_token_id: give the mask, as its generate does). qkv runs the two stacks by one config: a T5Gemma
whose encoder and decoder differ in a knob (9b-2b: another width, depth) is refused in one line, as are RoPE
tables that change with the length (dynamic, longrope). No GGUF: llama.cpp's architectures (gguf-py 0.19's
MODEL_ARCH) have T5 and T5ENCODER but no T5Gemma.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from ..core.config import ModelConfig
from ..core.positions import rope_kind
from ..core.weights import Seq2SeqWeights
from ..runtime.errors import QkvError
from . import gemma2
from .common import c_arrays, check_config, layer_types, linear_T, reads_back, rope_parameters
from .table import About, Gamma, Row, attention, gated_ffn, out_bias, qkv_bias, read_table, write_table
from .tensors import TensorStore

MODEL_TYPES = ("t5gemma",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("t5gemma",), models="T5Gemma",
          brings="Gemma 2's blocks as an encoder–decoder (`encoder`, `decoder` module configs): a norm before and "
                 "after self-attention, cross-attention and the FFN, sliding and full layers (`layer_types`; the "
                 "encoder's window reaching both ways, |i − j| ≤ `sliding_window`), soft-capped scores (the "
                 "cross-attention's too) and logits, GQA in the cross-attention, each stack its own √d-scaled table",
          kind="encoder–decoder"),
)

IGNORED: dict[str, str] = {}

# T5GemmaModuleConfig's defaults: what a module config.json that leaves a key out means
MODULE_DEFAULTS = {
    "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
    "attention_bias": False, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
}
READ = {*MODULE_DEFAULTS, "layer_types", "rope_parameters", "rope_theta", "rope_scaling"}   # a module's keys qkv
                                       # reads: the others (mlp_bias, use_bidirectional_attention) no T5Gemma reads
NULLABLE = ("final_logit_softcapping", "attn_logit_softcapping", "sliding_window")   # null: none, not the default
UNREAD = ("final_softcap", "tied_embeddings")   # the encoder's final_logit_softcapping (no logits of its own), the
                                                # modules' tie_word_embeddings (the top level's ties)
GROWING = ("dynamic", "longrope")      # RoPE tables that change with the length: refused


def _module(hf: dict, which: str) -> ModelConfig:
    """The knobs of config.json's WHICH module ("encoder" or "decoder"), read as a Gemma 2 decoder's."""
    sub = hf.get(which) or {}
    if not isinstance(sub, dict):
        raise QkvError(f"config.json {which} = {sub!r:.40} is not an object; restore the checkpoint's config.json")
    checked = {k: v for k, v in check_config(sub, f"config.json ({which})").items() if k in READ}
    nulls = {k: None for k in NULLABLE if k in sub and sub[k] is None}
    cfg = gemma2.config(MODULE_DEFAULTS | checked | nulls | {"model_type": "gemma2"})
    if rope_kind(cfg.rope_scaling) in GROWING:
        raise QkvError(f"T5Gemma with rope_type {rope_kind(cfg.rope_scaling)!r} is not supported (its table changes "
                       "with the length); use a checkpoint with rope_type 'default', 'linear' or 'yarn'")
    return cfg


def _alike(enc: ModelConfig, dec: ModelConfig) -> None:
    """One error naming the first knob the encoder's and the decoder's configs differ in (but those only one of
    them reads): qkv runs both stacks by one config."""
    for f in fields(ModelConfig):
        a, b = getattr(enc, f.name), getattr(dec, f.name)
        if f.name not in UNREAD and a != b:
            raise QkvError(f"T5Gemma whose encoder and decoder differ ({f.name}: {a!r:.40} and {b!r:.40}) is not "
                           "supported; qkv runs T5Gemma whose two stacks have the same sizes and knobs "
                           "(2b-2b, 9b-9b; not 9b-2b)")


def config(hf: dict) -> ModelConfig:
    if hf.get("is_encoder_decoder", True) is False:
        raise QkvError("T5Gemma's encoder alone (is_encoder_decoder false: T5GemmaEncoderModel) is not supported; "
                       "use a T5GemmaForConditionalGeneration checkpoint")
    enc, dec = _module(hf, "encoder"), _module(hf, "decoder")
    _alike(enc, dec)
    windows = [dec.window(i) for i in range(dec.n_layers)]
    both_ways = tuple(None if w is None else w + 1 for w in windows)   # |i − j| ≤ w is |i − j| < w + 1
    return dec.with_(
        family="t5gemma", encoder_decoder=True, n_decoder_layers=dec.n_layers,
        encoder_layer_windows=both_ways if any(windows) else None,
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        decoder_start_token_id=dec.bos_token_id,          # generate's fallback: T5Gemma has no decoder_start_token_id
    )


GAMMA = Gamma(lambda cfg: True)                            # every RMSNorm: x·(1 + w), w stored


def stack_rows(which: str) -> list[Row]:
    """The table of one stack ("encoder", or "decoder" with a cross-attention in each block), read both ways:
    four norms around attention and the FFN (six in the decoder: the cross-attention's two), the GeGLU FFN, the
    final norm and the stack's own embedding table."""
    p = f"{which}.layers.{{i}}"
    cross = [
        Row("block.cross_norm", f"{p}.pre_cross_attn_layernorm.weight", "d", GAMMA),
        *attention(f"{p}.cross_attn", qkv_bias, out_bias, ours="block.cross_attn"),
        Row("block.cross_out_norm", f"{p}.post_cross_attn_layernorm.weight", "d", GAMMA),
    ] if which == "decoder" else []
    return [
        Row("tok_embed", f"{which}.embed_tokens.weight", "V d"),
        Row("block.attn_norm", f"{p}.pre_self_attn_layernorm.weight", "d", GAMMA),
        *attention(f"{p}.self_attn", qkv_bias, out_bias),
        Row("block.attn_out_norm", f"{p}.post_self_attn_layernorm.weight", "d", GAMMA),
        *cross,
        Row("block.ffn_norm", f"{p}.pre_feedforward_layernorm.weight", "d", GAMMA),
        *gated_ffn(f"{p}.mlp"),
        Row("block.ffn_out_norm", f"{p}.post_feedforward_layernorm.weight", "d", GAMMA),
        Row("final_norm", f"{which}.norm.weight", "d", GAMMA),
    ]


HEAD = "lm_head.out_proj.weight"


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Seq2SeqWeights:
    """Both stacks by `stack_rows`, each over its own table, and the head: lm_head.out_proj when the file has
    one (untied), else the decoder's table's transpose."""
    encoder, decoder = (read_table(stack_rows(which), store, cfg, dtype, n)
                        for which, n in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)))
    if cfg.tied_embeddings and not store.has(HEAD):
        decoder.W_vocab = decoder.tok_embed.T                                        # (d, V) a view
    else:
        decoder.W_vocab = linear_T(store, HEAD, cfg.d_model, cfg.vocab_size, dtype)  # (d, V)
    return Seq2SeqWeights(encoder, decoder)


def tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under T5GemmaForConditionalGeneration's name ("model." + stack_rows'), and lm_head.out_proj
    when W_vocab is not the decoder's table; new arrays."""
    t = {}
    for which, w in (("encoder", weights.encoder), ("decoder", weights.decoder)):
        t |= write_table(stack_rows(which), w, cfg, "model.")
    if not np.shares_memory(weights.decoder.W_vocab, weights.decoder.tok_embed):
        t[HEAD] = weights.decoder.W_vocab.T                                          # (V, d)
    return c_arrays(t)


def _module_json(cfg: ModelConfig, decoder: bool) -> dict:
    """One module config (T5GemmaModuleConfig's keys) of CFG's knobs; the encoder's windows are the decoder's."""
    scalar = round(cfg.score_scale ** -2, 6) if cfg.score_scale else cfg.d_head   # S·scalar^-½; None: 1/√d_k
    windowed = any(cfg.window(i) is not None for i in range(cfg.n_layers))
    return {
        "model_type": "t5_gemma_module", "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_decoder_layers if decoder else cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.d_head,
        "hidden_activation": gemma2.hf_activation(cfg), "max_position_embeddings": cfg.max_positions,
        "rms_norm_eps": cfg.norm_eps, "rope_parameters": rope_parameters(cfg), "attention_bias": cfg.out_bias,
        "query_pre_attn_scalar": int(scalar) if scalar == int(scalar) else scalar,
        "sliding_window": cfg.sliding_window if windowed else None, "layer_types": layer_types(cfg),
        "final_logit_softcapping": cfg.final_softcap, "attn_logit_softcapping": cfg.attn_softcap,
        "pad_token_id": cfg.pad_token_id, "eos_token_id": cfg.eos_token_id, "bos_token_id": cfg.bos_token_id,
        "is_decoder": decoder, "dropout_rate": 0.0, "attention_dropout": 0.0,
    }


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a T5GemmaForConditionalGeneration with these knobs (no dropout)."""
    if cfg.decoder_start_token_id != cfg.bos_token_id:
        raise QkvError(f"a t5gemma config.json cannot hold decoder_start_token_id={cfg.decoder_start_token_id} "
                       f"(T5Gemma starts from bos_token_id {cfg.bos_token_id}); change that knob")
    hf = {"model_type": "t5gemma", "architectures": ["T5GemmaForConditionalGeneration"],
          "encoder": _module_json(cfg, False), "decoder": _module_json(cfg, True), "vocab_size": cfg.vocab_size,
          "tie_word_embeddings": cfg.tied_embeddings, "is_encoder_decoder": True, "dropout_rate": 0.0,
          "attention_dropout": 0.0, "pad_token_id": cfg.pad_token_id, "eos_token_id": cfg.eos_token_id,
          "bos_token_id": cfg.bos_token_id}
    return reads_back(cfg, hf, config)
