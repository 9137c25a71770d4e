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
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..engine.errors import QkvError
from ..engine.io import FileBatch, real_directory, refuse_link, write_atomic, write_text
from ..train.loop import KEEP, Interrupted, _deferred_interrupt, read_log
from ..train.optim import AdamW, check_lr
from .sae import AUX_COEF, SAE, SAEConfig, init_sae, loss_and_grads, normalize_decoder, project_decoder_grad, variance
from .saelens import write_saelens

RUN_FILE, LOG_FILE, CHECKPOINTS = "qkv.json", "log.jsonl", "checkpoints"
FORMAT = 1
BETAS, EPS = (0.9, 0.999), 6.25e-10
DEAD_TOKENS = 10_000_000                     # the paper's window for a dead latent
SAMPLE = 32768                               # activations read to set b_dec and the variance

Batches = Callable[[int], Iterator[np.ndarray]]      # start step → the minibatches from that step on


@dataclass(frozen=True)
class Settings:
    """Every knob of a training run (`qkv sae train`'s options)."""

    latents: int
    k: int
    steps: int
    batch: int = 4096
    lr: float = 4e-4
    aux_k: int | None = None                 # None: d_in // 2
    aux_coef: float = AUX_COEF
    seed: int = 0
    checkpoint_every: int = 500
    dead_tokens: int | None = None           # None: min(10 M, steps·batch / 10)

    def check(self) -> "Settings":
        for name in ("latents", "k", "steps", "batch", "checkpoint_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise QkvError(f"--{name.replace('_', '-')} must be a whole number ≥ 1, got {v!r}")
        if self.k > self.latents:
            raise QkvError(f"--k {self.k} is more than --latents {self.latents}; give k ≤ latents, e.g. --k 32")
        check_lr(self.lr, "--lr")
        if not (isinstance(self.aux_coef, (int, float)) and 0 <= self.aux_coef < float("inf")):
            raise QkvError(f"--aux-coef must be a number ≥ 0, got {self.aux_coef!r}; give e.g. 0.03125 (1/32)")
        for name in ("aux_k", "dead_tokens"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
                raise QkvError(f"--{name.replace('_', '-')} must be a whole number ≥ 1, got {v!r}")
        if self.seed < 0:
            raise QkvError(f"--seed must be ≥ 0, got {self.seed}")
        return self

    def window(self) -> int:
        """Tokens without a firing after which a latent counts as dead."""
        return self.dead_tokens or max(self.batch, min(DEAD_TOKENS, self.steps * self.batch // 10))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Settings":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


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
            raise QkvError(f"the loss became {st.loss} at step {self.step_count}; lower --lr (now {s.lr:g})")
        project_decoder_grad(sae.params["W_dec"], st.grads["W_dec"])
        self.opt.step(st.grads)
        normalize_decoder(sae.params["W_dec"])
        self.since_fired += x.shape[0]
        self.since_fired[st.fired] = 0
        self.step_count += 1
        self.tokens += x.shape[0]
        return {"step": self.step_count, "loss": st.loss, "fvu": st.mse, "aux": st.aux, "l0": st.l0,
                "dead": float(dead.mean())}

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything a resume needs, as arrays (copies)."""
        out = {f"param/{k}": v.copy() for k, v in self.sae.params.items()}
        out.update({f"optim/{k}": v for k, v in self.opt.state_dict().items()})
        out["since_fired"] = self.since_fired.copy()
        out["counts"] = np.array([self.step_count, self.tokens], np.int64)
        return out

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
        saved = read_json(self.out / RUN_FILE) if self.out.is_dir() else None
        if saved is None and self.out.is_dir() and any(self.out.iterdir()):
            raise QkvError(f"--out {self.out} holds other files, not a qkv SAE run; give a new or empty directory")
        self.resumed_from: Path | None = None
        self.seconds = 0.0                                                 # of training, over every session
        cfg = SAEConfig(d_in=int(d_in), d_sae=settings.latents, k=settings.k, model=self.source.get("model"),
                        layer=self.source.get("layer"), site=self.source.get("site"))
        if saved is not None:
            self._agree(saved)
            var = float(saved["variance"])
            sae = init_sae(cfg, np.zeros((1, d_in), np.float32), settings.seed, median=False)   # overwritten below
        else:
            x = np.asarray(sample(), dtype=np.float32)
            if x.ndim != 2 or x.shape[1] != d_in or len(x) < 2:
                raise QkvError(f"the sample of activations is {x.shape}, not (N ≥ 2, {d_in})")
            sae, var = init_sae(cfg, x, settings.seed), variance(x)
            if not var > 0:
                raise QkvError("the activations do not vary (variance 0): nothing to learn; check the store")
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
        self.log = read_log(self.out / LOG_FILE, upto=self.start_step)
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

    def _agree(self, saved: dict) -> None:
        if saved.get("qkv") != "sae" or "settings" not in saved or "variance" not in saved:
            raise QkvError(f"{self.out / RUN_FILE} is not a qkv SAE run; give another --out")
        old = Settings.from_json(saved["settings"])
        for f in fields(Settings):
            if getattr(old, f.name) != getattr(self.settings, f.name):
                raise QkvError(f"{self.out} holds an SAE trained with --{f.name.replace('_', '-')} "
                               f"{getattr(old, f.name)}, not {getattr(self.settings, f.name)}; give the same "
                               "settings to continue it, or another --out")
        d = saved.get("source", {}).get("d")
        if d != self.source["d"]:
            raise QkvError(f"{self.out} holds an SAE of activations of width {d}, these are {self.source['d']} wide; "
                           "give the activations it was trained on, or another --out")

    # checkpoints ------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        folder = self.out / CHECKPOINTS
        found = folder.glob("step-*.npz") if folder.is_dir() else []
        return sorted((p for p in found if p.stem[5:].isdigit()), key=lambda p: int(p.stem[5:]))

    def save_checkpoint(self) -> Path:
        """Every array of the trainer + the settings, atomically (fsynced); then only the newest KEEP stay."""
        arrays = self.trainer.arrays()
        meta = {"qkv": "sae", "format": FORMAT, "settings": self.settings.to_json(), "seconds": self.seconds}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)
        folder = real_directory(self.out / CHECKPOINTS)
        path = folder / f"step-{self.trainer.step_count:08d}.npz"
        write_atomic(path, lambda f: np.savez(f, **arrays), fsync=True)
        for old in self.checkpoints()[:-KEEP]:
            old.unlink(missing_ok=True)
        return path

    def _resume(self) -> None:
        for folder in (self.out, self.out / CHECKPOINTS):
            for leftover in folder.glob(".*.tmp"):                      # a write a kill interrupted
                leftover.unlink(missing_ok=True)
        for path in reversed(self.checkpoints()):
            try:
                with np.load(path, allow_pickle=False) as z:
                    meta = json.loads(bytes(z["meta"]).decode("utf-8"))
                    arrays = {k: z[k] for k in z.files if k != "meta"}
            except (OSError, ValueError, KeyError, EOFError):
                continue                                                 # unreadable: the one before
            if Settings.from_json(meta["settings"]) != self.settings:
                raise QkvError(f"{path} was written with other settings than {self.out / RUN_FILE}; give another --out")
            self.trainer.load(arrays)
            self.seconds = float(meta.get("seconds", 0.0))
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
                self.log.append(entry)
                log.write(json.dumps(entry) + "\n")
                on_step(entry)
                if t.step_count % s.checkpoint_every == 0 or t.step_count == s.steps:
                    log.flush()
                    self.save_checkpoint()
                if interrupted() and t.step_count < s.steps:
                    log.flush()
                    raise Interrupted(t.step_count, self.save_checkpoint())

    def finish(self, final: dict | None = None, **cfg_fields) -> list[Path]:
        """The SAE in SAELens's layout and qkv.json with the last numbers, in one batch of files."""
        with FileBatch(self.out) as batch:
            write_saelens(batch, self.sae, **cfg_fields)
            batch.write_text(RUN_FILE, json.dumps(self._meta(final), indent=1))
        return batch.paths


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


def read_json(path: Path) -> dict | None:
    """A JSON object from PATH, or None (missing, unreadable, not an object)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def store_batches(acts, batch: int, seed: int, steps: int) -> Batches:
    """Minibatches of BATCH rows from an activation store (qkv.features.activations), as many passes over it
    as STEPS need: step s is always the same batch (the store's batches(B, seed, start=s))."""
    per_epoch = acts.tokens // batch
    if per_epoch < 1:
        raise QkvError(f"the store holds {acts.tokens} activations, fewer than one batch of {batch}; "
                       "give a smaller --batch or store more tokens")
    epochs = -(-steps // per_epoch)
    return lambda start: acts.batches(batch, seed=seed, start=start, epochs=epochs)
