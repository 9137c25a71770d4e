"""How good a set of per-layer transcoders is, in the numbers the field reports (features/evaluate.py's, for FFNs).

    per layer   FVU of the FFN's output: Σ‖y − ŷ‖² / Σ‖y − mean(y)‖² (y = ffn_out, ŷ = transcoder(x), x = ffn_in
                or, for a transcoder that reads the stream before the FFN's norm, resid_mid),
                L0 (non-zero latents per token), dead latents (never fired on these tokens)
    CE          the next-token loss with layer L's FFN replaced by its transcoder (hook "L.ffn_out" → ŷ, ŷ from
                this pass's own x), and with every FFN replaced at once; against the FFN zero-ablated
                (one layer's; all of them):
                    recovered = (CE_zero − CE_replaced) / (CE_zero − CE_clean)       1: as good as the FFNs

Positions: every position but each sequence's first is replaced (skip_first, as the SAE eval and as training,
which leaves the attention sink out); FVU, L0 and dead count the replaced positions.
Cost: a clean pass records the stream entering each layer, so a one-layer pass runs blocks L..end only
(`transformer(start=L, stream=...)`); with every layer: 2 + 2·L partial or full passes a batch of sequences.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..runtime.errors import QkvError
from .evaluate import HOOK_POINTS, Tally, _fraction, next_token_loss
from .sae import SAE

@dataclass
class LayerEval:
    """One layer's numbers."""

    layer: int
    fvu: float
    l0: float
    dead: float                 # fraction of latents that never fired
    dead_count: int
    replaced: float | None      # CE with this layer's FFN replaced (None: not measured)
    zero: float | None          # CE with this layer's FFN zero-ablated
    recovered: float | None


@dataclass
class TranscodersEval:
    """The clean loss, every FFN replaced at once against every FFN zero-ablated, and each layer's numbers."""

    tokens: int                 # predicted tokens
    clean: float
    replaced_all: float
    zero_all: float
    recovered_all: float
    layers: list[LayerEval] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def _batches(sequences: Sequence[np.ndarray], tokens: int) -> list[np.ndarray]:
    """Consecutive sequences of one length stacked into (b, n) batches of about TOKENS tokens."""
    out, group = [], []
    for s in sequences:
        if group and (len(s) != len(group[0]) or (len(group) + 1) * len(s) > tokens):
            out.append(np.stack(group))
            group = []
        group.append(np.asarray(s, np.int64))
    if group:
        out.append(np.stack(group))
    return out


def evaluate_transcoders(model, transcoders: dict[int, SAE], sequences: Sequence[np.ndarray], *,
                         each: Sequence[int] | None = None, skip_first: bool = True, batch_tokens: int = 1024,
                         progress: Callable[[int, int], None] = lambda done, total: None) -> TranscodersEval:
    """The module's numbers over SEQUENCES (each (n,) ids, n ≥ 2 + skip_first); EACH: the layers whose one-layer
    CE is measured (default every transcoder's layer; FVU, L0 and dead are measured for all)."""
    from ..core.hooks import Hooks
    from ..core.stack import transformer
    from .dictionaries import check_fits

    check_fits(model, transcoders)
    each = list(transcoders) if each is None else list(each)
    for layer in each:
        if layer not in transcoders:
            raise QkvError(f"there is no transcoder for layer {layer}; give one of {', '.join(map(str, transcoders))}")
    first = 1 if skip_first else 0
    W, cfg = model.weights, model.config
    tallies = {layer: Tally(sae) for layer, sae in transcoders.items()}
    sums = {"clean": 0.0, "replaced_all": 0.0, "zero_all": 0.0}
    one = {layer: {"replaced": 0.0, "zero": 0.0} for layer in each}
    count = 0
    batches = _batches(sequences, batch_tokens)
    total, done = len(batches) * (3 + 2 * len(each)), 0

    def put(x, new):                                                      # x (b, n, d) → new at positions first..
        out = np.array(x)
        out[:, first:] = new
        return out

    def predict(layer: int, x: np.ndarray) -> np.ndarray:               # x (b, n, d) its input → ŷ (b, n − first, d)
        b, n, d = x.shape
        flat = np.asarray(x[:, first:], np.float32).reshape(-1, d)
        return transcoders[layer].forward(flat)[0].reshape(b, n - first, -1)

    def source(layer: int) -> str:                                       # the hook key of what LAYER's transcoder reads
        return f"{layer}.{HOOK_POINTS[transcoders[layer].config.site]}"

    def replacing(layers) -> dict:
        seen = {}
        spec = {}
        for layer in layers:
            spec[source(layer)] = lambda x, layer: seen.__setitem__(layer, np.array(x)) or None
            spec[f"{layer}.ffn_out"] = lambda x, layer: put(x, predict(layer, seen.pop(layer)))
        return spec

    def zeroing(layers) -> dict:
        return {f"{layer}.ffn_out": (lambda x, layer: put(x, 0)) for layer in layers}

    def loss(ids, mask, spec, start=0, stream=None) -> float:
        _, logits = transformer(W, cfg, None if stream is not None else ids, mask, start=start, stream=stream,
                                hooks=Hooks(spec, cfg, model.name) if spec else None)
        return next_token_loss(logits, ids)[0]

    for ids in batches:
        if ids.shape[1] < 2 + first:
            raise QkvError(f"a sequence needs at least {2 + first} tokens to have a replaced token to predict from")
        mask = np.ones_like(ids)
        got: dict[int, dict] = {}

        def record(name):
            return lambda x, layer: got.setdefault(layer, {}).__setitem__(name, np.array(x)) or None

        spec = {f"{layer}.residual": record("residual") for layer in each}
        spec.update({source(layer): record("x") for layer in transcoders})
        spec.update({f"{layer}.ffn_out": record("y") for layer in transcoders})
        sums["clean"] += loss(ids, mask, spec)
        count += ids.shape[0] * (ids.shape[1] - 1)
        for layer, tally in tallies.items():
            d = cfg.d_model
            tally.add(np.asarray(got[layer]["x"][:, first:], np.float32).reshape(-1, d),
                      np.asarray(got[layer]["y"][:, first:], np.float32).reshape(-1, d))
        done += 1
        progress(done, total)
        for layer in each:
            stream = got[layer]["residual"]
            one[layer]["replaced"] += loss(ids, mask, replacing([layer]), start=layer, stream=stream)
            one[layer]["zero"] += loss(ids, mask, zeroing([layer]), start=layer, stream=stream)
            done += 2
            progress(done, total)
        sums["replaced_all"] += loss(ids, mask, replacing(transcoders))
        sums["zero_all"] += loss(ids, mask, zeroing(transcoders))
        done += 2
        progress(done, total)
    if count == 0:
        raise QkvError("no tokens to evaluate on; give more --tokens")
    ce = {k: v / count for k, v in sums.items()}
    layers = []
    for layer, tally in tallies.items():
        r = tally.result()
        rep = one[layer]["replaced"] / count if layer in one else None
        zero = one[layer]["zero"] / count if layer in one else None
        rec = _fraction(zero, rep, ce["clean"]) if layer in one else None
        layers.append(LayerEval(layer, r.fvu, r.l0, r.dead, r.dead_count, rep, zero, rec))
    return TranscodersEval(count, ce["clean"], ce["replaced_all"], ce["zero_all"],
                           _fraction(ce["zero_all"], ce["replaced_all"], ce["clean"]), layers)
