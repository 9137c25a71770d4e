"""BART: an encoder–decoder, post-norm, learned positions (offset 2), embedding LayerNorm, GELU.

    checkpoint name (relative to BartModel)            qkv name
    shared                                             tok_embed (both stacks)
    {stack}.embed_positions   (P + 2, d)               pos_embed: position p reads row p + 2
    {stack}.layernorm_embedding                        embed_norm
    {stack}.layers.{i}.self_attn.q_proj/k_proj/v_proj/out_proj    W_Q / W_K / W_V / W_O (+ b)
    {stack}.layers.{i}.self_attn_layer_norm            attn_norm (after the residual)
    decoder.layers.{i}.encoder_attn.q_proj/…/out_proj  cross_attn: Q from the decoder, K, V from the encoder
    decoder.layers.{i}.encoder_attn_layer_norm         cross_norm
    {stack}.layers.{i}.fc1 / fc2                       W_in / W_out
    {stack}.layers.{i}.final_layer_norm                ffn_norm
    lm_head (absent when tied)                         W_vocab (the decoder's)
    final_logits_bias (1, V)                           b_vocab
{stack} is "encoder" or "decoder". Marian (marian.py) has the same blocks under the same names.
torch's Linear stores W (out, in): we read its transpose, a view. `config` / `weights` read a
checkpoint by this table; `hf_config` / `tensors` write one, under BartForConditionalGeneration's
names ("model." + the name above; "lm_head" and "final_logits_bias" at the top).
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, Seq2SeqWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back
from .tensors import TensorStore

OFFSET = 2                                     # BartLearnedPositionalEmbedding's offset

# Tensors a BART checkpoint may hold that qkv never reads, relative to BartModel.
IGNORED = {
    "encoder.embed_tokens.weight": "a copy of shared (tied; transformers ties it to shared too)",
    "decoder.embed_tokens.weight": "likewise",
    "encoder.version": "a fairseq leftover, which transformers ignores too",
    "decoder.version": "likewise",
}


def stacks_config(hf: dict, family: str) -> dict:
    """The knobs BART and Marian read alike: sizes of the two stacks (which must match but in depth)."""
    d = need(hf, "d_model")
    heads, ffn = need(hf, "encoder_attention_heads"), need(hf, "encoder_ffn_dim")
    if hf.get("decoder_attention_heads", heads) != heads or hf.get("decoder_ffn_dim", ffn) != ffn:
        raise QkvError(f"{family}: encoder and decoder with different heads or FFN widths are not supported; "
                       "use a checkpoint whose two stacks have the same width")
    check_shapes({}, d, heads)
    if hf.get("tie_word_embeddings", True) is False:         # transformers then keeps three tables
        raise QkvError(f"{family} with tie_word_embeddings=false (separate source, target and output embeddings) "
                       "is not supported; use a checkpoint whose embeddings are shared")
    return dict(
        family=family, vocab_size=need(hf, "vocab_size"), d_model=d, n_layers=need(hf, "encoder_layers"),
        n_decoder_layers=hf.get("decoder_layers", hf["encoder_layers"]), n_heads=heads, d_ff=ffn,
        max_positions=hf.get("max_position_embeddings", 1024), causal=True, norm="layer", norm_place="post",
        norm_eps=1e-5, activation=activation(hf.get("activation_function", "gelu")),
        scale_embedding=bool(hf.get("scale_embedding", False)), final_norm=False, lm_head=True,
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)), encoder_decoder=True,
        pad_token_id=hf.get("pad_token_id"), bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        decoder_start_token_id=hf.get("decoder_start_token_id", hf.get("bos_token_id")),   # as generate: else BOS
        forced_bos_token_id=hf.get("forced_bos_token_id"),
        pad_embedding_frozen=True,                           # the shared table: nn.Embedding(padding_idx=pad)
    )


def config(hf: dict) -> ModelConfig:
    return ModelConfig(**stacks_config(hf, "bart"), position="learned", position_offset=OFFSET, embed_norm=True)


def attention(store: TensorStore, p: str, d: int, dtype, key_bias: bool = True) -> AttentionWeights:
    """The attention at P: q_proj, k_proj, v_proj, out_proj with their biases (k_proj's only if KEY_BIAS: Whisper
    has none, softmax ignoring a constant added to every score of a row)."""
    def lin(name: str) -> np.ndarray:
        return linear_T(store, f"{p}.{name}.weight", d, d, dtype)

    def bias(name: str) -> np.ndarray:
        return store.get(f"{p}.{name}.bias", (d,), dtype)

    return AttentionWeights(W_Q=lin("q_proj"), W_K=lin("k_proj"), W_V=lin("v_proj"), W_O=lin("out_proj"),
                            b_Q=bias("q_proj"), b_K=bias("k_proj") if key_bias else None, b_V=bias("v_proj"),
                            b_O=bias("out_proj"))


def norm(store: TensorStore, name: str, d: int, dtype) -> NormWeights:
    return NormWeights(store.get(f"{name}.weight", (d,), dtype), store.get(f"{name}.bias", (d,), dtype))


def stack(store: TensorStore, cfg: ModelConfig, dtype, which: str, tok: np.ndarray,
          pos: np.ndarray | None, key_bias: bool = True) -> Weights:
    """One stack's blocks by the table above; decoder blocks with their cross-attention (k_proj without a bias
    unless KEY_BIAS: Whisper)."""
    d, f = cfg.d_model, cfg.d_ff
    decoder = which == "decoder"

    def block(i: int) -> BlockWeights:
        p = f"{which}.layers.{i}"
        ffn = FFNWeights(W_in=linear_T(store, f"{p}.fc1.weight", d, f, dtype),
                         b_in=store.get(f"{p}.fc1.bias", (f,), dtype),
                         W_out=linear_T(store, f"{p}.fc2.weight", f, d, dtype),
                         b_out=store.get(f"{p}.fc2.bias", (d,), dtype))
        return BlockWeights(
            attn_norm=norm(store, f"{p}.self_attn_layer_norm", d, dtype),
            attn=attention(store, f"{p}.self_attn", d, dtype, key_bias),
            ffn_norm=norm(store, f"{p}.final_layer_norm", d, dtype), ffn=ffn,
            cross_attn=attention(store, f"{p}.encoder_attn", d, dtype, key_bias) if decoder else None,
            cross_norm=norm(store, f"{p}.encoder_attn_layer_norm", d, dtype) if decoder else None)

    embed_norm = norm(store, f"{which}.layernorm_embedding", d, dtype) if cfg.embed_norm else None
    final_norm = norm(store, f"{which}.layer_norm", d, dtype) if cfg.final_norm else None   # mBART, Pegasus
    return Weights(tok_embed=tok, pos_embed=pos, embed_norm=embed_norm, final_norm=final_norm,
                   blocks=[block(i) for i in range(cfg.n_decoder_layers if decoder else cfg.n_layers)])


def head(store: TensorStore, cfg: ModelConfig, dtype, tok: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(W_vocab (d, V), b_vocab (V,) or None): lm_head if the file has one (as transformers 5 unties
    a head stored apart), else the embedding table's transpose; final_logits_bias if present."""
    d, V = cfg.d_model, cfg.vocab_size
    W_vocab = tok.T if cfg.tied_embeddings and not store.has("lm_head.weight") else linear_T(
        store, "lm_head.weight", d, V, dtype)
    b_vocab = store.get("final_logits_bias", (1, V), dtype)[0] if store.has("final_logits_bias") else None
    return W_vocab, b_vocab


def shared_table(store: TensorStore, cfg: ModelConfig, dtype) -> np.ndarray:
    """The embedding table both stacks read (older files name it encoder.embed_tokens)."""
    name = "shared.weight" if store.has("shared.weight") else "encoder.embed_tokens.weight"
    return store.get(name, (cfg.vocab_size, cfg.d_model), dtype)


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Seq2SeqWeights:
    tok = shared_table(store, cfg, dtype)
    P = cfg.max_positions + OFFSET

    def pos(which: str) -> np.ndarray:
        return store.get(f"{which}.embed_positions.weight", (P, cfg.d_model), dtype)

    encoder, decoder = stack(store, cfg, dtype, "encoder", tok, pos("encoder")), stack(
        store, cfg, dtype, "decoder", tok, pos("decoder"))
    decoder.W_vocab, decoder.b_vocab = head(store, cfg, dtype, tok)
    return Seq2SeqWeights(encoder, decoder)


def stacks_hf_config(cfg: ModelConfig) -> dict:
    """The config.json keys BART and Marian write alike (no dropout: qkv trains without it)."""
    return {
        "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "encoder_layers": cfg.n_layers,
        "decoder_layers": cfg.n_decoder_layers, "encoder_attention_heads": cfg.n_heads,
        "decoder_attention_heads": cfg.n_heads, "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions, "activation_function": HF_ACTIVATIONS[cfg.activation],
        "scale_embedding": cfg.scale_embedding, "tie_word_embeddings": cfg.tied_embeddings,
        "is_encoder_decoder": True, "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
        "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        "decoder_start_token_id": cfg.decoder_start_token_id, "forced_eos_token_id": cfg.eos_token_id,
        **({} if cfg.forced_bos_token_id is None else {"forced_bos_token_id": cfg.forced_bos_token_id}),
    }


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a BartForConditionalGeneration with these knobs."""
    return reads_back(cfg, {"model_type": "bart", "architectures": ["BartForConditionalGeneration"],
                            **stacks_hf_config(cfg)}, config)


def _attention_tensors(p: str, a: AttentionWeights) -> dict:
    return {f"{p}.{name}.{kind}": (W.T if kind == "weight" else W)                 # Linear: (out, in)
            for name, Wb in (("q_proj", (a.W_Q, a.b_Q)), ("k_proj", (a.W_K, a.b_K)),
                             ("v_proj", (a.W_V, a.b_V)), ("out_proj", (a.W_O, a.b_O)))
            for kind, W in zip(("weight", "bias"), Wb)}


def _norm_tensors(p: str, w: NormWeights | None) -> dict:
    return {} if w is None else {f"{p}.weight": w.weight, f"{p}.bias": w.bias}


def stack_tensors(w: Weights, which: str, positions: bool) -> dict:
    """One stack's tensors under the BART/Marian names, "model." included."""
    t = {f"model.{which}.embed_positions.weight": w.pos_embed} if positions else {}
    t |= _norm_tensors(f"model.{which}.layernorm_embedding", w.embed_norm)
    for i, b in enumerate(w.blocks):
        p = f"model.{which}.layers.{i}"
        t |= _attention_tensors(f"{p}.self_attn", b.attn) | _norm_tensors(f"{p}.self_attn_layer_norm", b.attn_norm)
        if b.cross_attn is not None:
            t |= _attention_tensors(f"{p}.encoder_attn", b.cross_attn)
            t |= _norm_tensors(f"{p}.encoder_attn_layer_norm", b.cross_norm)
        t |= {f"{p}.fc1.weight": b.ffn.W_in.T, f"{p}.fc1.bias": b.ffn.b_in,          # (d_ff, d)
              f"{p}.fc2.weight": b.ffn.W_out.T, f"{p}.fc2.bias": b.ffn.b_out}        # (d, d_ff)
        t |= _norm_tensors(f"{p}.final_layer_norm", b.ffn_norm)
    return t | _norm_tensors(f"model.{which}.layer_norm", w.final_norm)          # mBART, Pegasus


def head_tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict:
    """model.shared, final_logits_bias (1, V) and, untied, lm_head."""
    dec = weights.decoder
    bias = dec.b_vocab if dec.b_vocab is not None else np.zeros(cfg.vocab_size, dec.W_vocab.dtype)
    t = {"model.shared.weight": weights.tok_embed, "final_logits_bias": bias[None]}          # (V, d), (1, V)
    if not (cfg.tied_embeddings and np.shares_memory(dec.W_vocab, weights.tok_embed)):
        t["lm_head.weight"] = dec.W_vocab.T                                                 # (V, d)
    return t


def tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under BartForConditionalGeneration's name, as its file stores it; new arrays."""
    return c_arrays(head_tensors(weights, cfg) | stack_tensors(weights.encoder, "encoder", True)
                    | stack_tensors(weights.decoder, "decoder", True))
