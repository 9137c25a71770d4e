"""A training run in a directory: its state, its steps, its checkpoints, and resuming it.

    DIR/run.json              the settings (marks DIR as a qkv training run)
    DIR/log.jsonl             one JSON line a step: step, loss, lr, grad_norm, tokens_per_s, seconds (of
                              training so far), and the task's records every K steps (step 0: before training)
    DIR/checkpoints/step-N.npz  params + AdamW state + step + settings, the last KEEP of them
    DIR/model/                the trained model (config.json, model.safetensors, tokenizer.json), at the end
    DIR/loss.png, DIR/induction.png, DIR/before.html, DIR/after.html (the viewer on held-out ids)
    DIR/tokenizer.json        text runs: the tokenizer made from the text, read again on a resume

One step: ids = batch(seed, step); loss, grads = loss_and_grads(weights, ids); clip the global
norm; AdamW with the scheduled lr. Batches depend only on (seed, step) and a checkpoint holds
params and optimiser state exactly (float32 bits, npz without pickle), so a run killed at any
moment (kill -9) and started again ends with the same weights, bit for bit, as one never
stopped. Every file is written atomically; Ctrl-C finishes the step, saves a checkpoint and
stops (`Interrupted`); the model is written only at the end.

The checkpoints' files are shared with features/ (an SAE's and transcoders' runs):
    write_checkpoint(out, step, arrays, meta) → Path   OUT/checkpoints/step-N.npz atomically, the newest KEEP kept
    checkpoint_files(out)                     → [Path] oldest first
    remove_unfinished(out)                    the .tmp files of writes a kill interrupted
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..core.context import NotFinite
from ..runtime.errors import QkvError
from ..runtime.io import real_directory, refuse_link, write_atomic, write_text
from .tasks import Settings, file_sha256, make_task, read_json, settings_for

RUN_FILE = "run.json"
LOG_FILE = "log.jsonl"
CHECKPOINTS = "checkpoints"
MODEL = "model"                              # the trained model, a checkpoint folder
KEEP = 2                                     # checkpoints kept (the newest)
BETAS, EPS = (0.9, 0.95), 1e-8
FORMAT = 1                                   # of run.json and the checkpoints
FIGURE_EVERY = 30.0                          # seconds: at a checkpoint, the figures are redrawn at most this often


class Interrupted(Exception):
    """Ctrl-C during training: the step in progress was finished and saved as `checkpoint`."""

    def __init__(self, step: int, checkpoint: Path):
        super().__init__(f"interrupted at step {step}")
        self.step, self.checkpoint = step, checkpoint


# ── opening a run: fresh, or resumed from DIR ──────────────────────────────────────

def open_run(out: str | os.PathLike, task: str | None, given: dict) -> "Run":
    """The run in OUT: a new one (OUT missing or empty) or the one OUT holds, resumed from its last
    checkpoint. GIVEN: the options the user gave (name → value); on a resume each must equal the
    saved setting, and the rest are taken from it. Bad input raises QkvError before OUT is touched."""
    out = Path(out)
    try:
        refuse_link(out)                                  # the run's folders: never through a link
        for sub in (CHECKPOINTS, MODEL):
            refuse_link(out / sub)
    except OSError as e:
        raise QkvError(f"--out {out}: {e.strerror}; give a real folder") from None
    if out.exists() and not out.is_dir():
        raise QkvError(f"--out {out} is a file; give a directory for the run")
    saved = read_json(out / RUN_FILE) if out.is_dir() else None
    if saved is None and out.is_dir() and any(out.iterdir()):
        raise QkvError(f"--out {out} holds other files, not a qkv training run; give a new or empty directory")
    if saved is not None:
        settings = _agreed(Settings.from_json(saved.get("settings", {})), task, given, out)
        return Run(out, settings, fresh=False)
    if task == "text":
        given = {**given, "text_sha256": _text_sha(given.get("text"))}
    settings = settings_for(task or "induction", given)
    existed = out.exists()
    try:
        return Run(out, settings, fresh=True)
    except BaseException:                        # a run that never started leaves nothing behind
        if existed:
            for p in out.iterdir():
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        else:
            shutil.rmtree(out, ignore_errors=True)
        raise


def _text_sha(path: str | None) -> str:
    """The SHA-256 of a text to learn, after checking it is a readable, non-empty UTF-8 file."""
    from .data import read_text

    if path is None:
        raise QkvError("give --text FILE (a UTF-8 text to learn) or --task induction")
    if not read_text(path).strip():
        raise QkvError(f"{path} is empty; give a text to learn from")
    return file_sha256(path)


def _agreed(saved: Settings, task: str | None, given: dict, out: Path) -> Settings:
    """The saved settings, if every GIVEN option agrees with them; else a QkvError naming the first."""
    if task is not None and task != saved.task:
        raise QkvError(f"{out} holds a run of --task {saved.task}, not {task}; give another --out or the same task")
    for name, value in given.items():
        if name == "text":
            if _text_sha(value) != saved.text_sha256:
                raise QkvError(f"{value} is not the text the run in {out} began with; give another --out")
            saved = replace(saved, text=value)                              # the same bytes, maybe moved
            continue
        if getattr(saved, name) != value:
            raise QkvError(f"{out} holds a run with --{name.replace('_', '-')} {getattr(saved, name)}, not {value}; "
                           "give the same settings to continue it, or another --out")
    if saved.task == "text" and given.get("text") is None and _text_sha(saved.text) != saved.text_sha256:
        raise QkvError(f"{saved.text} has changed since the run in {out} began; restore it or give another --out")
    return saved.check()


# ── the run ──────────────────────────────────────────────────────────────────────

class Run:
    """Settings, task, params (checkpoint name → float32 array, updated in place), AdamW, step."""

    def __init__(self, out: Path, settings: Settings, *, fresh: bool):
        from ..checkpoints.families import family_of, weights_from_tensors
        from ..models.fresh import init
        from .optim import AdamW

        self.out, self.settings = out, settings
        try:
            real_directory(out, (CHECKPOINTS, MODEL))
        except OSError as e:
            raise QkvError(f"cannot write to --out {out}: {e.strerror}; choose a writable folder") from None
        self.task = make_task(settings, out)
        self.config = self.task.config
        start = init(self.config, seed=settings.seed)                      # step 0, also for "before"
        tensors = family_of(self.config.family).tensors(start.weights, self.config)
        if hasattr(self.task, "initial"):                                   # a task's own start (speech: Whisper's
            tensors = self.task.initial(tensors)                            # sinusoidal encoder positions)
        self.params = {k: np.array(v, dtype=np.float32) for k, v in tensors.items()}   # owned, C order
        self.weights = weights_from_tensors(self.params, self.config)        # views into self.params
        s = settings
        self.opt = AdamW(self.params, lr=s.lr, betas=BETAS, eps=EPS, weight_decay=s.weight_decay)  # no decay: 1-D
        self.step = 0
        self.seconds = 0.0                                                  # of training, over every session
        self.resumed_from: Path | None = None
        if fresh:
            write_text(out / RUN_FILE, json.dumps({"qkv": "train", "format": FORMAT, "settings": s.to_json()},
                                                  indent=1))
            write_text(out / LOG_FILE, "")
            self._viewer(self.model(), "before.html", "before training")
        else:
            self._resume()
        self.start_step = self.step                                         # where this session began
        self.log = read_log(out / LOG_FILE, upto=self.step)
        write_text(out / LOG_FILE, "".join(json.dumps(e) + "\n" for e in self.log))   # drop steps not saved

    def n_params(self) -> int:
        return sum(v.size for v in self.params.values())

    def model(self):
        """The model of the current weights (a copy in the inference layout: training goes on)."""
        from ..models.model import Model
        from ..models.seq2seq import Seq2SeqModel

        name = f"{self.settings.task} step {self.step}"
        if self.config.image_size is not None:                              # digits: a ViT, its images' processing
            from ..models.image_model import ImageModel

            return ImageModel(self.config, self.weights, None, name, self.task.processing, self.task.labels)
        kind = Seq2SeqModel if self.config.encoder_decoder else Model
        return kind(self.config, self.weights, self.task.tokenizer, name=name)

    # checkpoints ------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        """The checkpoints in DIR, oldest first."""
        return checkpoint_files(self.out)

    def save_checkpoint(self) -> Path:
        """params + optimiser state + step + settings, atomically; then only the newest KEEP are kept."""
        arrays, scalars = _flatten(self.opt.state_dict(), "optim")
        meta = {"qkv": "train", "format": FORMAT, "step": self.step, "settings": self.settings.to_json(),
                "optim": scalars, "seconds": self.seconds}
        arrays.update({f"param/{k}": v for k, v in self.params.items()})
        return write_checkpoint(self.out, self.step, arrays, meta)

    def _resume(self) -> None:
        """Load the newest readable checkpoint (none: start again from step 0), after removing the
        temporary files of a write a kill interrupted (qkv.runtime.io names them .NAME.*.tmp)."""
        remove_unfinished(self.out)
        for path in reversed(self.checkpoints()):
            try:
                with np.load(path, allow_pickle=False) as z:
                    meta = json.loads(bytes(z["meta"]).decode("utf-8"))
                    arrays = {k: z[k] for k in z.files if k != "meta"}
            except (OSError, ValueError, KeyError, EOFError):
                continue                                                    # unreadable: try the one before
            if replace(Settings.from_json(meta["settings"]), text=None) != replace(self.settings, text=None):
                raise QkvError(f"{path} was written with other settings than {self.out / RUN_FILE}; "
                               "give another --out")
            for k, v in self.params.items():
                v[...] = arrays[f"param/{k}"]                               # in place: the weights are views
            self.opt.load_state_dict(_unflatten(arrays, meta["optim"]))
            self.step, self.resumed_from = int(meta["step"]), path
            self.seconds = float(meta.get("seconds", 0.0))
            self._reread()
            return

    def _reread(self) -> None:
        """Read the weights from the params again where the family's table copies a tensor rather than viewing it
        (Whisper's convolutions, transposed into one product): the copies follow the params' in-place updates."""
        if self.config.audio_mels is not None:
            from ..checkpoints.families import weights_from_tensors

            self.weights = weights_from_tensors(self.params, self.config)

    # training ---------------------------------------------------------------

    def train(self, on_step: Callable[[dict], None] = lambda e: None,
              on_record: Callable[[dict], None] = lambda e: None) -> None:
        """Take the steps left, recording every K and saving every N; Ctrl-C → `Interrupted`."""
        from .gradients import grads_by_name
        from .optim import clip_grad_norm, lr_at

        s, cfg = self.settings, self.config
        if self.step == 0 and not self.log:
            self._record({"step": 0}, on_record)
        drawn = time.monotonic()
        # overflow is checked where it matters (the losses, below), as one line: no NumPy warnings before it
        with _deferred_interrupt() as interrupted, np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            while self.step < s.steps:
                t0 = time.perf_counter()
                batch = self.task.batch(self.step)                          # a function of (seed, step)
                loss, tree = self.task.loss_and_grads(self.weights, batch)
                if not np.isfinite(loss):
                    raise QkvError(f"the loss became {loss} at step {self.step}; lower --lr (now {s.lr:g})")
                grads = grads_by_name(tree, cfg)
                for name in sorted(self.params.keys() - grads.keys()):      # buffers (final_logits_bias): never move,
                    grads[name] = np.zeros_like(self.params[name])          # nor decay (they are (1, V): 2-D)
                    self.opt.decay[name] = False
                norm = clip_grad_norm(grads, s.clip)
                lr = lr_at(self.step, lr=s.lr, warmup=s.warmup, total=s.steps, min_lr=s.min_lr)
                self.opt.step(grads, lr=lr)
                self._reread()
                self.step += 1
                took = time.perf_counter() - t0
                self.seconds += took
                entry = {"step": self.step, "loss": float(loss), "lr": float(lr), "grad_norm": float(norm),
                         "tokens_per_s": round(self.task.tokens(batch) / took, 1), "seconds": round(self.seconds, 3)}
                if self.step % s.every == 0 or self.step == s.steps:
                    self._record(entry, on_record)
                else:
                    self._append(entry)
                on_step(entry)
                if self.step % s.checkpoint_every == 0 or self.step == s.steps:
                    self.save_checkpoint()
                    if time.monotonic() - drawn > FIGURE_EVERY and self.step < s.steps:
                        self.write_figures()                                # to watch a long run; finish() draws the last
                        drawn = time.monotonic()
                if interrupted() and self.step < s.steps:
                    raise Interrupted(self.step, self.save_checkpoint())

    def _record(self, entry: dict, on_record: Callable[[dict], None]) -> None:
        try:
            measured = self.task.record(self.model())
        except NotFinite as e:                                      # the model's own pass overflowed (core.blocks)
            raise QkvError(f"the model's weights overflowed by step {self.step} ({str(e).split(':')[0]}); "
                           f"lower --lr (now {self.settings.lr:g})") from None
        bad = [k for k, v in measured.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:                                                     # never a NaN in log.jsonl (invalid JSON)
            raise QkvError(f"the {bad[0].replace('_', ' ')} became {measured[bad[0]]} at step {self.step}; "
                           f"lower --lr (now {self.settings.lr:g})")
        entry.update(measured)
        self._append(entry)
        on_record(entry)

    def _append(self, entry: dict) -> None:
        self.log.append(entry)
        with open(self.out / LOG_FILE, "a", encoding="utf-8") as f:   # a log: a torn last line is dropped on resume
            f.write(json.dumps(entry) + "\n")

    # the end ----------------------------------------------------------------

    def finish(self) -> list[Path]:
        """The trained model (DIR/model, all files or none), the figures and the viewer after training;
        the files of the run a user opens, in order: also the viewer before training, written at the start."""
        model = self.model()
        model.name = f"{self.settings.task} ({self.step} steps)"
        written = [model.save(self.out / MODEL)]                       # all files or none (FileBatch)
        written += self.write_figures()
        if hasattr(self.task, "finish"):
            written += self.task.finish(self.out)                      # the task's own files (digits: examples)
        before = self.out / "before.html"
        written.append(before if before.is_file() and hasattr(self.task, "viewer_ids") else None)
        written.append(self._viewer(model, "after.html", f"after {self.step} steps"))
        return [w for w in written if w is not None]

    def write_figures(self) -> list[Path]:
        """DIR/loss.png, and for the induction task DIR/induction.png, from the log."""
        from ..viz.drawing import save_figure
        from ..viz.training import induction_figure, loss_figure

        s, log = self.settings, self.log
        steps = [e for e in log if "loss" in e]
        val = [e for e in log if "val_loss" in e]
        c = self.config
        title = (f"qkv train {s.task}: {'attention-only ' if c.d_ff == 0 else ''}{c.family}, {c.n_layers} layers "
                 f"× {c.n_heads} heads, d_model {c.d_model}")
        fig = loss_figure([e["step"] for e in steps], [e["loss"] for e in steps], [e["lr"] for e in steps],
                          title=title, val=([e["step"] for e in val], [e["val_loss"] for e in val]) if val else None)
        written = save_figure(fig, self.out, "loss", formats=("png",))
        rec = [e for e in log if "induction" in e]
        if rec:
            fig = induction_figure([e["step"] for e in rec], [e["loss_repeated"] for e in rec],
                                   [e["loss_first"] for e in rec], np.array([e["induction"] for e in rec]),
                                   title=title, vocab=s.vocab - 1)
            written += save_figure(fig, self.out, "induction", formats=("png",))
        return written

    def _viewer(self, model, name: str, when: str) -> Path | None:
        from ..viz.html import save_viewer

        if not hasattr(self.task, "viewer_ids"):
            return None
        trace = model.run(self.task.viewer_ids(), keep=("attentions",))
        return save_viewer(trace, self.out / name, title=f"qkv train {self.settings.task}: {when}")


def read_log(path: Path, upto: int | None = None) -> list[dict]:
    """The entries of a log.jsonl (a torn or broken line is skipped), those of steps ≤ UPTO."""
    entries = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return entries
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and isinstance(e.get("step"), int) and (upto is None or e["step"] <= upto):
            entries.append(e)
    return entries


def checkpoint_files(out: Path) -> list[Path]:
    """OUT/checkpoints/step-NNNNNNNN.npz, oldest first (the training loops' checkpoints: this one's, an SAE's,
    transcoders')."""
    folder = out / CHECKPOINTS
    found = folder.glob("step-*.npz") if folder.is_dir() else []
    return sorted((p for p in found if p.stem[5:].isdigit()), key=lambda p: int(p.stem[5:]))


def remove_unfinished(out: Path) -> None:
    """Remove the temporary files of writes a kill interrupted (qkv.runtime.io names them .NAME.*.tmp) from OUT
    and OUT/checkpoints."""
    for folder in (out, out / CHECKPOINTS):
        for leftover in folder.glob(".*.tmp"):
            leftover.unlink(missing_ok=True)


def write_checkpoint(out: Path, step: int, arrays: dict[str, np.ndarray], meta: dict) -> Path:
    """ARRAYS and META (JSON, as the bytes of the array "meta") to OUT/checkpoints/step-NNNNNNNN.npz, atomically
    and fsynced (a kill leaves the one before whole); then only the newest KEEP stay."""
    arrays = {**arrays, "meta": np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)}
    path = real_directory(out / CHECKPOINTS) / f"step-{step:08d}.npz"
    write_atomic(path, lambda f: np.savez(f, **arrays), fsync=True)
    for old in checkpoint_files(out)[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


@contextmanager
def _deferred_interrupt() -> Iterator[Callable[[], bool]]:
    """Inside: the first Ctrl-C is only noted (the step in progress finishes, then the loop saves and
    stops); a second one interrupts at once. Yields `interrupted()`. Outside the main thread: no-op."""
    hits = []

    def handler(signum, frame):
        hits.append(signum)
        if len(hits) > 1:
            raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:                                                   # not the main thread
        yield lambda: False
        return
    try:
        yield lambda: bool(hits)
    finally:
        signal.signal(signal.SIGINT, previous)


def _flatten(obj, prefix: str) -> tuple[dict[str, np.ndarray], object]:
    """A state dict → (arrays by path, the rest as JSON with {"@array": path} in the arrays' places)."""
    arrays: dict[str, np.ndarray] = {}

    def walk(x, path: str):
        if isinstance(x, np.ndarray):
            arrays[path] = x
            return {"@array": path}
        if isinstance(x, dict):
            return {str(k): walk(v, f"{path}/{k}") for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v, f"{path}/{i}") for i, v in enumerate(x)]
        if isinstance(x, np.generic):
            return x.item()
        return x

    return arrays, walk(obj, prefix)


def _unflatten(arrays: dict[str, np.ndarray], scalars):
    """The inverse of `_flatten`."""
    if isinstance(scalars, dict):
        if set(scalars) == {"@array"}:
            return arrays[scalars["@array"]]
        return {k: _unflatten(arrays, v) for k, v in scalars.items()}
    if isinstance(scalars, list):
        return [_unflatten(arrays, v) for v in scalars]
    return scalars
