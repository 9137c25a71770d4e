"""Training a TopK SAE: the steps, the dead-latent counts, checkpoints and resume, in a directory.

    SAE_DIR/qkv.json                  the settings, the activations' source and variance (marks SAE_DIR as a run),
                                      and at the end the last numbers (FVU, L0, dead)
    SAE_DIR/log.jsonl                 one JSON line a step: step, loss, fvu, aux, l0, dead, seconds
    SAE_DIR/checkpoints/step-N.npz    params + AdamW state + tokens since each latent fired + step (the last 2)
    SAE_DIR/cfg.json, sae_weights.safetensors   the SAE in SAELens's layout (saelens.py), at the end

One step (a minibatch x (B, d_in) of activations):

    L, ∂L = loss_and_grads(x; dead latents for AuxK)     sae.py, by hand
    ∂L/∂W_dec: each row's component along W_dec's row removed     project_decoder_grad
    AdamW (qkv.train.optim: β = (0.9, 0.999), ε = 6.25e-10 as OpenAI's code, no weight decay), constant lr
    W_dec's rows back to unit norm                                  normalize_decoder
    tokens since fired: + B for every latent, 0 for those with a non-zero z in the batch

A latent is dead when it has not fired for `dead_tokens` tokens (the paper: 10 M; by default here the
smaller of 10 M and a tenth of the run's tokens). Batches depend only on (seed, step) — the store's
`batches(B, seed, start)` — and a checkpoint holds every array exactly (npz, no pickle), so a run killed at
any moment and started again ends with the same arrays, bit for bit, as one never stopped: the
mechanisms of qkv.train.loop (atomic fsynced checkpoints, the newest two kept, Ctrl-C finishing the step).

A run's files are read as untrusted: qkv.json through runtime.io_json, every key typed and ranged (`read_run`);
a checkpoint's arrays checked for names, shapes, dtypes and finite values (a damaged one is passed over, named
in `Run.skipped`); log.jsonl line by line (a damaged line dropped). Every knob has an upper bound (MAX_*), and
before anything is allocated `check_memory` compares the run's peak (`Settings.memory`) with the memory free.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Callable, Iterator, TextIO

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import FileBatch, open_regular, real_directory, refuse_link, write_text
from ..runtime.io_json import Fields, parse_json
from ..train.loop import (CHECKPOINTS, LOG_FILE, Interrupted, _deferred_interrupt, checkpoint_files,
                          remove_unfinished, write_checkpoint)
from ..train.optim import AdamW
from .sae import SAE, SAEConfig, init_sae, loss_and_grads, normalize_decoder, project_decoder_grad, variance
from .saelens import write_saelens
from .train_settings import ANOTHER_OUT, RUN_FILE, SAMPLE, SavedRun, Settings, read_run

FORMAT = 1
BETAS, EPS = (0.9, 0.999), 6.25e-10

Batches = Callable[[int], Iterator[np.ndarray]]      # start step → the minibatches from that step on


class Trainer:
    """An SAE, its AdamW and its dead-latent counts; `step(x)` takes one optimiser step."""

    def __init__(self, sae: SAE, settings: Settings, variance: float):
        self.sae, self.settings, self.variance = sae, settings.check(), float(variance)
        self.opt = AdamW(sae.params, lr=settings.lr, betas=BETAS, eps=EPS, weight_decay=0.0)
        self.since_fired = np.zeros(sae.config.d_sae, np.int64)         # tokens since each latent last fired
        self.step_count = 0
        self.tokens = 0

    def dead(self) -> np.ndarray:
        """(d_sae,) bool: the latents that have not fired for `settings.window()` tokens."""
        return self.since_fired >= self.settings.window()

    def step(self, x: np.ndarray) -> dict:
        """One step on the minibatch x (B, d_in) float32; returns its log entry."""
        s, sae = self.settings, self.sae
        if x.ndim != 2 or x.shape[1] != sae.config.d_in:
            raise QkvError(f"a batch of activations is {x.shape}, not (B, {sae.config.d_in}); "
                           "give activations of the SAE's width")
        dead = self.dead()
        st = loss_and_grads(sae.params, sae.config, x, variance=self.variance, dead=dead,
                            k_aux=s.aux_k, aux_coef=s.aux_coef)
        if not np.isfinite(st.loss):
            raise QkvError(self._why_not_finite(x, st))
        project_decoder_grad(sae.params["W_dec"], st.grads["W_dec"])
        self.opt.step(st.grads)
        normalize_decoder(sae.params["W_dec"])
        self.since_fired += x.shape[0]
        self.since_fired[st.fired] = 0
        self.step_count += 1
        self.tokens += x.shape[0]
        return {"step": self.step_count, "loss": st.loss, "fvu": st.mse, "aux": st.aux, "l0": st.l0,
                "dead": float(dead.mean())}

    def _why_not_finite(self, x: np.ndarray, st) -> str:
        """Which term of the loss went non-finite at this step, and the fix for that cause."""
        s, at = self.settings, f"at step {self.step_count}"
        if not np.isfinite(x).all():
            bad = int((~np.isfinite(x)).sum())
            return (f"the batch of activations {at} holds {bad:,} NaN or infinite values; the store is damaged: "
                    "remake it (qkv activations with a new --out)")
        if not all(np.isfinite(p).all() for p in self.sae.params.values()):
            return f"the SAE's weights became NaN or infinite {at}; lower --lr (now {s.lr:g})"
        if not np.isfinite(st.mse) and self.step_count == 0:               # no step taken: not the lr
            big = float(np.abs(x).max())
            return (f"the reconstruction error (FVU) is {st.mse} {at}, before any step: the activations (|x| up "
                    f"to {big:.3g}, variance {self.variance:.3g}) are too large for float32 arithmetic; store a "
                    "site whose values are smaller")
        if not np.isfinite(st.mse):
            return f"the reconstruction error (FVU) became {st.mse} {at}; lower --lr (now {s.lr:g})"
        return (f"the AuxK term became {st.aux} {at} (the reconstruction error is {st.mse:.4g}); lower --aux-coef "
                f"(now {s.aux_coef:g}; the paper's is 1/32)")

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything a resume needs, as arrays (copies)."""
        out = {f"param/{k}": v.copy() for k, v in self.sae.params.items()}
        out.update({f"optim/{k}": v for k, v in self.opt.state_dict().items()})
        out["since_fired"] = self.since_fired.copy()
        out["counts"] = np.array([self.step_count, self.tokens], np.int64)
        return out

    def check_arrays(self, arrays: dict[str, np.ndarray]) -> str | None:
        """What is wrong with a checkpoint's ARRAYS for this trainer (a missing name, another shape or dtype,
        a value not finite or out of range), None if nothing."""
        want = {f"param/{k}": (v.shape, v.dtype) for k, v in self.sae.params.items()}
        want["since_fired"] = ((self.sae.config.d_sae,), np.dtype(np.int64))
        want["counts"] = ((2,), np.dtype(np.int64))
        for name, (shape, dtype) in want.items():
            a = arrays.get(name)
            if a is None:
                return f"it has no {name}"
            if a.shape != shape or a.dtype != dtype:
                return f"its {name} is {a.dtype} {a.shape}, not {np.dtype(dtype)} {shape}"
        for name, a in arrays.items():
            if name.startswith(("param/", "optim/m.", "optim/v.")) and not np.isfinite(a).all():
                return f"its {name} holds NaN or infinite values"
        if (arrays["since_fired"] < 0).any() or not 0 <= arrays["counts"][0] <= self.settings.steps \
                or arrays["counts"][1] < 0:
            return "its step or token counts are out of range"
        return None

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        for k, v in self.sae.params.items():
            v[...] = arrays[f"param/{k}"]                                # in place: AdamW holds these
        self.opt.load_state_dict({k[6:]: v for k, v in arrays.items() if k.startswith("optim/")})
        self.since_fired[...] = arrays["since_fired"]
        self.step_count, self.tokens = (int(c) for c in arrays["counts"])


# ── a run in a directory ─────────────────────────────────────────────────────────

class Run:
    """A training run in OUT: fresh (OUT missing or empty) or resumed from its newest checkpoint.

    batches(start): the minibatches from step START on; sample(): activations (N, d_in) for b_dec (their
    geometric median) and the variance; source: what the activations are (model, layer, site, store, d).
    Given settings must equal a resumed run's (else a QkvError naming the first that differs)."""

    def __init__(self, out: str | Path, settings: Settings, *, d_in: int, batches: Batches,
                 sample: Callable[[], np.ndarray], source: dict | None = None):
        self.out, self.settings, self.batches = Path(out), settings.check(), batches
        self.source = dict(source or {})
        self.source["d"] = int(d_in)
        try:
            for folder in (self.out, self.out / CHECKPOINTS):       # never through a link: refused before the work
                refuse_link(folder)
        except OSError as e:
            raise QkvError(f"--out {self.out}: {e.strerror}; give a real folder") from None
        if self.out.exists() and not self.out.is_dir():
            raise QkvError(f"--out {self.out} is a file; give a directory for the SAE")
        saved = read_run(self.out) if self.out.is_dir() else None
        if saved is None and self.out.is_dir() and any(self.out.iterdir()):
            raise QkvError(f"--out {self.out} holds other files, not a qkv SAE run; give a new or empty directory")
        self.resumed_from: Path | None = None
        self.skipped: list[str] = []                                      # damaged checkpoints passed over
        self.seconds = 0.0                                                 # of training, over every session
        cfg = SAEConfig(d_in=int(d_in), d_sae=settings.latents, k=settings.k, model=self.source.get("model"),
                        layer=self.source.get("layer"), site=self.source.get("site"))
        if saved is not None:
            self._agree(saved)
            var = saved.variance
            sae = init_sae(cfg, np.zeros((1, d_in), np.float32), settings.seed, median=False)   # overwritten below
        else:
            x = np.asarray(sample(), dtype=np.float32)
            if x.ndim != 2 or x.shape[1] != d_in or len(x) < 2:
                raise QkvError(f"the sample of activations is {x.shape}, not (N ≥ 2, {d_in})")
            bad = int(x.size - np.isfinite(x).sum())
            if bad:
                raise QkvError(f"the activations hold NaN or infinite values ({bad:,} in a sample of {len(x):,} rows); "
                               "the store is damaged: remake it (qkv activations with a new --out)")
            var = variance(x)
            if not 0 < var < float("inf"):
                raise QkvError(f"the activations' variance is {var:g} (a sample of {len(x):,} rows): "
                               + ("they do not vary, nothing to learn; check the store" if var == 0 else
                                  "too large for float32; store a site whose values are smaller"))
            sae = init_sae(cfg, x, settings.seed)
        self.trainer = Trainer(sae, settings, var)
        try:
            real_directory(self.out, (CHECKPOINTS,))
        except OSError as e:
            raise QkvError(f"cannot write to {self.out}: {e.strerror}; choose a writable directory") from None
        if saved is None:
            write_text(self.out / RUN_FILE, json.dumps(self._meta(), indent=1))
            write_text(self.out / LOG_FILE, "")
        else:
            self._resume()
        self.start_step = self.trainer.step_count
        self.log = read_entries(self.out / LOG_FILE, upto=self.start_step)
        write_text(self.out / LOG_FILE, "".join(json.dumps(e) + "\n" for e in self.log))   # drop steps not saved

    @property
    def sae(self) -> SAE:
        return self.trainer.sae

    def _meta(self, final: dict | None = None) -> dict:
        meta = {"qkv": "sae", "format": FORMAT, "settings": self.settings.to_json(), "source": self.source,
                "variance": self.trainer.variance}
        if final is not None:
            meta["final"] = final
        return meta

    def _agree(self, saved: "SavedRun") -> None:
        for f in fields(Settings):
            if f.name == "checkpoint_every":                          # changes no number: a resume may change it
                continue
            if getattr(saved.settings, f.name) != getattr(self.settings, f.name):
                raise QkvError(f"{self.out} holds an SAE trained with --{f.name.replace('_', '-')} "
                               f"{getattr(saved.settings, f.name)}, not {getattr(self.settings, f.name)}; give the "
                               "same settings to continue it, or another --out")
        if saved.d != self.source["d"]:
            raise QkvError(f"{self.out} holds an SAE of activations of width {saved.d}, these are {self.source['d']} "
                           "wide; give the activations it was trained on, or another --out")

    # checkpoints ------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        return checkpoint_files(self.out)

    def save_checkpoint(self) -> Path:
        """Every array of the trainer + the settings (`train.loop.write_checkpoint`: atomic, the newest KEEP stay)."""
        meta = {"qkv": "sae", "format": FORMAT, "settings": self.settings.to_json(), "seconds": self.seconds}
        return write_checkpoint(self.out, self.trainer.step_count, self.trainer.arrays(), meta)

    def _resume(self) -> None:
        remove_unfinished(self.out)                                      # writes a kill interrupted
        for path in reversed(self.checkpoints()):
            try:
                with open_regular(path) as f, np.load(f, allow_pickle=False) as z:      # a FIFO: refused
                    meta = Fields(parse_json(bytes(z["meta"]), f"{path}'s meta", ANOTHER_OUT), f"{path}'s meta")
                    saved = Settings.from_json(meta.object("settings"))
                    seconds = meta.number("seconds", 0, 1e12, 0.0)
                    arrays = {k: z[k] for k in z.files if k != "meta"}
            except (OSError, ValueError, KeyError, EOFError, QkvError):
                continue                                                 # unreadable (a kill mid-write): the one before
            if replace(saved, checkpoint_every=self.settings.checkpoint_every) != self.settings:
                raise QkvError(f"{path} was written with other settings than {self.out / RUN_FILE}; give another --out")
            wrong = self.trainer.check_arrays(arrays)
            if wrong is None:
                try:
                    self.trainer.load(arrays)
                except QkvError as e:                                    # AdamW's state: another shape or dtype
                    wrong = str(e)
            if wrong is not None:
                self.skipped.append(f"{path.name}: {wrong}")
                continue
            self.seconds = seconds
            self.resumed_from = path
            return
        # no checkpoint: start again from step 0, with the fresh SAE the settings and sample make
        raise _Restart()

    # training ---------------------------------------------------------------

    def train(self, on_step: Callable[[dict], None] = lambda e: None) -> None:
        """The steps left; a checkpoint every N and at the end; Ctrl-C → `Interrupted` after saving."""
        s, t = self.settings, self.trainer
        if t.step_count >= s.steps:
            return
        batches = self.batches(t.step_count)
        with _deferred_interrupt() as interrupted, open(self.out / LOG_FILE, "a", encoding="utf-8") as log:
            while t.step_count < s.steps:
                t0 = time.perf_counter()
                try:
                    x = next(batches)
                except StopIteration:
                    raise QkvError(f"the activations ran out at step {t.step_count} of {s.steps}; give fewer "
                                   "--steps or more activations") from None
                entry = t.step(np.asarray(x, dtype=np.float32))
                self.seconds += time.perf_counter() - t0
                entry["seconds"] = round(self.seconds, 3)
                end_step(self, entry, log, on_step, interrupted)

    def finish(self, final: dict | None = None, **cfg_fields) -> list[Path]:
        """The SAE in SAELens's layout and qkv.json with the last numbers, in one batch of files."""
        with FileBatch(self.out) as batch:
            write_saelens(batch, self.sae, **cfg_fields)
            batch.write_text(RUN_FILE, json.dumps(self._meta(final), indent=1))
        return batch.paths


def end_step(run, entry: dict, log: TextIO, on_step: Callable[[dict], None],
             interrupted: Callable[[], bool]) -> None:
    """The tail of a training step of RUN (an SAE's `Run`, a `TranscoderRun`): ENTRY (its "step": the steps done)
    into run.log and a line of LOG, on_step(ENTRY); a checkpoint every checkpoint_every steps and at the last; after
    a Ctrl-C (`interrupted()`), a checkpoint, then `Interrupted`."""
    step, s = entry["step"], run.settings
    run.log.append(entry)
    log.write(json.dumps(entry) + "\n")
    on_step(entry)
    if step % s.checkpoint_every == 0 or step == s.steps:
        log.flush()
        run.save_checkpoint()
    if interrupted() and step < s.steps:
        log.flush()
        raise Interrupted(step, run.save_checkpoint())


class _Restart(Exception):
    """A run directory without a readable checkpoint: begin it again (raised by Run._resume)."""


def open_run(out: str | Path, settings: Settings, **kwargs) -> Run:
    """`Run(out, settings, ...)`, starting over from step 0 when OUT holds settings but no checkpoint yet."""
    try:
        return Run(out, settings, **kwargs)
    except _Restart:
        out = Path(out)
        for name in (RUN_FILE, LOG_FILE):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)             # none of it readable
        return Run(out, settings, **kwargs)


def read_entries(path: Path, upto: int) -> list[dict]:
    """The entries of a run's log.jsonl for steps 1..UPTO, each a JSON object whose step is a whole number and
    whose numbers are finite; a torn, damaged or deep line is skipped (the log is rewritten from these)."""
    entries: list[dict] = []
    try:
        with open_regular(path) as f:                                   # a FIFO: refused, not waited on
            for line in f:
                try:
                    e = parse_json(line, str(path), "")
                except QkvError:
                    continue
                step = e.get("step")
                numbers = [e.get(k) for k in ("loss", "fvu", "aux", "l0", "dead")]
                if (isinstance(step, int) and not isinstance(step, bool) and 1 <= step <= upto
                        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                for v in numbers)):
                    entries.append(e)
    except OSError:
        return entries
    return entries


def store_batches(acts, batch: int, seed: int, steps: int) -> Batches:
    """Minibatches of BATCH rows from an activation store (qkv.features.activations), as many passes over it
    as STEPS need: step s is always the same batch (the store's batches(B, seed, start=s))."""
    per_epoch = acts.tokens // batch
    if per_epoch < 1:
        raise QkvError(f"the store holds {acts.tokens} activations, fewer than one batch of {batch}; "
                       "give a smaller --batch or store more tokens")
    epochs = -(-steps // per_epoch)
    return lambda start: acts.batches(batch, seed=seed, start=start, epochs=epochs)
