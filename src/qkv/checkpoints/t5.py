"""T5: an encoder–decoder, pre-norm RMSNorm, relative position buckets, no 1/√d_k, no biases.

    checkpoint name (relative to T5ForConditionalGeneration)        qkv name
    shared                                                          tok_embed (both stacks)
    {stack}.block.0.layer.0.SelfAttention.relative_attention_bias   rel_bias (buckets, H), for every layer
    {stack}.block.{i}.layer.0.SelfAttention.q / k / v / o           W_Q / W_K / W_V / W_O
    {stack}.block.{i}.layer.0.layer_norm                            attn_norm (RMS, before attention)
    decoder.block.{i}.layer.1.EncDecAttention.q / k / v / o         cross_attn: Q from the decoder, K, V from
                                                                    the encoder
    decoder.block.{i}.layer.1.layer_norm                            cross_norm
    {stack}.block.{i}.layer.{f}.DenseReluDense.wi / wo              W_in / W_out: ReLU(x·W_in)·W_out
    {stack}.block.{i}.layer.{f}.DenseReluDense.wi_0 / wi_1          v1.1 "gated-gelu": W_gate / W_in,
                                                                    GELU(x·W_gate) ⊙ x·W_in (tanh GELU)
    {stack}.block.{i}.layer.{f}.layer_norm                          ffn_norm
    {stack}.final_layer_norm                                        final_norm
    lm_head (absent when tied)                                      W_vocab
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
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Seq2SeqWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, linear_T, need, reads_back
from .tensors import TensorStore

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


def _stack(store: TensorStore, cfg: ModelConfig, dtype, which: str, tok: np.ndarray) -> Weights:
    d, f, inner = cfg.d_model, cfg.d_ff, cfg.n_heads * cfg.d_head
    decoder = which == "decoder"

    def rms(name: str) -> NormWeights:
        return NormWeights(store.get(f"{name}.weight", (d,), dtype))

    def attention(p: str) -> AttentionWeights:
        return AttentionWeights(W_Q=linear_T(store, f"{p}.q.weight", d, inner, dtype),
                                W_K=linear_T(store, f"{p}.k.weight", d, inner, dtype),
                                W_V=linear_T(store, f"{p}.v.weight", d, inner, dtype),
                                W_O=linear_T(store, f"{p}.o.weight", inner, d, dtype))

    def block(i: int) -> BlockWeights:
        p = f"{which}.block.{i}.layer"
        ff = f"{p}.{2 if decoder else 1}"
        m = f"{ff}.DenseReluDense"
        if cfg.gated_ffn:
            ffn = FFNWeights(W_gate=linear_T(store, f"{m}.wi_0.weight", d, f, dtype),
                             W_in=linear_T(store, f"{m}.wi_1.weight", d, f, dtype),
                             W_out=linear_T(store, f"{m}.wo.weight", f, d, dtype))
        else:
            ffn = FFNWeights(W_in=linear_T(store, f"{m}.wi.weight", d, f, dtype),
                             W_out=linear_T(store, f"{m}.wo.weight", f, d, dtype))
        return BlockWeights(attn_norm=rms(f"{p}.0.layer_norm"), attn=attention(f"{p}.0.SelfAttention"),
                            ffn_norm=rms(f"{ff}.layer_norm"), ffn=ffn,
                            cross_attn=attention(f"{p}.1.EncDecAttention") if decoder else None,
                            cross_norm=rms(f"{p}.1.layer_norm") if decoder else None)

    rel = store.get(f"{which}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                    (cfg.relative_buckets, cfg.n_heads), dtype)
    return Weights(tok_embed=tok, blocks=[block(i) for i in range(cfg.n_decoder_layers if decoder else cfg.n_layers)],
                   final_norm=rms(f"{which}.final_layer_norm"), rel_bias=rel)


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Seq2SeqWeights:
    d, V = cfg.d_model, cfg.vocab_size
    name = "shared.weight" if store.has("shared.weight") else "encoder.embed_tokens.weight"
    tok = store.get(name, (V, d), dtype)
    encoder, decoder = _stack(store, cfg, dtype, "encoder", tok), _stack(store, cfg, dtype, "decoder", tok)
    decoder.W_vocab = tok.T if not store.has("lm_head.weight") else linear_T(store, "lm_head.weight", d, V, dtype)
    return Seq2SeqWeights(encoder, decoder)


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
    t = {"shared.weight": weights.tok_embed}                                          # (V, d)
    for which, w in (("encoder", weights.encoder), ("decoder", weights.decoder)):
        t[f"{which}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = w.rel_bias   # (buckets, H)
        t[f"{which}.final_layer_norm.weight"] = w.final_norm.weight
        for i, b in enumerate(w.blocks):
            p = f"{which}.block.{i}.layer"
            sublayers = [(f"{p}.0", "SelfAttention", b.attn, b.attn_norm)]
            if b.cross_attn is not None:
                sublayers.append((f"{p}.1", "EncDecAttention", b.cross_attn, b.cross_norm))
            for s, name, a, n in sublayers:
                t |= {f"{s}.{name}.q.weight": a.W_Q.T, f"{s}.{name}.k.weight": a.W_K.T,     # (H·d_k, d)
                      f"{s}.{name}.v.weight": a.W_V.T, f"{s}.{name}.o.weight": a.W_O.T,     # o: (d, H·d_k)
                      f"{s}.layer_norm.weight": n.weight}
            f = f"{p}.{len(sublayers)}"                                                # the FFN comes last
            if b.ffn.W_gate is not None:
                t |= {f"{f}.DenseReluDense.wi_0.weight": b.ffn.W_gate.T,                # (d_ff, d)
                      f"{f}.DenseReluDense.wi_1.weight": b.ffn.W_in.T}
            else:
                t[f"{f}.DenseReluDense.wi.weight"] = b.ffn.W_in.T                      # (d_ff, d)
            t |= {f"{f}.DenseReluDense.wo.weight": b.ffn.W_out.T, f"{f}.layer_norm.weight": b.ffn_norm.weight}
    if not np.shares_memory(weights.decoder.W_vocab, weights.tok_embed):
        t["lm_head.weight"] = weights.decoder.W_vocab.T                               # (V, d)
    return c_arrays(t)
