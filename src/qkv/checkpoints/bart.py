"""BART: an encoder–decoder, post-norm, learned positions (offset 2), embedding LayerNorm, GELU.

Its tensors: `stack_rows` below, each checkpoint name (relative to BartModel) beside ours and how it is stored, read
both ways (loading and saving).
{stack} is "encoder" or "decoder". Marian (marian.py) has the same blocks under the same names.
torch's Linear stores W (out, in): we read its transpose, a view. `config` / `weights` read a
checkpoint by this table; `hf_config` / `tensors` write one, under BartForConditionalGeneration's
names ("model." + the names in stack_rows; "lm_head" and "final_logits_bias" at the top).
With tie_word_embeddings=false (BART, mBART, Pegasus) transformers 5 keeps three tables and a head: each stack
reads its own {stack}.embed_tokens, the decoder's output is lm_head, and `shared` is read by no forward (qkv
leaves it unread and does not write it back).
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import Seq2SeqWeights, Weights
from .common import HF_ACTIVATIONS, activation, c_arrays, check_shapes, linear_T, need, reads_back, special_ids
from .table import About, Row, layer_norm, linear, read_table, write_table
from .tensors import TensorStore

MODEL_TYPES = ("bart",)

ABOUT = (                              # its rows of the README's table of families (families.about)
    About(types=("bart",), models="BART",
          brings="encoder–decoder with cross-attention; learned positions; untied embeddings "
                 "(`tie_word_embeddings` false: each stack its own table, `lm_head` its own)",
          kind="encoder–decoder"),
)

OFFSET = 2                                     # BartLearnedPositionalEmbedding's offset

# Tensors a BART checkpoint may hold that qkv never reads, relative to BartModel.
IGNORED = {
    "encoder.embed_tokens.weight": "a copy of shared (tied; transformers ties it to shared too)",
    "decoder.embed_tokens.weight": "likewise",
    "shared.weight": "untied (tie_word_embeddings=false): a table no forward reads (each stack reads its own)",
    "encoder.version": "a fairseq leftover, which transformers ignores too",
    "decoder.version": "likewise",
}


def stacks_config(hf: dict, family: str, untied: bool = False) -> dict:
    """The knobs BART and Marian read alike: sizes of the two stacks (which must match but in depth). UNTIED: the
    family reads tie_word_embeddings=false (each stack's own table, `tables`); else it is refused (Marian)."""
    d = need(hf, "d_model")
    heads, ffn = need(hf, "encoder_attention_heads"), need(hf, "encoder_ffn_dim")
    if hf.get("decoder_attention_heads", heads) != heads or hf.get("decoder_ffn_dim", ffn) != ffn:
        raise QkvError(f"{family}: encoder and decoder with different heads or FFN widths are not supported; "
                       "use a checkpoint whose two stacks have the same width")
    check_shapes({}, d, heads)
    if hf.get("tie_word_embeddings", True) is False and not untied:   # transformers then keeps three tables
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
    return ModelConfig(**stacks_config(hf, "bart", untied=True), position="learned", position_offset=OFFSET,
                       embed_norm=True)


def _attention(p: str, ours: str, key_bias: bool) -> list[Row]:
    """The attention at P: q_proj, k_proj, v_proj, out_proj with their biases (k_proj's only if KEY_BIAS: Whisper
    has none, softmax ignoring a constant added to every score of a row)."""
    return [*linear(f"{ours}.W_Q", f"{p}.q_proj", "d q", f"{ours}.b_Q"),
            *linear(f"{ours}.W_K", f"{p}.k_proj", "d kv", f"{ours}.b_K", key_bias),
            *linear(f"{ours}.W_V", f"{p}.v_proj", "d kv", f"{ours}.b_V"),
            *linear(f"{ours}.W_O", f"{p}.out_proj", "q d", f"{ours}.b_O")]


def embed_norm(cfg: ModelConfig) -> bool:
    return cfg.embed_norm


def final_norm(cfg: ModelConfig) -> bool:                # mBART, Pegasus: a norm after the last block
    return cfg.final_norm


def stack_rows(which: str, key_bias: bool = True) -> list[Row]:
    """The table of one stack ("encoder" or "decoder", whose blocks have cross-attention; k_proj without a bias
    unless KEY_BIAS: Whisper), BART's names, read both ways (its embeddings and head are the family's)."""
    p = f"{which}.layers.{{i}}"
    cross = [*_attention(f"{p}.encoder_attn", "block.cross_attn", key_bias),
             *layer_norm("block.cross_norm", f"{p}.encoder_attn_layer_norm")] if which == "decoder" else []
    return [
        *layer_norm("embed_norm", f"{which}.layernorm_embedding", when=embed_norm),
        *_attention(f"{p}.self_attn", "block.attn", key_bias),
        *layer_norm("block.attn_norm", f"{p}.self_attn_layer_norm"),
        *cross,
        *linear("block.ffn.W_in", f"{p}.fc1", "d f", "block.ffn.b_in"),
        *linear("block.ffn.W_out", f"{p}.fc2", "f d", "block.ffn.b_out"),
        *layer_norm("block.ffn_norm", f"{p}.final_layer_norm"),
        *layer_norm("final_norm", f"{which}.layer_norm", when=final_norm),
    ]


def stack(store: TensorStore, cfg: ModelConfig, dtype, which: str, tok: np.ndarray,
          pos: np.ndarray | None, key_bias: bool = True) -> Weights:
    """One stack's Weights by `stack_rows`, over the shared table TOK and the positions POS."""
    n = cfg.n_decoder_layers if which == "decoder" else cfg.n_layers
    return read_table(stack_rows(which, key_bias), store, cfg, dtype, n, tok_embed=tok, pos_embed=pos)


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


def tables(store: TensorStore, cfg: ModelConfig, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(the encoder's token table, the decoder's), each (V, d): one shared table (tied), or each stack's own
    {stack}.embed_tokens (tie_word_embeddings=false, as transformers 5 reads them)."""
    if cfg.tied_embeddings:
        tok = shared_table(store, cfg, dtype)
        return tok, tok
    if not (store.has("encoder.embed_tokens.weight") and store.has("decoder.embed_tokens.weight")):
        raise QkvError("config.json says tie_word_embeddings=false (each stack its own embeddings) but the checkpoint "
                       "has no encoder.embed_tokens / decoder.embed_tokens; use the config.json that came with it")
    return tuple(store.get(f"{which}.embed_tokens.weight", (cfg.vocab_size, cfg.d_model), dtype)
                 for which in ("encoder", "decoder"))


def weights(store: TensorStore, cfg: ModelConfig, dtype) -> Seq2SeqWeights:
    enc_tok, dec_tok = tables(store, cfg, dtype)
    P = cfg.max_positions + OFFSET

    def pos(which: str) -> np.ndarray:
        return store.get(f"{which}.embed_positions.weight", (P, cfg.d_model), dtype)

    encoder, decoder = stack(store, cfg, dtype, "encoder", enc_tok, pos("encoder")), stack(
        store, cfg, dtype, "decoder", dec_tok, pos("decoder"))
    decoder.W_vocab, decoder.b_vocab = head(store, cfg, dtype, dec_tok)
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
        **special_ids(cfg),
        "decoder_start_token_id": cfg.decoder_start_token_id, "forced_eos_token_id": cfg.eos_token_id,
        **({} if cfg.forced_bos_token_id is None else {"forced_bos_token_id": cfg.forced_bos_token_id}),
    }


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json of a BartForConditionalGeneration with these knobs."""
    return reads_back(cfg, {"model_type": "bart", "architectures": ["BartForConditionalGeneration"],
                            **stacks_hf_config(cfg)}, config)


def stack_tensors(w: Weights, cfg: ModelConfig, which: str, positions: bool) -> dict:
    """One stack's tensors by `stack_rows`, "model." included (and its positions, if POSITIONS)."""
    t = {f"model.{which}.embed_positions.weight": w.pos_embed} if positions else {}
    return t | write_table(stack_rows(which), w, cfg, "model.")


def head_tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict:
    """model.shared (untied: each stack's model.{stack}.embed_tokens instead), final_logits_bias (1, V) and,
    untied, lm_head."""
    dec = weights.decoder
    bias = dec.b_vocab if dec.b_vocab is not None else np.zeros(cfg.vocab_size, dec.W_vocab.dtype)
    t = {"final_logits_bias": bias[None]}                                                    # (1, V)
    if cfg.tied_embeddings:
        t["model.shared.weight"] = weights.tok_embed                                        # (V, d)
    else:
        t |= {f"model.{which}.embed_tokens.weight": w.tok_embed for which, w in (("encoder", weights.encoder),
                                                                                ("decoder", dec))}
    if not (cfg.tied_embeddings and np.shares_memory(dec.W_vocab, weights.tok_embed)):
        t["lm_head.weight"] = dec.W_vocab.T                                                 # (V, d)
    return t


def tensors(weights: Seq2SeqWeights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor under BartForConditionalGeneration's name, as its file stores it; new arrays."""
    return c_arrays(head_tensors(weights, cfg) | stack_tensors(weights.encoder, cfg, "encoder", True)
                    | stack_tensors(weights.decoder, cfg, "decoder", True))
