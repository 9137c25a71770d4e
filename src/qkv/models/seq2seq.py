"""Encoder–decoder transformers (guide: self-cross): Marian, BART, mBART, Pegasus, T5, mT5,
UMT5, T5Gemma.

    source ids ─embed─▶ L_enc × block: self-attention (bidirectional), FFN   ─▶ M (n_src × d_model)
    target ids ─embed─▶ L_dec × block: self-attention (causal),
                                       cross-attention  Q = Y·W_Q, K = M·W_K, V = M·W_V,
                                       FFN                                   ─▶ logits = Y·W_vocab + b

Self-attention takes Q, K and V from one sentence; cross-attention takes Q from the decoder and
K, V from the encoder's output: when the decoder writes "I" it looks at "나는". Every attention
array is (…, n_q, n_k) — n_tgt × n_src in cross-attention — never assumed square.

There is no second engine here: both stacks run blocks.py's `block` (the decoder's with its
cross-attention box), so hooks, ablation, the tiled path and the KV cache are the decoders' own.
What differs is said by the config's knobs (post- or pre-norm, scaled scores or not, T5's relative
position bias, carried by the AttentionMask; UMT5's, one table per layer, made in the attention box
from the pass's buckets, Context.rel_buckets; T5Gemma's RoPE and sliding layers,
core.stack.rope_and_windows).
`Seq2SeqModel` ties the passes to a config, a Seq2SeqWeights and a tokenizer; writing is in
writing/seq2seq_generate.py.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..core.context import ABLATIONS, Ablation
from ..core.cache import KVCache
from ..core.config import ModelConfig
from ..runtime.errors import QkvError, check_index
from .model import Model
from ..core.hooks import STACKS, HookFn, Hooks, head_key, stack_hooks
from ..core.stack import Stacks, decoder_pass, encoder_pass, memory_of
from ..writing.sampling import Sampling
from ..writing.generate import stream
from ..writing.seq2seq_generate import TargetStream, generate, stream_ids
from ..inputs.tokenizer import Tokenizer
from ..core.trace import INTERMEDIATES, OPT_IN, Recorder, Trace, layer_traces, made_by, spelled
from ..core.weights import Seq2SeqWeights

SEQ2SEQ_KEEP = tuple(name for name in INTERMEDIATES if name not in OPT_IN)   # what `run` keeps without keep=


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
    Hooks and ablations name their stack ("encoder", "decoder", "cross"), see `run`.
    """

    hooks: dict[str, Hooks | None] = dict.fromkeys(STACKS)       # run by every pass (a view: `with_hooks`)
    ablated: dict[str, Ablation | None] = dict.fromkeys(STACKS)  # heads knocked out of every pass (`ablate`)

    def __init__(self, config: ModelConfig, weights: Seq2SeqWeights, tokenizer: Tokenizer | None = None,
                 name: str = "model", source: str | None = None):
        if not config.encoder_decoder:
            raise QkvError(f"{name} is not an encoder–decoder ({config.family}); load it as a qkv.Model")
        self.config, self.weights, self.tokenizer, self.name = config, weights, tokenizer, name
        self.source = source           # what qkv.load was given (None: not loaded), as Model.source

    def __repr__(self) -> str:
        c = self.config
        return (f"Seq2SeqModel({self.name!r}: {c.family}, L_enc={c.n_layers}, L_dec={c.n_decoder_layers}, "
                f"H={c.n_heads}, d_model={c.d_model}, V={c.vocab_size}, encoder–decoder)")

    @property
    def dtype(self) -> np.dtype:
        return self.weights.tok_embed.dtype

    @property
    def arith(self) -> str:
        """How its passes compute: "exact" or "llama.cpp" (as Model.arith)."""
        return self.config.arith

    def astype(self, dtype) -> "Seq2SeqModel":
        """The same model computing in another float type (float64 for checks)."""
        return Seq2SeqModel(self.config, self.weights.astype(dtype), self.tokenizer, self.name, self.source)

    def save(self, directory: str | Path) -> Path:
        """Write the model in Hugging Face layout (see qkv.checkpoints.save)."""
        from ..checkpoints.save import save  # the file formats live with the checkpoints

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
        """decoder_start_token_id: what the decoder reads first (Marian, T5, Pegasus: the pad token; mBART:
        the end token or, absent, bos_token_id)."""
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

    # hooks and ablation, by stack ------------------------------------------------

    def stacks(self, hooks: Mapping[str, HookFn] | None = None, ablate: Iterable | None = None, how: str = "zero",
               keep: Iterable[str] | None = None) -> Stacks:
        """This view's hooks and ablations joined with a pass's own, and a recorder per stack keeping
        `keep` (None: nothing)."""
        extra = stack_hooks(hooks, self.config, self.name)
        joined = {s: Hooks.of(self.hooks[s], extra[s], self.config) for s in STACKS}
        recs = {} if keep is None else {s: Recorder(keep=keep) for s in STACKS}
        return Stacks(recs, joined, self.ablation(ablate, how))

    def ablation(self, ablate: Iterable | None, how: str = "zero") -> dict[str, Ablation | None]:
        """Heads to knock out → a checked Ablation per stack, joined with this view's own. Each entry is a key
        of the one grammar naming a head (qkv.core.hooks.parse_key): "encoder.3.heads.2", "cross.0.heads.1",
        "decoder.3.heads.2" or "3.heads.2" (the decoder's self-attention), (layer, head) or (stack, layer, head)
        with stack "encoder", "decoder" or "cross"; one key alone may be given as a string; how: "zero" or
        "mean" (as Model.ablation)."""
        if how not in ABLATIONS:
            raise QkvError(f"unknown ablation {how!r}; choose from {list(ABLATIONS)}")
        heads: dict[str, dict[int, set[int]]] = {s: {} for s in STACKS}
        for entry in [ablate] if isinstance(ablate, str) else ablate or ():
            key = head_key(entry)
            stack = key.stack or "decoder"
            layer = self.check_layer(key.layer, "encoder" if stack == "encoder" else "decoder")
            heads[stack].setdefault(layer, set()).add(self.check_head(key.head))
        out = {}
        for s in STACKS:
            new = Ablation({l: tuple(sorted(h)) for l, h in heads[s].items()}, how) if heads[s] else None
            base = self.ablated[s]
            out[s] = base if new is None else (new if base is None else base.join(new))
        return out

    def with_hooks(self, hooks: Mapping[str, HookFn]) -> "Seq2SeqModel":
        """This model (the same weights) with HOOKS run by every pass (run, forward, generate, ...):
        "encoder.3.heads", "cross.0.attentions", "1.ffn_out" (the decoder's), as `run` takes them."""
        view = copy.copy(self)
        view.hooks = self.stacks(hooks).hooks
        return view

    def ablate(self, heads: Iterable, how: str = "zero") -> "Seq2SeqModel":
        """This model (the same weights) with HEADS knocked out of every pass ((layer, head) of the decoder,
        (stack, layer, head), or keys such as "encoder.0.heads.1": `ablation`); e.g.
        `model.ablate(["cross.0.heads.1"]).generate(text)`.
        Mean-ablation of the decoder needs whole passes: generate with use_cache=False."""
        view = copy.copy(self)
        view.ablated = self.ablation(heads, how)
        return view

    # the passes --------------------------------------------------------------

    def encoder_output(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The encoder's output M (B, n_src, d_model) of checked source ids (this view's hooks and ablation)."""
        return encoder_pass(self.weights, self.config, ids, mask, self.stacks())

    def memory(self, encoded: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each decoder layer's cross-attention K, V of the encoder's output: computed once per source."""
        return memory_of(self.weights, self.config, encoded)

    def decoder_logits(self, ids: np.ndarray, memory, source_mask: np.ndarray, mask: np.ndarray | None = None, *,
                       cache: KVCache | None = None, rec: Recorder | None = None,
                       stacks: Stacks | None = None) -> np.ndarray:
        """The logits of the last position (B, 1, V): one step of writing (after the cache's past);
        rec: what the decoder's self-attention and FFN keep (generation traces); stacks: this view's
        hooks and ablation when the caller made them once (`BoundDecoder`), else made here."""
        stacks = self.stacks() if stacks is None else stacks
        if rec is not None:
            stacks = Stacks({"decoder": rec}, stacks.hooks, stacks.ablate)
        return decoder_pass(self.weights, self.config, ids, mask, memory, source_mask, cache=cache, stacks=stacks,
                            logits="last")[1]

    def bound(self, ids: np.ndarray, mask: np.ndarray) -> "BoundDecoder":
        """This model's decoder with the source ids (B, n_src), mask read once: what the decoding loop
        (writing.generate.decode) drives, as it drives a decoder."""
        return BoundDecoder(self, ids, mask)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """A KV cache for the decoder's self-attention: L_dec layers, max_len target positions."""
        return KVCache(self.config.with_(n_layers=self.config.n_decoder_layers), batch, max_len, self.dtype)

    def forward(self, input_ids, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None, *,
                attentions: bool = True, ablate: Iterable | None = None, how: str = "zero",
                hooks: Mapping[str, HookFn] | None = None) -> Seq2SeqOutput:
        """Source ids (B, n_src) and decoder ids (B, n_tgt) → Seq2SeqOutput (logits, both hidden states,
        the three kinds of attention), as transformers' forward with decoder_input_ids (teacher forcing).

        decoder_input_ids begin with decoder_start_token_id (None: that token alone). Padding (a mask 0)
        is never attended to; rows of padding positions are computed but meaningless. ablate, how,
        hooks: as in `run`.
        """
        ids, mask = self.check_ids(input_ids, attention_mask)
        dec, dec_mask = self.check_decoder_ids(decoder_input_ids, decoder_attention_mask, len(ids))
        self.check_length(dec.shape[1])
        stacks = self.stacks(hooks, ablate, how, keep=("attentions",) if attentions else ())
        encoded = encoder_pass(self.weights, self.config, ids, mask, stacks)
        return self._output(stacks, encoded, dec, dec_mask, mask, attentions)

    def _output(self, stacks: Stacks, encoded: np.ndarray, dec: np.ndarray, dec_mask: np.ndarray, mask: np.ndarray,
                attentions: bool) -> Seq2SeqOutput:
        """The decoder's pass over the encoder's output ENCODED (B, n_src, d), and what `forward` returns."""
        hidden, logits = decoder_pass(self.weights, self.config, dec, dec_mask, self.memory(encoded), mask, stacks=stacks)
        depths = (self.config.n_layers, self.config.n_decoder_layers, self.config.n_decoder_layers)
        encoder_att, decoder_att, cross_att = (_stacked(stacks.rec[s], L) if attentions else None
                                               for s, L in zip(STACKS, depths))
        return Seq2SeqOutput(logits=logits, hidden=hidden, encoder_hidden=encoded, encoder_attentions=encoder_att,
                             attentions=decoder_att, cross_attentions=cross_att)

    def run(self, text: str | Sequence[int], target: str | Sequence[int] | None = None, *,
            keep: Iterable[str] = SEQ2SEQ_KEEP, max_new_tokens: int | None = None,
            ablate: Iterable | None = None, how: str = "zero", hooks: Mapping[str, HookFn] | None = None) -> Trace:
        """One source (text or ids) and its target through the model, keeping what you ask for.

        target: the target text (read after decoder_start_token_id, as in training), the decoder's
        ids (starting with it), or None: the model's own greedy translation (at most max_new_tokens,
        default 64 or what the positions allow), less its final end token: the last row writes it, as in
        `qkv show` and generate(trace=True). Returns the decoder's
        Trace (tokens = the decoder's input, attentions (L_dec, H, n_tgt, n_tgt), logits) with
        `.encoder`, the source's Trace (attentions (L_enc, H, n_src, n_src)), and `.cross`, target
        × source (attentions (L_dec, H, n_tgt, n_src), `source_tokens`). keep: names from
        qkv.core.trace.INTERMEDIATES, for every stack (cross: its q, k, v, scores, attentions, heads, attn_out);
        by default all but the FFN's hidden "neurons".

        ablate: heads knocked out, (layer, head) of the decoder's self-attention or (stack, layer, head)
        with stack "encoder", "decoder" or "cross", or keys such as "encoder.3.heads.2" (`ablation`);
        how="zero" or "mean" (see Model.run).
        hooks: {"encoder.3.heads": fn, "cross.0.attentions": fn, "1.ffn_out": fn, ...}: as Model.run's,
        the stack first (none: the decoder's); the trace keeps the values they return. A target of None
        is written by this model with the same hooks and ablation.
        """
        ids, src_tokens = self._one(text)
        if target is None:
            new = max_new_tokens or min(64, self.config.max_positions - 1)
            writer = self if hooks is None and ablate is None else self.with_hooks(hooks or {}).ablate(ablate or (), how)
            dec = self.without_end(writer.generate(ids, new, temperature=0, use_cache=how != "mean")[0])  # (≤ 1 + new,)
        else:
            dec = self._target(target)
        self.check_length(len(dec))
        return self._trace(ids, src_tokens, text if isinstance(text, str) else None, dec,
                           target if isinstance(target, str) else None, self.stacks(hooks, ablate, how, keep=keep))

    def without_end(self, dec: np.ndarray) -> np.ndarray:
        """A written target's decoder ids (n_tgt,) less their final end token: the decoder reads what came
        before it and its last row writes it (as `qkv show`), rather than a row that reads the end token
        and writes it again."""
        eos = self.config.eos_token_id
        ends = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        return dec[:-1] if len(dec) > 1 and int(dec[-1]) in ends else dec

    def _target(self, target: str | Sequence[int]) -> np.ndarray:
        """A given target → the decoder's checked ids (n_tgt,): a text after decoder_start_token_id (as in
        training), or the ids themselves (starting with it)."""
        if isinstance(target, str):
            return np.concatenate([[self.start_token], self.encode(target)[0]])
        return self.check_decoder_ids(target)[0][0]

    def _trace(self, ids: np.ndarray, src_tokens: list[str], text: str | None, dec: np.ndarray, target: str | None,
               stacks: Stacks, frames: np.ndarray | None = None) -> Trace:
        """`run`'s passes over one checked source ids (n_src,) and target dec (n_tgt,), and the decoder's Trace
        with its `.encoder` and `.cross`; FRAMES: what the encoder reads instead of looking ids up (Whisper's
        log-mel frames (1, frames, mels))."""
        recs = [stacks.rec[s] for s in STACKS]                     # encoder, decoder, cross
        mask = np.ones((1, len(ids)), np.int64)
        encoded = encoder_pass(self.weights, self.config, ids[None], mask, stacks, tokens=frames)
        hidden, logits = decoder_pass(self.weights, self.config, dec[None], None, self.memory(encoded), mask,
                                      stacks=stacks)
        tgt_tokens = self._tokens(dec)
        common = made_by(self)
        source = Trace(tokens=src_tokens, ids=ids, hidden=encoded[0], logits=None, layers=layer_traces(recs[0].store),
                       text=text, causal=False, **common)
        cross = Trace(tokens=tgt_tokens, ids=dec, hidden=None, logits=None, layers=layer_traces(recs[2].store),
                      causal=False, source_tokens=src_tokens, prompt_length=1, **common)
        return Trace(tokens=tgt_tokens, ids=dec, hidden=hidden[0], logits=None if logits is None else logits[0],
                     layers=layer_traces(recs[1].store), text=target, causal=True, prompt_length=1,
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
        return spelled(self.tokenizer, ids)

    # writing -----------------------------------------------------------------
    # settings: the fields of qkv.writing.sampling.Sampling by name (temperature, top_k, top_p, seed, stop_at_eos).

    def generate(self, source, max_new_tokens: int = 20, sampling: Sampling | None = None, *, stop=None,
                 attention_mask=None, use_cache: bool = True, trace: bool = False, **settings: Any):
        """Write the target (guide: temperature: sample from softmax(logits[last] / temperature)): the encoder
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
        return stream(self, source, max_new_tokens, Sampling.of(sampling, **settings), stop=stop,
                      attention_mask=attention_mask, use_cache=use_cache, text_stream=TargetStream, id_stream=stream_ids)


class DecoderView:
    """An encoder–decoder read as the decoder inside it, writing one TARGET after whatever source it
    is given: the shape the decoder analyses take (the logit lens, direct logit attribution,
    activation patching), so they run on every encoder–decoder family unchanged.

    run(source) runs the source and the target (None: the model's own greedy translation of each
    source) and returns the decoder's Trace, with `.encoder` and `.cross`; `config` counts the
    decoder's layers (n_layers = L_dec) and `weights` are the decoder's (final norm, W_vocab);
    `from_layer` reruns the decoder from a block, reading the source of the trace it continues.
    """

    def __init__(self, model: "Seq2SeqModel", prefix: str | Sequence[int] | None = None):
        """prefix: the target written so far, after decoder_start_token_id: text (no end token added) or
        token ids after the start token; "" the start token alone (what comes first); None: the model's
        own greedy translation of each source."""
        if isinstance(prefix, str):
            ids = model.tokenizer.encode(prefix, add_special_tokens=False)[0] if prefix and model.tokenizer else []
            if prefix and model.tokenizer is None:
                raise QkvError(f"{model.name} has no tokenizer.json; give the prefix as token ids")
            prefix = [model.start_token, *map(int, ids)]
        elif prefix is not None:
            prefix = [model.start_token, *map(int, np.asarray(prefix).reshape(-1))]
        self.model, self.target = model, prefix
        self.config = model.config.with_(n_layers=model.config.n_decoder_layers)
        self.weights = model.weights.decoder
        self.tokenizer, self.name = model.tokenizer, model.name

    def __repr__(self) -> str:
        return f"DecoderView({self.model!r}, target={self.target!r})"

    @property
    def dtype(self) -> np.dtype:
        return self.model.dtype

    def encode(self, text: str) -> tuple[np.ndarray, list[str]]:
        """The source text → (ids, tokens)."""
        return self.model.encode(text)

    def check_ids(self, input_ids, attention_mask=None):
        return self.model.check_ids(input_ids, attention_mask)

    def check_layer(self, layer: int) -> int:
        return self.model.check_layer(layer, "decoder")

    def check_head(self, head: int) -> int:
        return self.model.check_head(head)

    def run(self, source: str | Sequence[int], *, keep: Iterable[str] = SEQ2SEQ_KEEP, **more: Any) -> Trace:
        """SOURCE and this view's target through the model: the decoder's Trace (see Seq2SeqModel.run).
        Without a prefix the target is the model's greedy translation of SOURCE, less its end token
        (so the last position predicts it)."""
        target = self.target
        if target is None:
            ids, _ = self.model._one(source)
            target = self.model.without_end(self.model.generate(ids, min(64, self.config.max_positions - 1),
                                                                temperature=0)[0])
        return self.model.run(source, target, keep=keep, **more)

    def from_layer(self, x: np.ndarray, start: int, hooks: Mapping[str, HookFn] | None, trace: Trace
                   ) -> tuple[np.ndarray, np.ndarray]:
        """x (B, n, d_model), the decoder's residual stream entering block START, through blocks
        START.. with the source of TRACE (its encoder output) → (hidden (B, n, d_model), the last
        position's logits (B, 1, V)); hooks: the decoder's and its cross-attention's ("cross.…")."""
        memory = self.model.memory(trace.encoder.hidden[None].astype(self.dtype, copy=False))   # (1, H, n_src, d_k) each
        source_mask = np.ones((1, len(trace.encoder.ids)), np.int64)
        return decoder_pass(self.model.weights, self.model.config, None, None, memory, source_mask,
                            stacks=Stacks(hooks=stack_hooks(hooks, self.model.config, self.name)), logits="last",
                            start=start, stream=x)


class BoundDecoder:
    """An encoder–decoder's decoder with its source read: the encoder and each layer's cross-attention
    K, V run once, here; `last_logits` of the target so far (with a KV cache: of its new tokens) is what
    the decoding loop asks of a decoder, so encoder–decoders write through the decoders' own loop."""

    def __init__(self, model: "Seq2SeqModel", ids: np.ndarray, mask: np.ndarray):
        self.model, self.source_mask = model, mask
        self.config = model.config.with_(n_layers=model.config.n_decoder_layers, causal=True)
        self.weights, self.tokenizer, self.name = model.weights.decoder, model.tokenizer, model.name
        self.memory = model.memory(model.encoder_output(ids, mask))   # L_dec × (K, V) (B, Hkv, n_src, d_k)
        self.stacks = model.stacks()                                   # its hooks and ablation, once per writing

    @property
    def dtype(self) -> np.dtype:
        return self.model.dtype

    def last_logits(self, ids: np.ndarray, attention_mask: np.ndarray, *, rec: Recorder | None = None,
                    cache: KVCache | None = None) -> np.ndarray:
        """The logits of the last target position (B, 1, V); attention_mask (B, past + n) the target's.
        After the start token alone, a forced_bos_token_id (mBART-50's target language) is the only
        choice: every other logit −inf, as transformers' ForcedBOSTokenLogitsProcessor."""
        logits = self.model.decoder_logits(ids, self.memory, self.source_mask, attention_mask, cache=cache, rec=rec,
                                           stacks=self.stacks)
        forced = self.config.forced_bos_token_id
        if forced is not None and attention_mask.shape[1] == 1:         # the decoder has read the start token only
            logits = np.full_like(logits, -np.inf)
            logits[..., forced] = 0
        return logits                                                   # (B, 1, V)
