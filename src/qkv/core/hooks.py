"""Hooks: read or replace any intermediate of a forward pass by name, while it runs.

    model.run(text, hooks={"3.heads": fn})              one pass
    model.forward(ids, mask, hooks={...})                a batch
    model.generate(prompt, hooks={...})                  every step of writing (prefill and each token)
    model.with_hooks({...})                              a view of the model (same weights) whose every
                                                         pass runs the hooks: generate, stream, chat, ...

A key names a point of `qkv.core.trace.INTERMEDIATES` ("z" is "heads", the guide's Z = A·V), in the one
grammar of hook and ablation keys for every kind of model (`parse_key`):

    "3.heads"       layer 3's value, the whole batched array: fn(value (B, H, n, d_k), layer=3)
    "heads"         every layer's (negative layers count from the end: "-1.attn_out")
    "3.heads.2"     one head of a per-head value: fn(value[:, 2] (B, n, d_k), layer=3);
                    for "k" and "v" the index is a K/V head (0..Hkv-1, GQA shares them)
    "encoder.3.heads", "decoder.3.heads", "cross.3.heads"
                    an encoder–decoder's stacks (none named: the decoder's, so a decoder's keys read the same
                    on Llama and on T5); cross is the decoder's cross-attention (Q from the target, K, V from
                    the source)

fn(value, layer) returns None to only read (the value must then not be changed in place), or
an array of the value's shape (or one that broadcasts to it, e.g. 0) to use instead, cast to
the model's dtype. What the pass records in a trace is the value after its hooks.

Where each point sits in the pass (shapes as INTERMEDIATES; n = the positions this pass adds):

    residual → [norm: attn_norm_scale] → attn_in → q_pre_rope, k_pre_rope → q, k, v (after RoPE) → scores S
             → attentions A → heads Z → attn_out → residual_mid → [norm: ffn_norm_scale] → ffn_in
             → ffn_pre (what the activation reads) → neurons h = act(x·W_in + b) (the FFN's hidden, (B, n, d_ff))
             → ffn_out = h·W_out + b → residual_out;  after the last block: [final norm: final_norm_scale]

A norm's scale s (B, n) is what it divides each position by: a hook's s is used instead (e.g. frozen at
another text's). "final_norm_scale" is the last layer's only ("final_norm_scale" or "-1.final_norm_scale").
"attn_out_norm_scale", "ffn_out_norm_scale" (qkv.core.trace.OUT_NORMS): the scales of a box's output norm
(Gemma 2, OLMo 2), hooked alike; a layer without such a norm never calls them.
"scores_c2c", "scores_c2p", "scores_p2c" (qkv.core.trace.DISENTANGLED): DeBERTa's three score tables, S = c2c +
(c2p + p2c) (+ M), each (B, H, n, n), hooked before S is summed (a replaced c2p or p2c is what S adds; c2c is read
only: hook "scores" to change S); a model without disentangled attention refuses them.
A parallel residual (GPT-NeoX, Phi) has no stream between attention and the FFN: its residual_mid is recorded
for reading, and a hook on it is refused.

"neurons" is what W_out reads: a hook that zeroes neuron i takes exactly h_i·W_out[i] out of ffn_out
(neuron ablation). A MoE layer (a routed FFN) has no single hidden: a hook on its neurons or ffn_pre is refused.

With a KV cache (generate), n is the new positions only: q, k, v, heads, attn_out, ffn_out and
residual are (…, n_new, …) and k, v are hooked before they join the cache (so the cache keeps the
replaced keys); scores and attentions are (B, H, n_new, m) over every key so far. A layer with a
hook on "scores" or "attentions" computes attention the plain way (S, then A = softmax(S), then
Z = A·V, each hookable): n × m numbers per head, never the tiled path.

Cost: a pass without hooks does no hook work at all (`Context.hooks` is None and the engine
tests it once per box); with hooks, only the points hooked are touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from .attention import AttentionMask, attend, attention_scores, softmax_of
from .config import ModelConfig
from ..runtime.errors import QkvError, check_index
from .trace import DISENTANGLED, FINAL, INTERMEDIATES, OUT_NORMS, ROUTER, Recorder

HookFn = Callable[[np.ndarray, int], "np.ndarray | None"]

ALIASES = {"z": "heads"}                                        # the guide's name for a head's output
PER_HEAD = {"q", "k", "v", "scores", "attentions", "heads",    # arrays (B, H or Hkv, ...): a head can be picked
            "q_pre_rope", "k_pre_rope", *DISENTANGLED}
KV_HEAD = {"k", "v", "k_pre_rope"}                              # those whose heads are the Hkv K/V heads
NAMES = list(INTERMEDIATES) + list(FINAL) + list(OUT_NORMS) + list(DISENTANGLED) + list(ALIASES)


class Hooks:
    """Checked hooks of one stack by (layer, point): each a list of (head or None, fn), run in the order given."""

    def __init__(self, spec: Mapping[str, HookFn], cfg: ModelConfig, owner: str = "the model",
                 stack: str | None = None):
        """spec: key → fn, each key of the grammar (`parse_key`), checked against CFG's layers and heads;
        stack: the encoder–decoder's stack these hooks are for (`stack_hooks` sorts a spec's keys by it);
        None: a single stack's hooks, whose keys name no stack."""
        if not isinstance(spec, Mapping):
            raise QkvError("hooks must be a dict of name → function, e.g. {'3.heads': fn}, "
                           f"got {type(spec).__name__}")
        self.cfg = cfg
        self.points: dict[tuple[int, str], list[tuple[int | None, HookFn]]] = {}
        self.keys: list[str] = []
        for key, fn in spec.items():
            if not callable(fn):
                raise QkvError(f"the hook {str(key)!r} is not a function; give fn(value, layer) → array or None")
            parsed = parse_key(key)
            if stack is None and parsed.stack is not None:
                raise QkvError(f"hook name {key!r}: {owner} is a single stack, with no {parsed.stack}; name its points "
                               f"without a stack, e.g. '{parsed.without_stack()}'")
            layers, head = self._place(parsed, owner)
            for layer in layers:
                self.points.setdefault((layer, parsed.name), []).append((head, fn))
            self.keys.append(str(key))

    def _place(self, key: "Key", owner: str) -> tuple[list[int], int | None]:
        """A parsed key's layers (every layer when it names none) and head, checked against this stack's config."""
        cfg = self.cfg
        layers = (list(range(cfg.n_layers)) if key.layer is None
                  else [check_index("layer", key.layer, cfg.n_layers, owner)])
        if key.name in FINAL:                                   # after the last block: that layer's only
            if layers[0] != cfg.n_layers - 1 and key.layer is not None:
                raise QkvError(f"hook name {str(key)!r}: the final norm comes after the last layer "
                               f"({cfg.n_layers - 1}); hook '{key.name}' or '-1.{key.name}'")
            layers = [cfg.n_layers - 1]
        if key.name == "residual_mid" and cfg.parallel_residual:
            raise QkvError(f"hook name {str(key)!r}: {owner}'s blocks are parallel (attention and the FFN both read "
                           "the block's input), so no stream lies between them to replace; hook 'attn_out', "
                           "'ffn_in' or 'residual_out'")
        if key.name in DISENTANGLED and (cfg.disentangled is None or (
                key.name != "scores_c2c" and key.name[-3:] not in cfg.disentangled.terms)):
            raise QkvError(f"hook name {str(key)!r}: {owner}'s attention has no {key.name[-3:]} term (only DeBERTa's "
                           "disentangled attention has c2c, c2p, p2c tables); hook 'scores'")
        routed = [i for i in layers if cfg.moe_layer(i)] if key.name in ("neurons", "ffn_pre") else []
        if routed:
            dense = [i for i in layers if not cfg.moe_layer(i)]
            raise QkvError(f"hook name {str(key)!r}: layer {routed[0]} of {owner} routes its FFN among "
                           f"{cfg.n_experts} experts, so it has no single d_ff hidden to hook; hook 'ffn_out'"
                           + (f", or the neurons of a dense layer ({', '.join(map(str, dense))})" if dense else ""))
        if key.head is None:
            return layers, None
        kv = key.name in KV_HEAD
        return layers, check_index("K/V head" if kv else "head", key.head, cfg.n_kv_heads if kv else cfg.n_heads, owner)

    @classmethod
    def of(cls, base: "Hooks | None", spec: "Mapping[str, HookFn] | Hooks | None", cfg: ModelConfig,
           owner: str = "the model") -> "Hooks | None":
        """base's hooks, then spec's (a dict or Hooks); None when there are none (the fast path)."""
        extra = spec if isinstance(spec, Hooks) or spec is None else cls(spec, cfg, owner)
        if extra is not None and not extra.points:
            extra = None
        if base is None or extra is None:
            return base if extra is None else extra
        both = cls({}, cfg)
        for hooks in (base, extra):
            for point, fns in hooks.points.items():
                both.points.setdefault(point, []).extend(fns)
            both.keys += hooks.keys
        return both

    def __repr__(self) -> str:
        return f"Hooks({', '.join(self.keys)})"

    def wants(self, layer: int, name: str) -> bool:
        return (layer, name) in self.points

    def __call__(self, layer: int, name: str, value: np.ndarray) -> np.ndarray:
        """value after this point's hooks (the same array when they only read)."""
        for head, fn in self.points.get((layer, name), ()):
            if head is None:
                value = _replacement(fn(value, layer), value, layer, name)
            else:
                part = value[:, head]                                  # (B, ...) one head's slice
                new = fn(part, layer)
                if new is not None and new is not part:
                    value = value.copy()                               # never write into the engine's arrays
                    value[:, head] = _replacement(new, part, layer, f"{name}.{head}")
        return value

    def qkv(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray):
        """q (B, H, n, d_k), k, v (B, Hkv, n, d_k) of the new positions, after their hooks."""
        return self(layer, "q", q), self(layer, "k", k), self(layer, "v", v)

    def on_weights(self, layer: int) -> bool:
        """Whether this layer's S or A is hooked (then attention runs step by step, `attention`)."""
        return (layer, "scores") in self.points or (layer, "attentions") in self.points

    def attention(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: AttentionMask,
                  rec: Recorder, scale: float | None = None, cap: float | None = None,
                  sink: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """softmax(Q·Kᵀ/√d_k + M)·V with hooks on S and A: (Z (B, H, n, d_k), A, S for the recorder). sink: (H,)
        each head's sink logit in the softmax (gpt-oss), or None.

        The same steps as attention.scaled_dot_product_attention, so identity hooks change no bit.
        """
        s = attention_scores(q, k, scale, cap)                         # (B, H, n, m)
        bias = mask.bias(q.dtype)
        if bias is not None:
            s += bias                                                  # -∞ where a key is hidden
        s = self(layer, "scores", s)
        a = self(layer, "attentions", softmax_of(s.copy(), sink))      # (B, H, n, m)
        z = attend(a, v)                                               # (B, H, n, d_k)
        if rec.heads is not None:                                      # the recorder keeps some heads only
            a, s = a[:, rec.heads], s[:, rec.heads]
        return z, a, s


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _replacement(new, old: np.ndarray, layer: int, name: str) -> np.ndarray:
    """A hook's answer checked: None keeps `old`; otherwise an array of old's shape and dtype, finite (scores
    may be -inf: a key hidden), so that NaN a hook wrote is blamed on the hook, not on the model's weights."""
    if new is None or new is old:
        return old
    new = np.asarray(new)
    if new.dtype.kind not in "fiub":
        raise QkvError(f"the hook on {layer}.{name} returned {new.dtype} values; return numbers or None")
    if new.shape == old.shape:
        out = new.astype(old.dtype, copy=False)
    else:
        try:
            out = np.empty_like(old)
            out[...] = new                                             # broadcast, e.g. a scalar 0
        except ValueError:
            raise QkvError(f"the hook on {layer}.{name} returned shape {new.shape}, but the value there is "
                           f"{old.shape}; return an array of that shape (or None to only read)") from None
    scores = name.split(".")[0] == "scores"
    bad = (np.isnan(out).any() or np.isposinf(out).any()) if scores else not np.isfinite(out).all()
    if bad:
        raise QkvError(f"the hook on {layer}.{name} returned inf or NaN (or values beyond {old.dtype}); return "
                       + ("finite scores (or -inf to hide a key)" if scores else "finite numbers"))
    return out


# ── the one key grammar ───────────────────────────────────────────────────────────

STACKS = ("encoder", "decoder", "cross")
CROSS_POINTS = ("q", "k", "v", "scores", "attentions", "heads", "attn_out")   # cross-attention has no residual or FFN
GRAMMAR = ("[STACK.][LAYER.]NAME[.HEAD] with STACK encoder, decoder or cross (none: a single stack's, or the "
           "decoder's), e.g. '3.heads', 'attn_out', '3.heads.2', 'encoder.0.heads.1', 'cross.1.attentions'; "
           "a head also as LAYER.HEAD ('3.2') or as (layer, head) pairs and (stack, layer, head) of integers")


@dataclass(frozen=True)
class Key:
    """One hook or ablation key, parsed (`parse_key`): a point of the pass in one stack."""

    stack: str | None          # "encoder", "decoder" or "cross"; None: not named (a single stack, or the decoder)
    layer: int | None          # as written (negative counts from the end); None: every layer
    name: str                  # a name of INTERMEDIATES ("z" read as "heads")
    head: int | None = None    # one head of a per-head value (for k and v a K/V head); None: the whole array

    def __str__(self) -> str:
        return ".".join(str(p) for p in (self.stack, self.layer, self.name, self.head) if p is not None)

    def without_stack(self) -> str:
        return str(Key(None, self.layer, self.name, self.head))


def parse_key(key, what: str = "hook name") -> Key:
    """The one grammar of hook and ablation keys, for every kind of model, in text or as a tuple:

        [STACK.][LAYER.]NAME[.HEAD]        "3.heads", "heads", "-1.attn_out", "3.heads.2", "encoder.3.heads.2",
                                           "decoder.3.heads.2" (= "3.heads.2" on an encoder–decoder),
                                           "cross.3.heads.2", "cross.0.attentions"
        [STACK.]LAYER.HEAD                 "3.2", "encoder.0.1": short for LAYER.heads.HEAD (qkv show --ablate's)
        (LAYER, HEAD), (STACK, LAYER, HEAD)  (3, 2), ("encoder", 0, 1): a head's Z, as ablate= takes them

    STACK: "encoder", "decoder" or "cross" (an encoder–decoder's decoder's cross-attention: Q from the target,
    K and V from the source, so it has only CROSS_POINTS); none named: the decoder of an encoder–decoder, or the
    model's one stack. LAYER, HEAD: integers, negative counting from the end; no LAYER: every layer (hooks).
    NAME: one of qkv.core.trace.INTERMEDIATES ("z" is "heads"); a HEAD only on a per-head value (PER_HEAD).
    What depends on the model (whether the layer, head and stack exist) is checked by the caller (`Hooks`,
    `head_key`, the models' `ablation`); a key that breaks the grammar is one QkvError saying it (WHAT names
    the key: "hook name", "ablate", "--ablate").
    """
    if isinstance(key, (tuple, list)):
        return _tuple_key(key, what)
    if not isinstance(key, str):
        raise QkvError(f"{what} {key!r} is not {GRAMMAR}")
    parts = key.split(".")
    stack = parts.pop(0) if len(parts) > 1 and parts[0] in STACKS else None
    layer = int(parts.pop(0)) if parts and _is_int(parts[0]) else None
    if layer is not None and len(parts) == 1 and _is_int(parts[0]):
        parts = ["heads", parts[0]]                            # LAYER.HEAD: a head's Z
    if not 1 <= len(parts) <= 2 or not parts[0] or (len(parts) == 2 and not _is_int(parts[1])):
        raise QkvError(f"{what} {key!r} is not {GRAMMAR}")
    name = ALIASES.get(parts[0], parts[0])
    if name in ROUTER:                                      # a MoE layer's choice: recorded, not hooked
        raise QkvError(f"{what} {key!r}: the router's {name} is recorded in the trace, not hooked; read it "
                       "from model.run(text), or hook 'ffn_out' to change the FFN's output")
    if name not in INTERMEDIATES and name not in FINAL and name not in OUT_NORMS and name not in DISENTANGLED:
        raise QkvError(f"{what} {key!r}: unknown intermediate {parts[0]!r}; choose from {NAMES}")
    if len(parts) == 2 and name not in PER_HEAD:
        raise QkvError(f"{what} {key!r}: {name} is one array for all heads; hook it without a head")
    parsed = Key(stack, layer, name, int(parts[1]) if len(parts) == 2 else None)
    if stack == "cross" and name not in CROSS_POINTS:
        raise QkvError(f"{what} {key!r}: cross-attention has {list(CROSS_POINTS)}; "
                       f"{name} belongs to the decoder ('{parsed.without_stack()}')")
    return parsed


def _tuple_key(key: tuple | list, what: str) -> Key:
    """(layer, head) or (stack, layer, head) → the Key of that head's Z."""
    *stack, layer, head = key if 2 <= len(key) <= 3 else (None, None, None, None)
    whole = all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in (layer, head))
    if not whole or (stack and stack[0] not in STACKS):
        raise QkvError(f"{what} {tuple(key)!r} is not {GRAMMAR}")
    return Key(stack[0] if stack else None, int(layer), "heads", int(head))


def head_key(entry, what: str = "ablate") -> Key:
    """An ablation entry, a key of the grammar naming one head's Z ("3.heads.2", "encoder.0.heads.1", "3.2",
    (3, 2), ("cross", 0, 1)) → its Key; anything else (a whole layer, another point) is one QkvError."""
    key = parse_key(entry, what)
    if key.name != "heads" or key.layer is None or key.head is None:
        raise QkvError(f"{what} {entry!r}: ablation knocks out one head's Z = A·V; name it [STACK.]LAYER.heads.HEAD, "
                       "e.g. '3.heads.2', 'encoder.0.heads.1', or as (layer, head) pairs, e.g. (3, 2)")
    return key


def stack_hooks(spec: Mapping[str, HookFn] | None, cfg: ModelConfig, owner: str = "the model"
                ) -> dict[str, "Hooks | None"]:
    """An encoder–decoder's hooks by stack ("encoder", "decoder", "cross"), each checked against its
    own depth (n_layers or n_decoder_layers); a key naming no stack is the decoder's; a stack without hooks
    maps to None."""
    if spec is None:
        return dict.fromkeys(STACKS)
    if not isinstance(spec, Mapping):
        raise QkvError("hooks must be a dict of name → function, e.g. {'3.heads': fn, 'cross.0.attentions': fn}, "
                       f"got {type(spec).__name__}")
    parts: dict[str, dict] = {s: {} for s in STACKS}
    for key, fn in spec.items():
        parts[parse_key(key).stack or "decoder"][key] = fn      # as spelled: "3.heads" and "3.z" both run
    decoder = cfg.with_(n_layers=cfg.n_decoder_layers)
    return {s: Hooks.of(None, Hooks(parts[s], cfg if s == "encoder" else decoder, f"{owner}'s {s}", s), cfg)
            if parts[s] else None for s in STACKS}
