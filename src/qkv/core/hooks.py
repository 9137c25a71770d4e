"""Hooks: read or replace any intermediate of a forward pass by name, while it runs.

    model.run(text, hooks={"3.heads": fn})              one pass
    model.forward(ids, mask, hooks={...})                a batch
    model.generate(prompt, hooks={...})                  every step of writing (prefill and each token)
    model.with_hooks({...})                              a view of the model (same weights) whose every
                                                         pass runs the hooks: generate, stream, chat, ...

A key names a point of `qkv.core.trace.INTERMEDIATES` ("z" is "heads", the guide's Z = A·V):

    "3.heads"       layer 3's value, the whole batched array: fn(value (B, H, n, d_k), layer=3)
    "heads"         every layer's (negative layers count from the end: "-1.attn_out")
    "3.heads.2"     one head of a per-head value: fn(value[:, 2] (B, n, d_k), layer=3);
                    for "k" and "v" the index is a K/V head (0..Hkv-1, GQA shares them)

fn(value, layer) returns None to only read (the value must then not be changed in place), or
an array of the value's shape (or one that broadcasts to it, e.g. 0) to use instead, cast to
the model's dtype. What the pass records in a trace is the value after its hooks.

Where each point sits in the pass (shapes as INTERMEDIATES; n = the positions this pass adds):

    residual → [norm] → q, k, v (after RoPE) → scores S → attentions A → heads Z → attn_out
             → [norm] → neurons h = act(x·W_in + b) (the FFN's hidden, (B, n, d_ff)) → ffn_out = h·W_out + b

"neurons" is what W_out reads: a hook that zeroes neuron i takes exactly h_i·W_out[i] out of ffn_out
(neuron ablation). A MoE layer (a routed FFN) has no single hidden: a hook on its neurons is refused.

With a KV cache (generate), n is the new positions only: q, k, v, heads, attn_out, ffn_out and
residual are (…, n_new, …) and k, v are hooked before they join the cache (so the cache keeps the
replaced keys); scores and attentions are (B, H, n_new, m) over every key so far. A layer with a
hook on "scores" or "attentions" computes attention the plain way (S, then A = softmax(S), then
Z = A·V, each hookable): n × m numbers per head, never the tiled path.

Cost: a pass without hooks does no hook work at all (`Context.hooks` is None and the engine
tests it once per box); with hooks, only the points hooked are touched.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from .attention import AttentionMask, attend, attention_scores
from .config import ModelConfig
from ..runtime.errors import QkvError, check_index
from .ops import softmax_
from .trace import INTERMEDIATES, ROUTER, Recorder

HookFn = Callable[[np.ndarray, int], "np.ndarray | None"]

ALIASES = {"z": "heads"}                                        # the guide's name for a head's output
PER_HEAD = {"q", "k", "v", "scores", "attentions", "heads"}    # arrays (B, H or Hkv, ...): a head can be picked
NAMES = list(INTERMEDIATES) + list(ALIASES)


class Hooks:
    """Checked hooks by (layer, point): each a list of (head or None, fn), run in the order given."""

    def __init__(self, spec: Mapping[str, HookFn], cfg: ModelConfig, owner: str = "the model"):
        if not isinstance(spec, Mapping):
            raise QkvError("hooks must be a dict of name → function, e.g. {'3.heads': fn}, "
                           f"got {type(spec).__name__}")
        self.cfg = cfg
        self.points: dict[tuple[int, str], list[tuple[int | None, HookFn]]] = {}
        self.keys: list[str] = []
        for key, fn in spec.items():
            if not callable(fn):
                raise QkvError(f"the hook {key!r} is not a function; give fn(value, layer) → array or None")
            layers, name, head = self._parse(key, owner)
            for layer in layers:
                self.points.setdefault((layer, name), []).append((head, fn))
            self.keys.append(str(key))

    def _parse(self, key, owner: str) -> tuple[list[int], str, int | None]:
        """"3.heads.2" → ([3], "heads", 2); "heads" → (every layer, "heads", None)."""
        parts = str(key).split(".")
        layers = list(range(self.cfg.n_layers))
        if parts and _is_int(parts[0]):
            layers = [check_index("layer", int(parts[0]), self.cfg.n_layers, owner)]
            parts = parts[1:]
        if not 1 <= len(parts) <= 2 or (len(parts) == 2 and not _is_int(parts[1])):
            raise QkvError(f"hook name {key!r} is not [LAYER.]NAME[.HEAD], e.g. '3.heads', 'attn_out', '3.heads.2'")
        name = ALIASES.get(parts[0], parts[0])
        if name in ROUTER:                                      # a MoE layer's choice: recorded, not hooked
            raise QkvError(f"hook name {key!r}: the router's {name} is recorded in the trace, not hooked; read it "
                           "from model.run(text), or hook 'ffn_out' to change the FFN's output")
        if name not in INTERMEDIATES:
            raise QkvError(f"hook name {key!r}: unknown intermediate {parts[0]!r}; choose from {NAMES}")
        routed = [i for i in layers if self.cfg.moe_layer(i)] if name == "neurons" else []
        if routed:
            dense = [i for i in layers if not self.cfg.moe_layer(i)]
            raise QkvError(f"hook name {key!r}: layer {routed[0]} of {owner} routes its FFN among "
                           f"{self.cfg.n_experts} experts, so it has no single d_ff hidden to hook; hook 'ffn_out'"
                           + (f", or the neurons of a dense layer ({', '.join(map(str, dense))})" if dense else ""))
        if len(parts) == 1:
            return layers, name, None
        if name not in PER_HEAD:
            raise QkvError(f"hook name {key!r}: {name} is one array for all heads; hook it without a head")
        count = self.cfg.n_kv_heads if name in ("k", "v") else self.cfg.n_heads
        return layers, name, check_index("K/V head" if name in ("k", "v") else "head", int(parts[1]), count, owner)

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
                  rec: Recorder, scale: float | None = None, cap: float | None = None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """softmax(Q·Kᵀ/√d_k + M)·V with hooks on S and A: (Z (B, H, n, d_k), A, S for the recorder).

        The same steps as attention.scaled_dot_product_attention, so identity hooks change no bit.
        """
        s = attention_scores(q, k, scale, cap)                         # (B, H, n, m)
        bias = mask.bias(q.dtype)
        if bias is not None:
            s += bias                                                  # -∞ where a key is hidden
        s = self(layer, "scores", s)
        a = self(layer, "attentions", softmax_(s.copy()))              # (B, H, n, m)
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


# ── an encoder–decoder's three stacks ────────────────────────────────────────────
# Its hook names say the stack first: "encoder.3.heads" (the encoder), "cross.3.heads" (the decoder's
# cross-attention: Q from the target, K and V from the source), and the decoder's own without a prefix
# ("3.heads", or "decoder.3.heads"), so a decoder's hooks read the same on Llama and on T5.

STACKS = ("encoder", "decoder", "cross")
CROSS_POINTS = ("q", "k", "v", "scores", "attentions", "heads", "attn_out")   # cross-attention has no residual or FFN


def stack_hooks(spec: Mapping[str, HookFn] | None, cfg: ModelConfig, owner: str = "the model"
                ) -> dict[str, "Hooks | None"]:
    """An encoder–decoder's hooks by stack ("encoder", "decoder", "cross"), each checked against its
    own depth (n_layers or n_decoder_layers); a stack without hooks maps to None."""
    if spec is None:
        return dict.fromkeys(STACKS)
    if not isinstance(spec, Mapping):
        raise QkvError("hooks must be a dict of name → function, e.g. {'3.heads': fn, 'cross.0.attentions': fn}, "
                       f"got {type(spec).__name__}")
    parts: dict[str, dict] = {s: {} for s in STACKS}
    for key, fn in spec.items():
        stack, _, rest = str(key).partition(".")
        if stack in STACKS and rest:
            parts[stack][rest] = fn
        else:
            parts["decoder"][key] = fn
    for key in parts["cross"]:
        bare = [p for p in key.split(".") if not _is_int(p)]
        if bare and ALIASES.get(bare[0], bare[0]) not in CROSS_POINTS:
            raise QkvError(f"hook name 'cross.{key}': cross-attention has {list(CROSS_POINTS)}; "
                           f"{bare[0]} belongs to the decoder (hook '{key}')")
    decoder = cfg.with_(n_layers=cfg.n_decoder_layers)
    return {s: Hooks.of(None, parts[s], cfg if s == "encoder" else decoder, f"{owner}'s {s}") if parts[s] else None
            for s in STACKS}
