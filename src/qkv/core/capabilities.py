"""What each kind of layer supports: the one place an analysis, a lesson, a view or a command asks before it reads a
layer as softmax attention.

A layer's kind (`kind_of`) is what its block has in attention's place, read from the config's knobs:

    attention   softmax(Q·Kᵀ/√d_k + M)·V with W_Q, W_K, W_V, W_O per head           (every transformer)
    sinks       the same with a learned sink logit per head in each softmax           (gpt-oss: cfg.attn_sinks)
    gated       the same with each head's Z_h gated, Z_h ⊙ σ(X·W_G)_h, before W_O      (Qwen3-Next: attn_output_gate)
    latent      multi-head latent attention: K, V from one latent per token           (DeepSeek: cfg.latent)
    mamba       Mamba's selective scan, no softmax, no q, k, v                         (core/mamba.py)
    mamba2      a Mamba-2 mixer (SSD) in attention's place                             (core/mamba2.py)
    parallel    softmax attention and a Mamba-2 mixer side by side on one norm        (Falcon-H1)
    delta       the gated delta rule's linear attention                               (Qwen3-Next: core/delta.py)
    lightning   lightning attention, a linear attention with a per-head decay         (MiniMax: core/lightning.py)
    minimax     MiniMax's softmax layer: attention, in a block α·Norm(x) + β·Attn(·)  (core/lightning.py)

and what a caller needs (NEEDS), each kind supporting some (SUPPORTS):

    qkv_heads       each head's W_Q, W_K, W_V, W_O, so Q = X·W_Q etc. and the QK / OV circuits exist
    backward        gradients through the layer (training, input attribution, attribution patching)
    sum_of_boxes    the stream a sum of the boxes' outputs from the embeddings on (direct logit attribution)
    plain_softmax   each row of A sums to 1 over the keys (no sink takes a share)
    plain_heads     each head's output Z_h = A·V as the trace records it (no gate after it)
    plain_block     the transformer block x + Attn(Norm(x)), then + FFN(Norm(·)), as a lesson rebuilds it
    dense_ffn       an FFN of d_ff neurons (not routed experts, not absent)
    kv_heads        K and V heads (or MLA's latent) that a KV cache keeps for every token
    pipeline        its box's steps, as the pass recorded them, drawn on the pipeline page (softmax: Q, K, V, S, A, Z;
                    a scan or linear attention: its inputs, gate, decay, the implied matrix and its output, trace.MIXER)

`require` raises one QkvError naming the model, the first layer that lacks a need, its kind, and what to use
instead. Every kind's attention (implied, for the layers without softmax) is recorded in the trace, so `qkv show`,
`heads`, `rollout`, `lens` and `patch` work on all of them: the usual way out.

A module of its own rather than core/config.py: the config holds the knobs and checks them; which analyses a
combination of knobs allows is a question every consumer downstream asks (analysis, lessons, views, commands), and
the answer is one table read here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..runtime.errors import QkvError
from .mamba2 import Mamba2

if TYPE_CHECKING:
    from .config import ModelConfig

KIND_NAMES = {                                   # kind → how a message names a layer of it
    "attention": "softmax attention",
    "gated": "softmax attention with an output gate (Qwen3-Next: Z_h ⊙ σ(X·W_G)_h before W_O)",
    "sinks": "softmax attention with attention sinks (gpt-oss: a learned logit in each softmax, with no value)",
    "latent": "multi-head latent attention (DeepSeek: K and V from a normalised latent per token)",
    "mamba": "a Mamba layer (a selective scan: no q, k, v, no softmax)",
    "mamba2": "a Mamba-2 layer (a selective scan: no q, k, v, no softmax)",
    "parallel": "attention and a Mamba-2 mixer side by side (Falcon-H1)",
    "delta": "a gated delta (linear-attention) layer (Qwen3-Next: no softmax)",
    "lightning": "a lightning (linear-attention) layer (MiniMax: no softmax)",
    "minimax": "a MiniMax softmax layer, whose block carries the normalised stream (α·Norm(x) + β·Attn)",
}

NEEDS = {                                        # need → what a message says the caller needs
    "qkv_heads": "heads with W_Q, W_K, W_V and W_O",
    "backward": "gradients through every layer",
    "sum_of_boxes": "logits that are a sum of the boxes' outputs",
    "plain_softmax": "softmax rows that sum to 1",
    "plain_heads": "heads whose output is A·V (no gate after it)",
    "plain_block": "the transformer block x + Attn(Norm(x)), + FFN(Norm(·))",
    "dense_ffn": "a dense FFN of d_ff neurons",
    "kv_heads": "K and V heads kept in a KV cache",
    "pipeline": "its steps drawn on the pipeline page",
}

WHOLE_MODEL = {"backward", "sum_of_boxes"}       # needs every layer meets, whichever layer the caller reads

_SOFTMAX = {"qkv_heads", "backward", "sum_of_boxes", "plain_softmax", "plain_heads", "plain_block", "kv_heads",
            "pipeline"}
SUPPORTS = {                                     # kind → the needs it meets (dense_ffn: the FFN's own, not the kind's)
    "attention": _SOFTMAX,
    "sinks": _SOFTMAX - {"plain_softmax"},
    "gated": _SOFTMAX - {"plain_heads", "plain_block"},
    "latent": _SOFTMAX - {"qkv_heads"},
    "mamba": {"pipeline"},                       # the pipeline page: the scan's steps and its implied matrix
    "mamba2": {"pipeline"},
    "parallel": {"qkv_heads", "plain_softmax", "plain_heads", "kv_heads", "pipeline"},   # DLA: the mixer's share not
    "delta": {"pipeline"},                                                               # split out
    "lightning": {"pipeline"},
    "minimax": {"qkv_heads", "plain_softmax", "plain_heads", "kv_heads", "pipeline"},
}

INSTEAD = ("read its attention with qkv show, heads or rollout, patch its heads (qkv patch) or read the logit lens "
           "(qkv lens)")


def kind_of(cfg: "ModelConfig", layer: int) -> str:
    """LAYER's kind (KIND_NAMES): what its block has in attention's place, from the config's knobs alone."""
    mamba2 = isinstance(cfg.mamba, Mamba2)                 # else a Mamba's sizes (core/mamba.py), or None
    kind = cfg.layer_kind(layer)                           # "attention", "mamba", "delta" or "lightning"
    if kind == "attention" and cfg.lightning is not None:
        return "minimax"                                   # MiniMax's softmax layers, among its lightning ones
    if mamba2 and cfg.mamba.beside is not None:
        return "parallel"                                  # Falcon-H1: attention and the mixer in every layer
    if kind == "mamba":
        return "mamba2" if mamba2 else "mamba"
    if kind == "attention" and cfg.latent:
        return "latent"
    if kind == "attention" and cfg.attn_sinks:
        return "sinks"
    if kind == "attention" and cfg.attn_output_gate:
        return "gated"
    return kind


def layer_kinds(cfg: "ModelConfig") -> tuple[str, ...]:
    """Every layer's kind, in order (L,)."""
    return tuple(kind_of(cfg, i) for i in range(cfg.n_layers))


def layers_with(cfg: "ModelConfig", needs: set[str]) -> list[int]:
    """The layers that meet every one of NEEDS on their own (e.g. {"qkv_heads"}: the softmax layers a lesson reads)."""
    return [i for i in range(cfg.n_layers) if all(supports(cfg, i, need) for need in needs)]


def choose_layer(cfg: "ModelConfig", needs: set[str], otherwise: str) -> str:
    """What a message suggests: the layers that meet NEEDS ("choose one with --layer (1, 3)"), or OTHERWISE."""
    good = layers_with(cfg, needs)
    return f"choose one with --layer ({', '.join(map(str, good))})" if good else otherwise


def has_ffn(cfg: "ModelConfig", layer: int) -> bool:
    """Whether LAYER's block has an FFN (dense or routed): a pure Mamba or Mamba-2 stack's blocks have none."""
    return cfg.d_ff > 0 and not (cfg.mamba is not None and cfg.layer_kinds is None)


def supports(cfg: "ModelConfig", layer: int, need: str) -> bool:
    """Whether LAYER meets NEED (NEEDS)."""
    if need not in NEEDS:
        raise ValueError(f"unknown need {need!r}; one of {', '.join(NEEDS)}")
    if need == "dense_ffn":
        return has_ffn(cfg, layer) and not cfg.moe_layer(layer)
    return need in SUPPORTS[kind_of(cfg, layer)]


def lacking(cfg: "ModelConfig", needs: set[str], layer: int | None = None) -> tuple[int, str] | None:
    """The first (layer, need) of NEEDS not met, None if all are: WHOLE_MODEL needs on every layer, the rest on LAYER
    (None: on every layer)."""
    every = range(cfg.n_layers)
    for need in sorted(needs, key=list(NEEDS).index):
        for i in (every if layer is None or need in WHOLE_MODEL else [layer % cfg.n_layers]):
            if not supports(cfg, i, need):
                return i, need
    return None


def require(cfg: "ModelConfig", name: str, what: str, needs: set[str], layer: int | None = None,
            instead: str = INSTEAD) -> None:
    """Raise one QkvError unless model NAME (config CFG) meets NEEDS for WHAT (e.g. "direct logit attribution"):
    the message names the first offending layer and its kind, and INSTEAD (what to use)."""
    miss = lacking(cfg, needs, layer)
    if miss is None:
        return
    i, need = miss
    if need != "dense_ffn":
        is_ = f"is {KIND_NAMES[kind_of(cfg, i)]}"
    else:
        is_ = "has no FFN" if not has_ffn(cfg, i) else "routes its FFN among experts (MoE)"
    raise QkvError(f"{what} needs {NEEDS[need]}, and layer {i} of {name} {is_}; {instead}")
