"""The transformer, top to bottom as the guide draws it (docs/guide.md, tokens to logits).

    text ─tokenizer─▶ ids ─embed (+ positions)─▶ X (n × d_model)
      └─▶ L × block:  X + Attention(Norm(X)), X + FFN(Norm(X))   (pre-norm: GPT-2, Llama)
                      Norm(X + Attention(X)), Norm(X + FFN(X))   (post-norm: BERT)
      └─▶ final norm ─▶ logits = H·W_vocab

The boxes of a block, each called as box(x, w, …) with `w` the weights of that box, and the
`Context` that every box of one pass shares (the config, the mask, the rotation of positions,
the recorder, the KV cache) live in qkv.core.blocks; here `embed` (`weights` is the whole model's)
and `transformer` compose them into one pass, and `Model` ties them to a config, weights and
tokenizer. Everything works on a batch: B rows of n tokens.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..core.context import ABLATIONS, Ablation
from ..core.cache import KVCache
from ..writing.chat import chat, chat_sampling, chat_stream
from ..core.config import ModelConfig
from ..runtime.errors import QkvError, check_index
from ..writing.generate import generate, stream
from ..core.hooks import HookFn, Hooks, head_key
from ..core.layout import fast_layout
from ..core.stack import Output, transformer
from ..writing.sampling import Sampling
from ..inputs.tokenizer import Tokenizer
from ..core.trace import DEFAULT_KEEP, Recorder, Trace, layer_traces, made_by, spelled
from ..core.weights import Weights


# ── the model a user holds ───────────────────────────────────────────────────────

def encode_batch(model, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Texts → ids (B, n) and attention mask (B, n) (1 = token, 0 = pad): each text encoded as `Model.encode`
    encodes it alone, padded on its tokenizer's padding side with its pad token, else the config's
    pad_token_id (forward(ids, mask) then gives each row what the text alone gives, at its real positions)."""
    from ..inputs.tokenizer import check_texts

    rows = [model.encode(t)[0] for t in check_texts(texts)]                   # each (n_b,)
    pad, fallback = model.tokenizer.pad_token_id, model.config.pad_token_id
    if pad is None and fallback is not None and 0 <= fallback < model.config.vocab_size:
        pad = fallback
    if pad is None:
        raise QkvError(f"{model.name} has no pad token (no pad_token in tokenizer_config.json, no pad_token_id in "
                       "config.json), so a list of texts cannot be padded into a batch; set pad_token in "
                       "tokenizer_config.json (e.g. to the eos token), or encode one text at a time")
    return model.tokenizer.pad(rows, pad)


class Model:
    """A loaded checkpoint: config, weights under the guide's names, and its tokenizer. SOURCE: what qkv.load was
    given (a shipped model's name, a path), which another process loads again (analysis workers); None for a
    model qkv.load did not make (models.fresh, trained, built from arrays)."""

    hooks: Hooks | None = None          # run by every pass of this model (a view made by `with_hooks`)
    ablated: Ablation | None = None     # heads knocked out of every pass (a view made by `ablate`)

    def __init__(self, config: ModelConfig, weights: Weights, tokenizer: Tokenizer | None = None,
                 name: str = "model", source: str | None = None):
        self.config = config
        # Decoders: equal values laid out for one-token steps (core/layout.py), copied out of the
        # memory-mapped file. Encoders never decode: they stay mapped (shared between processes).
        self.weights = fast_layout(weights) if config.causal else weights
        self.tokenizer = tokenizer
        self.name = name
        self.source = source

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({self.name!r}: {c.family}, L={c.n_layers}, H={c.n_heads}, Hkv={c.n_kv_heads}, "
                f"d_model={c.d_model}, V={c.vocab_size}, {'decoder' if c.causal else 'encoder'})")

    @property
    def dtype(self) -> np.dtype:
        return self.weights.tok_embed.dtype

    @property
    def arith(self) -> str:
        """How its passes compute: "exact" (float32 activations) or "llama.cpp" (qkv.load(…, arith="llama.cpp"))."""
        return self.config.arith

    def with_config(self, **changes) -> "Model":
        """The same weights under changed knobs, e.g. `model.with_config(sliding_window=512)`."""
        return Model(self.config.with_(**changes), self.weights, self.tokenizer, self.name, self.source)

    def astype(self, dtype) -> "Model":
        """The same model computing in another float type (float64 for checks), in the exact arithmetic (its
        stored matrices dequantised)."""
        cfg = self.config if self.arith == "exact" else self.config.with_(arith="exact")
        return Model(cfg, self.weights.astype(dtype), self.tokenizer, self.name, self.source)

    def save(self, directory: str | Path) -> Path:
        """Write the model into DIRECTORY in Hugging Face layout (config.json, model.safetensors,
        tokenizer.json), readable by `qkv.load` and by transformers; see qkv.checkpoints.save."""
        from ..checkpoints.save import save  # the file formats live with the checkpoints

        return save(self, directory)

    # inputs ------------------------------------------------------------------

    def check_ids(self, input_ids, attention_mask=None) -> tuple[np.ndarray, np.ndarray]:
        """Validate token ids (B, n) or (n,) and the mask; one clear error for each problem."""
        ids = np.asarray(input_ids)
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise QkvError(f"input_ids must be integers of shape (B, n) or (n,), got {ids.dtype} {ids.shape}")
        if ids.shape[1] == 0:
            raise QkvError("the input is empty; give at least one token")
        V = self.config.vocab_size
        if ids.min() < 0 or ids.max() >= V:
            raise QkvError(f"token id {int(ids.max() if ids.max() >= V else ids.min())} is outside the "
                           f"vocabulary [0, {V}); use ids from this model's tokenizer")
        self.check_length(ids.shape[1])
        if attention_mask is None:
            mask = np.ones(ids.shape, dtype=np.int64)
        else:
            mask = np.asarray(attention_mask)
            if mask.ndim == 1:
                mask = mask[None]
            if mask.shape != ids.shape:
                raise QkvError(f"attention_mask has shape {mask.shape} but input_ids {ids.shape}; give one 0/1 per token")
        return ids.astype(np.int64, copy=False), mask.astype(np.int64, copy=False)

    def check_length(self, n: int) -> None:
        limit = self.config.context
        if n > limit:
            raise QkvError(f"the input has {n} tokens but {self.name} handles at most {limit}; shorten the text")

    def encode(self, text: str | Sequence[str]) -> tuple[np.ndarray, list[str]] | tuple[np.ndarray, np.ndarray]:
        """Text → (ids (n,), tokens) with this model's tokenizer, special tokens included; a list of texts →
        (ids (B, n), attention mask (B, n)), padded as transformers' tokenizer(texts, padding=True) (`encode_batch`)."""
        if isinstance(text, (list, tuple)):
            return encode_batch(self, text)
        if not isinstance(text, str) or not text.strip():
            raise QkvError("the text is empty; give some words to look at")
        if self.tokenizer is None:
            raise QkvError(f"{self.name} has no tokenizer.json, so text cannot be encoded; "
                           "add the checkpoint's tokenizer.json or pass token ids")
        ids, tokens = self.tokenizer.encode(text)
        if len(ids) == 0:
            raise QkvError("the text gives no tokens; give some words to look at")
        self.check_length(len(ids))
        return ids, tokens

    # the passes --------------------------------------------------------------

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, *, attentions: bool = True,
                ablate: Iterable[tuple[int, int]] | None = None, how: str = "zero",
                hooks: Mapping[str, HookFn] | None = None) -> Output:
        """ids (B, n) → Output(hidden (B, n, d), logits (B, n, V) | None, attentions (L, B, H, n, n)).

        Padding (attention_mask 0) is never attended to; rows of padding positions are
        computed but meaningless. ablate, how: heads to knock out, hooks: as in `run`.
        """
        ids, mask = self.check_ids(input_ids, attention_mask)
        types = None if token_type_ids is None else np.asarray(token_type_ids, dtype=np.int64).reshape(ids.shape)
        return self._output(ids, mask, attentions, self.ablation(ablate, how),
                            Hooks.of(self.hooks, hooks, self.config, self.name), token_type_ids=types)

    def _output(self, ids: np.ndarray, mask: np.ndarray, attentions: bool, ablate: Ablation | None,
                hooks: Hooks | None, **inputs) -> Output:
        """`forward`'s pass over checked ids (B, n) and what it returns; INPUTS: the rest `transformer` reads
        (token types; an image model's patches as `tokens`)."""
        rec = Recorder(keep=("attentions",) if attentions else ())
        hidden, logits = transformer(self.weights, self.config, ids, mask, rec=rec, ablate=ablate, hooks=hooks, **inputs)
        att = np.stack([rec.store[i]["attentions"] for i in range(self.config.n_layers)]) if attentions else None
        return Output(hidden=hidden, logits=logits, attentions=att)

    def run(self, text: str | Sequence[int], *, layers: Iterable[int] | None = None,
            keep: Iterable[str] = DEFAULT_KEEP, heads: Iterable[int] | None = None,
            ablate: Iterable[tuple[int, int]] | None = None, how: str = "zero",
            hooks: Mapping[str, HookFn] | None = None, top: int = 32) -> Trace:
        """One text (or a list of token ids) through the model, keeping what you ask for.

        layers: which layers to keep (default all; negative counts from the end);
        keep: which intermediates, from `qkv.core.trace.INTERMEDIATES` (and a MoE layer's router choice,
        `ROUTER`); by default all of them but the FFN's hidden "neurons" (keep=("neurons",) asks for it);
        heads: keep scores and attention weights of these heads only (default all) — on
        long inputs the rest of the pass then runs tiled, never holding n × n per head;
        ablate: heads knocked out of the pass, (layer, head) pairs or keys such as "3.heads.2"
        (qkv.core.hooks.parse_key), how="zero" (their Z = A·V set to
        0 before Concat·W_O) or "mean" (Z replaced by its mean over this input's positions);
        the trace then keeps the ablated Z as "heads" (attention weights are unchanged);
        hooks: {"3.heads": fn, ...}, functions fn(value, layer) that read or replace
        intermediates as the pass runs (see qkv.core.hooks); the trace keeps the values they return;
        top: with keep=(..., "attention_top"), the weights kept per query row (a long input's view: each row's
        TOP largest, exact, computed by blocks of rows while the pass itself runs tiled).
        """
        ablation = self.ablation(ablate, how)
        hooked = Hooks.of(self.hooks, hooks, self.config, self.name)
        if isinstance(text, str):
            ids, tokens = self.encode(text)
        else:
            ids, _ = self.check_ids(text)
            ids = ids[0]
            tokens = spelled(self.tokenizer, ids)
        return self._trace(ids, tokens, text if isinstance(text, str) else None, layers, keep, heads, ablation,
                           hooked, top)

    def _trace(self, ids: np.ndarray, tokens: list[str], text: str | None, layers: Iterable[int] | None,
               keep: Iterable[str], heads: Iterable[int] | None, ablate: Ablation | None, hooks: Hooks | None,
               top: int, inputs: np.ndarray | None = None, **about) -> Trace:
        """`run`'s pass over one checked row of ids (n,) and the Trace it returns; INPUTS: `transformer`'s
        `tokens` (an image model's patches (1, P, C·p·p)), ABOUT: more fields of the Trace (its image)."""
        kept = None if layers is None else sorted({self.check_layer(i) for i in layers})
        head_ids = None if heads is None else sorted({self.check_head(h) for h in heads})
        rec = Recorder(layers=kept, keep=keep, heads=head_ids, top=top)
        hidden, logits = transformer(self.weights, self.config, ids[None], np.ones((1, len(ids)), np.int64),
                                     rec=rec, ablate=ablate, hooks=hooks, tokens=inputs)
        return Trace(tokens=tokens, ids=ids, hidden=hidden[0], logits=None if logits is None else logits[0],
                     layers=layer_traces(rec.store), text=text, head_ids=head_ids, causal=self.config.causal,
                     **about, **made_by(self))

    def from_layer(self, x: np.ndarray, start: int, hooks: Mapping[str, HookFn] | None = None,
                   trace: Trace | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """x (B, n, d_model), the residual stream entering block START, through blocks START..L-1 and the
        final norm, with HOOKS (as `run`'s) → (hidden (B, n, d_model), the last position's logits (B, 1, V)
        or None): what activation patching reruns. trace: the pass x continues (a DecoderView reads its
        source; unused here)."""
        return transformer(self.weights, self.config, None, np.ones(x.shape[:2], np.int64), logits="last",
                           hooks=Hooks.of(None, hooks, self.config, self.name), start=start, stream=x)

    def last_logits(self, ids: np.ndarray, attention_mask: np.ndarray, *, rec: Recorder | None = None,
                    cache: KVCache | None = None, ablate: Ablation | None = None) -> np.ndarray:
        """The logits of the last position (B, 1, V) of ids (B, n) that the caller has checked:
        one step of writing (after the cache's past, with a cache); ablate: see `ablation`."""
        return self.step(ids, attention_mask, rec=rec, cache=cache, ablate=ablate)[1]

    def step(self, ids: np.ndarray, attention_mask: np.ndarray, *, rec: Recorder | None = None,
             cache: KVCache | None = None, ablate: Ablation | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`last_logits`, with the final hidden states of ids too: (hidden (B, n, d_model), logits (B, 1, V));
        hidden (B, past + n, d_model) when the pass read the cache's past again (its RoPE table changed with the
        length: `transformer`)."""
        return transformer(self.weights, self.config, ids, attention_mask, rec=rec, cache=cache, logits="last",
                           ablate=self.ablated if ablate is None else ablate, hooks=self.hooks)

    # writing -----------------------------------------------------------------
    # settings: the fields of qkv.writing.sampling.Sampling by name (temperature, top_k, top_p, seed,
    # stop_at_eos), over `sampling` (a Sampling; default Sampling(): greedy, as transformers and chat).

    def generate(self, prompt, max_new_tokens: int = 20, sampling: Sampling | None = None, *, stop=None,
                 attention_mask=None, use_cache: bool = True, trace: bool = False,
                 hooks: Mapping[str, HookFn] | None = None, **settings: Any):
        """Continue a prompt (guide: temperature: sample from softmax(logits[last] / temperature)).

        prompt text → the continuation (str); prompt ids (B, n) → ids (B, n + new), as
        transformers' generate. Greedy unless a temperature is given (temperature=0.8 samples); seed makes sampling
        repeatable; stop: token id(s) or string(s); the model's EOS stops too unless
        stop_at_eos=False. trace=True returns a Trace of prompt + continuation instead.
        hooks: as in `run`, called at every step (the prompt's pass, then one per new token).
        """
        if hooks:
            return self.with_hooks(hooks).generate(prompt, max_new_tokens, sampling, stop=stop,
                                                   attention_mask=attention_mask, use_cache=use_cache,
                                                   trace=trace, **settings)
        return generate(self, prompt, max_new_tokens, Sampling.of(sampling, **settings), stop=stop,
                        attention_mask=attention_mask, use_cache=use_cache, trace=trace)

    def stream(self, prompt, max_new_tokens: int = 20, sampling: Sampling | None = None, *, stop=None,
               attention_mask=None, use_cache: bool = True, **settings: Any):
        """Like generate, but yields as it goes: text pieces for a text prompt, (B,) ids for ids."""
        return stream(self, prompt, max_new_tokens, Sampling.of(sampling, **settings), stop=stop,
                      attention_mask=attention_mask, use_cache=use_cache)

    def chat(self, messages, max_new_tokens: int = 256, sampling: Sampling | None = None, *,
             system: str | None = None, stream: bool = False, use_cache: bool = True, **settings: Any):
        """The reply to a message (a str is one user turn) or to a conversation
        [{"role": "system" | "user" | "assistant", "content": str}, ...], through the model's
        chat template, ending at its end-of-turn token. Greedy by default (temperature 0).

        system: a system message to put first; stream=True yields the reply's text pieces
        as they are written instead of returning the whole text (see qkv.writing.chat).
        """
        sampling = chat_sampling(sampling, **settings)
        if stream:
            return iter(chat_stream(self, messages, max_new_tokens, sampling, system=system, use_cache=use_cache))
        return chat(self, messages, max_new_tokens, sampling, system=system, use_cache=use_cache)

    def with_hooks(self, hooks: Mapping[str, HookFn]) -> "Model":
        """This model (the same weights, not copied) with HOOKS run by every pass: run, forward,
        generate, stream, chat, ... (qkv.core.hooks). Hooks of a view of a view run in order."""
        view = copy.copy(self)
        view.hooks = Hooks.of(self.hooks, hooks, self.config, self.name)
        return view

    def ablate(self, heads: Iterable, how: str = "zero") -> "Model":
        """This model (the same weights) with HEADS ((layer, head) pairs or keys such as "3.heads.2") knocked out
        of every pass, as `run(..., ablate=heads, how=how)` does; e.g. `model.ablate([(23, 3)]).generate(prompt)`.
        Mean-ablation needs whole passes: generate with use_cache=False."""
        view = copy.copy(self)
        view.ablated = self.ablation(heads, how)
        return view

    def ablation(self, ablate: Iterable | None, how: str = "zero") -> Ablation | None:
        """Heads to knock out → a checked Ablation, joined with this view's own (`ablate`); None when there is
        nothing to ablate. Each entry is a key of the one grammar naming a head (qkv.core.hooks.parse_key):
        (layer, head) pairs, "3.heads.2" or "3.2"; one key alone may be given as a string."""
        if how not in ABLATIONS:
            raise QkvError(f"unknown ablation {how!r}; choose from {list(ABLATIONS)}")
        if ablate is None:
            return self.ablated
        heads: dict[int, set[int]] = {}
        for entry in [ablate] if isinstance(ablate, str) else ablate:
            key = head_key(entry)
            if key.stack is not None:
                raise QkvError(f"ablate {entry!r}: {self.name} is a single stack, with no {key.stack}; name its heads "
                               f"without a stack, e.g. '{key.without_stack()}' or ({key.layer}, {key.head})")
            heads.setdefault(self.check_layer(key.layer), set()).add(self.check_head(key.head))
        if not heads:
            return self.ablated
        new = Ablation({layer: tuple(sorted(h)) for layer, h in heads.items()}, how)
        return new if self.ablated is None else self.ablated.join(new)

    def check_layer(self, layer: int) -> int:
        """A layer index (negative from the end) → 0..L-1, or a clear error."""
        return check_index("layer", layer, self.config.n_layers, self.name)

    def check_head(self, head: int) -> int:
        """A query head index (negative from the end) → 0..H-1, or a clear error."""
        return check_index("head", head, self.config.n_heads, self.name)
