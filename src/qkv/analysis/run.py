"""What each head does, over a few texts or a corpus: `analyse` → `HeadReport`.

    texts or Corpus ─backend (this process | local cores | Ray)─▶ per-text results
        ─Totals (in text order, checkpointed)─▶ means over texts
        + induction scores on repeated random tokens ─▶ roles ─▶ HeadReport
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.threads import blas_one_thread
from . import backends
from .corpus import Corpus
from .detectors import repeated_scores
from .roles import THRESHOLDS, classify
from .seq2seq_heads import Seq2SeqHeadReport, analyse_seq2seq, check_options
from .stats import STATS
from .text import Setup, prepare
from .totals import Failure, Totals

VERSION = 1                     # bump when a definition changes: old checkpoints no longer match
CHECKPOINT_EVERY = 5.0          # seconds between checkpoint writes


@dataclass
class HeadReport:
    """Per-head statistics (L × H, mean over texts), detector scores and roles of one model."""

    model: str
    layers: int
    heads: int
    texts: int
    tokens: int
    windows: int
    stats: dict[str, np.ndarray | None]          # STATS → (L, H), None = not applicable
    detectors: dict[str, np.ndarray | None]      # detectors.DETECTORS → (L, H), None = no evidence
    uniform_entropy: float                       # mean entropy of evenly spread attention, same texts
    roles: list[list[str]]
    not_applicable: dict[str, str] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)

    def to_json(self) -> dict:
        """The JSON object of `qkv heads --json`: every statistic an L × H list of lists (null = n/a)."""
        def grid(a):
            return [[None] * self.heads for _ in range(self.layers)] if a is None else np.asarray(a).tolist()

        return {"model": self.model, "layers": self.layers, "heads": self.heads, "texts": self.texts,
                "stats": {name: grid(self.stats[name]) for name in STATS},
                "roles": self.roles,
                "detectors": {name: grid(v) for name, v in self.detectors.items()},
                "not_applicable": self.not_applicable, "thresholds": THRESHOLDS,
                "uniform_entropy": self.uniform_entropy, "tokens": self.tokens, "windows": self.windows,
                "failed": [asdict(f) for f in self.failures]}


def analyse(model, texts: Iterable[str] | Corpus, *, window: int | None = None, backend: str = "local",
            workers: int | None = None, address: str | None = None, checkpoint: str | Path | None = None,
            progress: Callable[[int], None] | None = None, dtype=np.float32) -> HeadReport | Seq2SeqHeadReport:
    """Analyse every head of `model` over `texts` (a list, or a Corpus streamed from disk).

    model: a source ("minilm", a directory) or a loaded Model (workers load its `source` again).
    backend "local" runs in this process (workers None or 1) or on `workers` processes;
    "ray" on a Ray cluster (address None = a local one) with `workers` actors (None = one
    per CPU of the cluster); each worker loads the model itself from the source.
    checkpoint (corpus runs only): saved every few seconds and when stopped; a rerun with
    the same file continues where it stopped. progress: called with the number of texts done.
    An encoder–decoder gives a Seq2SeqHeadReport: encoder, decoder and cross-attention apart,
    each text translated greedily, in this process (seq2seq_heads.py).
    """
    from ..models.loading import held_as, load

    if backend not in backends.BACKENDS:
        raise QkvError(f"unknown backend {backend!r}; choose one of {', '.join(backends.BACKENDS)}")
    if backend == "ray":
        backends.import_ray()                        # fail before any work when Ray is missing
    loaded = load(model, dtype=dtype) if isinstance(model, str) else model
    if loaded.config.encoder_decoder:                # three kinds of attention, each with its own statistics
        check_options(window, backend, workers, checkpoint)
        return analyse_seq2seq(loaded, texts, progress=progress)
    source = loaded.source                           # None: a model qkv.load did not make (fresh, trained)
    if backend == "ray" or (workers or 1) > 1:
        source = worker_source(source, loaded)
    setup = prepare(loaded, window)
    if isinstance(texts, Corpus):
        jobs = texts.texts
        key = run_key(setup, texts)
    else:
        texts = list(texts)
        jobs = lambda start=0: ((i, None, t) for i, t in enumerate(texts) if i >= start)   # noqa: E731
        key = None
        if checkpoint is not None:
            raise QkvError("--checkpoint needs a corpus file (--file); texts on the command line are not resumable")
    totals = Totals.load(checkpoint, key) if checkpoint is not None else Totals()
    if progress is not None and totals.next_index:
        progress(totals.next_index)
    todo = jobs(totals.next_index)
    spec = backends.WorkerSpec(source, str(held_as(loaded)), setup.window, loaded.arith)
    if backend == "ray":
        results = backends.ray_cluster(spec, todo, workers=workers, address=address)
    elif (workers or 1) > 1:
        results = backends.process_pool(spec, todo, workers)
    else:
        results = backends.in_process(setup, todo)
    _fold(results, totals, checkpoint, key, progress)
    return report(setup, totals)


def _fold(results, totals: Totals, checkpoint, key, progress) -> None:
    """Fold results in text order, saving the checkpoint every few seconds and whatever happens."""
    saved = time.monotonic()
    try:
        for index, result in results:
            done = totals.offer(index, result)
            if progress is not None and done:
                progress(done)
            if checkpoint is not None and time.monotonic() - saved > CHECKPOINT_EVERY:
                totals.save(checkpoint, key)
                saved = time.monotonic()
    finally:
        if hasattr(results, "close"):
            results.close()                          # stop workers before writing
        if checkpoint is not None:
            totals.save(checkpoint, key)


def report(setup: Setup, totals: Totals) -> HeadReport:
    """Means over texts, induction scores and roles, from the folded totals."""
    model = setup.model
    if totals.texts == 0:
        first = f": text {totals.failures[0].index}: {totals.failures[0].error}" if totals.failures else ""
        raise QkvError(f"no text could be analysed{first}; give texts with words in them")
    L, H = model.config.n_layers, model.config.n_heads
    stats = {name: totals.mean(name) for name in STATS}
    uniform = float(totals.mean("uniform_entropy"))
    with blas_one_thread():                 # small products: threads only slow them down
        repeated = repeated_scores(model, setup.template.prefix, setup.template.suffix)
    induction = repeated["induction"]
    detectors = {"previous_token": totals.mean("previous_token"),
                 "duplicate_token": totals.mean("duplicate_token"), **repeated}
    return HeadReport(model=model.name, layers=L, heads=H, texts=totals.texts, tokens=totals.tokens,
                      windows=totals.windows, stats=stats, detectors=detectors, uniform_entropy=uniform,
                      roles=classify(stats, uniform, induction), not_applicable=setup.not_applicable,
                      failures=list(totals.failures))


def worker_source(source: str | None, model) -> str:
    """The source workers load the model from, checked to give this very model (in its arithmetic)."""
    from ..models.loading import held_as, load

    try:
        again = None if source is None else load(source, dtype=held_as(model), arith=model.arith)
        same = again is not None and model_fingerprint(again) == model_fingerprint(model)
    except QkvError:
        same = False
    if not same:
        raise QkvError(f"workers load the model themselves, but {source or model.name!r} does not load this model; "
                       "pass the source ('minilm', a directory) instead of a Model built or changed in memory")
    path = Path(source).expanduser()
    return str(path.resolve()) if path.is_dir() else source      # workers may start in another directory


def run_key(setup: Setup, corpus: Corpus) -> str:
    """What a checkpoint must match to be continued: definitions, corpus, split, model, window."""
    return hashlib.sha256(json.dumps({
        "version": VERSION, "corpus": corpus.sha256, "split": corpus.split, "window": setup.window,
        "model": model_fingerprint(setup.model)}, sort_keys=True).encode()).hexdigest()


def _box_matrix(block, first: bool) -> np.ndarray:
    """The first (W_Q) or last (W_O) matrix of BLOCK's box in attention's place; a layer without attention (Mamba,
    Qwen3-Next's delta, MiniMax's lightning: core/capabilities.py) its own box's first or last array."""
    if block.attn is not None:
        return block.attn.W_Q if first else block.attn.W_O
    box = next(getattr(block, name) for name in ("mixer", "delta", "lightning")
               if getattr(block, name, None) is not None)
    arrays = [v for v in vars(box).values() if len(getattr(v, "shape", ())) == 2]    # arrays or a GGUF's stored
    return arrays[0] if first else arrays[-1]


def model_fingerprint(model) -> str:
    """A hash of the config, float type and a sample of the weights: a changed checkpoint shows."""
    h = hashlib.sha256(repr(model.config).encode() + str(model.dtype).encode())
    w = model.weights
    for array in (w.tok_embed, _box_matrix(w.blocks[0], first=True), _box_matrix(w.blocks[-1], first=False)):
        a = np.asarray(array)
        h.update(a.flat[:4096].tobytes() + a.flat[max(0, a.size - 4096):].tobytes())
    return h.hexdigest()
