"""Path patching's pieces: who sends and who receives, and the pass in which only the receivers read the
senders' change (`analysis.path_patch` builds its effects and tables from them; the module doc there says what
path patching is).

    Node, parse_nodes, every_sender, reaches      components: a head "L.H", an FFN "L.ffn", the embeddings "embed"
    sender_changes, altered_inputs                 out_s(corrupted) − out_s(clean) of each sender set, added to the
                                                   clean stream entering each receiver's layer
    receiver_hooks, patched_logits                 the clean run on from there, each receiver's q/k/v computed by
                                                   its layer itself from the altered stream (a companion batch row)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

import numpy as np

from ..core.hooks import Hooks, HookFn
from ..core.stack import transformer
from ..runtime.errors import QkvError
from .patch import tail

if TYPE_CHECKING:
    from ..core.trace import Trace
    from ..models.model import Model

EMBED = -1                                                   # the embeddings' "layer": before block 0


@dataclass(frozen=True)
class Node:
    """A sender or receiver: head HEAD of LAYER, or (head None) LAYER's FFN, or (layer EMBED) the embeddings."""

    layer: int
    head: int | None = None

    def __str__(self) -> str:
        return "embed" if self.layer == EMBED else f"{self.layer}.{'ffn' if self.head is None else self.head}"

    def order(self) -> tuple[int, float]:
        """The pass's order: the embeddings, then each layer's heads, then its FFN."""
        return self.layer, float("inf") if self.head is None else self.head


# ── who sends and who receives ───────────────────────────────────────────────────

def parse_nodes(model: "Model", spec: "str | Sequence | None", what: str = "senders", heads_only: bool = False
                ) -> list[Node]:
    """SPEC — "L.H,L.ffn,embed", a list of such strings, (layer, head) pairs or Nodes; None: none — → Nodes, checked
    against MODEL (negative layers count from the end); HEADS_ONLY: receivers, heads alone."""
    items = ([s.strip() for s in spec.split(",") if s.strip()] if isinstance(spec, str)
             else [] if spec is None else list(spec))
    L, H = model.config.n_layers, model.config.n_heads
    example = "'3.2' (layer 3, head 2)" + ("" if heads_only else ", '3.ffn' or 'embed'")
    nodes = []
    for item in items:
        if item == Node(EMBED) or (isinstance(item, str) and item in ("embed", "emb")):
            if heads_only:
                raise QkvError(f"{what}: the embeddings are no head; name heads as {example}")
            nodes.append(Node(EMBED))
            continue
        if isinstance(item, Node):
            layer, head = item.layer, item.head
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            layer, head = item
        elif isinstance(item, str) and item.count(".") == 1:
            layer, head = item.split(".")
            head = None if head in ("ffn", "mlp") and not heads_only else head
        else:
            raise QkvError(f"{what}: {item!r} is not a component; name them as {example}, comma-separated")
        try:
            layer, head = int(layer), None if head is None else int(head)
        except (TypeError, ValueError):
            raise QkvError(f"{what}: {item!r} is not a component; name them as {example}") from None
        if not -L <= layer < L or (head is not None and not 0 <= head < H):
            raise QkvError(f"{what}: {item!r} is outside {model.name} ({L} layers × {H} heads); name them as {example}")
        nodes.append(Node(layer % L, head))
    return sorted(set(nodes), key=Node.order)


def every_sender(model: "Model") -> list[Node]:
    """The embeddings, then each layer's heads and its FFN."""
    L, H = model.config.n_layers, model.config.n_heads
    return [Node(EMBED)] + [Node(l, h) for l in range(L) for h in [*range(H), None]]


def reaches(sender: Node, receivers: Sequence[Node]) -> bool:
    """Whether SENDER has a direct path to any of RECEIVERS: one of them is in a later layer."""
    return any(r.layer > sender.layer for r in receivers)


# ── the altered receivers (the mechanism) ────────────────────────────────────────

def sender_changes(model: "Model", clean: "Trace", corrupted: "Trace", senders: Sequence[Sequence[Node]],
                   below: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """(layer l, row i, Δ (n, d_model)) for each row i's sender set SENDERS[i] and each layer l < BELOW it has
    senders in: Δ = Σ_{s ∈ S_i, layer(s) = l} out_s(corrupted) − out_s(clean) (l = EMBED: the embeddings). A
    layer's heads: its attention output with those heads' Z from the corrupted run and the rest clean, minus the
    clean one, computed by the layer itself (its W_O, output norm, multiplier); an FFN: ffn_out's change."""
    for i, nodes in enumerate(senders):
        for s in nodes:
            if s.layer == EMBED:
                yield EMBED, i, corrupted.layers[0].residual - clean.layers[0].residual
            elif s.head is None and s.layer < below:
                yield s.layer, i, corrupted.layers[s.layer].ffn_out - clean.layers[s.layer].ffn_out
    for layer in sorted({s.layer for nodes in senders for s in nodes if s.head is not None and s.layer < below}):
        rows = [(i, [s.head for s in nodes if s.layer == layer and s.head is not None])
                for i, nodes in enumerate(senders)]
        rows = [(i, heads) for i, heads in rows if heads]
        outs = _attention_with(model, clean, corrupted, layer, [heads for _, heads in rows])   # (B', n, d_model)
        for (i, _), out in zip(rows, outs):
            yield layer, i, out - clean.layers[layer].attn_out


def _attention_with(model: "Model", clean: "Trace", corrupted: "Trace", layer: int, heads: list[list[int]]
                    ) -> np.ndarray:
    """Layer LAYER's attention output (B, n, d_model) on the clean stream, row i with HEADS[i]'s Z = A·V from
    the corrupted run: block LAYER alone, as a batch, its attn_out read by a hook."""
    source = corrupted.layers[layer].heads                                    # (H, n, d_k)
    seen: list[np.ndarray] = []

    def swap(z: np.ndarray, _layer: int) -> np.ndarray:                       # (B, H, n, d_k)
        z = z.copy()
        for i, hs in enumerate(heads):
            z[i, hs] = source[hs]
        return z

    def read(out: np.ndarray, _layer: int) -> None:                           # (B, n, d_model)
        seen.append(out.copy())

    x = np.repeat(clean.layers[layer].residual[None], len(heads), axis=0)      # (B, n, d_model)
    _blocks(model, x, layer, layer + 1, {f"{layer}.heads": swap, f"{layer}.attn_out": read})
    return seen[0]


def altered_inputs(model: "Model", clean: "Trace", corrupted: "Trace", senders: Sequence[Sequence[Node]],
                   layers: Sequence[int]) -> dict[int, np.ndarray]:
    """The stream each receiver layer r of LAYERS reads, for each row i's sender set SENDERS[i]:

        x'_r[i] = x_r(clean) + Σ_{s ∈ S_i, layer(s) < r} (out_s(corrupted) − out_s(clean))      (B, n, d_model)

    the senders' change reaching layer r directly, every other component at its clean value (`sender_changes`)."""
    out = {r: np.repeat(clean.layers[r].residual[None], len(senders), axis=0) for r in sorted(set(layers))}
    for layer, i, change in sender_changes(model, clean, corrupted, senders, below=max(out)):
        for r, x in out.items():
            if layer < r:
                x[i] += change
    return out


def receiver_hooks(altered: Mapping[int, np.ndarray], receivers: Mapping[int, Sequence[Sequence[int]]],
                   channel: str, positions: Sequence[int] | None = None) -> dict[str, HookFn]:
    """Hooks on a pass over 2B rows — B main rows, then row B + i the companion of row i — under which main row
    i's receiver heads RECEIVERS[r][i] of layer r read their CHANNEL input ("q", "k", "v" or "all") from
    ALTERED[r][i] (n, d_model), an altered residual stream entering block r, and everything else from their own:

        r.residual      the companion's stream entering block r := ALTERED[r][i]
        r.q, r.k, r.v   the companion's := the main row's, for each channel not chosen and at each position not
                        in POSITIONS (None: all positions altered)
        r.heads         main row i's Z_h := the companion's Z_h, for each receiver h

    So the receiver's q (k, v) is what layer r's own norm, projections, biases, QK-norm and RoPE make of the
    altered stream, and its Z = A·V what the layer's attention (mask, ALiBi, soft-cap) makes of them. Only the
    receivers' Z leave the companion: under GQA, the companion alters a whole K/V head, but only the receiver
    reads it (its group mates' Z are not copied). The companions' rows after layer r mean nothing."""
    chosen = ("q", "k", "v") if channel == "all" else (channel,)
    B = len(next(iter(altered.values())))

    def restream(r: int) -> HookFn:
        def fn(x: np.ndarray, _layer: int) -> np.ndarray:                      # (2B, n, d_model)
            x = x.copy()
            x[B:] = altered[r]
            return x
        return fn

    def keep_main(name: str) -> HookFn:
        def fn(y: np.ndarray, _layer: int) -> np.ndarray:                      # (2B, H or Hkv, n, d_k)
            y = y.copy()
            if name not in chosen:
                y[B:] = y[:B]
            elif positions is not None:
                rest = np.setdiff1d(np.arange(y.shape[2]), positions)
                y[B:, :, rest] = y[:B, :, rest]
            return y
        return fn

    def copy_back(r: int) -> HookFn:
        def fn(z: np.ndarray, _layer: int) -> np.ndarray:                      # (2B, H, n, d_k)
            z = z.copy()
            for i, heads in enumerate(receivers[r]):
                z[i, list(heads)] = z[B + i, list(heads)]
            return z
        return fn

    hooks: dict[str, HookFn] = {}
    for r in altered:
        hooks[f"{r}.residual"] = restream(r)
        for name in ("q", "k", "v"):
            if name not in chosen or positions is not None:
                hooks[f"{r}.{name}"] = keep_main(name)
        hooks[f"{r}.heads"] = copy_back(r)
    return hooks


def _blocks(model: "Model", x: np.ndarray, start: int, stop: int, hooks: Mapping[str, HookFn]
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """X (B, n, d_model), the stream entering block START, through blocks START..STOP-1 with HOOKS → (the stream
    entering block STOP (B, n, d_model), None); STOP = L: (the final hidden states, the last position's logits
    (B, 1, V))."""
    end = stop >= model.config.n_layers
    return transformer(model.weights, model.config, None, np.ones(x.shape[:2], np.int64),
                       logits="last" if end else None, hooks=Hooks.of(None, hooks, model.config, model.name),
                       start=start, stream=x, stop=None if end else stop)


def patched_logits(model: "Model", clean: "Trace", corrupted: "Trace",
                   rows: Sequence[tuple[Sequence[Node], Sequence[Node]]], channel: str,
                   positions: Sequence[int] | None = None) -> np.ndarray:
    """The clean run with each row's (senders, receivers) path patched (module doc) → the last position's
    logits (B, V), one batched pass: 2B rows (`receiver_hooks`) over the receivers' layers, then B rows on."""
    B = len(rows)
    layers = sorted({r.layer for _, receivers in rows for r in receivers})
    altered = altered_inputs(model, clean, corrupted, [senders for senders, _ in rows], layers)
    heads = {r: [[h.head for h in receivers if h.layer == r] for _, receivers in rows] for r in layers}
    hooks = receiver_hooks(altered, heads, channel, positions)
    first, last = layers[0], layers[-1]
    x = np.repeat(clean.layers[first].residual[None], 2 * B, axis=0)           # (2B, n, d_model)
    x, logits = _blocks(model, x, first, last + 1, hooks)
    if logits is not None:
        return logits[:B, 0]                                                   # (B, V)
    return tail(model, x[:B], last + 1, None, clean)                           # (B, V) the main rows on
