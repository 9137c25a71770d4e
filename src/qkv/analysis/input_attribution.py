"""Input attribution: which input tokens made an output, from the gradient with respect to their embeddings.

The output is one number z (`Output`): a decoder's logit of a target token at the last position (by
default its top-1 next token), a masked-LM encoder's at its first mask token, or a logit difference
z_A − z_B; for an encoder without an LM head (MiniLM), the cosine of its sentence embedding (mean-pooled,
as sentence-transformers pools it) to a second text's. Its inputs are the token embeddings e_i = E[ids_i]·s
(the table's rows as they join the positions: s is the family's embedding scale, 1 for most), so

    saliency       ‖∂z/∂e_i‖₂                                  how much z moves per unit change of e_i
    grad-x-input   Σ_d e_id · ∂z/∂e_id                         the first-order part of z that e_i gives
    ig             Σ_d (e − b)_id · ∫₀¹ ∂z/∂e_id(b + α(e − b)) dα    integrated gradients (Sundararajan et al.
                                                               2017) from a baseline b: the zero embedding, or
                                                               the pad token's (positions kept; `baseline_rows`)

Integrated gradients' scores sum to z(e) − z(b) (completeness); the integral is a Gauss–Legendre sum over
STEPS nodes, as Captum's default, and `InputAttribution.completeness` reports how close the sum came. Where
it is more than TOLERANCE off, the integral is done again adaptively (`quadrature.refined`: the zero
baseline's path turns sharply near its start, where the streams are below the norms' ε). A Llama of weights
N(0, 0.3²) with its first token kept: 64 nodes miss z(e) − z(b) by 50–450 % and single tokens by several
times the largest score; refined, by < 0.5 % and < 1 %.
The gradients are the engine's own backward (qkv.core.backward: the pass that inference runs, kept on a
tape), which tests/test_input_attribution.py checks against torch autograd. The nodes of IG are rows of
one batch (a few batches for long inputs): each batch is one forward and one backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..runtime.errors import QkvError
from . import quadrature
from .attribution import token_id
from .quadrature import ig_nodes, node_scores

if TYPE_CHECKING:
    from ..models.model import Model

METHODS = ("saliency", "grad-x-input", "ig")
BATCH_TOKENS = 512           # rows × tokens of one IG batch (its tape and logits: ~1.4 MB a token for SmolLM2)
TAPE_BYTES = 2 << 30         # the attention weights one backward keeps (L · rows · H · n² floats), at the most
MAX_STEPS = 1024
TOLERANCE = 0.02             # ig: the completeness error above which the integral is refined (the 2 %)
BASELINES = ("zero", "pad")


@dataclass
class InputAttribution:
    """Scores (n,) for the n input tokens of one output z; `to_json` is what `qkv attribute --json` prints."""

    tokens: list[str]
    ids: list[int]
    scores: np.ndarray                      # (n,) float64
    method: str
    target: int | None                      # None: an encoder's cosine
    other: int | None
    logit: float                            # z at the input
    baseline_logit: float | None = None     # z at the zero embedding (ig)
    steps: int | None = None                # ig's nodes, as used (more than asked where it was refined)
    requested_steps: int | None = None      # ig: the nodes asked for
    requested_error: float | None = None    # ig: the completeness error of the nodes asked for
    tolerance: float | None = None          # ig: the completeness error above which it refines (None: never)
    baseline: str | None = None             # ig's starting point: "zero" or "pad (token N)", ", first token kept"
    target_label: str = ""
    what: str = ""                          # z in words: "logit(␣Paris)", "cos(sentence embedding, …)"
    sides: list[str] | None = None          # an encoder–decoder's: "source" or "target" for each token

    @property
    def completeness(self) -> float | None:
        """ig: |Σ scores − (z(e) − z(b))| / |z(e) − z(b)|, the relative error of the integral (None otherwise)."""
        if self.baseline_logit is None:
            return None
        gap = self.logit - self.baseline_logit
        return abs(float(self.scores.sum()) - gap) / max(abs(gap), 1e-12)

    def to_json(self) -> dict:
        out = {"tokens": self.tokens, "ids": self.ids, "scores": [float(s) for s in self.scores],
               "target": self.target, "target_token": self.target_label, "logit": self.logit,
               "baseline_logit": self.baseline_logit, "method": self.method, "output": self.what}
        if self.other is not None:
            out["other"] = self.other
        if self.sides is not None:
            out["sides"] = self.sides
        if self.steps is not None:
            out["steps"] = self.steps
            out["baseline"] = self.baseline
            out["completeness_error"] = self.completeness
            out["requested_steps"] = self.requested_steps
            out["requested_completeness_error"] = self.requested_error
            out["tolerance"] = self.tolerance
        return out

    @property
    def refinement(self) -> str | None:
        """One line where ig's nodes asked for were more than the tolerance off: how far, the nodes refined to,
        and whether the tolerance was met (None where no refinement was tried)."""
        if self.requested_error is None:
            return None
        asked = f"{self.requested_steps} steps were" if self.requested_steps > 1 else "1 step was"
        line = f"{asked} {100 * self.requested_error:.2f} % apart, more than the {100 * self.tolerance:g} % tolerance: "
        if self.completeness >= self.requested_error:
            return line + f"an adaptive refinement ({quadrature.REFINE_NODES} nodes at most) came no closer"
        line += f"refined adaptively to {self.steps} steps"
        if self.completeness > self.tolerance:
            budget = quadrature.REFINE_NODES
            line += f", still {100 * self.completeness:.2f} % apart ({budget} nodes evaluated at most)"
        return line


@dataclass
class Output:
    """What z is, read from a pass's final hidden states h (b, n, d) and logits (b, n, V): the logit of TARGET
    (− OTHER's) at POSITION, or with COMPARE (d,) (unit) the cosine of the mean-pooled h to it (an encoder's
    sentence embedding, as sentence-transformers pools it)."""

    position: int = -1
    target: int | None = None
    other: int | None = None
    compare: np.ndarray | None = None

    def value(self, h: np.ndarray, logits: np.ndarray | None) -> np.ndarray:
        """z of each row (b,) float64."""
        if self.compare is not None:
            e = h.astype(np.float64).mean(axis=1)                            # (b, d)
            return e @ self.compare / np.linalg.norm(e, axis=-1)
        z = logits[:, self.position, self.target].astype(np.float64)
        return z if self.other is None else z - logits[:, self.position, self.other]

    def gradient(self, h: np.ndarray, logits: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(dz/dlogits, None), or (None, dz/dh) for the cosine: with e = mean h, u = e/‖e‖,
        dz/dh_i = (v − (u·v)·u) / (‖e‖·n)."""
        if self.compare is not None:
            e = h.astype(np.float64).mean(axis=1)                            # (b, d)
            norm = np.linalg.norm(e, axis=-1, keepdims=True)
            u = e / norm
            de = (self.compare - (u @ self.compare)[:, None] * u) / norm     # (b, d)
            return None, np.broadcast_to((de / h.shape[1])[:, None], h.shape).astype(h.dtype)
        d = np.zeros_like(logits)                                            # (b, n, V)
        d[:, self.position, self.target] = 1.0
        if self.other is not None:
            d[:, self.position, self.other] = -1.0
        return d, None


def output_of(model: "Model", ids: np.ndarray, target, other, compare: str | None) -> tuple[Output, str]:
    """What to attribute for this model and ids (n,), and its name: a decoder's next token (TARGET, default its
    top-1), a masked-LM encoder's token at the first mask token, an encoder's sentence embedding's cosine to
    COMPARE's."""
    from ..writing.nexttoken import MASK_TOKENS, mask_position

    cfg = model.config
    label = model.tokenizer.label if model.tokenizer else str
    if compare is not None:
        if cfg.causal:
            raise QkvError("--compare is for encoders (a sentence embedding's cosine); a decoder explains its next "
                           "token: give --token instead")
        if target is not None or other is not None:
            raise QkvError("--compare explains a cosine, not a token: leave out --token and --other")
        from .patch import sentence_embedding
        v = sentence_embedding(model.forward(model.encode(compare)[0][None], attentions=False).hidden)[0]
        return Output(compare=v), f"cos(sentence embedding, {compare!r}'s)"
    if model.weights.W_vocab is None:
        raise QkvError(f"{model.name} has no LM head: give --compare TEXT to attribute the cosine of its sentence "
                       "embedding to TEXT's")
    position = -1
    if not cfg.causal:
        position = mask_position(model, ids)
        if position is None:
            tok = model.tokenizer
            shown = next((t for t in MASK_TOKENS if tok is not None and tok.token_to_id(t) is not None), "<mask>")
            raise QkvError(f"{model.name} is a masked-LM encoder: put its mask token {shown} where a word should be "
                           f'predicted, e.g. "The cat sat on the {shown}."')
    if target is None:
        if other is not None:
            raise QkvError("--other needs --token: give the token whose logit the other is subtracted from")
        logits = model.forward(ids[None], attentions=False).logits[0, position]
        target = int(np.argmax(logits))
    t = token_id(model, target)
    o = None if other is None else token_id(model, other)
    if o is not None and o == t:
        raise QkvError("the target and the other token are the same token; give two different tokens")
    where = "" if cfg.causal else f" at the mask (position {position})"
    return Output(position, t, o), f"logit({label(t)})" + ("" if o is None else f" − logit({label(o)})") + where


def attribute(model: "Model", text_or_ids: str | Sequence[int], target: str | int | None = None,
              other: str | int | None = None, *, method: str = "grad-x-input", steps: int = 64,
              baseline: str = "zero", keep_first: bool = True, compare: str | None = None,
              prefix: str | Sequence[int] | None = None, tolerance: float | None = TOLERANCE) -> InputAttribution:
    """Attribute the logit of TARGET after TEXT (None: the model's top-1 next token; a masked-LM encoder's at
    its first mask token), or the difference logit(target) − logit(other), or an encoder's sentence
    embedding's cosine to COMPARE's, to the input tokens by METHOD (saliency, grad-x-input, ig with STEPS
    nodes from BASELINE: `baseline_rows`; KEEP_FIRST: the first token stays itself along the path, score 0;
    where the STEPS nodes miss z(e) − z(b) by more than TOLERANCE of it, refined adaptively
    (`quadrature.refined`; None or 0: never, the STEPS nodes as Captum sums them). An encoder–decoder: TEXT is
    the source, PREFIX the target written so far ("" or None: the start token alone), z the logit of the next
    target token, scored over the source tokens and the target's."""
    if baseline not in BASELINES:
        raise QkvError(f"unknown IG baseline {baseline!r}; choose one of {', '.join(BASELINES)}")
    if method not in METHODS:
        raise QkvError(f"unknown attribution method {method!r}; choose one of {', '.join(METHODS)}")
    if not isinstance(steps, (int, np.integer)) or not 1 <= steps <= MAX_STEPS:
        raise QkvError(f"--steps must be a whole number from 1 to {MAX_STEPS}, got {steps!r}")
    if tolerance is not None and (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float, np.floating))
                                  or not 0 <= tolerance < 1):
        raise QkvError(f"--tolerance must be a number from 0 (never refine) to below 1, got {tolerance!r}")
    tolerance = float(tolerance) if tolerance else None
    if model.config.encoder_decoder:
        return _attribute_seq2seq(model, text_or_ids, target, other, method, int(steps), baseline, keep_first,
                                  prefix, compare, tolerance)
    if prefix is not None:
        raise QkvError("--prefix is for an encoder–decoder (the target written so far); a decoder reads TEXT whole")
    ids = model.encode(text_or_ids)[0] if isinstance(text_or_ids, str) else model.check_ids(text_or_ids)[0][0]
    labels = [model.tokenizer.label(int(i)) if model.tokenizer else str(int(i)) for i in ids]   # "␣Paris"
    cfg = model.config
    n = len(ids)
    per_row = cfg.n_layers * cfg.n_heads * n * n * 4                         # A of every layer, one row
    if per_row > TAPE_BYTES:
        longest = int((TAPE_BYTES / (cfg.n_layers * cfg.n_heads * 4)) ** 0.5)
        raise QkvError(f"{n} tokens need {per_row / 2**30:.1f} GiB of attention weights for the backward pass; "
                       f"attribute at most {longest} tokens of {model.name} (shorten the text)")
    model = float_model(model)
    out, what = output_of(model, np.asarray(ids, np.int64), target, other, compare)
    weights = model.weights
    ids = np.asarray(ids, np.int64)[None]                                    # (1, n)
    rows = weights.tok_embed[ids].astype(np.float32)                         # (1, n, d_embed) E[ids]
    if cfg.embed_scale is not None:
        rows *= cfg.embed_scale                                              # e = E[ids]·s
    label = "" if out.target is None else (model.tokenizer.label(out.target) if model.tokenizer else str(out.target))
    result = InputAttribution(list(labels), [int(i) for i in ids[0]], np.zeros(ids.shape[1]), method, out.target,
                              out.other, 0.0, target_label=label, what=what)
    start = None
    if method == "ig":
        start, result.baseline = baseline_rows(model, rows, baseline)    # (1, n, d)
        if keep_first and ids.shape[1] > 1:
            start[:, 0] = rows[:, 0]                                         # the attention sink stays itself
            result.baseline += ", first token kept"
    per = max(1, min(BATCH_TOKENS // ids.shape[1], TAPE_BYTES // per_row))    # rows a pass
    _scores(result, rows, start, int(steps), per, lambda r: _gradient(model, ids, r, out),
            lambda r: _z(model, ids, r, out), tolerance)
    return result


def _attribute_seq2seq(model, source, target, other, method: str, steps: int, baseline: str, keep_first: bool,
                       prefix, compare, tolerance: float | None) -> InputAttribution:
    """`attribute` on an encoder–decoder: the source's and the target prefix's token embeddings both vary
    (IG: on one path; keep_first keeps the decoder's start token itself)."""
    from ..models.seq2seq import DecoderView
    from ..core.seq2seq_backward import backward, taped

    if compare is not None:
        raise QkvError("--compare is for encoders; an encoder–decoder explains a target token: give --token")
    cfg, w = model.config, model.weights
    src = model.encode(source)[0] if isinstance(source, str) else model.check_ids(source)[0][0]
    tgt = np.asarray(DecoderView(model, "" if prefix is None else prefix).target, np.int64)
    model.check_ids(tgt)
    L_dec = cfg.n_decoder_layers or cfg.n_layers
    per_row = 4 * cfg.n_heads * (cfg.n_layers * len(src) ** 2 + L_dec * (len(tgt) ** 2 + len(tgt) * len(src)))
    if per_row > TAPE_BYTES:
        raise QkvError(f"the source and target need {per_row / 2**30:.1f} GiB of attention weights for the backward "
                       "pass; shorten them")
    label = model.tokenizer.label if model.tokenizer else str
    scale = np.float32(cfg.embed_scale or 1.0)
    e_src = np.asarray(w.encoder.tok_embed[src], np.float32)[None] * scale          # (1, n_src, d)
    e_tgt = np.asarray(w.decoder.tok_embed[tgt], np.float32)[None] * scale          # (1, n_tgt, d)
    n_src = e_src.shape[1]

    def run(points: np.ndarray, grad: bool):
        """(∂z/∂points (b, n, d) or None, z (b,)) of points (b, n, d): the source's rows, then the target's."""
        b = points.shape[0]
        s_ids, t_ids = np.broadcast_to(src, (b, len(src))), np.broadcast_to(tgt, (b, len(tgt)))
        m, h, logits, tapes = taped(w, cfg, s_ids, np.ones(s_ids.shape, np.int64), t_ids, points[:, :n_src],
                                    points[:, n_src:])
        z = out.value(h, logits)
        if not grad:
            return None, z
        inputs: dict[str, np.ndarray] = {}
        backward(out.gradient(h, logits)[0], m, h, w, cfg, tapes, inputs)
        return np.concatenate([inputs["source_tokens"], inputs["target_tokens"]], axis=1), z

    out = Output()
    if target is None:
        if other is not None:
            raise QkvError("--other needs --token: give the token whose logit the other is subtracted from")
        logits = model.forward(src[None], decoder_input_ids=tgt[None], attentions=False).logits   # (1, n_tgt, V)
        out.target = int(np.argmax(logits[0, -1]))                        # the model's next target token
    else:
        out.target = token_id(model, target)
    out.other = None if other is None else token_id(model, other)
    if out.other is not None and out.other == out.target:
        raise QkvError("the target and the other token are the same token; give two different tokens")
    rows = np.concatenate([e_src, e_tgt], axis=1)                         # (1, n, d): source, then target
    what = f"logit({label(out.target)})" + ("" if out.other is None else f" − logit({label(out.other)})") + \
        f" after {len(tgt)} target token{'s' if len(tgt) > 1 else ''}"
    labels = [label(int(i)) for i in src] + [label(int(i)) for i in tgt]
    result = InputAttribution(labels, [int(i) for i in src] + [int(i) for i in tgt], np.zeros(rows.shape[1]), method,
                              out.target, out.other, 0.0, target_label=label(out.target), what=what,
                              sides=["source"] * n_src + ["target"] * len(tgt))
    start = None
    if method == "ig":
        if baseline != "zero":
            raise QkvError("an encoder–decoder's integrated gradients start from the zero embedding: leave out "
                           "--baseline")
        start = np.zeros_like(rows)
        result.baseline = "zero"
        if keep_first:
            start[:, n_src] = rows[:, n_src]                               # the decoder's start token stays itself
            result.baseline += ", start token kept"
    per = max(1, min(BATCH_TOKENS // rows.shape[1], TAPE_BYTES // per_row))
    _scores(result, rows, start, steps, per, lambda r: run(r, True), lambda r: run(r, False)[1], tolerance)
    return result


def _scores(result: InputAttribution, rows: np.ndarray, start: np.ndarray | None, steps: int, per: int,
            gradient, value, tolerance: float | None = None) -> None:
    """RESULT's scores and z (and ig's baseline z) from rows (1, n, d) of token embeddings: gradient(points
    (b, n, d)) → (∂z/∂points, z (b,)), value(points) → z (b,). START None: saliency or gradient × input at
    the rows (z from the same pass); else IG from START, STEPS nodes in batches of PER, refined where they
    miss z(e) − z(b) by more than TOLERANCE of it (None: never)."""
    if start is None:
        g, z = gradient(rows)                                                # (1, n, d), (1,)
        g = g[0].astype(np.float64)
        result.logit = float(z[0])
        result.scores = np.linalg.norm(g, axis=-1) if result.method == "saliency" else np.einsum("nd,nd->n", rows[0], g)
        return
    alphas, w = ig_nodes(steps)
    result.scores = w @ node_scores(alphas, rows, start, per, gradient)     # (n,)
    result.logit = float(value(rows)[0])
    result.baseline_logit = float(value(start)[0])
    result.steps = result.requested_steps = steps
    result.tolerance = tolerance
    if tolerance is None or result.completeness <= tolerance:
        return
    first, result.requested_error = result.scores, result.completeness
    gap = result.logit - result.baseline_logit
    result.scores, result.steps = quadrature.refined(rows, start, per, gradient, value, result.baseline_logit,
                                                     result.logit, tolerance * abs(gap))
    if result.completeness >= result.requested_error:                       # no closer: keep what was asked
        result.scores, result.steps = first, steps


def baseline_rows(model: "Model", rows: np.ndarray, baseline: str) -> tuple[np.ndarray, str]:
    """IG's starting point b (1, n, d) and its name: "zero" (the issue's and Captum's default), or "pad" —
    every position the embedding of the pad token (EOS where the model has none), as inseq offers.

    Neither makes the path smooth everywhere. Where positions are added to the tokens (GPT-2, OPT) the
    stream never nears zero and 64 nodes integrate to ~1e-6. Where nothing is added (RoPE, ALiBi) the zero
    path runs the norms on inputs far below their ε, where each block multiplies by ~100 (SmolLM2: z(α·e)
    swings between −2 and 17 for α from 10⁻¹² to 10⁻²); the pad path swings too (z 17 → −3 → 17 around
    α = 0.5, transformers computing the same). What swings is the first position, every later token's
    attention sink: `attribute` keeps it itself along the path by default (keep_first: b₀ = e₀, so its score
    is 0), and SmolLM2's sums then come within 1–13 % of z(e) − z(b) at 64 nodes on some prompts (from 40 %
    to 1200 % with it moving), 63 % on others ("Alice gave the book to"): the other tokens' streams still
    start below ε, and where 64 nodes miss by more than the tolerance `quadrature.refined` finds that start
    (there: 504 nodes, 0.09 %). With the first token moving too, each block's gain compounds: z turns in
    every octave of α down to 10⁻¹⁹ (a random 8-layer Llama), and a refinement may run out of nodes.
    `completeness` says how far the sum is."""
    cfg, weights = model.config, model.weights
    if baseline == "zero":
        return np.zeros_like(rows), "zero"
    eos = cfg.eos_token_id[0] if isinstance(cfg.eos_token_id, list) and cfg.eos_token_id else cfg.eos_token_id
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else eos
    if pad is None or not 0 <= int(pad) < cfg.vocab_size:
        raise QkvError(f"{model.name} names no pad or EOS token for the pad baseline; use --baseline zero")
    row = np.asarray(weights.tok_embed[np.asarray([int(pad)])], np.float32) * np.float32(cfg.embed_scale or 1.0)
    return np.broadcast_to(row[None], rows.shape).copy(), f"pad (token {int(pad)})"


def float_model(model: "Model") -> "Model":
    """The model with float32 arrays where it keeps weights stored (a GGUF's blocks): the backward
    multiplies by Wᵀ, which a stored matrix answers only by dequantising it whole, every time."""
    from ..runtime.stored import StoredMatrix, StoredTable

    leaves = [model.weights.tok_embed, model.weights.W_vocab] + [b.attn.W_Q for b in model.weights.blocks
                                                                  if b.attn is not None]
    if any(isinstance(w, (StoredMatrix, StoredTable)) for w in leaves):
        return model.astype(np.float32)
    return model


def _z(model: "Model", ids: np.ndarray, rows: np.ndarray, out: Output) -> np.ndarray:
    """z (b,) of a pass over ids with token embeddings ROWS (b, n, d)."""
    from ..core.stack import transformer

    batch = np.broadcast_to(ids, (rows.shape[0], ids.shape[1]))
    h, logits = transformer(model.weights, model.config, batch, np.ones(batch.shape, np.int64), tokens=rows,
                            logits="last" if out.compare is None and out.position == -1 else "all")
    return out.value(h, logits)


def _gradient(model: "Model", ids: np.ndarray, rows: np.ndarray, out: Output) -> tuple[np.ndarray, np.ndarray]:
    """(∂z/∂rows (b, n, d), z (b,)) for b rows of token embeddings of the same ids: one forward keeping a tape
    and one backward (qkv.core.backward)."""
    from ..core.backward import backward, taped

    batch = np.broadcast_to(ids, (rows.shape[0], ids.shape[1]))
    h, logits, tape = taped(model.weights, model.config, batch, np.ones(batch.shape, np.int64), tokens=rows)
    z = out.value(h, logits)
    dlogits, dhidden = out.gradient(h, logits)
    inputs: dict[str, np.ndarray] = {}
    backward(dlogits, h, logits, model.weights, model.config, tape, inputs, dhidden=dhidden)
    return inputs["tokens"], z
