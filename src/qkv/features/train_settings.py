"""The knobs of an SAE training run (`qkv sae train`'s flags), their bounds, the memory they need, and a run's
qkv.json read back: what qkv.features.train checks before it allocates or resumes anything.

    Settings(latents=, k=, steps=, batch=, ...).check()     every knob typed and in range (MAX_* below)
    Settings.memory(d_in)                                    the run's peak bytes (measured, see there)
    check_memory(settings, d_in)                             refused in one line when that exceeds the memory free
    check_whole_numbers(settings, ranges), check_lr_and_seed(settings)   the knobs an SAE's and transcoders' runs share
    read_run(SAE_DIR)                                        SAE_DIR/qkv.json, every key typed (runtime.io_json)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..runtime import tuning
from ..runtime.errors import QkvError
from ..runtime.io_json import Fields, read_json
from ..train.optim import check_lr
from .sae import AUX_COEF, MAX_D_IN, MAX_LATENTS

RUN_FILE = "qkv.json"
DEAD_TOKENS = 10_000_000                     # the paper's window for a dead latent
SAMPLE = 32768                               # activations read to set b_dec and the variance
MAX_STEPS = 10**8                            # a log line each: 10 GB of log.jsonl at most
MAX_BATCH = 1 << 20                          # rows a step (memory is checked too: `check_memory`)
MAX_DEAD_TOKENS = 10**15
MAX_SEED = 2**63 - 1
MAX_LR, MAX_AUX_COEF = 1.0, 10.0             # AdamW past lr 1 or AuxK past 10 × the MSE only diverges


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
        """Every knob typed and in range (the upper bounds: MAX_* above), or one QkvError naming the flag."""
        ranges = {"latents": MAX_LATENTS, "k": self.latents, "steps": MAX_STEPS, "batch": MAX_BATCH,
                  "checkpoint_every": MAX_STEPS, "aux_k": self.latents, "dead_tokens": MAX_DEAD_TOKENS}
        check_whole_numbers(self, {name: (1, most) for name, most in ranges.items()}, optional=("aux_k", "dead_tokens"))
        check_lr_and_seed(self)
        a = self.aux_coef
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a <= MAX_AUX_COEF:
            raise QkvError(f"--aux-coef must be a number from 0 to {MAX_AUX_COEF:g}, got {a!r}; give e.g. 0.03125 "
                           "(1/32, the paper's), or 0 for no AuxK")
        return self

    def memory(self, d_in: int) -> int:
        """Bytes a run holds at its peak (float32 throughout), as `check_memory` counts them:
            8 × the parameters: the SAE, its gradient, AdamW's m, v and scratch, and a checkpoint's copies of
                the SAE, m and v while it is written (tracemalloc measured 6.5 × for 256 × 65 536)
            10 × (batch, latents): pre-activations, TopK's indices (int64), z, their gradients and the AuxK
                term's own (tracemalloc measured 10.1 for a step of 512 × 65 536 with AuxK)
            the sample that sets b_dec (SAMPLE × d_in, float64, twice)."""
        params = 2 * d_in * self.latents + self.latents + d_in
        return 4 * (8 * params + 10 * self.batch * self.latents) + 16 * SAMPLE * d_in

    def window(self) -> int:
        """Tokens without a firing after which a latent counts as dead."""
        return self.dead_tokens or max(self.batch, min(DEAD_TOKENS, self.steps * self.batch // 10))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict | Fields, source: str = "settings") -> "Settings":
        """The settings a run's qkv.json (or a checkpoint) holds, each key typed (`Fields`), then `check`ed."""
        f = data if isinstance(data, Fields) else Fields(data, source, ANOTHER_OUT)
        whole = {"latents": MAX_LATENTS, "k": MAX_LATENTS, "steps": MAX_STEPS, "batch": MAX_BATCH,
                 "checkpoint_every": MAX_STEPS, "seed": MAX_SEED}
        got = {name: f.integer(name, 0 if name == "seed" else 1, most) for name, most in whole.items()}
        got["aux_k"] = f.integer("aux_k", 1, MAX_LATENTS, None)
        got["dead_tokens"] = f.integer("dead_tokens", 1, MAX_DEAD_TOKENS, None)
        got["lr"] = f.number("lr", 0, MAX_LR)
        got["aux_coef"] = f.number("aux_coef", 0, MAX_AUX_COEF)
        try:
            return cls(**got).check()
        except QkvError as e:
            raise QkvError(f"{f.source}: {e}") from None


ANOTHER_OUT = "give another --out (or delete the damaged run)"


def check_whole_numbers(settings, ranges: dict[str, tuple[int, int]], optional: tuple[str, ...] = ()) -> None:
    """Each knob NAME of SETTINGS (an SAE's or transcoders' run) a whole number in RANGES[NAME] = (low, most), an
    OPTIONAL one None too; else one QkvError naming its flag (--k past --latents says so)."""
    for name, (low, most) in ranges.items():
        v = getattr(settings, name)
        if v is None and name in optional:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not low <= v <= most:
            if name == "k" and isinstance(v, (int, np.integer)) and v > settings.latents >= 1:
                raise QkvError(f"--k {v} is more than --latents {settings.latents}; give k ≤ latents, e.g. --k 32")
            raise QkvError(f"--{name.replace('_', '-')} must be a whole number from {low} to {most:,}, got {v!r}")


def check_lr_and_seed(settings) -> None:
    """SETTINGS.lr a learning rate AdamW does not diverge at (at most MAX_LR) and .seed one numpy takes."""
    check_lr(settings.lr, "--lr")
    if settings.lr > MAX_LR:
        raise QkvError(f"--lr {settings.lr:g} is more than {MAX_LR:g}, where AdamW only diverges; give e.g. 4e-4")
    seed = settings.seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise QkvError(f"--seed must be a whole number from 0 to 2^63 - 1, got {seed!r}")


def check_memory(settings: Settings, d_in: int) -> None:
    """Refuse, before allocating, a run whose peak (`Settings.memory`) exceeds the memory available now,
    naming the sizes that fit."""
    need, free = settings.memory(d_in), tuning.available_memory()
    if free is None or need <= free:
        return
    per_latent = need / settings.latents
    fits = max(0, int(free / per_latent)) if per_latent > 0 else 0
    raise QkvError(f"training {settings.latents:,} latents of width {d_in} with --batch {settings.batch:,} needs "
                   f"about {need / 2**30:.1f} GiB, and {free / 2**30:.1f} GiB of memory is available; give fewer "
                   f"--latents (about {fits:,} fit) or a smaller --batch")


@dataclass(frozen=True)
class SavedRun:
    """What a run's qkv.json says (`read_run`): its settings, the activations' variance and width."""

    settings: Settings
    variance: float
    d: int


def read_run(out: str | Path) -> SavedRun | None:
    """OUT/qkv.json, each key typed and ranged (runtime.io_json; one line naming the file and the key when
    not), or None when OUT holds none (a new run)."""
    path = Path(out) / RUN_FILE
    if not (path.exists() or path.is_symlink()):
        return None
    meta = Fields(read_json(path, fix=ANOTHER_OUT), str(path), ANOTHER_OUT)
    if meta.text("qkv", None, max_len=64) != "sae":
        raise QkvError(f"{path} is not a qkv SAE run's (its \"qkv\" is not \"sae\"); {ANOTHER_OUT}")
    settings = Settings.from_json(meta.object("settings"))
    var = meta.number("variance", 1e-300, 1e300)
    d = meta.object("source").integer("d", 1, MAX_D_IN)
    return SavedRun(settings, var, d)
