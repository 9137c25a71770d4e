"""T5: an encoder–decoder, pre-norm RMSNorm, relative position buckets, no 1/√d_k, no biases.

Its tensors: `stack_rows` below, each checkpoint name (relative to T5ForConditionalGeneration) beside ours and how
it is stored, read both ways (loading and saving).
{f} is 1 in the encoder, 2 in the decoder (after the cross-attention). Heads have d_kv, which
need not be d_model / H. The original T5 ties W_vocab to the table and scales the decoder's output
by d_model^-0.5 first; v1.1 (flan-t5) has its own lm_head and no rescale. transformers 5 writes
`scale_decoder_outputs` for that and keeps `tie_word_embeddings` true, untying a head stored apart:
we read the head if the file has one, as it does. `hf_config` / `tensors` write one back.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import Seq2SeqWeights
from .common import HF_ACTIVATIONS, activation, c_arrays, linear_T, need, reads_back
from .table import LINEAR, About, Row, gated_ffn, layer_norm, read_table, write_table
from .tensors import TensorStore

MODEL_TYPES = ("t5",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("t5",), models="T5 v1.0 / v1.1 (flan-t5)",
          brings="encoder–decoder with cross-attention; T5's relative position bias and unscaled scores",
          kind="encoder–decoder"),
)

# Tensors a T5 checkpoint may hold that qkv never reads, relative to T5ForConditionalGeneration.
IGNORED = {
    "encoder.embed_tokens.weight": "a copy of shared (transformers ties it to shared)",
    "decoder.embed_tokens.weight": "likewise",
    "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight":
        "a position bias for the cross-attention, which T5 never applies (transformers ignores it too)",
}


def _ffn(hf: dict, default: str) -> tuple[bool, str]:
    """feed_forward_proj "relu" / "gated-gelu" / "gated-silu" … (absent: DEFAULT) → (gated, our activation)."""
    proj = hf.get("feed_forward_proj", default)
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise QkvError(f"T5 feed_forward_proj {proj!r} is not supported; use 'relu', 'gated-gelu' or 'gated-ACT'")
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]         # transformers' own special case
    return len(parts) == 2, activation(act)


def config(hf: dict) -> ModelConfig:
    gated, act = _ffn(hf, "relu")
    tied = bool(hf.get("tie_word_embeddings", True))
    return ModelConfig(
        family="t5", vocab_size=need(hf, "vocab_size"), d_model=need(hf, "d_model"), n_layers=need(hf, "num_layers"),
        n_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"], n_heads=need(hf, "num_heads"),
        d_head=need(hf, "d_kv"), d_ff=need(hf, "d_ff"), max_positions=hf.get("n_positions", 512), causal=True,
        norm="rms", norm_place="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-6), position="relative",
        relative_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_max_distance=hf.get("relative_attention_max_distance", 128), scale_scores=False,
        activation=act, gated_ffn=gated, qkv_bias=False, out_bias=False, ffn_bias=False, tied_embeddings=tied,
        scale_decoder_output=bool(hf.get("scale_decoder_outputs", tied)), final_norm=True, lm_head=True,
        encoder_decoder=True, pad_token_id=hf.get("pad_token_id", 0), eos_token_id=hf.get("eos_token_id", 1),
        decoder_start_token_id=hf.get("decoder_start_token_id", hf.get("pad_token_id", 0)),
        forced_bos_token_id=hf.get("forced_bos_token_id"),  # the first token written, as transformers' generate
        pad_embedding_frozen=False,                          # shared: a plain nn.Embedding, the pad row learns
    )


def gated(cfg: ModelConfig) -> bool:
    return cfg.gated_ffn


def plain(cfg: ModelConfig) -> bool:
    return not cfg.gated_ffn


def _attention(p: str, ours: str) -> list[Row]:
    """q, k, v, o at P (Linears without biases; T5 does not scale Q·Kᵀ)."""
    return [Row(f"{ours}.W_Q", f"{p}.q.weight", "d q", LINEAR), Row(f"{ours}.W_K", f"{p}.k.weight", "d kv", LINEAR),
            Row(f"{ours}.W_V", f"{p}.v.weight", "d kv", LINEAR), Row(f"{ours}.W_O", f"{p}.o.weight", "q d", LINEAR)]


def stack_rows(which: str, bias_per_layer: bool = False) -> list[Row]:
    """The table of one stack ("encoder", or "decoder" with cross-attention in layer.1 of each block), read both
    ways: each sublayer's RMSNorm (no β) before it; the FFN last (wi, or wi_0 and wi_1 gated); the relative
    position bias table (buckets, H) in block 0's self-attention, the stack's (or, BIAS_PER_LAYER, each
    block's own: UMT5)."""
    p = f"{which}.block.{{i}}.layer"
    ff = f"{p}.{2 if which == 'decoder' else 1}"
    bias = "relative_attention_bias.weight"
    cross = [*_attention(f"{p}.1.EncDecAttention", "block.cross_attn"),
             *layer_norm("block.cross_norm", f"{p}.1.layer_norm", bias=False)] if which == "decoder" else []
    return [
        Row("block.attn.rel_bias", f"{p}.0.SelfAttention.{bias}", "R H") if bias_per_layer else
        Row("rel_bias", f"{which}.block.0.layer.0.SelfAttention.{bias}", "R H"),
        *layer_norm("block.attn_norm", f"{p}.0.layer_norm", bias=False),
        *_attention(f"{p}.0.SelfAttention", "block.attn"),
        *cross,
        *layer_norm("block.ffn_norm", f"{ff}.layer_norm", bias=False),
        *gated_ffn(f"{ff}.DenseReluDense", "wi_0", "wi_1", "wo", when=gated),
        Row("block.ffn.W_in", f"{ff}.DenseReluDense.wi.weight", "d f", LINEAR, plain),
        Row("block.ffn.W_out", f"{ff}.DenseReluDense.wo.weight", "f d", LINEAR, plain),
        *layer_norm("final_norm", f"{which}.final_layer_norm", bias=False),
    ]


def stacks(store: TensorStore, cfg: ModelConfig, dtype, bias_per_layer: bool = False) -> Seq2SeqWeights:
    """Both stacks by `stack_rows`, over the shared table (older files name it encoder.embed_tokens), and the
    head: lm_head when the file has one, else the table's transpose."""
    name = "shared.weight" if store.has("shared.weight") else "encoder.embed_tokens.weight"
    tok = store.get(name, (cfg.vocab_size, cfg.d_model), dtype)
    encoder, decoder = (read_table(stack_rows(which, bias_per_layer), store, cfg, dtype, n, tok_embed=tok)
                        for which, n in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)))
    decoder.W_vocab = tok.T if not store.has("lm_head.weight") else linear_T(store, "lm_head.weight", cfg.d_model,
                                                                              cfg.vocab_size, dtype)
    return Seq2SeqWeights(encoder, decoder)


def stacks_tensors(weights: Seq2SeqWeights, cfg: ModelConfig, bias_per_layer: bool = False) -> dict:
    """Every tensor of both stacks by `stack_rows`, the shared table, and lm_head when W_vocab is not the table."""
    t = {"shared.weight": weights.tok_embed}                                          # (V, d)
    for which, w in (("encoder", weights.encoder), ("decoder", weights.decoder)):
        t |= write_table(stack_rows(which, bias_per_layer), w, cfg)
    if not np.shares_memory(weights.decoder.W_vocab, weights.tok_embed):
        t["lm_head.weight"] = weights.decoder.W_vocab.T                               # (V, d)
    return c_arrays(t)


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Seq2SeqWeights:
    return stacks(store, cfg, dtype)


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a T5ForConditionalGeneration with these knobs (no dropout)."""
    return reads_back(cfg, {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], **stack_hf_config(cfg),
                            "tie_word_embeddings": cfg.tied_embeddings,
                            "scale_decoder_outputs": cfg.scale_decoder_output}, config)


def stack_hf_config(cfg: ModelConfig) -> dict:
    """The config.json keys T5 and mT5 write alike."""
    if cfg.gated_ffn:
        proj = "gated-gelu" if cfg.activation == "gelu_tanh" else f"gated-{HF_ACTIVATIONS[cfg.activation]}"
    else:
        proj = HF_ACTIVATIONS[cfg.activation]
    return {
        "vocab_size": cfg.vocab_size,
        "d_model": cfg.d_model, "d_kv": cfg.d_head, "d_ff": cfg.d_ff, "num_layers": cfg.n_layers,
        "num_decoder_layers": cfg.n_decoder_layers, "num_heads": cfg.n_heads, "n_positions": cfg.max_positions,
        "relative_attention_num_buckets": cfg.relative_buckets,
        "relative_attention_max_distance": cfg.relative_max_distance, "layer_norm_epsilon": cfg.norm_eps,
        "feed_forward_proj": proj, "is_encoder_decoder": True, "dropout_rate": 0.0,
        "pad_token_id": cfg.pad_token_id, "eos_token_id": cfg.eos_token_id,
        "decoder_start_token_id": cfg.decoder_start_token_id,
        **({} if cfg.forced_bos_token_id is None else {"forced_bos_token_id": cfg.forced_bos_token_id}),
    }


def tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under T5ForConditionalGeneration's name (Linear: (out, in)); new arrays.
    lm_head only when W_vocab is not the table."""
    return stacks_tensors(weights, cfg)
