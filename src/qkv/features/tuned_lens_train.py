"""Training a tuned lens (qkv.analysis.tuned_lens) on a corpus in NumPy, and measuring it on held-out text:
what `qkv tuned-lens train` and `qkv tuned-lens eval` run.

    corpus ─cut_windows (transcoder_train)─▶ windows of ≤ context tokens
           ─step s: rows s·B.. of the windows (Windows.pieces, reshuffled each epoch)─▶ one pass keeping the
            residual stream x (L+1, N, d_model) and the model's final log-probabilities log p (N, V)
           ─per layer l < L: tuned_lens.layer_loss─▶ KL(p ‖ q_l), dA_l, db_l
           ─clip_grad_norm(1.0) → AdamW (train.optim: lr_at's warm-up (a fifth of the run) and cosine; weight decay
            on A only, towards the identity map)─▶ A, b updated in place

As the tuned-lens package trains (Adam lr 1e-3, weight decay 1e-3, clipping at 1, the current token's final
distribution as the target, every position). It lives in features, not analysis: it reads the corpora
(features.corpora) and the trainers' optimiser (train.optim), which come after analysis in the folder order; the
lens itself (load, apply, KL, the gradient) is analysis.tuned_lens.

The run's folder: config.json + params.safetensors (the lens, the package's layout), qkv.json (model, corpus and
its sha256, the settings, the texts the windows came from, the step reached, each layer's KL over the last steps)
and checkpoint.npz (A, b, AdamW's state, the step; no pickle): the same command again continues from it.
Held-out text for eval: the corpus's texts after the last one training read.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import numpy as np

from ..analysis.lens import KEEP
from ..analysis.tuned_lens import (Target, TunedLens, check_fits, check_model, identity_lens, layer_kl, layer_loss,
                                   log_softmax, write_tuned_lens)
from ..runtime import tuning
from ..runtime.errors import QkvError
from ..runtime.io import FileBatch, open_regular, refuse_link
from ..runtime.io_json import Fields, read_json
from ..train.optim import AdamW, clip_grad_norm, lr_at
from .transcoder_train import Windows, cut_windows

if TYPE_CHECKING:
    from ..models.model import Model
    from .corpora import Texts

RUN_FILE, CHECKPOINT = "qkv.json", "checkpoint.npz"
ANOTHER_OUT = "give another --out (or delete the damaged run)"
MAX_TOKENS = 10**10


@dataclass(frozen=True)
class LensSettings:
    """Every knob of a run (`qkv tuned-lens train`'s flags)."""

    steps: int
    batch: int = 512                         # tokens (rows) a step
    context: int = 128                       # tokens a window
    lr: float = 1e-3
    weight_decay: float = 1e-3
    seed: int = 0
    checkpoint_every: int = 25

    def check(self) -> "LensSettings":
        """Every knob in range, or one QkvError naming the flag."""
        for name in ("steps", "batch", "context", "checkpoint_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS:
                raise QkvError(f"--{name.replace('_', '-')} must be a whole number ≥ 1, got {value!r}")
        if not 0 < self.lr <= 1:
            raise QkvError(f"--lr must be in (0, 1], got {self.lr:g}; give e.g. 1e-3")
        if not 0 <= self.weight_decay <= 1:
            raise QkvError(f"--weight-decay must be in [0, 1], got {self.weight_decay:g}; give e.g. 1e-3")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise QkvError(f"--seed must be a whole number in [0, 2³²), got {self.seed!r}")
        return self

    @property
    def warmup(self) -> int:
        return self.steps // 5

    def memory(self, model: "Model") -> int:
        """Peak bytes of a step beside the model: the kept stream (L+1)·N·d (×1.25 for a step's split windows),
        five (N, V) arrays (log p, one layer's logits, log q, dlogits, a temporary), the lens and AdamW's m, v and
        scratch (4·L·d²), in the model's float type."""
        L, d, V = model.config.n_layers, model.config.d_model, model.weights.W_vocab.shape[1]
        item = np.dtype(model.dtype).itemsize
        return item * (int(1.25 * (L + 1) * self.batch * d) + 5 * self.batch * V + 4 * L * (d * d + d))


def check_memory(settings: LensSettings, model: "Model") -> None:
    """Refuse, before allocating, a run whose step needs more than the memory available now."""
    need, free = settings.memory(model), tuning.available_memory()
    if free is not None and need > free:
        raise QkvError(f"a tuned-lens step of {settings.batch:,} tokens on {model.name} needs about "
                       f"{need / 2**30:.1f} GiB, and {free / 2**30:.1f} GiB is available; give a smaller --batch")


# ── the rows ────────────────────────────────────────────────────────────────────

def stream_rows(model: "Model", win: Windows, pieces: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """One pass over the windows of PIECES (right-padded, masked) → (x (L+1, N, d_model): the residual stream after
    0..L blocks, log p (N, V): the model's final log-probabilities), rows lo..hi−1 of each window, in order."""
    from ..core.stack import transformer
    from ..core.trace import Recorder

    lengths = np.array([win.starts[w + 1] - win.starts[w] for w, _, _ in pieces])
    ids = np.zeros((len(pieces), int(lengths.max())), np.int64)                      # (b, n)
    for i, (w, _, _) in enumerate(pieces):
        ids[i, :lengths[i]] = win.ids[win.starts[w]:win.starts[w + 1]]
    mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)     # (b, n)
    rec = Recorder(keep=KEEP)
    _, logits = transformer(model.weights, model.config, ids, mask, rec=rec)          # (b, n, V)
    L, s = model.config.n_layers, win.skip

    def rows(a: np.ndarray) -> np.ndarray:                                            # (b, n, ·) → (N, ·)
        return np.concatenate([a[i, s + lo:s + hi] for i, (_, lo, hi) in enumerate(pieces)])

    x = np.stack([rows(rec.store[l]["residual"]) for l in range(L)] + [rows(rec.store[L - 1]["residual_out"])])
    return x, log_softmax(rows(logits))                                               # (L+1, N, d), (N, V)


def counted(texts: "Texts", start: int, seen: list[int]) -> Iterator[str]:
    """The corpus's texts from START on, SEEN[0] set to one past the index of the last one handed out."""
    for index, _, text in texts.texts(start):
        seen[0] = index + 1
        yield text


# ── the run ─────────────────────────────────────────────────────────────────────

@dataclass
class LensRun:
    """A run in OUT: its settings, lens, optimiser, windows, and where it is."""

    out: Path
    settings: LensSettings
    model: "Model"
    lens: TunedLens
    opt: AdamW
    win: Windows
    record: dict                                 # qkv.json: model, corpus, sha256, texts_read, settings …
    step: int = 0
    resumed: bool = False
    kl: np.ndarray | None = None                 # (L,) each layer's KL over the last logged steps

    def train(self, on_step: Callable[[int, float], None] | None = None) -> None:
        """Steps self.step … steps−1; a checkpoint every checkpoint_every steps and at the end."""
        s, L = self.settings, self.model.config.n_layers
        recent: list[np.ndarray] = []
        t0 = time.perf_counter()
        while self.step < s.steps:
            x, log_p = stream_rows(self.model, self.win, self.win.pieces(self.step, s.batch, s.seed))
            grads = {"A": np.empty_like(self.lens.A), "b": np.empty_like(self.lens.b)}
            losses, target = np.empty(L), Target.of(log_p)
            for l in range(L):
                losses[l], grads["A"][l], grads["b"][l] = layer_loss(self.model, self.lens, l, x[l], target)
            del x, log_p, target
            clip_grad_norm(grads, 1.0)
            self.opt.step(grads, lr=lr_at(self.step, lr=s.lr, warmup=s.warmup, total=s.steps))
            self.step += 1
            recent = (recent + [losses])[-10:]
            self.kl = np.mean(recent, axis=0)
            if self.step % s.checkpoint_every == 0 or self.step == s.steps:
                self.record["seconds"] = round(self.record.get("seconds", 0.0) + time.perf_counter() - t0, 1)
                t0 = time.perf_counter()
                self.save()
            if on_step is not None:
                on_step(self.step, float(losses.mean()))

    def save(self) -> None:
        """checkpoint.npz, qkv.json, config.json and params.safetensors, all or none."""
        self.record["step"] = self.step
        if self.kl is not None:
            self.record["train_kl"] = [round(float(v), 6) for v in self.kl]
        state = {"A": self.lens.A, "b": self.lens.b, **{f"opt.{k}": v for k, v in self.opt.state_dict().items()}}
        with FileBatch(self.out) as batch:
            batch.write(CHECKPOINT, lambda f: np.savez(f, **state))
            batch.write_text(RUN_FILE, json.dumps(self.record, indent=1))
            write_tuned_lens(batch, self.lens)


def open_lens_run(out: str | Path, settings: LensSettings, model: "Model", texts: "Texts") -> LensRun:
    """A fresh run in OUT (new or empty), or the run OUT holds continued (the same model, corpus and settings, or
    one QkvError naming the difference)."""
    check_model(model)
    settings.check()
    check_memory(settings, model)
    out = Path(out)
    record = read_record(out)
    from .corpora import NAMES

    want = {"model": model.name, "corpus": texts.name, "corpus_file": texts.name not in NAMES, "sha256": texts.sha256,
            "settings": asdict(settings)}
    if record is not None:
        for key, value in want.items():
            if record.get(key) != value:
                raise QkvError(f"{out} holds a tuned lens trained with another {key} ({_short(record.get(key))}, "
                               f"not {_short(value)}); give the same settings to continue, or another --out")
    context = min(settings.context, model.config.max_positions)
    seen = [0]
    win = cut_windows(model.tokenizer, counted(texts, 0, seen), context, 0, settings.steps * settings.batch)
    lens = identity_lens(model, model.dtype)
    opt = AdamW({"A": lens.A, "b": lens.b}, lr=settings.lr, weight_decay=settings.weight_decay)
    run = LensRun(out, settings, model, lens, opt, win, {**want, "texts_read": seen[0],
                                                         "tokens_read": int(win.rows.sum())})
    if record is not None:
        _resume(run, record)
    return run


def _short(value) -> str:
    return json.dumps(value)[:80]


def read_record(out: Path) -> dict | None:
    """OUT/qkv.json as a dict (its keys checked where used), None for a new or empty OUT; one QkvError for a file,
    a link, or a folder holding something else."""
    try:
        refuse_link(out)
    except OSError as e:
        raise QkvError(f"--out {out}: {e.strerror}; give a real folder") from None
    if out.exists() and not out.is_dir():
        raise QkvError(f"--out {out} is a file; give a directory for the tuned lens")
    path = out / RUN_FILE
    if not path.is_file():
        if out.is_dir() and any(out.iterdir()):
            raise QkvError(f"--out {out} holds other files, not a qkv tuned-lens run; give a new or empty directory")
        return None
    return read_json(path, fix=ANOTHER_OUT)


def _resume(run: LensRun, record: dict) -> None:
    """Load checkpoint.npz into RUN: A, b, AdamW's state, the step."""
    f = Fields(record, str(run.out / RUN_FILE), ANOTHER_OUT)
    run.step = f.integer("step", 0, run.settings.steps)
    run.record["seconds"] = f.number("seconds", 0, 1e9, 0.0)
    path = run.out / CHECKPOINT
    try:
        with open_regular(path) as fh, np.load(fh, allow_pickle=False) as z:
            A, b = z["A"], z["b"]
            if A.shape != run.lens.A.shape or b.shape != run.lens.b.shape:
                raise QkvError(f"{path} holds a lens of another shape; {ANOTHER_OUT}")
            run.lens.A[...], run.lens.b[...] = A, b
            run.opt.load_state_dict({k[4:]: z[k] for k in z.files if k.startswith("opt.")})
    except (OSError, KeyError, ValueError) as e:
        raise QkvError(f"{path} cannot be read ({e}); {ANOTHER_OUT}") from None
    if int(run.opt.step_count) != run.step:
        raise QkvError(f"{path} is at step {run.opt.step_count}, qkv.json says {run.step}; {ANOTHER_OUT}")
    run.resumed = run.step > 0


# ── held-out KL ─────────────────────────────────────────────────────────────────

def held_out_kl(model: "Model", lens: TunedLens, texts: "Texts", start: int, tokens: int, context: int = 128,
                batch: int = 512) -> dict:
    """Per layer the mean KL(final ‖ lens_l) over TOKENS positions of the texts from START on, for the logit lens
    and the tuned lens: {"logit": [L floats], "tuned": [L], "tokens": N, "from_text": START}. Row L (the model's
    own read-out) is 0 for both and left out."""
    check_model(model)
    check_fits(model, lens)
    if start >= texts.count:
        raise QkvError(f"the corpus {texts.name} has {texts.count} texts and training read them all; give held-out "
                       "text with --file or another --corpus")
    context = min(context, model.config.max_positions)
    win = cut_windows(model.tokenizer, (t for _, _, t in texts.texts(start)), context, 0, tokens)
    n = min(tokens, int(win.rows.sum()))
    sums, done = np.zeros((2, model.config.n_layers)), 0
    steps = -(-n // batch)
    order = np.arange(len(win.rows))                                       # the windows in corpus order
    cum = np.concatenate([[0], np.cumsum(win.rows[order])])
    for step in range(steps):
        lo, hi = step * batch, min(n, (step + 1) * batch)
        pieces = [(int(w), max(lo - int(cum[w]), 0), min(hi - int(cum[w]), int(win.rows[w])))
                  for w in range(len(order)) if cum[w] < hi and cum[w + 1] > lo]
        x, log_p = stream_rows(model, win, pieces)
        rows = len(log_p)
        sums[0] += layer_kl(model, None, x, log_p) * rows
        sums[1] += layer_kl(model, lens, x, log_p) * rows
        done += rows
    return {"logit": (sums[0] / done).tolist(), "tuned": (sums[1] / done).tolist(), "tokens": done,
            "from_text": start, "corpus": texts.name}


def layers_table(report: dict) -> Iterable[str]:
    """Lines of `qkv tuned-lens eval`: layer, KL logit lens, KL tuned lens (nats), their ratio."""
    yield f"{'layer':>5}  {'logit lens KL':>13}  {'tuned lens KL':>13}"
    for l, (a, b) in enumerate(zip(report["logit"], report["tuned"])):
        yield f"{l:>5}  {a:>13.4f}  {b:>13.4f}"
