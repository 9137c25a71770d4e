"""The logit lens (nostalgebraist 2020): what each layer would predict if the model stopped there.

    logit_lens          text or ids → (L+1, n, V): the residual stream after l blocks through
                        the final norm and W_vocab (row 0: the embeddings; row L: the logits)
    lens_of_trace       the same, from a trace that kept "residual" and "residual_out"
    residual_stream     that trace's residual stream after 0..L blocks, (L+1, n, d_model)
    final_prediction    each position's final top token and its probability at every layer
    lens_top            the same without the (L+1, n, V) array, layer by layer, with each cell's
                        top-k tokens and the final prediction's rank: what the viewer's panel shows
                        (`sections.lens_payload`)

The figure (layers × positions) is `viz.interpret_figures.lens_figure`.

The norm and W_vocab are the model's own (`qkv.core.blocks.norm`, `qkv.core.blocks.logits_of`), so row L
is the model's logits by construction of the same arithmetic, and the tests check that it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..core.blocks import logits_of, norm, unembed_in
from ..runtime.errors import QkvError

if TYPE_CHECKING:
    from ..models.model import Model
    from ..core.trace import Trace

KEEP = ("residual", "residual_out")               # what a trace must keep for the lens
MAX_BYTES = 2 << 30                              # the lens array (L+1)·n·V; past this, one clear error
TRACE_LENS_TOKENS = 256                          # `qkv generate/chat --trace` adds the lens up to this many tokens


def check_lens(model: "Model") -> None:
    """The lens reads through W_vocab: an encoder without an LM head has none."""
    if model.weights.W_vocab is None:
        raise QkvError(f"{model.name} has no LM head (W_vocab), so it has no logits to read the layers through; "
                       "the logit lens needs a decoder, e.g. --model smollm2")


def residual_stream(model: "Model", trace: "Trace") -> np.ndarray:
    """(L+1, n, d_model): row l is the residual stream after l blocks (row 0: the embeddings).

    Rows 0..L-1 are the blocks' inputs ("residual"); row L is the last block's output ("residual_out"), the
    stream the final norm reads, as the pass recorded them (whatever the block's layout: pre- or post-norm,
    parallel, an encoder–decoder's decoder with its cross-attention).
    """
    L = model.config.n_layers
    if trace.layer_ids != list(range(L)) or any(trace.layers[i].residual is None for i in range(L)):
        raise QkvError("the logit lens needs every layer's residual stream; run the model with "
                       f"keep={KEEP} and every layer")
    last = trace.layers[L - 1].residual_out
    if last is None:
        raise QkvError(f"the logit lens needs the last layer's residual_out; run with keep={KEEP}")
    return np.stack([trace.layers[i].residual for i in range(L)] + [last])    # (L+1, n, d_model)


def lens_of_trace(model: "Model", trace: "Trace") -> np.ndarray:
    """(L+1, n, V) logits read from each row of the trace's residual stream (see `logit_lens`)."""
    check_lens(model)
    n = len(trace.ids)
    size = (model.config.n_layers + 1) * n * model.weights.W_vocab.shape[1] * np.dtype(model.dtype).itemsize
    if size > MAX_BYTES:
        raise QkvError(f"the logit lens of {n:,} tokens needs {size / 2**30:.1f} GiB "
                       f"(more than {MAX_BYTES / 2**30:.0f} GiB); give a shorter text")
    return read_out(model, residual_stream(model, trace))                  # (L+1, n, V)


def read_out(model: "Model", x: np.ndarray) -> np.ndarray:
    """Rows of the residual stream x (…, d_model) read as the model reads its last: the final norm, (OPT-350m)
    unembed_in back to the table's width, then W_vocab → (…, V)."""
    if model.weights.final_norm is not None:
        x = norm(x, model.weights.final_norm, model.config)
    return logits_of(unembed_in(x, model.weights), model.weights, model.config)


def logit_lens(model: "Model", text_or_ids: str | Sequence[int]) -> np.ndarray:
    """(L+1, n, V): row l reads the residual stream after l blocks through the final norm and
    W_vocab (row 0: the embeddings), so row L equals the model's logits.

    Memory: (L+1)·n·V numbers, about 6 MB per token for SmolLM2 (31 × 49,152 float32).
    An encoder without an LM head (MiniLM, BERT) raises QkvError.
    """
    check_lens(model)
    return lens_of_trace(model, model.run(text_or_ids, keep=KEEP))


def final_prediction(lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids (n,), probabilities (L+1, n)): each position's top token at the last layer, and
    softmax(row l)[that token] at every layer l (float64)."""
    z = lens.astype(np.float64)                                            # (L+1, n, V)
    ids = np.argmax(z[-1], axis=-1)                                        # (n,)
    top = z.max(axis=-1, keepdims=True)                                    # (L+1, n, 1)
    log_sum = np.log(np.exp(z - top).sum(axis=-1)) + top[..., 0]           # (L+1, n)
    picked = np.take_along_axis(z, ids[None, :, None], axis=-1)[..., 0]    # (L+1, n)
    return ids, np.exp(picked - log_sum)


@dataclass
class LensTop:
    """What the logit lens shows per (layer, position), without the (L+1, n, V) logits."""

    predicted: np.ndarray            # (n,) each position's final prediction (argmax of row L)
    probs: np.ndarray                # (L+1, n) softmax(row l)[predicted], float64
    ranks: np.ndarray                # (L+1, n) its rank at row l: 1 + how many tokens score higher
    top_ids: np.ndarray              # (L+1, n, k) each cell's k most likely tokens, most likely first
    top_probs: np.ndarray            # (L+1, n, k) their probabilities, float64


def lens_top(model: "Model", trace: "Trace", k: int = 5,
             translate: Callable[[int, np.ndarray], np.ndarray] | None = None) -> LensTop:
    """The logit lens of TRACE (kept KEEP) summarised per cell, one row of the residual stream at a
    time: memory (n, V) instead of (L+1, n, V), so a long text fits. Row l's logits are exactly
    `lens_of_trace`'s row l (the same norm and W_vocab on the same rows); exp runs in the model's
    dtype and the sums in float64 (probabilities within ~1e-7 of `final_prediction`'s).
    translate(l, rows (n, d_model)): what row l becomes before the read (the tuned lens's translators,
    `analysis.tuned_lens.translate`); None: the rows themselves."""
    check_lens(model)
    x = residual_stream(model, trace)                                      # (L+1, n, d_model)
    rows, n = x.shape[:2]
    V = model.weights.W_vocab.shape[1]
    k = max(1, min(int(k), V))

    def logits(l: int) -> np.ndarray:
        return read_out(model, x[l] if translate is None else translate(l, x[l]))   # (n, V)

    z = logits(rows - 1)
    predicted = np.argmax(z, axis=-1)                                      # (n,)
    probs, ranks = np.empty((rows, n)), np.empty((rows, n), np.int64)
    top_ids, top_probs = np.empty((rows, n, k), np.int64), np.empty((rows, n, k))
    at = np.arange(n)
    for l in range(rows - 1, -1, -1):
        z = z if l == rows - 1 else logits(l)                              # (n, V)
        top = z.max(axis=-1, keepdims=True).astype(np.float64)             # (n, 1)
        log_sum = np.log(np.exp(z - top.astype(z.dtype)).sum(axis=-1, keepdims=True, dtype=np.float64)) + top
        picked = z[at, predicted].astype(np.float64)                       # (n,)
        probs[l] = np.exp(picked - log_sum[:, 0])
        ranks[l] = 1 + (z > z[at, predicted][:, None]).sum(axis=-1)        # ties do not count
        for t in range(k):                  # k argmaxes: faster than argpartition for small k; ties: lowest id
            top_ids[l, :, t] = best = np.argmax(z, axis=-1)                # (n,)
            top_probs[l, :, t] = np.exp(z[at, best].astype(np.float64) - log_sum[:, 0])
            z[at, best] = -np.inf                                          # z is this row's own array
    return LensTop(predicted, probs, ranks, top_ids, top_probs)
