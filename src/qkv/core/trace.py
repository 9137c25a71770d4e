"""What one forward pass saw: every intermediate by name, as plain arrays (STYLE habit 5).

The caller picks which layers and which intermediates to keep (a `Recorder`), so
memory stays bounded on long inputs: attention weights alone are L·H·n² numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

import errno
import io
import json
import math
import os
import zipfile
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from .labels import labels_of

if TYPE_CHECKING:
    from .attention import TopAttention
from ..runtime.io import FileBatch, open_regular

# Names a forward pass can record, per layer, with their batched shapes. What the pass computed is recorded, so
# that analyses and views read it instead of applying the config's knobs again (norm_place, parallel_residual,
# residual_multiplier, qk_norm): a family's maths stays in the core. Each is hooked under its name (qkv.core.hooks).
INTERMEDIATES = {
    "residual": "(B, n, d_model)  the residual stream entering the block",
    "q": "(B, H, n, d_k)  queries, after RoPE where the model uses it",
    "k": "(B, Hkv, n, d_k)  keys, after RoPE",
    "v": "(B, Hkv, n, d_k)  values",
    "scores": "(B, H, n, n)  S + M: the scores S = Q·Kᵀ/√d_k with the mask M applied (-inf), before softmax",
    "attentions": "(B, H, n, n)  A = softmax(S + M), rows sum to 1",
    "heads": ("(B, H, n, d_k)  each head's output Z_h = A_h·V_h, before Concat·W_O (its part of attn_out is "
              "Z_h·W_O[h·d_k:(h+1)·d_k], before the output norm and multiplier)"),
    "attn_out": "(B, n, d_model)  Concat(heads)·W_O, added to the residual stream",
    "ffn_out": "(B, n, d_model)  the FFN's output, added to the residual stream",
    "neurons": ("(B, n, d_ff)  the FFN's hidden activations act(x·W_in + b) (gated: act(x·W_gate) ⊙ (x·W_in + b)), "
                "the input to W_out: each neuron's coefficient on its output vector (Geva et al. 2021's memory "
                "coefficients); a MoE layer (a routed FFN) has no single d_ff hidden and records none"),
    # recorded so that analyses and views read them (pass order):
    "attn_norm_scale": ("(B, n)  s, what the block's first norm divided each position by: √(mean(x²) + eps) "
                        "(RMSNorm) or √(var(x) + eps) (LayerNorm), of the block's input (pre-norm) or of input + "
                        "attn_out (post-norm); a hook's s is what the norm divides by. None where the block has "
                        "no such norm (OLMo 2)"),
    "attn_in": ("(B, n, d_model)  what attention reads: Norm(residual) (pre-norm, parallel), the residual itself "
                "(post-norm, or no norm before it: OLMo 2)"),
    "q_pre_rope": "(B, H, n, d_k)  queries before RoPE turns them (after the q norm where there is one); q without RoPE",
    "k_pre_rope": "(B, Hkv, n, d_k)  keys before RoPE turns them (after the k norm where there is one); k without RoPE",
    "residual_mid": ("(B, n, d_model)  the stream after attention, the one the FFN's step starts from: residual + "
                     "attn_out (pre-norm; an encoder–decoder's decoder: after its cross-attention too), "
                     "Norm(residual + attn_out) (post-norm). A parallel residual (GPT-NeoX, Phi, GPT-J, Cohere) has "
                     "no such stream, as its FFN reads the block's input: residual + attn_out there, recorded for "
                     "reading and never hooked"),
    "ffn_norm_scale": ("(B, n)  s of the FFN's norm as attn_norm_scale: of residual_mid (pre-norm), of residual_mid "
                       "+ ffn_out (post-norm), of the block's input (parallel). None where the FFN has no norm of "
                       "its own (OLMo 2; Phi, whose FFN reads the attention's)"),
    "ffn_in": ("(B, n, d_model)  what the FFN reads: Norm(residual_mid) (pre-norm), residual_mid (post-norm, or no "
               "norm before it), Norm(residual) (parallel; Phi: attention's Norm(residual), as attn_in before hooks)"),
    "ffn_pre": ("(B, n, d_ff)  what the FFN's activation reads: x·W_in + b, or gated x·W_gate (whose neurons are "
                "act(x·W_gate) ⊙ (x·W_in + b)); a MoE layer has none"),
    "residual_out": ("(B, n, d_model)  the stream leaving the block: the next block's residual; the last block's "
                     "is what the final norm reads"),
}
# What the pass does after its last block, recorded with the last layer (trace.layer(-1)) and hooked there
# ("final_norm_scale", or "-1.final_norm_scale"): none without a final norm (BERT).
FINAL = {
    "final_norm_scale": ("(B, n)  s, what the final norm divided each position of the last block's output "
                         "(residual_out) by, as attn_norm_scale"),
}
# What a view of a long input keeps instead of A: each query row's K largest weights (Recorder(top=K)).
SPARSE = {
    "attention_top": ("(B, H, n, K)  each query row's K largest attention weights, exactly, largest first, with "
                      "their keys and the rest of the row (core.attention.TopAttention): L·H·n·K numbers, not "
                      "L·H·n², computed a block of query rows at a time"),
}
# Kept only when asked for (keep=("neurons",)): d_ff numbers a token (2.7–4 × d_model) that no default view reads,
# so Model.run, the pipeline page and saved traces leave them out (DEFAULT_KEEP); and attention_top.
# q, k before RoPE and the FFN's pre-activations are kept only when asked for too (a copy of q, k; d_ff a token).
OPT_IN = ("neurons", "ffn_pre", "q_pre_rope", "k_pre_rope", "attention_top")
# What a MoE layer (a routed FFN: Mixtral, Qwen2-MoE) records besides: the router's choice. A dense layer
# has none of them; they are read from the trace, not hooked (qkv.core.hooks takes INTERMEDIATES).
ROUTER = {
    "router": "(B, n, E)  the router's probabilities p = softmax(x·W_router) over the E experts",
    "experts": "(B, n, k)  the k experts each token went to, most probable first",
    "expert_weights": "(B, n, k)  the weights their outputs were summed with (p, renormalised where the config says)",
}
RECORDED = {**INTERMEDIATES, **FINAL, **ROUTER, **SPARSE}                  # every name a Recorder can keep
PER_LAYER = [*INTERMEDIATES, *FINAL]                                        # what a LayerTrace's repr lists
DEFAULT_KEEP = tuple(name for name in RECORDED if name not in OPT_IN)     # what Model.run keeps without keep=


class Recorder:
    """Collects the intermediates a caller asked for during one forward pass."""

    def __init__(self, layers: Iterable[int] | None = None, keep: Iterable[str] = DEFAULT_KEEP,
                 heads: Iterable[int] | None = None, beside: bool = False, top: int = 32):
        """beside: attention weights are computed beside the pass, whose output takes the route it takes
        unrecorded (plain, causal blocks or tiled): a generation records what it attended to without
        changing a bit of what it writes (writing.generate.Recording). top: the weights per query row
        "attention_top" keeps."""
        if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
            raise QkvError(f"top must be a whole number of keys ≥ 1, got {top!r}")
        self.top = int(top)
        self.layers = None if layers is None else set(layers)
        self.heads = None if heads is None else sorted(set(heads))   # weights/scores of these heads only
        self.keep = set(keep)
        self.beside = beside
        unknown = self.keep - set(RECORDED)
        if unknown:
            raise QkvError(f"unknown intermediate(s) {sorted(unknown)}; choose from {list(RECORDED)}")
        self.store: dict[int, dict[str, np.ndarray]] = {}

    def wants(self, layer: int, name: str) -> bool:
        return name in self.keep and (self.layers is None or layer in self.layers)

    def put(self, layer: int, name: str, value: np.ndarray | None) -> None:
        if value is not None and self.wants(layer, name):
            self.store.setdefault(layer, {})[name] = value


@dataclass
class LayerTrace:
    """One layer's intermediates for one text (batch axis removed); None = not kept."""

    layer: int
    residual: np.ndarray | None = None      # (n, d_model)
    attn_norm_scale: np.ndarray | None = None   # (n,) what the block's first norm divided by
    attn_in: np.ndarray | None = None       # (n, d_model) what attention read
    q_pre_rope: np.ndarray | None = None    # (H, n, d_k) queries before RoPE (kept only when asked for)
    k_pre_rope: np.ndarray | None = None    # (Hkv, n, d_k) keys before RoPE (kept only when asked for)
    q: np.ndarray | None = None             # (H, n, d_k)
    k: np.ndarray | None = None             # (Hkv, n, d_k)
    v: np.ndarray | None = None             # (Hkv, n, d_k)
    scores: np.ndarray | None = None        # (H, n_q, n_k) S + M: S = Q·Kᵀ/√d_k, masked = -inf, before softmax
    attentions: np.ndarray | None = None    # (H, n_q, n_k); self-attention: n_q = n_k = n
    heads: np.ndarray | None = None         # (H, n, d_k)
    attn_out: np.ndarray | None = None      # (n, d_model)
    residual_mid: np.ndarray | None = None  # (n, d_model) the stream after attention
    ffn_norm_scale: np.ndarray | None = None    # (n,) what the FFN's norm divided by
    ffn_in: np.ndarray | None = None        # (n, d_model) what the FFN read
    ffn_pre: np.ndarray | None = None       # (n, d_ff) what the FFN's activation read (kept only when asked for)
    ffn_out: np.ndarray | None = None       # (n, d_model)
    residual_out: np.ndarray | None = None  # (n, d_model) the stream leaving the block
    final_norm_scale: np.ndarray | None = None  # (n,) the last layer only: what the final norm divided by
    neurons: np.ndarray | None = None       # (n, d_ff) the FFN's hidden activations (kept only when asked for)
    router: np.ndarray | None = None        # (n, E) MoE layers: the router's probabilities
    experts: np.ndarray | None = None       # (n, k) the chosen experts, most probable first
    expert_weights: np.ndarray | None = None   # (n, k) their weights in the sum
    attention_top: "TopAttention | None" = None   # (H, n, K) each row's K largest weights (kept only when asked for)

    def __repr__(self) -> str:
        """The layer and the names of what it kept, never the arrays themselves."""
        return f"LayerTrace(layer={self.layer}, kept={[n for n in PER_LAYER if getattr(self, n) is not None]})"


class KeptLayer:
    """One layer of a trace as `Trace.layer` gives it: the LayerTrace's fields, except that an intermediate
    that was not kept raises one error naming `keep=` instead of reading as None."""

    __slots__ = ("_t",)

    def __init__(self, t: LayerTrace):
        object.__setattr__(self, "_t", t)

    def __getattr__(self, name: str):
        value = getattr(self._t, name)
        if value is None and name in OPT_IN:
            raise QkvError(f"{name} of layer {self._t.layer} was not kept in this trace (it is kept only when asked "
                           f"for); run the model with keep=(..., {name!r}) (a MoE layer has none)")
        if value is None and name in FINAL:
            raise QkvError(f"{name} is kept with the last layer only, for a model with a final norm; run the model "
                           f"with keep=(..., {name!r}) and the last layer (layers=None or [-1])")
        if value is None and name in INTERMEDIATES:
            raise QkvError(f"{name} of layer {self._t.layer} was not kept in this trace; run the model with "
                           f"keep=(..., {name!r}) or without keep= (a trace read by Trace.load holds attentions only)")
        return value

    def __setattr__(self, name: str, value) -> None:
        setattr(self._t, name, value)

    def kept(self, name: str) -> bool:
        """Whether intermediate NAME was kept for this layer."""
        return getattr(self._t, name) is not None

    def __repr__(self) -> str:
        kept = [n for n in PER_LAYER if getattr(self._t, n) is not None]
        return f"KeptLayer(layer={self._t.layer}, kept={kept})"


@dataclass
class Trace:
    """One text through the model: tokens, final states, the kept layers, and what made them.

    `attentions` stacks the weights of the kept layers, in the order of `layer_ids`
    (every layer by default): (L, H, n_q, n_k), or (L, h, n_q, n_k) for the heads in
    `head_ids`. Rows are the queries (`tokens`), columns the keys: the same tokens in
    self-attention (n_q = n_k = n); in cross-attention the source's (`source_tokens`).

    `tokens` are spelled as the tokenizer spells them ("Ġcapital", "[CLS]"), which the
    analysis reads; `labels` are the same tokens as a reader sees them ("␣capital"), which
    every view shows, read with the tokenizer's `spelling` (`qkv.core.labels.label`).

    An encoder–decoder's trace (Seq2SeqModel.run) is the decoder's: tokens = what the decoder
    read (decoder_start_token_id first, `prompt_length` 1), attentions (L_dec, H, n_tgt, n_tgt),
    logits (n_tgt, V); with two more traces, each a plain Trace that saves on its own:
    `encoder`, the source (attentions (L_enc, H, n_src, n_src), hidden = the encoder's output),
    and `cross`, target × source (attentions (L_dec, H, n_tgt, n_src), `source_tokens` the source), whose
    residual, attn_norm_scale and attn_in are the cross-attention step's: the decoder's stream after its
    self-attention, the norm's scale and what the cross-attention read (the decoder's residual_mid follows it).
    """

    tokens: list[str]
    ids: np.ndarray                          # (n,)
    hidden: np.ndarray | None                # (n, d_model) final hidden states
    logits: np.ndarray | None                # (n, V) or None for encoders
    layers: dict[int, LayerTrace] = field(default_factory=dict)
    text: str | None = None
    prompt_length: int | None = None         # generation traces: tokens before this were the prompt
    head_ids: list[int] | None = None        # the heads whose scores/attentions were kept (None = all)
    model: str = ""                          # the model's name ("" = unknown)
    family: str = ""                         # "bert", "gpt2", "llama", ... ("" = unknown)
    causal: bool | None = None               # each query saw only keys up to its own position; None = unknown
    spelling: str = "plain"                  # how tokens spell text: "byte-level" (Ġ), "sentencepiece" (▁), "plain"
    source_tokens: list[str] | None = None   # (n_k,) cross-attention's keys; None = self-attention
    encoder: Trace | None = None             # encoder–decoders: the source through the encoder (see above)
    cross: Trace | None = None               # encoder–decoders: the decoder's cross-attention to the source
    image: np.ndarray | None = None          # image models (ViT): the image the model read, (H, W, C) uint8
    grid: tuple[int, int] | None = None      # and its patches' (rows, columns): token 1 + r·cols + c is patch (r, c)
    label_names: list[str] | None = None     # an image classifier's labels: the names of the logits' columns
    # The model's tokenizer, so that views can spell tokens the trace did not read (the Next token tab's
    # candidates); set by Model.run and generation, not saved (a trace read by Trace.load has none).
    tokenizer: object | None = field(default=None, repr=False, compare=False)

    @property
    def layer_ids(self) -> list[int]:
        return sorted(self.layers)

    def __repr__(self) -> str:
        """A few lines that say what the trace holds (a notebook cell ending in a trace shows this, not the
        megabytes of its arrays): the model, the tokens, the layers and intermediates kept, the arrays' shapes."""
        n, labels = len(self.tokens), self.labels
        shown = " ".join(labels[:12]) + (f" … ({n - 12} more)" if n > 12 else "")
        kept = sorted({name for t in self.layers.values() for name in PER_LAYER if getattr(t, name) is not None},
                      key=PER_LAYER.index)
        ids = self.layer_ids
        span = "none" if not ids else (f"{ids[0]}–{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else
                                       ", ".join(map(str, ids)))
        lines = [f"Trace of {self.model or 'a model'}{f' ({self.family})' if self.family else ''}: {n} tokens",
                 f"  tokens: {shown}",
                 f"  layers {span}: {', '.join(kept) or 'nothing kept'}"
                 + (f" (heads {self.head_ids})" if self.head_ids is not None else "")]
        shapes = [f"{name} {getattr(self, name).shape}" for name in ("attentions", "hidden", "logits")
                  if getattr(self, name) is not None]
        if shapes:
            lines.append("  " + ", ".join(shapes))
        for name in ("encoder", "cross"):
            if getattr(self, name) is not None:
                lines.append(f"  .{name}: {len(getattr(self, name).tokens)} tokens")
        if self.prompt_length is not None:
            lines.append(f"  generated from token {self.prompt_length} on")
        return "\n".join(lines)

    @property
    def attentions(self) -> np.ndarray | None:
        """(L, H, n_q, n_k) attention weights of the kept layers, or None if not kept: a read-only view when
        the layers are rows of one array (a recorded generation's, a loaded trace's), else a stacked copy."""
        if not self.layers or any(t.attentions is None for t in self.layers.values()):
            return None
        arrays = [self.layers[i].attentions for i in self.layer_ids]
        whole = _rows_of(arrays)
        return whole if whole is not None else np.stack(arrays)

    @property
    def labels(self) -> list[str]:
        """(n,) the tokens as a reader sees them: "Ġcapital" → "␣capital", "Ċ" → "↵" (byte-level BPE)."""
        return labels_of(self.tokens, self.spelling)

    @property
    def key_labels(self) -> list[str]:
        """(n_k,) the keys as a reader sees them, attention's columns: `labels` in self-attention."""
        return self.labels if self.source_tokens is None else labels_of(self.source_tokens, self.spelling)

    def save(self, directory: str | os.PathLike, model_name: str | None = None) -> Path:
        """Write tokens and attention weights to DIRECTORY/trace.npz + trace.json (atomically).

        Reload with `Trace.load`. Only the tokens, ids, attentions (a causal trace's lower triangles only),
        the router's choice in MoE layers
        (router, experts, expert_weights) and what made them (model, family, causal, spelling) are saved.
        model_name: instead of the trace's `model`.
        """
        out = Path(directory)
        arrays: dict[str, np.ndarray | _Lower] = {"ids": self.ids, "layers": np.array(self.layer_ids)}
        A = self.attentions                                              # (L, H, n, n_k)
        if A is not None and self.source_tokens is None and _above_diagonal_empty(A):
            arrays["attentions_lower"] = _Lower(A)                       # causal: the lower triangles only
        elif A is not None:
            arrays["attentions"] = A
        routed = [i for i in self.layer_ids if self.layers[i].experts is not None]   # MoE layers' router choice
        if routed:
            arrays["router_layers"] = np.array(routed)
            arrays.update({name: np.stack([getattr(self.layers[i], name) for i in routed]) for name in ROUTER})
        if self.image is not None:
            arrays["image"] = self.image                                 # (H, W, C) uint8, what the model read
        meta = {"model": self.model if model_name is None else model_name, "family": self.family,
                "causal": self.causal, "spelling": self.spelling, "text": self.text, "tokens": self.tokens,
                "source_tokens": self.source_tokens, "layers": self.layer_ids, "prompt_length": self.prompt_length,
                "rows": "softmax" if A is None or _softmax_rows(A) else "edited",     # hooks may edit the weights
                "grid": None if self.grid is None else list(self.grid), "label_names": self.label_names}
        try:
            with FileBatch(out) as files:                       # both files or neither
                files.write("trace.npz", lambda f: _write_npz(f, arrays))
                files.write("trace.json", lambda f: f.write(json.dumps(meta, ensure_ascii=False).encode()))
        except OSError as e:
            raise QkvError(f"cannot write to {out}: {e.strerror}; choose a writable directory") from None
        return out

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Trace":
        """A trace written by `save` (tokens, ids, attentions; older ones lack family, causal, spelling).

        Checked before use: the sizes in trace.npz's zip directory and array headers (a zip bomb
        is refused before it expands), trace.json's keys and types, and the arrays' shapes."""
        d = Path(directory)
        try:
            meta = json.loads(_regular_file(d / "trace.json", TRACE_JSON_MAX).decode("utf-8"))
            npz = io.BytesIO(_regular_file(d / "trace.npz", None))
            arrays = _read_npz(npz, ("ids", "layers"), ("attentions", "attentions_lower", "router_layers", *ROUTER,
                                                         "image"))
        except (OSError, ValueError, KeyError, RecursionError, zipfile.BadZipFile) as e:
            raise QkvError(f"{d} does not hold a qkv trace ({_short(e)}); give a directory written by --trace") from None
        meta = _check_meta(d, meta)
        ids, att, layers = _check_arrays(d, meta, *arrays[:4])
        routed = _check_router(d, len(ids), layers, *arrays[4:-1])
        image = _check_image(d, meta, arrays[-1])
        trace = cls(tokens=meta["tokens"], ids=ids, hidden=None, logits=None, text=meta.get("text"),
                   prompt_length=meta.get("prompt_length"), model=meta.get("model") or "",
                   family=meta.get("family") or "", causal=meta.get("causal"),
                   spelling=meta.get("spelling") or "plain", source_tokens=meta.get("source_tokens"),
                   layers={i: LayerTrace(layer=i, attentions=att[k]) for k, i in enumerate(layers)},
                   image=image, grid=None if image is None else tuple(meta["grid"]), label_names=meta.get("label_names"))
        for i, values in routed.items():
            for name, value in zip(ROUTER, values):
                setattr(trace.layers[i], name, value)
        return trace

    def layer(self, i: int) -> KeptLayer:
        """The trace of model layer i (negative counts from the end of the kept layers); reading an
        intermediate it did not keep raises (`trace.layers[i]`, the LayerTrace itself, reads None)."""
        if i < 0:
            i = self.layer_ids[i]
        if i not in self.layers:
            raise QkvError(f"layer {i} was not kept in this trace; kept: {self.layer_ids}")
        return KeptLayer(self.layers[i])


class _Lower:
    """A causal self-attention's weights (L, H, n, n) saved as their lower triangles, (L, H, n(n+1)/2) row by
    row (Trace.load unpacks them): half the bytes, gathered a layer at a time (no temporary of the whole)."""

    def __init__(self, A: np.ndarray):
        self.A = A
        self.rows, self.cols = np.tril_indices(A.shape[-1])
        self.shape, self.dtype = A.shape[:2] + (len(self.rows),), A.dtype

    def layers(self):
        for layer in self.A:                                             # (H, n, n) → (H, n(n+1)/2)
            yield layer[:, self.rows, self.cols]


def _above_diagonal_empty(A: np.ndarray) -> bool:
    """Whether every weight above the diagonal is 0 (a causal self-attention, unless a hook changed it)."""
    if A.shape[-1] != A.shape[-2]:
        return False
    rows, cols = np.triu_indices(A.shape[-1], 1)
    return not any(layer[:, rows, cols].any() for layer in A)


def _write_npz(f, arrays: dict) -> None:
    """ARRAYS as np.savez writes them (a stored zip of .npy files, which np.load and Trace.load read); a
    _Lower is written a layer at a time. Stored, not deflated: weights barely compress (the causal zeros
    are not written at all), and deflating takes half a second per 30 MB."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, value in arrays.items():
            with z.open(name + ".npy", "w", force_zip64=True) as member:
                if isinstance(value, _Lower):
                    np.lib.format.write_array_header_2_0(member, {
                        "descr": np.lib.format.dtype_to_descr(value.dtype), "fortran_order": False,
                        "shape": value.shape})
                    for part in value.layers():
                        member.write(np.ascontiguousarray(part).tobytes())
                else:
                    np.lib.format.write_array(member, np.asarray(value), allow_pickle=False)


def _rows_of(arrays: list[np.ndarray]) -> np.ndarray | None:
    """The array whose rows 0..L-1 ARRAYS are, in order, as a read-only view (no copy); None if they are not."""
    base = arrays[0].base
    if not isinstance(base, np.ndarray) or base.shape != (len(arrays),) + arrays[0].shape \
            or not base.flags.c_contiguous:
        return None
    start = base.__array_interface__["data"][0]
    for k, a in enumerate(arrays):
        if a.base is not base or a.shape != base.shape[1:] or a.strides != base.strides[1:] \
                or a.__array_interface__["data"][0] != start + k * base.strides[0]:
            return None
    view = base.view()
    view.flags.writeable = False
    return view


def spelled(tokenizer, ids) -> list[str]:
    """(n,) ids as the tokenizer spells them ("Ġcapital"), or their numbers without one: a trace's `tokens`."""
    return [tokenizer.id_to_token(int(i)) if tokenizer else str(int(i)) for i in ids]


def made_by(handle) -> dict:
    """The fields of a Trace that say what made it (a model's name, family, spelling and tokenizer)."""
    tok = handle.tokenizer
    return dict(model=handle.name, family=handle.config.family, spelling=tok.spelling if tok else "plain",
                tokenizer=tok)


def layer_traces(store: dict[int, dict[str, np.ndarray]], row: int = 0) -> dict[int, LayerTrace]:
    """Per-layer traces of batch row `row` from a recorder's store."""
    return {
        layer: LayerTrace(layer=layer, **{name: arr[row] for name, arr in named.items()})
        for layer, named in sorted(store.items())
    }


# ── reading a saved trace: nothing is trusted ───────────────────────────────────

TRACE_MIN_BOUND = 64 << 20        # a trace.npz may always expand to 64 MiB ...
TRACE_RATIO = 100                 # ... and beyond that to at most 100× its size on disk (attention
                                  # weights compress 2-5×; a zip bomb of zeros, ~1000×)


def _short(e: Exception) -> str:
    text = str(e).replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


TRACE_JSON_MAX = 64 << 20         # trace.json: tokens and a text (8,192 tokens take well under 1 MiB)
MAX_LAYER = 10_000                # layer numbers a trace may name (the largest models have ~100)
ROW_SUM = 1e-2                    # a row of attention sums to 1 (0 when every key is masked), float16 included


def _regular_file(path: Path, limit: int | None) -> bytes:
    """PATH's bytes if it is a regular file of at most LIMIT bytes (`io.open_regular`: a FIFO or a device
    such as /dev/zero is refused before it is read)."""
    try:
        with open_regular(path, limit) as f:
            return f.read()
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EISDIR, errno.EFBIG):
            raise ValueError(f"{path.name}: {e.strerror}") from None
        raise


def _read_npz(data: io.BytesIO, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> list[np.ndarray | None]:
    """The named arrays of an .npz's bytes (then the OPTIONAL ones, None where absent), after checking the zip
    directory's uncompressed sizes against a bound and each .npy header's shape against its member's
    size: nothing large is allocated first."""
    size = len(data.getbuffer())
    bound = max(TRACE_MIN_BOUND, TRACE_RATIO * size)
    with zipfile.ZipFile(data) as z:
        members = {info.filename: info for info in z.infolist()}
        total = sum(info.file_size for info in members.values())
        if total > bound:
            raise ValueError(f"trace.npz would expand to {total / 2**20:.0f} MiB from "
                             f"{size / 2**20:.1f} MiB on disk, more than a trace can hold")
        out = []
        for name in names + optional:
            info = members.get(name + ".npy")
            if info is None and name in optional:
                out.append(None)
                continue
            if info is None:
                raise KeyError(f"trace.npz has no {name!r}")
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0(f))
            if dtype.hasobject or math.prod(shape) * dtype.itemsize > info.file_size:
                raise ValueError(f"{name} in trace.npz claims shape {shape} of {dtype}, more than it holds")
            with z.open(info) as f:
                out.append(np.lib.format.read_array(f, allow_pickle=False))
        return out


def _check_meta(d: Path, meta) -> dict:
    """trace.json: an object with a list of string tokens; the optional keys of the right types."""
    def bad(what: str) -> QkvError:
        return QkvError(f"{d}/trace.json is not a qkv trace ({what}); give a directory written by --trace")

    if not isinstance(meta, dict):
        raise bad("not a JSON object")
    for key in ("tokens", "source_tokens"):
        v = meta.get(key)
        if (key == "tokens" or v is not None) and not (isinstance(v, list) and all(isinstance(t, str) for t in v)):
            raise bad(f"{key!r} must be a list of strings")
    for key in ("model", "family", "spelling", "text"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise bad(f"{key!r} must be a string")
    if meta.get("causal") is not None and not isinstance(meta["causal"], bool):
        raise bad("'causal' must be true, false or null")
    if meta.get("rows") not in (None, "softmax", "edited"):
        raise bad("'rows' must be \"softmax\" or \"edited\"")
    p = meta.get("prompt_length")
    if p is not None and not (isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= len(meta["tokens"])):
        raise bad("'prompt_length' must be a token count")
    return meta


def _check_image(d: Path, meta: dict, image) -> np.ndarray | None:
    """An image model's trace: the image (H, W, C) uint8 and a grid of (rows, columns) whose patches are the
    tokens after [CLS]; None for a text trace (neither saved)."""
    grid = meta.get("grid")
    if image is None and grid is None:
        return None
    if image is None or not (isinstance(grid, list) and len(grid) == 2
                             and all(isinstance(g, int) and not isinstance(g, bool) and g > 0 for g in grid)
                             and 1 + grid[0] * grid[1] == len(meta["tokens"])):
        raise QkvError(f"{d} is not a qkv trace of an image (its image, its grid and its {len(meta['tokens'])} "
                       "tokens disagree); give a directory written by qkv show")
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (1, 3) \
            or image.shape[0] < grid[0] or image.shape[1] < grid[1]:
        raise QkvError(f"{d}/trace.npz's image is {image.dtype} {image.shape}, not (H, W, 1 or 3) uint8 pixels "
                       "holding its grid; give a directory written by qkv show")
    names = meta.get("label_names")
    if names is not None and not (isinstance(names, list) and all(isinstance(x, str) for x in names)):
        raise QkvError(f"{d}/trace.json's label_names must be a list of strings; give a directory written by qkv show")
    return image


def _check_arrays(d: Path, meta: dict, ids, layers, att, lower) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """ids (n,) integers, layers (L,) distinct integers, attentions (L, H, n, n_k) floats, or of a causal
    self-attention their lower triangles (L, H, n(n+1)/2), row by row (unpacked here)."""
    n = len(meta["tokens"])
    n_k = n if meta.get("source_tokens") is None else len(meta["source_tokens"])

    def bad(what: str) -> QkvError:
        return QkvError(f"{d}/trace.npz does not match trace.json ({what}); give a directory written by --trace")

    if ids.shape != (n,) or ids.dtype.kind not in "iu":
        raise bad(f"ids have shape {ids.shape} of {ids.dtype}, expected ({n},) integers for {n} tokens")
    if ids.size and not 0 <= ids.min() <= ids.max() < 2**31:
        raise bad(f"ids must be token ids (0 or more), not {ids.min()}")
    if layers.ndim != 1 or layers.dtype.kind not in "iu" or len(set(layers.tolist())) != len(layers) \
            or (layers.size and not 0 <= layers.min() <= layers.max() < MAX_LAYER):
        raise bad(f"layers must be distinct layer numbers from 0 to {MAX_LAYER - 1}")
    if (att is None) == (lower is None):
        raise bad("it must hold attentions or attentions_lower, one of them")
    if lower is not None:
        if lower.ndim != 3 or lower.shape[0] != len(layers) or lower.shape[2] != n * (n + 1) // 2 \
                or n_k != n or lower.dtype.kind != "f":
            raise bad(f"attentions_lower have shape {lower.shape} of {lower.dtype}, expected "
                      f"({len(layers)}, H, {n * (n + 1) // 2}) floats: {n} rows of a causal self-attention")
        att = np.zeros(lower.shape[:2] + (n, n), dtype=lower.dtype)
        rows, cols = np.tril_indices(n)
        att[..., rows, cols] = lower
    if att.ndim != 4 or att.shape[0] != len(layers) or att.shape[2:] != (n, n_k) or att.dtype.kind != "f":
        raise bad(f"attentions have shape {att.shape} of {att.dtype}, expected ({len(layers)}, H, {n}, {n_k}) floats")
    check_weights(att, lambda what: bad(f"attentions {what}"), rows=meta.get("rows") != "edited")
    return ids, att, layers.tolist()


def _softmax_rows(att: np.ndarray) -> bool:
    """Whether every row of ATT sums to 1 (or 0: every key masked), to within ROW_SUM."""
    sums = att.sum(axis=-1, dtype=np.float64)
    return not sums.size or float(np.minimum(np.abs(sums - 1), np.abs(sums)).max()) <= ROW_SUM


def check_weights(att: np.ndarray, bad, rows: bool = True) -> None:
    """Attention weights as a pass leaves them: finite and ≥ 0; with ROWS (a trace whose trace.json does not say
    its weights were edited by hooks: "rows": "edited") also at most 1, each row summing to 1 (0: every key
    masked) to within ROW_SUM. Else bad(what is wrong) is raised."""
    if not np.isfinite(att).all():
        raise bad("hold NaN or inf")
    if att.size and att.min() < 0:
        raise bad(f"must be weights ≥ 0, not {float(att.min()):.3g}")
    if not rows:
        return
    if att.size and att.max() > 1 + ROW_SUM:
        raise bad(f"must be weights in [0, 1], not up to {float(att.max()):.3g}")
    sums = att.sum(axis=-1, dtype=np.float64)
    off = np.minimum(np.abs(sums - 1), np.abs(sums))
    if off.size and off.max() > ROW_SUM:
        raise bad(f"rows must each sum to 1 (softmax), not {float(sums.flat[int(np.argmax(off))]):.3g}")


def _check_router(d: Path, n: int, layers: list[int], routed, router, experts, weights
                  ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The MoE layers' router arrays, if any: router_layers (Lm,) among the layers, router (Lm, n, E) floats,
    experts (Lm, n, k) integers in 0..E-1, expert_weights (Lm, n, k) floats; all four or none."""
    def bad(what: str) -> QkvError:
        return QkvError(f"{d}/trace.npz has a bad router record ({what}); give a directory written by --trace")

    given = [a is not None for a in (routed, router, experts, weights)]
    if not any(given):
        return {}
    if not all(given):
        raise bad("router_layers, router, experts and expert_weights come together")
    if routed.ndim != 1 or routed.dtype.kind not in "iu" or not set(routed.tolist()) <= set(layers) \
            or len(set(routed.tolist())) != len(routed):
        raise bad("router_layers must be distinct layers of the trace")
    Lm = len(routed)
    if router.ndim != 3 or router.shape[:2] != (Lm, n) or router.dtype.kind != "f":
        raise bad(f"router has shape {router.shape} of {router.dtype}, expected ({Lm}, {n}, E) floats")
    k_shape = (Lm, n, experts.shape[-1] if experts.ndim == 3 else -1)
    if experts.shape != k_shape or experts.dtype.kind not in "iu" or not 1 <= k_shape[2] <= router.shape[2] \
            or (experts.size and not 0 <= experts.min() <= experts.max() < router.shape[2]):
        raise bad(f"experts have shape {experts.shape} of {experts.dtype}, expected ({Lm}, {n}, k) expert numbers")
    if weights.shape != experts.shape or weights.dtype.kind != "f":
        raise bad(f"expert_weights have shape {weights.shape}, expected {experts.shape} floats")
    if not (np.isfinite(router).all() and np.isfinite(weights).all()) or (weights.size and weights.min() < 0):
        raise bad("router and expert_weights must be finite, the weights ≥ 0")
    return {int(i): (router[j], experts[j], weights[j]) for j, i in enumerate(routed)}
