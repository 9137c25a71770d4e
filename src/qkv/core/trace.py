"""What one forward pass saw: every intermediate by name, as plain arrays (STYLE habit 5).

The caller picks which layers and which intermediates to keep (a `Recorder`), so
memory stays bounded on long inputs: attention weights alone are L·H·n² numbers. A trace's files on disk
(`Trace.save`, `Trace.load`) are written and checked in qkv.core.trace_files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

import os
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from .labels import labels_of
from .trace_files import attention_arrays, read_trace, weight_rows, write_trace

if TYPE_CHECKING:
    from .attention import TopAttention

# Names a forward pass can record, per layer, with their batched shapes. What the pass computed is recorded, so
# that analyses and views read it instead of applying the config's knobs again (norm_place, parallel_residual,
# residual_multiplier, qk_norm): a family's maths stays in the core. Each is hooked under its name (qkv.core.hooks).
INTERMEDIATES = {
    "residual": "(B, n, d_model)  the residual stream entering the block",
    "q": "(B, H, n, d_k)  queries, after RoPE where the model uses it",
    "k": "(B, Hkv, n, d_k)  keys, after RoPE",
    "v": "(B, Hkv, n, d_k)  values",
    "scores": ("(B, H, n, n)  S + M: the scores S = Q·Kᵀ/√d_k with the mask M applied (-inf), before softmax; a "
               "MiniMax lightning layer's: the matrix it mixes V with, A = (qₜ·kₛ)·λ^(t−s) (core/lightning.py)"),
    "attentions": ("(B, H, n, n)  A = softmax(S + M), rows sum to 1; a Mamba layer's: the attention its scan "
                   "implies, each group of channels' Σ|α| with rows divided by their sum (core/mamba.py); a "
                   "lightning layer's: each head's |scores| with rows divided by their sum (core/lightning.py)"),
    "heads": ("(B, H, n, d_k)  each head's output Z_h = A_h·V_h, before Concat·W_O (its part of attn_out is "
              "Z_h·W_O[h·d_k:(h+1)·d_k], before the output norm and multiplier)"),
    "attn_out": "(B, n, d_model)  Concat(heads)·W_O, added to the residual stream",
    "ffn_out": "(B, n, d_model)  the FFN's output, added to the residual stream",
    "neurons": ("(B, n, d_ff)  the FFN's hidden activations act(x·W_in + b) (gated: act(x·W_gate + b_g) ⊙ "
                "(x·W_in + b)), the input to W_out: each neuron's coefficient on its output vector (Geva et al. 2021's "
                "memory coefficients); a MoE layer (a routed FFN) has no single d_ff hidden and records none"),
    # recorded so that analyses and views read them (pass order):
    "attn_norm_scale": ("(B, n)  s, what the block's first norm divided each position by: √(mean(x²) + eps) "
                        "(RMSNorm) or √(var(x) + eps) (LayerNorm), of the block's input (pre-norm) or of input + "
                        "attn_out (post-norm); a hook's s is what the norm divides by. None where the block has "
                        "no such norm (OLMo 2)"),
    "attn_in": ("(B, n, d_model)  what attention reads: Norm(residual) (pre-norm, parallel), the residual itself "
                "(post-norm, or no norm before it: OLMo 2)"),
    "q_pre_rope": "(B, H, n, d_k)  queries before RoPE turns them (after the q norm where there is one, but Hunyuan's, "
                  "which follows RoPE); q without RoPE",
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
    "ffn_pre": ("(B, n, d_ff)  what the FFN's activation reads: x·W_in + b, or gated x·W_gate + b_g (whose neurons "
                "are act(x·W_gate + b_g) ⊙ (x·W_in + b); b_g: Llama's mlp_bias, else 0); a MoE layer has none"),
    "residual_out": ("(B, n, d_model)  the stream leaving the block: the next block's residual; the last block's "
                     "is what the final norm reads"),
}
# What the pass does after its last block, recorded with the last layer (trace.layer(-1)) and hooked there
# ("final_norm_scale", or "-1.final_norm_scale"): none without a final norm (BERT).
FINAL = {
    "final_norm_scale": ("(B, n)  s, what the final norm divided each position of the last block's output "
                         "(residual_out) by, as attn_norm_scale"),
}
# The scales of the norms some families put on a box's output before it joins the stream (Gemma 2, OLMo 2:
# attn_out_norm, ffn_out_norm), recorded and hooked like the other norms' (a frozen norm: attribution graphs);
# kept only when asked for (OPT_IN), None where the block has no such norm.
OUT_NORMS = {
    "attn_out_norm_scale": ("(B, n)  s, what attention's output norm divided each position of Concat(Z)·W_O by, "
                            "as attn_norm_scale (Gemma 2, OLMo 2); a hook's s is what the norm divides by"),
    "ffn_out_norm_scale": "(B, n)  s of the FFN's output norm, as attn_out_norm_scale",
}
# DeBERTa's disentangled attention (core/disentangled.py): S's three terms, each its own n × n table, recorded and
# hooked like the others (a hook's c2p or p2c is what S adds; c2c is read only: hook "scores" to change S). Every
# other model has none: a hook on them is refused. S + M = c2c + (c2p + p2c) + M, to the bit.
DISENTANGLED = {
    "scores_c2c": "(B, H, n, n)  content → content: Q·Kᵀ·s, s = 1/√(d_k·(1 + the position terms)), S's first term",
    "scores_c2p": "(B, H, n, n)  content → position: query i's Q against K^r of its distance to key j, ·s",
    "scores_p2c": "(B, H, n, n)  position → content: key j's K against Q^r of its distance to query i, ·s",
}
# What a view of a long input keeps instead of A: each query row's K largest weights (Recorder(top=K)).
SPARSE = {
    "attention_top": ("(B, H, n, K)  each query row's K largest attention weights, exactly, largest first, with "
                      "their keys and the rest of the row (core.attention.TopAttention): L·H·n·K numbers, not "
                      "L·H·n², computed a block of query rows at a time"),
}
# What a layer without softmax records of its own steps (a selective scan: Mamba, Mamba-2, Falcon-H1's mixer beside
# attention; a linear attention: the gated delta rule, lightning), so that the pipeline page shows the numbers the
# pass computed: M token-to-token matrices, each mixing its own values, mix_out = mix_matrix·mix_v exactly (Ali et
# al. 2024; the D·x̃ skip of a scan kept apart). M: a Mamba layer's MIX_CHANNELS first channels of each of its H
# groups (core/mamba.py: each channel has its own matrix, E of them), a Mamba-2 mixer's heads, the delta rule's value
# heads, lightning's heads. Read from the trace, not hooked; kept only when asked for (OPT_IN: M·n² numbers a layer,
# as many as its attentions and more); a softmax layer has none. The past of a cache: mix_matrix's m columns are
# every token's, the others this pass's n.
MIXER = {
    "mix_q": ("(B, M, n, d_s)  what reads the state at each token: C (Mamba, Mamba-2: the head's group's), q̂ (the "
              "delta rule: q/‖q‖·d_k^−½), q (lightning)"),
    "mix_k": "(B, M, n, d_s)  what writes it: B (Mamba, Mamba-2), k̂ = k/‖k‖ (the delta rule), k (lightning)",
    "mix_v": ("(B, M, n, d_v)  what is written, the values each matrix mixes: x̃ after the conv (Mamba: the matrix's "
              "channel, d_v = 1; Mamba-2: the head's P channels), v (the delta rule, lightning)"),
    "mix_gate": "(B, M, n)  each write's step: Δ (Mamba, Mamba-2), β (the delta rule); lightning none (None)",
    "mix_decay": ("(B, M, n)  the log of each token's decay of the state: Δₜ·A_h (Mamba-2), g (the delta rule), −r_h "
                  "(lightning, the same at every token); Mamba's, per state: Δₜ[c]·A[c, :] (B, M, n, N)"),
    "mix_matrix": ("(B, M, n, m)  the implied token-to-token matrix, signed, lower-triangular: α (Mamba, Mamba-2), A "
                   "(the delta rule, lightning: its 'scores')"),
    "mix_out": ("(B, M, n, d_v)  what the matrix gives, mix_matrix·mix_v: the scan's y without the D skip, the delta "
                "rule's or lightning's o"),
}
MIX_CHANNELS = 4            # a Mamba layer's channels of each group whose matrices MIXER keeps (E of them in all)
# Kept only when asked for (keep=("neurons",)): d_ff numbers a token (2.7–4 × d_model) that no default view reads,
# so Model.run, the pipeline page and saved traces leave them out (DEFAULT_KEEP); and attention_top.
# q, k before RoPE and the FFN's pre-activations are kept only when asked for too (a copy of q, k; d_ff a token).
OPT_IN = ("neurons", "ffn_pre", "q_pre_rope", "k_pre_rope", "attention_top", *OUT_NORMS, *MIXER)
# What a MoE layer (a routed FFN: Mixtral, Qwen2-MoE) records besides: the router's choice. A dense layer
# has none of them; they are read from the trace, not hooked (qkv.core.hooks takes INTERMEDIATES).
ROUTER = {
    "router": ("(B, n, E)  the router's probabilities p = softmax(x·W_router) over the E experts (σ(x·W_router) "
               "each, with DeepSeek-V3's router: cfg.router_score)"),
    "experts": "(B, n, k)  the k experts each token went to, highest ranked first (p, + a choice bias where there is one)",
    "expert_weights": ("(B, n, k)  the weights their outputs were summed with (p, renormalised and scaled where the "
                       "config says)"),
}
RECORDED = {**INTERMEDIATES, **FINAL, **OUT_NORMS, **ROUTER, **SPARSE, **DISENTANGLED, **MIXER}   # every name kept
PER_LAYER = [*INTERMEDIATES, *FINAL, *DISENTANGLED, *MIXER]                # what a LayerTrace's repr lists
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

    def wants_any(self, layer: int, names: Iterable[str]) -> bool:
        """Whether any of NAMES is kept for LAYER (e.g. MIXER: whether a scan records its own steps)."""
        return any(self.wants(layer, name) for name in names)

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
    attn_out_norm_scale: np.ndarray | None = None   # (n,) attention's output norm's s (kept only when asked for)
    ffn_out_norm_scale: np.ndarray | None = None    # (n,) the FFN's output norm's s (kept only when asked for)
    neurons: np.ndarray | None = None       # (n, d_ff) the FFN's hidden activations (kept only when asked for)
    router: np.ndarray | None = None        # (n, E) MoE layers: the router's probabilities
    experts: np.ndarray | None = None       # (n, k) the chosen experts, most probable first
    expert_weights: np.ndarray | None = None   # (n, k) their weights in the sum
    attention_top: "TopAttention | None" = None   # (H, n, K) each row's K largest weights (kept only when asked for)
    scores_c2c: np.ndarray | None = None    # (H, n, n) DeBERTa: S's content → content term
    scores_c2p: np.ndarray | None = None    # (H, n, n) content → position
    scores_p2c: np.ndarray | None = None    # (H, n, n) position → content
    mix_q: np.ndarray | None = None         # (M, n, d_s) a scan's or linear attention's own steps (MIXER)
    mix_k: np.ndarray | None = None         # (M, n, d_s)
    mix_v: np.ndarray | None = None         # (M, n, d_v)
    mix_gate: np.ndarray | None = None      # (M, n)
    mix_decay: np.ndarray | None = None     # (M, n), Mamba's (M, n, N)
    mix_matrix: np.ndarray | None = None    # (M, n, m) the implied matrix, signed
    mix_out: np.ndarray | None = None       # (M, n, d_v) mix_matrix·mix_v

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
        if value is None and name in MIXER:
            raise QkvError(f"{name} of layer {self._t.layer} was not kept in this trace: only a layer without softmax "
                           f"(a scan, a linear attention) records it, when asked for; run such a model with "
                           f"keep=(..., {name!r})")
        if value is None and name in OPT_IN:
            raise QkvError(f"{name} of layer {self._t.layer} was not kept in this trace (it is kept only when asked "
                           f"for); run the model with keep=(..., {name!r}) (a MoE layer has none)")
        if value is None and name in FINAL:
            raise QkvError(f"{name} is kept with the last layer only, for a model with a final norm; run the model "
                           f"with keep=(..., {name!r}) and the last layer (layers=None or [-1])")
        if value is None and name in DISENTANGLED:
            raise QkvError(f"{name} of layer {self._t.layer} was not kept in this trace: only disentangled attention "
                           f"(DeBERTa) has it; run such a model with keep=(..., {name!r}) or without keep=")
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
    sinks: bool = False                      # each head's softmax had a sink logit (gpt-oss, cfg.attn_sinks): a row
                                             # of A sums to less than 1, the rest its sink's (`sink_shares`)
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
    def sink_shares(self) -> np.ndarray | None:
        """(L, H, n_q) the share of each attention row its head's sink took, 1 − Σ_j A_ij (a model with attention
        sinks, gpt-oss: the sink is one more term of the softmax with no value); None without sinks or weights."""
        A = self.attentions
        return None if not self.sinks or A is None else np.maximum(1 - A.sum(axis=-1, dtype=np.float64), 0)

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
        arrays: dict = {"ids": self.ids, "layers": np.array(self.layer_ids)}
        A = self.attentions                                              # (L, H, n, n_k)
        if A is not None:
            arrays.update(attention_arrays(A, self_attention=self.source_tokens is None))   # causal: lower triangles
        routed = [i for i in self.layer_ids if self.layers[i].experts is not None]   # MoE layers' router choice
        if routed:
            arrays["router_layers"] = np.array(routed)
            arrays.update({name: np.stack([getattr(self.layers[i], name) for i in routed]) for name in ROUTER})
        if self.image is not None:
            arrays["image"] = self.image                                 # (H, W, C) uint8, what the model read
        meta = {"model": self.model if model_name is None else model_name, "family": self.family,
                "causal": self.causal, "spelling": self.spelling, "text": self.text, "tokens": self.tokens,
                "source_tokens": self.source_tokens, "layers": self.layer_ids, "prompt_length": self.prompt_length,
                "rows": "sinks" if self.sinks and A is not None else weight_rows(A),   # hooks may edit the weights;
                                                                         # sinks: rows sum to less than 1
                "grid": None if self.grid is None else list(self.grid), "label_names": self.label_names}
        return write_trace(Path(directory), arrays, meta)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Trace":
        """A trace written by `save` (tokens, ids, attentions; older ones lack family, causal, spelling).

        Checked before use: the sizes in trace.npz's zip directory and array headers (a zip bomb
        is refused before it expands), trace.json's keys and types, and the arrays' shapes."""
        saved = read_trace(Path(directory))                             # checked (qkv.core.trace_files)
        meta, image = saved.meta, saved.image
        trace = cls(tokens=meta["tokens"], ids=saved.ids, hidden=None, logits=None, text=meta.get("text"),
                    prompt_length=meta.get("prompt_length"), model=meta.get("model") or "",
                    family=meta.get("family") or "", causal=meta.get("causal"),
                    spelling=meta.get("spelling") or "plain", source_tokens=meta.get("source_tokens"),
                    layers={i: LayerTrace(layer=i, attentions=saved.attentions[k]) for k, i in enumerate(saved.layers)},
                    image=image, grid=None if image is None else tuple(meta["grid"]),
                    label_names=meta.get("label_names"), sinks=meta.get("rows") == "sinks")
        for i, values in saved.routed.items():
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
                tokenizer=tok, sinks=handle.config.attn_sinks)


def layer_traces(store: dict[int, dict[str, np.ndarray]], row: int = 0) -> dict[int, LayerTrace]:
    """Per-layer traces of batch row `row` from a recorder's store."""
    return {
        layer: LayerTrace(layer=layer, **{name: arr[row] for name, arr in named.items()})
        for layer, named in sorted(store.items())
    }
