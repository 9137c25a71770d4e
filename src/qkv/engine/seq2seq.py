"""Encoder–decoder transformers (seeds §2, self- and cross-attention): Marian, BART, T5.

    source ids ─embed─▶ L_enc × block: self-attention (bidirectional), FFN   ─▶ M (n_src × d_model)
    target ids ─embed─▶ L_dec × block: self-attention (causal),
                                       cross-attention  Q = Y·W_Q, K = M·W_K, V = M·W_V,
                                       FFN                                   ─▶ logits = Y·W_vocab + b

Self-attention takes Q, K and V from one sentence; cross-attention takes Q from the decoder and
K, V from the encoder's output: when the decoder writes "I" it looks at "나는". Every attention
array is (…, n_q, n_k) — n_tgt × n_src in cross-attention — never assumed square.

The boxes are blocks.py's (linear, norm, projections, feed_forward, logits_of), composed into one
block for either stack; what differs is said by the config's knobs (post- or pre-norm, scaled
scores or not, T5's relative position bias). `Seq2SeqModel` ties them to a config, a
Seq2SeqWeights and a tokenizer; writing is in seq2seq_generate.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .attention import AttentionMask, merge_heads, split_heads
from .blocks import feed_forward, linear, logits_of, norm, projections
from .cache import KVCache
from .config import ModelConfig
from .errors import QkvError, check_index
from .model import Model
from .ops import softmax_
from .positions import relative_bias
from ..writing.sampling import Sampling
from ..writing.seq2seq_generate import TargetStream, generate, stream_ids
from .tokenizer import Tokenizer
from .trace import INTERMEDIATES, Recorder, Trace, layer_traces
from .weights import AttentionWeights, BlockWeights, NormWeights, Seq2SeqWeights, Weights


# ── the boxes ────────────────────────────────────────────────────────────────────

def embed(weights: Weights, cfg: ModelConfig, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """X = E[ids]·(√d_model if scaled) + P[positions + offset], then LayerNorm (BART) (seeds §1).

    positions (n,): 0..n-1 in the encoder, past..past+n-1 in the decoder, whatever the padding
    (as transformers numbers them in these families). T5 has no table: its positions enter the scores.
    """
    x = weights.tok_embed[ids]                                     # (B, n, d_model)
    if cfg.scale_embedding:
        x *= math.sqrt(cfg.d_model)                                # Marian: E·√d
    if weights.pos_embed is not None:
        x += weights.pos_embed[positions + cfg.position_offset]    # (n, d_model): BART reads row p + 2
    if weights.embed_norm is not None:
        x = norm(x, weights.embed_norm, cfg)
    return x


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None, cfg: ModelConfig,
           keep_scores: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(Z, A, S): Z = softmax(S)·V, S = Q·Kᵀ/√d_k + B + M (seeds §3); T5: S = Q·Kᵀ + B + M.

    q (B, H, n_q, d_k), k and v (B, H, n_k, d_k); bias = B + M broadcast to (B, H, n_q, n_k): the
    relative position bias B (T5) and the mask M (-∞ where a key may not be seen). A (B, H, n_q, n_k).
    """
    s = np.matmul(q, k.swapaxes(-1, -2))                           # (B, H, n_q, n_k)
    if cfg.scale_scores:
        s *= 1.0 / math.sqrt(q.shape[-1])
    if bias is not None:
        s += bias
    a = softmax_(s.copy() if keep_scores else s)                   # rows sum to 1
    return np.matmul(a, v), a, (s if keep_scores else None)       # Z (B, H, n_q, d_k)


@dataclass
class StackContext:
    """What every box of one stack's pass shares (blocks.Context's counterpart, with cross-attention)."""

    cfg: ModelConfig
    bias: np.ndarray | None                   # self-attention's B + M: (B|1, H|1, n, m); None = nothing masked
    rec: Recorder                             # this stack's intermediates
    cache: KVCache | None = None              # decoder: the past's self-attention K, V
    memory: list[tuple[np.ndarray, np.ndarray]] | None = None   # decoder: each layer's cross K, V (B, H, n_src, d_k)
    memory_bias: np.ndarray | None = None     # decoder: M over the source's padding (B, 1, 1, n_src)
    cross_rec: Recorder | None = None         # decoder: the cross-attention's intermediates (same names)


def _record(rec: Recorder, layer: int, **values: np.ndarray | None) -> None:
    for name, value in values.items():
        rec.put(layer, name, value)


def self_attention(x: np.ndarray, w: AttentionWeights, ctx: StackContext, layer: int) -> np.ndarray:
    """MultiHead(X) = Concat_h softmax(Q_h·K_hᵀ/√d_k + B + M)·V_h · W_O, Q, K, V all from X (seeds §2–5).

    The encoder's M hides only the source's padding; the decoder's is causal too, and with a
    KV cache X holds only the new tokens, whose K, V join the cached past.
    """
    H, rec = ctx.cfg.n_heads, ctx.rec
    q, k, v = (split_heads(y, H) for y in projections(x, w))     # (B, H, n, d_k) each
    if ctx.cache is not None:
        k, v = ctx.cache.append(layer, k, v)                       # (B, H, past + n, d_k)
    z, a, s = attend(q, k, v, ctx.bias, ctx.cfg, keep_scores=rec.wants(layer, "scores"))
    _record(rec, layer, q=q, k=k, v=v, scores=s, attentions=a, heads=z)
    return linear(merge_heads(z), w.W_O, w.b_O)                   # (B, n, d_model)


def cross_attention(y: np.ndarray, w: AttentionWeights, ctx: StackContext, layer: int) -> np.ndarray:
    """Concat_h softmax(Q_h·K_hᵀ/√d_k + M)·V_h · W_O with Q = Y·W_Q from the decoder (n_tgt rows)
    and K = M·W_K, V = M·W_V from the encoder's output M (n_src rows, computed once: `memory_of`).

    A is (B, H, n_tgt, n_src): row i says which source tokens target token i reads.
    """
    rec = ctx.cross_rec
    q = split_heads(linear(y, w.W_Q, w.b_Q), ctx.cfg.n_heads)     # (B, H, n_tgt, d_k)
    k, v = ctx.memory[layer]                                       # (B, H, n_src, d_k) each
    z, a, s = attend(q, k, v, ctx.memory_bias, ctx.cfg, keep_scores=rec.wants(layer, "scores"))
    _record(rec, layer, q=q, k=k, v=v, scores=s, attentions=a, heads=z)
    return linear(merge_heads(z), w.W_O, w.b_O)                   # (B, n_tgt, d_model)


def residual(x: np.ndarray, w: NormWeights, cfg: ModelConfig,
             box: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(x + Box(Norm(x)) (pre-norm: T5) or Norm(x + Box(x)) (post-norm: Marian, BART), Box's output)."""
    if cfg.norm_place == "post":
        out = box(x)
        return norm(x + out, w, cfg), out
    out = box(norm(x, w, cfg))
    return x + out, out                                            # (B, n, d_model) each


def block(x: np.ndarray, w: BlockWeights, ctx: StackContext, layer: int) -> np.ndarray:
    """One block of either stack (seeds §6): self-attention, then (decoder) cross-attention, then
    the FFN, each a residual step with its norm."""
    cfg = ctx.cfg
    ctx.rec.put(layer, "residual", x)
    x, a = residual(x, w.attn_norm, cfg, lambda h: self_attention(h, w.attn, ctx, layer))
    if w.cross_attn is not None:
        x, c = residual(x, w.cross_norm, cfg, lambda h: cross_attention(h, w.cross_attn, ctx, layer))
        ctx.cross_rec.put(layer, "attn_out", c)
    x, f = residual(x, w.ffn_norm, cfg, lambda h: feed_forward(h, w.ffn, cfg))
    _record(ctx.rec, layer, attn_out=a, ffn_out=f)
    return x                                                       # (B, n, d_model)


def _add(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    return b if a is None else (a if b is None else a + b)


def encode(weights: Seq2SeqWeights, cfg: ModelConfig, ids: np.ndarray, mask: np.ndarray,
           rec: Recorder | None = None) -> np.ndarray:
    """Source ids (B, n_src), mask (B, n_src) → the encoder's output M (B, n_src, d_model).

    Bidirectional: every source token sees every real source token (padding never).
    """
    w, n = weights.encoder, ids.shape[1]
    pos = np.arange(n)                                             # (n_src,)
    x = embed(w, cfg, ids, pos)                                    # (B, n_src, d_model)
    pad = AttentionMask(n, n, causal=False, key_mask=None if mask.all() else mask.astype(bool))
    bias = pad.bias(x.dtype)                                       # (B, 1, 1, n_src) or None
    if w.rel_bias is not None:                                     # T5: B over key − query, both ways
        bias = _add(relative_bias(w.rel_bias, pos, pos, True, cfg.relative_max_distance), bias)
    ctx = StackContext(cfg, bias, rec or Recorder(keep=()))
    for layer, b in enumerate(w.blocks):
        x = block(x, b, ctx, layer)
    return x if w.final_norm is None else norm(x, w.final_norm, cfg)


def memory_of(weights: Seq2SeqWeights, cfg: ModelConfig, encoded: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each decoder layer's cross-attention K = M·W_K + b_K and V = M·W_V + b_V of the encoder's
    output M (B, n_src, d_model): (B, H, n_src, d_k) each, computed once per source and read by
    every decoding step."""
    H = cfg.n_heads
    return [(split_heads(linear(encoded, b.cross_attn.W_K, b.cross_attn.b_K), H),
             split_heads(linear(encoded, b.cross_attn.W_V, b.cross_attn.b_V), H)) for b in weights.decoder.blocks]


def decode(weights: Seq2SeqWeights, cfg: ModelConfig, ids: np.ndarray, mask: np.ndarray | None,
           memory: list[tuple[np.ndarray, np.ndarray]], source_mask: np.ndarray, *, cache: KVCache | None = None,
           rec: Recorder | None = None, cross_rec: Recorder | None = None,
           logits: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """Decoder ids (B, n) → (hidden (B, n, d_model), logits (B, n, V); logits="last": (B, 1, V)).

    mask (B, past + n) covers the target's past and new tokens (None: no padding); source_mask
    (B, n_src) the source's. With a KV cache, ids are the n new tokens after the cache's past.
    """
    w, n = weights.decoder, ids.shape[1]
    past = 0 if cache is None else cache.length
    pos = np.arange(past, past + n)                                # (n,) positions of the new tokens
    x = embed(w, cfg, ids, pos)                                    # (B, n, d_model)
    key_mask = None if mask is None or mask.all() else mask.astype(bool)
    bias = AttentionMask(n, past + n, causal=True, key_mask=key_mask).bias(x.dtype)   # (B|1, 1, n, past + n)
    if w.rel_bias is not None:                                     # T5: B over key − query, backwards only
        bias = _add(relative_bias(w.rel_bias, pos, np.arange(past + n), False, cfg.relative_max_distance), bias)
    n_src = source_mask.shape[1]
    src = AttentionMask(n, n_src, causal=False, key_mask=None if source_mask.all() else source_mask.astype(bool))
    ctx = StackContext(cfg, bias, rec or Recorder(keep=()), cache, memory, src.bias(x.dtype),
                       cross_rec or Recorder(keep=()))
    for layer, b in enumerate(w.blocks):
        x = block(x, b, ctx, layer)
    if cache is not None:
        cache.advance(n)
    if w.final_norm is not None:
        x = norm(x, w.final_norm, cfg)
    y = x[:, -1:] if logits == "last" else x
    if cfg.scale_decoder_output:                                   # T5, tied: Z·d_model^-0.5 before W_vocab
        y = y * (cfg.d_model ** -0.5)
    return x, logits_of(y, w)                                      # (B, n, d_model), (B, n | 1, V)


# ── the model a user holds ───────────────────────────────────────────────────────

@dataclass
class Seq2SeqOutput:
    """What `Seq2SeqModel.forward` returns."""

    logits: np.ndarray                        # (B, n_tgt, V)
    hidden: np.ndarray                        # (B, n_tgt, d_model) the decoder's, after its final norm (T5)
    encoder_hidden: np.ndarray                # (B, n_src, d_model) the encoder's output M
    encoder_attentions: np.ndarray | None     # (L_enc, B, H, n_src, n_src) source ↔ source
    attentions: np.ndarray | None             # (L_dec, B, H, n_tgt, n_tgt) target → earlier target (causal)
    cross_attentions: np.ndarray | None       # (L_dec, B, H, n_tgt, n_src) target → source


def _stacked(rec: Recorder, layers: int) -> np.ndarray:
    return np.stack([rec.store[i]["attentions"] for i in range(layers)])    # (L, B, H, n_q, n_k)


class Seq2SeqModel:
    """A loaded encoder–decoder checkpoint: config, both stacks' weights, and its tokenizer.

    The source goes through the encoder once; the decoder reads the target so far and, through
    cross-attention, the encoder's output. Token ids of both sides come from one vocabulary.
    """

    def __init__(self, config: ModelConfig, weights: Seq2SeqWeights, tokenizer: Tokenizer | None = None,
                 name: str = "model"):
        if not config.encoder_decoder:
            raise QkvError(f"{name} is not an encoder–decoder ({config.family}); load it as a qkv.Model")
        self.config, self.weights, self.tokenizer, self.name = config, weights, tokenizer, name

    def __repr__(self) -> str:
        c = self.config
        return (f"Seq2SeqModel({self.name!r}: {c.family}, L_enc={c.n_layers}, L_dec={c.n_decoder_layers}, "
                f"H={c.n_heads}, d_model={c.d_model}, V={c.vocab_size}, encoder–decoder)")

    @property
    def dtype(self) -> np.dtype:
        return self.weights.tok_embed.dtype

    def astype(self, dtype) -> "Seq2SeqModel":
        """The same model computing in another float type (float64 for checks)."""
        return Seq2SeqModel(self.config, self.weights.astype(dtype), self.tokenizer, self.name)

    def save(self, directory: str | Path) -> Path:
        """Write the model in Hugging Face layout (see qkv.checkpoints.save)."""
        from ..checkpoints.save import save      # the file formats live with the checkpoints

        return save(self, directory)

    # inputs: the source's checks are Model's (they read only config, name, tokenizer) ----------

    check_ids = Model.check_ids
    check_length = Model.check_length
    encode = Model.encode

    def check_decoder_ids(self, decoder_input_ids, decoder_attention_mask=None, batch: int = 1
                          ) -> tuple[np.ndarray, np.ndarray]:
        """Decoder ids (B, n_tgt) or (n_tgt,) → checked (ids, mask); None → the start token alone."""
        if decoder_input_ids is None:
            return np.full((batch, 1), self.start_token, np.int64), np.ones((batch, 1), np.int64)
        try:
            ids, mask = self.check_ids(decoder_input_ids, decoder_attention_mask)
        except QkvError as e:
            raise QkvError(f"decoder_input_ids: {e}") from None
        if len(ids) != batch and len(ids) != 1:
            raise QkvError(f"decoder_input_ids have {len(ids)} rows but the source {batch}; give one row per source")
        return np.repeat(ids, batch // len(ids), axis=0), np.repeat(mask, batch // len(ids), axis=0)

    @property
    def start_token(self) -> int:
        """decoder_start_token_id: what the decoder reads first (Marian and T5: the pad token)."""
        start = self.config.decoder_start_token_id
        if start is None:
            raise QkvError(f"{self.name}'s config.json has no decoder_start_token_id; add it (Marian and T5: "
                           "the pad token's id) or pass decoder_input_ids")
        return start

    def check_layer(self, layer: int, stack: str = "decoder") -> int:
        """A layer index of the encoder or decoder (negative from the end) → 0..L-1, or a clear error."""
        count = self.config.n_layers if stack == "encoder" else self.config.n_decoder_layers
        return check_index(f"{stack} layer", layer, count, self.name)

    def check_head(self, head: int) -> int:
        return check_index("head", head, self.config.n_heads, self.name)

    # the passes --------------------------------------------------------------

    def encoder_output(self, ids: np.ndarray, mask: np.ndarray, rec: Recorder | None = None) -> np.ndarray:
        """The encoder's output M (B, n_src, d_model) of checked source ids."""
        return encode(self.weights, self.config, ids, mask, rec)

    def memory(self, encoded: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each decoder layer's cross-attention K, V of the encoder's output: computed once per source."""
        return memory_of(self.weights, self.config, encoded)

    def decoder_logits(self, ids: np.ndarray, memory, source_mask: np.ndarray, mask: np.ndarray | None = None, *,
                       cache: KVCache | None = None) -> np.ndarray:
        """The logits of the last position (B, 1, V): one step of writing (after the cache's past)."""
        return decode(self.weights, self.config, ids, mask, memory, source_mask, cache=cache, logits="last")[1]

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """A KV cache for the decoder's self-attention: L_dec layers, max_len target positions."""
        return KVCache(self.config.with_(n_layers=self.config.n_decoder_layers), batch, max_len, self.dtype)

    def forward(self, input_ids, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None, *,
                attentions: bool = True) -> Seq2SeqOutput:
        """Source ids (B, n_src) and decoder ids (B, n_tgt) → Seq2SeqOutput (logits, both hidden states,
        the three kinds of attention), as transformers' forward with decoder_input_ids (teacher forcing).

        decoder_input_ids begin with decoder_start_token_id (None: that token alone). Padding (a mask 0)
        is never attended to; rows of padding positions are computed but meaningless.
        """
        ids, mask = self.check_ids(input_ids, attention_mask)
        dec, dec_mask = self.check_decoder_ids(decoder_input_ids, decoder_attention_mask, len(ids))
        self.check_length(dec.shape[1])
        keep = ("attentions",) if attentions else ()
        recs = [Recorder(keep=keep) for _ in range(3)]             # encoder, decoder, cross
        encoded = encode(self.weights, self.config, ids, mask, recs[0])
        hidden, logits = decode(self.weights, self.config, dec, dec_mask, self.memory(encoded), mask,
                                rec=recs[1], cross_rec=recs[2])
        depths = (self.config.n_layers, self.config.n_decoder_layers, self.config.n_decoder_layers)
        encoder_att, decoder_att, cross_att = (_stacked(r, L) if attentions else None for r, L in zip(recs, depths))
        return Seq2SeqOutput(logits=logits, hidden=hidden, encoder_hidden=encoded, encoder_attentions=encoder_att,
                             attentions=decoder_att, cross_attentions=cross_att)

    def run(self, text: str | Sequence[int], target: str | Sequence[int] | None = None, *,
            keep: Iterable[str] = tuple(INTERMEDIATES), max_new_tokens: int | None = None) -> Trace:
        """One source (text or ids) and its target through the model, keeping what you ask for.

        target: the target text (read after decoder_start_token_id, as in training), the decoder's
        ids (starting with it), or None: the model's own greedy translation (at most max_new_tokens,
        default 64 or what the positions allow). Returns the decoder's
        Trace (tokens = the decoder's input, attentions (L_dec, H, n_tgt, n_tgt), logits) with
        `.encoder`, the source's Trace (attentions (L_enc, H, n_src, n_src)), and `.cross`, target
        × source (attentions (L_dec, H, n_tgt, n_src), `source_tokens`). keep: names from
        qkv.engine.trace.INTERMEDIATES, for every stack (cross: its q, k, v, scores, attentions, heads, attn_out).
        """
        ids, src_tokens = self._one(text)
        if target is None:
            new = max_new_tokens or min(64, self.config.max_positions - 1)
            dec = self.generate(ids, new, temperature=0)[0]                       # (1 + new,)
        elif isinstance(target, str):
            dec = np.concatenate([[self.start_token], self.encode(target)[0]])
        else:
            dec = self.check_decoder_ids(target)[0][0]
        self.check_length(len(dec))
        recs = [Recorder(keep=keep) for _ in range(3)]             # encoder, decoder, cross
        mask = np.ones((1, len(ids)), np.int64)
        encoded = encode(self.weights, self.config, ids[None], mask, recs[0])
        hidden, logits = decode(self.weights, self.config, dec[None], None, self.memory(encoded), mask,
                                rec=recs[1], cross_rec=recs[2])
        tgt_tokens = self._tokens(dec)
        common = dict(model=self.name, family=self.config.family,
                      spelling=self.tokenizer.spelling if self.tokenizer else "plain")
        source = Trace(tokens=src_tokens, ids=ids, hidden=encoded[0], logits=None, layers=layer_traces(recs[0].store),
                       text=text if isinstance(text, str) else None, causal=False, **common)
        cross = Trace(tokens=tgt_tokens, ids=dec, hidden=None, logits=None, layers=layer_traces(recs[2].store),
                      causal=False, source_tokens=src_tokens, prompt_length=1, **common)
        return Trace(tokens=tgt_tokens, ids=dec, hidden=hidden[0], logits=logits[0], layers=layer_traces(recs[1].store),
                     text=target if isinstance(target, str) else None, causal=True, prompt_length=1,
                     encoder=source, cross=cross, **common)

    def _one(self, text: str | Sequence[int]) -> tuple[np.ndarray, list[str]]:
        """One source as (ids (n,), tokens)."""
        if isinstance(text, str):
            return self.encode(text)
        ids, _ = self.check_ids(text)
        if len(ids) != 1:
            raise QkvError(f"give one source sequence, got {len(ids)} rows")
        return ids[0], self._tokens(ids[0])

    def _tokens(self, ids: np.ndarray) -> list[str]:
        return [self.tokenizer.id_to_token(i) if self.tokenizer else str(int(i)) for i in ids]

    # writing -----------------------------------------------------------------
    # settings: the fields of qkv.writing.sampling.Sampling by name (temperature, top_k, top_p, seed, stop_at_eos).

    def generate(self, source, max_new_tokens: int = 20, sampling: Sampling | None = None, *, stop=None,
                 attention_mask=None, use_cache: bool = True, trace: bool = False, **settings: Any):
        """Write the target (seeds §6–7: sample from softmax(logits[last] / temperature)): the encoder
        runs once, the decoder one token at a time with a KV cache and the cross-attention's K, V of
        the source computed once.

        source text → the target text (str); source ids (B, n_src) → decoder ids (B, 1 + new) that
        begin with decoder_start_token_id, as transformers' generate. Greedy at temperature 0;
        stop: token id(s) or string(s); the model's EOS stops too unless stop_at_eos=False.
        trace=True returns the Trace of source and written target (see `run`).
        """
        return generate(self, source, max_new_tokens, Sampling.of(sampling, **settings), stop=stop,
                        attention_mask=attention_mask, use_cache=use_cache, trace=trace)

    def stream(self, source, max_new_tokens: int = 20, sampling: Sampling | None = None, *, stop=None,
               attention_mask=None, use_cache: bool = True, **settings: Any):
        """Like generate, but yields as it goes: text pieces for a text source, (B,) ids for ids."""
        sampling = Sampling.of(sampling, **settings)
        if isinstance(source, str):
            return iter(TargetStream(self, source, max_new_tokens, sampling, stop=stop, use_cache=use_cache))
        return stream_ids(self, source, max_new_tokens, sampling, attention_mask=attention_mask, stop=stop,
                          use_cache=use_cache)
