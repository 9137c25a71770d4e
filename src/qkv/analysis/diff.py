"""Model diffing: how far two checkpoints of one architecture (base and instruct, two training steps, a model
and a quantisation of it) read the same text differently, layer by layer and head by head.

Both models run TEXT (the same token ids: the tokenizers must be the same) keeping each layer's attention
weights and residual stream. With A_l,h (n, n) each head's attention pattern, x_l (n, d_model) the stream
after l blocks (row 0: the embeddings, row L: what the final norm reads) and p_l = softmax(lens_l) each
row's logit-lens distribution (`lens.read_out`: the model's own final norm and W_vocab; row L is the logits):

    js      (L, H)      mean over query rows q of JS(A_a[q] ‖ A_b[q]) = ½ KL(P‖M) + ½ KL(Q‖M), M = (P + Q)/2,
                        in bits (log base 2: 0 = the same row, 1 = rows on disjoint keys)
    cosine  (L+1, n)    cos(x_a, x_b) per position, as 1 − ½‖u − v‖² with u, v the unit rows (the same
                        number as u·v, but exactly 1 for equal rows and accurate near 1)
    norm_ratio (L+1, n) ‖x_b‖ / ‖x_a‖
    lens_kl (L+1, n)    KL(p_a ‖ p_b) = Σ p_a (log p_a − log p_b), in nats; row L is the final logits'

all in float64 from each model's own arrays. A model against itself is 0 (cosine and ratio 1) exactly.

Quantisation diffing (`requantized`): a copy of a model whose attention and FFN matrices are quantised by
the `gguf` package (gguf.quants, ggml's reference rounding) to KIND and dequantised to float32 — the numbers
a GGUF of that kind holds, multiplied as float32 (qkv's stored kernels give the same products to ~1e-6). The
embedding table, W_vocab and the norms stay as they were. SmolLM2 is bundled only as a Q4_1 GGUF (its
embedding Q8_0), with no float original: its float32 dequantisation against a re-quantisation shows what
one more rounding of that kind does to each head (re-quantised to Q4_1 itself, gguf's rounding gives the file's
blocks back byte for byte: the diff is exactly 0). Stored against float32 (`qkv --weights`) shows what qkv's
stored kernels change: a prompt of more than runtime.stored.FEW_ROWS (8) tokens multiplies dequantised tiles by BLAS, the same
numbers (0 everywhere); up to FEW_ROWS, the streaming kernels' float32 sums (SmolLM2, 5 tokens: JS ≤ 2e-12 bits,
final KL ≤ 5e-11 nats).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..core.capabilities import require
from ..runtime.errors import QkvError
from .lens import check_lens, read_out, residual_stream

if TYPE_CHECKING:
    from ..models.model import Model

KEEP = ("attentions", "residual", "residual_out")
KINDS = ("Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0")   # what gguf.quants quantises in NumPy (block of 32 weights)
SHAPE = ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head", "d_ff", "vocab_size", "causal")


@dataclass
class ModelDiff:
    """Two models on one text (module doc: each array); `to_json` is what `qkv diff --json` writes."""

    model_a: str
    model_b: str
    tokens: list[str]
    ids: list[int]
    js: np.ndarray                  # (L, H) mean over query rows, bits
    js_rows: np.ndarray             # (L, H, n) each query row's
    cosine: np.ndarray              # (L+1, n)
    norm_ratio: np.ndarray          # (L+1, n)
    lens_kl: np.ndarray | None      # (L+1, n) nats; None: no LM head
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def final_kl(self) -> np.ndarray | None:
        """(n,) KL(A‖B) of the final logits' distributions, nats (the lens's last row)."""
        return None if self.lens_kl is None else self.lens_kl[-1]

    def top_heads(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The K heads whose patterns moved most: (layer, head, mean JS in bits), largest first."""
        order = np.argsort(-self.js, axis=None, kind="stable")[:k]
        return [(int(i // self.js.shape[1]), int(i % self.js.shape[1]), float(self.js.flat[i])) for i in order]

    def layers(self) -> dict[str, np.ndarray]:
        """Per row of the stream 0..L, the mean over positions: cosine, norm_ratio, lens_kl (L+1,) each."""
        out = {"cosine": self.cosine.mean(axis=1), "norm_ratio": self.norm_ratio.mean(axis=1)}
        if self.lens_kl is not None:
            out["lens_kl"] = self.lens_kl.mean(axis=1)
        return out

    def to_json(self, top: int = 10) -> dict:
        rows = lambda a: None if a is None else [[float(x) for x in r] for r in a]
        return {"model_a": self.model_a, "model_b": self.model_b, "tokens": self.tokens, "ids": self.ids,
                "units": {"js": "bits (log base 2), mean over query rows", "lens_kl": "nats, KL(A‖B)",
                          "cosine": "cos(x_a, x_b) of the residual stream after l blocks (row 0: embeddings)",
                          "norm_ratio": "‖x_b‖ / ‖x_a‖"},
                "js": rows(self.js), "cosine": rows(self.cosine), "norm_ratio": rows(self.norm_ratio),
                "lens_kl": rows(self.lens_kl),
                "final_kl": None if self.final_kl is None else [float(x) for x in self.final_kl],
                "layers": {k: [float(x) for x in v] for k, v in self.layers().items()},
                "top_heads": [{"layer": l, "head": h, "js": v} for l, h, v in self.top_heads(top)],
                "seconds": self.seconds, "notes": self.notes}


def diff(model_a: "Model", model_b: "Model", text: str) -> ModelDiff:
    """How far MODEL_B reads TEXT differently from MODEL_A (module doc): two forward passes keeping the
    attention weights and the residual stream, and each row's logit lens."""
    start = time.perf_counter()
    ids = check_comparable(model_a, model_b, text)
    ta, tb = model_a.run(ids, keep=KEEP), model_b.run(ids, keep=KEEP)
    L = model_a.config.n_layers
    js_rows = np.stack([js_divergence(with_sink(ta.layers[l].attentions, ta.sinks),
                                      with_sink(tb.layers[l].attentions, tb.sinks)) for l in range(L)])
    xa, xb = residual_stream(model_a, ta), residual_stream(model_b, tb)    # (L+1, n, d_model) each
    cos, ratio = cosine(xa, xb), norm_ratio(xa, xb)
    lens = None
    if model_a.weights.W_vocab is not None and model_b.weights.W_vocab is not None:
        lens = np.stack([kl_divergence(read_out(model_a, xa[l]), read_out(model_b, xb[l])) for l in range(L + 1)])
    labels = model_a.tokenizer.labels(ids) if model_a.tokenizer else [str(i) for i in ids]
    return ModelDiff(model_a.name, model_b.name, list(labels), [int(i) for i in ids], js_rows.mean(axis=-1),
                     js_rows, cos, ratio, lens, time.perf_counter() - start)


def check_comparable(model_a: "Model", model_b: "Model", text: str) -> np.ndarray:
    """TEXT's token ids (n,), the same for both; one error where the shapes or the tokenizers differ."""
    for m in (model_a, model_b):
        if getattr(m.config, "encoder_decoder", False):
            raise QkvError(f"{m.name} is an encoder–decoder; qkv diff compares single-stack models (decoders, encoders)")
    differ = [k for k in SHAPE if getattr(model_a.config, k, None) != getattr(model_b.config, k, None)]
    if differ:
        k = differ[0]
        raise QkvError(f"{model_a.name} and {model_b.name} differ in shape ({k} {getattr(model_a.config, k, None)} vs "
                       f"{getattr(model_b.config, k, None)}); qkv diff compares two checkpoints of one architecture")
    ta, tb = model_a.tokenizer, model_b.tokenizer
    if (ta is None) != (tb is None) or (ta is not None and ta is not tb and ta.to_json() != tb.to_json()):
        raise QkvError(f"{model_a.name} and {model_b.name} have different tokenizers, so the same text is not the "
                       "same tokens; diff two checkpoints that share one tokenizer")
    if model_a.weights.W_vocab is not None:
        check_lens(model_a)
    return np.asarray(model_a.encode(text)[0], np.int64)


def with_sink(A: np.ndarray, sinks: bool) -> np.ndarray:
    """A (H, n_q, n_k) as a distribution over the keys and, with attention sinks (gpt-oss), a last column: each
    row's sink share 1 − Σ_k A (H, n_q, n_k + 1), so that the row sums to 1 again; A itself without sinks."""
    if not sinks:
        return A
    A = np.asarray(A, np.float64)
    return np.concatenate([A, np.maximum(1 - A.sum(axis=-1, keepdims=True), 0)], axis=-1)


def js_divergence(P: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """JS(P[..., q, :] ‖ Q[..., q, :]) in bits for each row of attention weights P, Q (H, n_q, n_k) → (H, n_q):
    ½ Σ_k P log₂(P/M) + ½ Σ_k Q log₂(Q/M), M = (P + Q)/2, a zero weight adding nothing (0 · log 0 = 0)."""
    P, Q = np.asarray(P, np.float64), np.asarray(Q, np.float64)
    M = (P + Q) / 2

    def half(X: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(X > 0, X * np.log2(X / M), 0.0).sum(axis=-1)   # (H, n_q)

    return np.maximum(0.5 * half(P) + 0.5 * half(Q), 0.0)


def kl_divergence(logits_a: np.ndarray, logits_b: np.ndarray) -> np.ndarray:
    """KL(softmax(a) ‖ softmax(b)) in nats for each row of logits (n, V) → (n,), in float64 from log-softmax."""
    la, lb = _log_softmax(logits_a), _log_softmax(logits_b)                  # (n, V)
    return np.maximum((np.exp(la) * (la - lb)).sum(axis=-1), 0.0)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """cos of each row pair (…, d) → (…): 1 − ½‖a/‖a‖ − b/‖b‖‖² (= â·b̂; exactly 1 for equal rows)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    u = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-300)
    v = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-300)
    return 1.0 - 0.5 * ((u - v) ** 2).sum(axis=-1)


def norm_ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """‖b‖ / ‖a‖ of each row pair (…, d) → (…)."""
    na = np.linalg.norm(np.asarray(a, np.float64), axis=-1)
    return np.linalg.norm(np.asarray(b, np.float64), axis=-1) / np.maximum(na, 1e-300)


def requantized(model: "Model", kind: str) -> "Model":
    """A copy of MODEL (float32) whose attention and FFN matrices are quantised to KIND by gguf.quants and
    dequantised (blocks of 32 along each matrix's input axis, as a GGUF file stores W's rows of Wᵀ); the
    embedding table, W_vocab, routers and norms kept (module doc)."""
    from gguf import GGMLQuantizationType, quants

    from ..core.weights import ffns_of
    from ..models.model import Model

    if kind not in KINDS:
        raise QkvError(f"unknown quantisation {kind!r}; choose one of {', '.join(KINDS)}")
    require(model.config, model.name, "re-quantising a model's attention and FFN matrices", {"qkv_heads"},
            instead="compare two checkpoints instead (--model-b DIR)")
    qtype = GGMLQuantizationType[kind]
    weights = model.weights.astype(np.float32)                # a stored model's blocks dequantised, copies
    for block in weights.blocks:
        a = block.attn
        matrices = [a.W_QKV, a.W_Q, a.W_K, a.W_V, a.W_O]
        for f in ffns_of(block.ffn):
            matrices += [f.W_gate_in, f.W_gate, f.W_in, f.W_out]
        done: list[np.ndarray] = []
        for W in matrices:                                    # (d_in, d_out); views of a fused one quantised once
            if W is None or any(np.shares_memory(W, d) for d in done):
                continue
            if W.shape[0] % 32:
                raise QkvError(f"{model.name}'s matrices have {W.shape[0]} inputs, not a multiple of {kind}'s "
                               "blocks of 32; it cannot be quantised to it")
            T = np.ascontiguousarray(W.T)                     # (d_out, d_in): the file's rows
            W[...] = quants.dequantize(quants.quantize(T, qtype), qtype).T
            done.append(W)
    return Model(model.config, weights, model.tokenizer, f"{model.name} → {kind}")
