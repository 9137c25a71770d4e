"""Causal tracing: where a decoder recalls a fact (Meng et al. 2022, "Locating and Editing Factual
Associations in GPT", the ROME paper's Figure 1).

"The Eiffel Tower is located in the city of" → " Paris". Three runs of the same tokens:

    clean       the text as it is: P(answer) = p_clean
    corrupted   Gaussian noise added to the subject's token embeddings ("The E iffel Tower"), so the
                model no longer knows what the subject is: P(answer) = p_corrupted, averaged over DRAWS
                noise draws (each its own batch row; σ = NOISE × the embedding table's standard deviation)
    restored    a corrupted run in which ONE clean value is put back: block l's output at token t
                ("hidden"), or the FFN outputs ("ffn") or attention outputs ("attn") at token t of a
                window of WINDOW layers around l (l − W/2 .. l + W/2 − 1, cut at the ends, as the paper)

The tables hold P(answer) of each restored run, (L, n) per kind; its indirect effect is
P(restored) − p_corrupted: how much of the fact one clean state brings back. The paper found, on
GPT-2 XL and GPT-J, the FFN's effect peaking in early–middle layers at the subject's last token, and
attention's late at the last token.

Noise enters where the paper adds it: to the token embeddings E[ids]·s before positions are added
(`qkv.core.stack.transformer(tokens=)`). σ is NOISE × the standard deviation of the table's
entries E·s (over up to STD_ROWS evenly spaced rows), where the paper measured the subjects' own
embeddings over its dataset: one number that needs no data beside the model.

Speed: every restored run shares the corrupted run before the first layer it changes, so it starts
from the corrupted residual stream entering that layer (`Model.from_layer`): hidden row l starts at
block l + 1, an FFN or attention window at its first layer; rows starting at the same block run as
one batch (DRAWS rows a restored value, split at patch.MAX_TOKENS). A decoder's tokens before the
subject are the same in all three runs, so restoring them changes nothing: P = p_corrupted exactly,
not run. Block L − 1's output reaches the answer only at the last token, where restoring it gives
the clean logits: that row is p_corrupted, and p_clean at the last token, not run either.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..runtime.errors import QkvError
from .attribution import token_id
from .patch import MAX_TOKENS

if TYPE_CHECKING:
    from ..models.model import Model

KINDS = ("hidden", "ffn", "attn")                 # the three tables, in the paper's order
HOOKED = {"ffn": "ffn_out", "attn": "attn_out"}   # the intermediate a window restores
STD_ROWS = 4096                                   # rows of the embedding table σ is measured on
MAX_DRAWS = 100
MAX_LENGTH = 512                                  # tokens: L·n·3 restored runs, each a pass over n tokens


@dataclass
class CausalTrace:
    """P(answer) with one clean state restored into the corrupted run (see the module)."""

    tables: dict[str, np.ndarray]          # kind → (L, n) P(answer), restored at (layer, token)
    p_clean: float
    p_corrupted: float                     # the mean over the draws
    tokens: list[str]                      # (n,) labels
    subject_span: tuple[int, int]          # the subject's tokens s..e-1
    answer: int
    answer_token: str
    noise: float                           # σ of the noise itself
    noise_scale: float                     # σ ÷ the embeddings' standard deviation (`embedding_std`)
    draws: int
    seed: int | None                       # what drew the noise (None: given by the caller)
    window: int
    text: str = ""
    subject: str = ""
    model: str = ""
    runs: int = 0                          # restored values computed (each in DRAWS batch rows)
    skipped: int = 0                       # restored values known without a pass (see the module)
    passes: int = 0
    seconds: float = 0.0
    p_corrupted_draws: list[float] = field(default_factory=list)

    def effect(self, kind: str) -> np.ndarray:
        """The indirect effect (L, n): P(restored) − p_corrupted."""
        return self.tables[kind] - self.p_corrupted

    def peak(self, kind: str, token: int | None = None) -> tuple[int, int, float]:
        """(layer, token, effect) of KIND's largest indirect effect, over every token or at TOKEN alone."""
        e = self.effect(kind)
        if token is not None:
            layer = int(np.argmax(e[:, token]))
            return layer, token, float(e[layer, token])
        layer, t = np.unravel_index(int(np.argmax(e)), e.shape)
        return int(layer), int(t), float(e[layer, t])

    def as_json(self) -> dict:
        last = self.subject_span[1] - 1
        peaks = {kind: dict(zip(("layer", "token", "effect"), self.peak(kind))) for kind in KINDS}
        at_last = {kind: dict(zip(("layer", "token", "effect"), self.peak(kind, last))) for kind in KINDS}
        return {"model": self.model, "text": self.text, "subject": self.subject,
                "subject_span": list(self.subject_span), "tokens": self.tokens, "answer": self.answer,
                "answer_token": self.answer_token, "p_clean": self.p_clean, "p_corrupted": self.p_corrupted,
                "p_corrupted_draws": self.p_corrupted_draws, "noise": self.noise, "noise_scale": self.noise_scale,
                "draws": self.draws, "seed": self.seed, "window": self.window,
                "tables": {kind: np.round(self.tables[kind], 6).tolist() for kind in KINDS},
                "peaks": peaks, "peaks_at_last_subject_token": at_last,
                "runs": self.runs, "skipped": self.skipped, "passes": self.passes, "seconds": round(self.seconds, 3)}


# ── inputs ───────────────────────────────────────────────────────────────────────

def subject_span(model: "Model", text: str, subject: str) -> tuple[int, int]:
    """The tokens s..e-1 of TEXT that spell SUBJECT (its first occurrence; a token counts when any of its
    characters is the subject's)."""
    if not isinstance(subject, str) or not subject.strip():
        raise QkvError("the subject is empty; give the words of the text that name it, e.g. --subject 'Eiffel Tower'")
    subject = subject.strip()
    start = text.find(subject)
    if start < 0:
        raise QkvError(f"the subject {subject!r} is not in the text {text!r}; give words exactly as the text "
                       "writes them (case matters)")
    end = start + len(subject)
    inside = [i for i, (a, b) in enumerate(model.tokenizer.offsets(text)) if b > a and a < end and b > start]
    return inside[0], inside[-1] + 1


def embedding_std(model: "Model") -> float:
    """The standard deviation of the entries of E·s over up to STD_ROWS evenly spaced rows of the table."""
    V = model.weights.tok_embed.shape[0]
    rows = np.unique(np.linspace(0, V - 1, min(V, STD_ROWS)).astype(np.int64))
    e = np.asarray(model.weights.tok_embed[rows], dtype=np.float64) * float(model.config.embed_scale or 1.0)
    return float(e.std())


def check_traceable(model: "Model") -> None:
    """One clear error unless MODEL is a decoder with an LM head (what P(answer) is read from)."""
    cfg = model.config
    if cfg.encoder_decoder or not cfg.causal or model.weights.W_vocab is None:
        raise QkvError(f"causal tracing reads a decoder's next token; {model.name} is not a decoder with an LM head "
                       "(use one such as --model smollm2 or gpt2)")


# ── the runs ─────────────────────────────────────────────────────────────────────

def _probability(logits: np.ndarray, answer: int) -> np.ndarray:
    """P(answer) (B,) from the last position's logits (B, V), in float64."""
    z = np.asarray(logits, dtype=np.float64)
    top = z.max(axis=-1, keepdims=True)
    return np.exp(z[:, answer] - top[:, 0]) / np.exp(z - top).sum(axis=-1)


def _run(model: "Model", ids: np.ndarray, tokens: np.ndarray):
    """The pass over ids (n,) with token embeddings TOKENS (B, n, d) → (the recorder's store, last logits (B, V))."""
    from ..core.stack import transformer
    from ..core.trace import Recorder

    rec = Recorder(keep=("residual", "attn_out", "ffn_out"))
    batch = np.broadcast_to(ids[None], tokens.shape[:2])
    _, logits = transformer(model.weights, model.config, batch, np.ones(batch.shape, np.int64), rec=rec,
                            tokens=tokens, logits="last")
    return rec.store, logits[:, 0]


def window_of(layer: int, window: int, n_layers: int) -> range:
    """The layers a window of WINDOW around LAYER restores: layer − W/2 .. layer + W/2 − 1 (the paper's),
    cut to 0..L-1."""
    return range(max(0, layer - window // 2), min(n_layers, layer - (-window // 2)))


def trace_fact(model: "Model", text: str, subject: str, answer: str | int | None = None, *, draws: int = 3,
               noise: float = 3.0, window: int = 10, seed: int = 0,
               progress: Callable[[int, int], None] | None = None) -> CausalTrace:
    """Causal tracing of TEXT's next token ANSWER (None: the model's top-1) through SUBJECT, words of TEXT
    (see the module). draws: noise draws averaged; noise: σ in standard deviations of the embeddings
    (`embedding_std`), drawn from numpy's default_rng(SEED); window: layers restored at once in the FFN and
    attention tables; progress(done, total) after each pass."""
    check_traceable(model)
    if model.tokenizer is None:
        raise QkvError(f"{model.name} has no tokenizer.json, so no subject words to find in the text; "
                       "from Python give ids and a token span to trace_tokens")
    if not isinstance(draws, (int, np.integer)) or not 1 <= draws <= MAX_DRAWS:
        raise QkvError(f"--draws must be a whole number from 1 to {MAX_DRAWS}, got {draws!r}")
    if not isinstance(noise, (int, float)) or not math.isfinite(noise) or noise <= 0:
        raise QkvError(f"--noise must be a positive number of standard deviations, got {noise!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise QkvError(f"--seed must be a whole number from 0 to {2**32 - 1}, got {seed!r}")
    ids, _ = model.encode(text)
    s, e = subject_span(model, text, subject)
    sigma = float(noise) * embedding_std(model)
    d = model.weights.tok_embed.shape[1]
    draw = np.random.default_rng(seed).standard_normal((int(draws), e - s, d)) * sigma
    result = trace_tokens(model, ids, (s, e), draw, answer, window=window, progress=progress)
    result.text, result.subject, result.seed = text, subject.strip(), int(seed)
    result.noise, result.noise_scale = sigma, float(noise)
    return result


def trace_tokens(model: "Model", ids, span: tuple[int, int], noise: np.ndarray, answer: str | int | None = None, *,
                 window: int = 10, progress: Callable[[int, int], None] | None = None) -> CausalTrace:
    """Causal tracing over token IDS (n,): NOISE (D, e − s, d_embed) added to the token embeddings E[ids]·s of
    the subject's tokens SPAN = (s, e), one draw a batch row (`trace_fact` makes it from a text)."""
    check_traceable(model)
    if not isinstance(window, (int, np.integer)) or window < 1:
        raise QkvError(f"--window must be a whole number of layers ≥ 1, got {window!r}")
    started = time.perf_counter()
    ids = model.check_ids(ids)[0][0]
    cfg, weights = model.config, model.weights
    L, n = cfg.n_layers, len(ids)
    if n > MAX_LENGTH:
        raise QkvError(f"the text has {n} tokens; causal tracing restores every (layer, token) state, each in a "
                       f"pass over the text, so it takes at most {MAX_LENGTH}: shorten it to the fact's sentence")
    s, e = (int(v) for v in span)
    if not 0 <= s < e <= n:
        raise QkvError(f"the subject's tokens {s}..{e - 1} are not within the {n} tokens")
    noise = np.asarray(noise, dtype=np.float32)
    if noise.ndim != 3 or noise.shape[1:] != (e - s, weights.tok_embed.shape[1]) or not 1 <= len(noise) <= MAX_DRAWS:
        raise QkvError(f"noise must be (draws ≤ {MAX_DRAWS}, {e - s}, {weights.tok_embed.shape[1]}), "
                       f"got {noise.shape}")
    if not np.isfinite(noise).all():                                             # the input's fault, not the weights'
        raise QkvError("noise holds inf or NaN (or values beyond float32); give finite numbers")
    D = len(noise)
    rows = np.asarray(weights.tok_embed[ids], dtype=np.float32)[None]            # (1, n, d_embed) E[ids]
    if cfg.embed_scale is not None:
        rows = rows * np.float32(cfg.embed_scale)                                # e = E[ids]·s
    clean, clean_logits = _run(model, ids, rows)
    answer = int(np.argmax(clean_logits[0])) if answer is None else token_id(model, answer)
    p_clean = float(_probability(clean_logits, answer)[0])
    noisy = np.repeat(rows, D, axis=0)                                           # (D, n, d)
    noisy[:, s:e] += noise
    corrupt, corrupt_logits = _run(model, ids, noisy)
    p_draws = _probability(corrupt_logits, answer)                               # (D,)
    p_corrupted = float(p_draws.mean())

    tables = {kind: np.full((L, n), p_corrupted) for kind in KINDS}
    tables["hidden"][L - 1, n - 1] = p_clean                                     # block L-1's output: the module
    # restored values by the block their run starts at: (kind, layer, token)
    starts: dict[int, list[tuple[str, int, int]]] = {}
    for layer in range(L):
        for t in range(s, n):
            if layer < L - 1:
                starts.setdefault(layer + 1, []).append(("hidden", layer, t))
            for kind in HOOKED:
                starts.setdefault(window_of(layer, window, L)[0], []).append((kind, layer, t))
    total = sum(map(len, starts.values()))
    per_pass = max(1, MAX_TOKENS // (n * D))                                     # restored values a pass
    runs = passes = 0
    for start in sorted(starts):
        todo = starts[start]
        for c in range(0, len(todo), per_pass):
            chunk = todo[c:c + per_pass]
            p = _restored(model, clean, corrupt, start, chunk, window, D, answer)    # (len(chunk),)
            for (kind, layer, t), value in zip(chunk, p):
                tables[kind][layer, t] = value
            runs, passes = runs + len(chunk), passes + 1
            if progress is not None:
                progress(runs, total)
    spell = model.tokenizer.label if model.tokenizer is not None else str
    return CausalTrace(tables=tables, p_clean=p_clean, p_corrupted=p_corrupted, tokens=[spell(int(i)) for i in ids],
                       subject_span=(s, e), answer=answer, answer_token=spell(answer),
                       noise=float(noise.std()), noise_scale=float(noise.std()) / embedding_std(model), draws=D, seed=None, window=int(window),
                       model=model.name, runs=runs, skipped=L * n * len(KINDS) - total, passes=passes,
                       seconds=time.perf_counter() - started, p_corrupted_draws=[float(x) for x in p_draws])


def _restored(model: "Model", clean: dict, corrupt: dict, start: int, chunk: list[tuple[str, int, int]],
              window: int, D: int, answer: int) -> np.ndarray:
    """P(answer) averaged over the D draws (len(chunk),) of the corrupted runs from block START on, each
    restored value of CHUNK in D batch rows of its own."""
    L = model.config.n_layers
    x = np.repeat(corrupt[start]["residual"][None], len(chunk), axis=0)         # (C, D, n, d)
    marks: dict[tuple[str, int], list[tuple[int, int]]] = {}                    # (intermediate, layer) → [(c, t)]
    for c, (kind, layer, t) in enumerate(chunk):
        if kind == "hidden":                                                     # block layer's output = START's input
            x[c, :, t] = clean[start]["residual"][0, t]
        else:
            for j in window_of(layer, window, L):
                marks.setdefault((HOOKED[kind], j), []).append((c, t))
    x = x.reshape(-1, *x.shape[2:])                                              # (C·D, n, d): chunk-major

    def restorer(name: str, j: int):
        cs, ts = (np.asarray(v) for v in zip(*marks[(name, j)]))
        batch_rows = (cs[:, None] * D + np.arange(D)).ravel()                    # each value's D rows
        tokens = np.repeat(ts, D)
        source = clean[j][name][0, ts]                                           # (k, d_model)

        def fn(value: np.ndarray, _layer: int) -> np.ndarray:                    # (C·D, n, d_model)
            value = value.copy()
            value[batch_rows, tokens] = np.repeat(source, D, axis=0)
            return value
        return fn

    hooks = {f"{j}.{name}": restorer(name, j) for name, j in marks}
    _, logits = model.from_layer(x, start, hooks or None)
    return _probability(logits[:, 0], answer).reshape(len(chunk), D).mean(axis=1)
