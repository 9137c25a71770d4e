"""The knobs of a transcoder run (`qkv transcoders train`'s flags), their bounds, the memory they need, and a
run's qkv.json read back: what qkv.features.transcoder_train checks before it allocates or resumes anything (as
train_settings.py for the SAE trainer, whose bounds it shares).

    TranscoderSettings(latents=, k=, steps=, ...).check()    every knob typed and in range
    check_memory(settings, d, layers)                         refused in one line when the peak exceeds the memory free
    read_run(DIR)                                             DIR/qkv.json, every key typed (runtime.io_json)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ..runtime import tuning
from ..runtime.errors import QkvError
from ..runtime.io import refuse_link
from ..runtime.io_json import Fields, read_json
from .sae import AUX_COEF, MAX_LATENTS
from .train_settings import (DEAD_TOKENS, MAX_AUX_COEF, MAX_BATCH, MAX_DEAD_TOKENS, MAX_LR, MAX_SEED, MAX_STEPS,
                             check_lr_and_seed, check_whole_numbers)

RUN_FILE, CHECKPOINTS = "qkv.json", "checkpoints"
FORMAT = 1
ARCHITECTURES = ("topk", "jumprelu")
MAX_CONTEXT = 1 << 16
MAX_KNOB = 1e3                     # l0_coef, bandwidth, threshold: past this nothing trains
ANOTHER_OUT = "give another --out (or delete the damaged run)"


# ── the knobs ───────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class TranscoderSettings:
    """Every knob of a run (`qkv transcoders train`'s flags)."""

    latents: int
    steps: int
    k: int | None = None                     # TopK: latents kept per token
    architecture: str = "topk"
    batch: int = 4096                        # tokens (rows) a step
    lr: float = 4e-4
    aux_k: int | None = None                 # None: d_in // 2
    aux_coef: float = AUX_COEF
    l0_coef: float = 1e-3                    # JumpReLU's λ (loss = FVU + λ·L0)
    bandwidth: float = 1e-3                  # JumpReLU's ε, in units of s_x
    threshold: float = 1e-3                  # JumpReLU's initial θ, in units of s_x
    skip: bool = False                       # a skip transcoder (W_skip, from 0)
    seed: int = 0
    checkpoint_every: int = 100
    dead_tokens: int | None = None           # None: min(10 M, steps·batch / 10)
    context: int = 128
    layers: tuple[int, ...] | None = None    # None: every layer

    def check(self) -> "TranscoderSettings":
        """Every knob typed and in range, or one QkvError naming the flag."""
        if self.architecture not in ARCHITECTURES:
            raise QkvError(f"--architecture {self.architecture!r}: give one of {', '.join(ARCHITECTURES)}")
        if self.architecture == "topk" and self.k is None:
            raise QkvError("a TopK transcoder needs --k, the latents kept per token; give e.g. --k 32")
        ranges = {"latents": MAX_LATENTS, "k": self.latents, "steps": MAX_STEPS, "batch": MAX_BATCH,
                  "checkpoint_every": MAX_STEPS, "aux_k": self.latents, "dead_tokens": MAX_DEAD_TOKENS,
                  "context": MAX_CONTEXT}
        check_whole_numbers(self, {name: (2 if name == "context" else 1, most) for name, most in ranges.items()},
                            optional=("k", "aux_k", "dead_tokens"))
        check_lr_and_seed(self)
        for name, most, low_ok in (("aux_coef", MAX_AUX_COEF, True), ("l0_coef", MAX_KNOB, True),
                                   ("bandwidth", MAX_KNOB, False), ("threshold", MAX_KNOB, False)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
                    not (0 <= v if low_ok else 0 < v) or v > most:
                raise QkvError(f"--{name.replace('_', '-')} must be a number {'from 0' if low_ok else 'above 0'} "
                               f"up to {most:g}, got {v!r}")
        if self.layers is not None and (not self.layers or len(set(self.layers)) != len(self.layers)
                                        or any(isinstance(v, bool) or not isinstance(v, int) or v < 0
                                               for v in self.layers)):
            raise QkvError(f"--layers must be distinct layer numbers ≥ 0, got {self.layers!r}")
        return self

    def window(self) -> int:
        """Tokens without a firing after which a latent counts as dead (as the SAE trainer's)."""
        return self.dead_tokens or max(self.batch, min(DEAD_TOKENS, self.steps * self.batch // 10))

    def memory(self, d: int, n_layers: int) -> int:
        """Peak bytes, float32: per layer the params, AdamW's m, v and scratch (4 × P; checkpoints are written
        from the arrays, not copies); one layer's step at a time (pre-activations, ∂ and the dense JumpReLU
        arrays: 6 × (batch, latents)); the pass's recorded ffn_in and ffn_out for every layer (2 × L × batch × d,
        ×1.25 for the windows' padding and a step's split windows)."""
        params = 2 * d * self.latents + 2 * self.latents + d + (d * d if self.skip else 0)
        return 4 * (4 * params * n_layers + 6 * self.batch * self.latents + int(2.5 * n_layers * self.batch * d))

    def to_json(self) -> dict:
        out = asdict(self)
        out["layers"] = None if self.layers is None else list(self.layers)
        return out

    @classmethod
    def from_json(cls, data: dict, source: str) -> "TranscoderSettings":
        """The settings a run's qkv.json holds, each key typed (`Fields`), then `check`ed."""
        f = Fields(data, source, ANOTHER_OUT)
        got = {"latents": f.integer("latents", 1, MAX_LATENTS), "steps": f.integer("steps", 1, MAX_STEPS),
               "k": f.integer("k", 1, MAX_LATENTS, None), "architecture": f.text("architecture", choices=ARCHITECTURES),
               "batch": f.integer("batch", 1, MAX_BATCH), "lr": f.number("lr", 0, MAX_LR),
               "aux_k": f.integer("aux_k", 1, MAX_LATENTS, None), "aux_coef": f.number("aux_coef", 0, MAX_AUX_COEF),
               "l0_coef": f.number("l0_coef", 0, MAX_KNOB), "bandwidth": f.number("bandwidth", 0, MAX_KNOB),
               "threshold": f.number("threshold", 0, MAX_KNOB), "skip": f.boolean("skip"),
               "seed": f.integer("seed", 0, MAX_SEED), "checkpoint_every": f.integer("checkpoint_every", 1, MAX_STEPS),
               "dead_tokens": f.integer("dead_tokens", 1, MAX_DEAD_TOKENS, None),
               "context": f.integer("context", 2, MAX_CONTEXT)}
        layers = data.get("layers")
        if layers is not None:
            got["layers"] = tuple(f.sub(f"layers[{i}]", {"v": v}).integer("v", 0, 1 << 20)
                                  for i, v in enumerate(f.array("layers", max_len=1 << 16)))
        try:
            return cls(**got).check()
        except QkvError as e:
            raise QkvError(f"{source}: {e}") from None


def check_memory(settings: TranscoderSettings, d: int, n_layers: int) -> None:
    """Refuse, before allocating, a run whose peak exceeds the memory available now, naming what fits."""
    need, free = settings.memory(d, n_layers), tuning.available_memory()
    if free is None or need <= free:
        return
    raise QkvError(f"training {n_layers} transcoders of {settings.latents:,} latents (width {d}) with --batch "
                   f"{settings.batch:,} needs about {need / 2**30:.1f} GiB, and {free / 2**30:.1f} GiB is available; "
                   "give fewer --latents, fewer --layers or a smaller --batch")


def read_run(out: Path) -> dict | None:
    """OUT/qkv.json of a transcoder run, each key typed: {"settings", "source", "layers": {layer: {"variance",
    "scale", "out_scale"}}}; None when OUT holds none. One QkvError for a damaged or foreign one, or OUT not a folder."""
    try:
        refuse_link(out)
        refuse_link(out / CHECKPOINTS)
    except OSError as e:
        raise QkvError(f"--out {out}: {e.strerror}; give a real folder") from None
    if out.exists() and not out.is_dir():
        raise QkvError(f"--out {out} is a file; give a directory for the transcoders")
    path = out / RUN_FILE
    if not (path.exists() or path.is_symlink()):
        if out.is_dir() and any(out.iterdir()):
            raise QkvError(f"--out {out} holds other files, not a qkv transcoder run; give a new or empty directory")
        return None
    meta = Fields(read_json(path, fix=ANOTHER_OUT), str(path), ANOTHER_OUT)
    if meta.text("qkv", None, max_len=64) != "transcoders":
        raise QkvError(f"{path} is not a qkv transcoder run's (its \"qkv\" is not \"transcoders\"); {ANOTHER_OUT}")
    settings = TranscoderSettings.from_json(meta.object("settings").data, str(path))
    src = meta.object("source")
    layers = tuple(src.sub(f"layers[{i}]", {"v": v}).integer("v", 0, 1 << 20)
                   for i, v in enumerate(src.array("layers", max_len=1 << 16)))
    source = {"model": src.text("model"), "corpus": src.text("corpus", ""), "sha256": src.text("sha256", ""),
              "layers": layers, "d": src.integer("d", 1, 1 << 20)}
    per = meta.object("layers")
    numbers = {}
    for layer in layers:
        one = per.object(str(layer))
        numbers[layer] = {k: one.number(k, 1e-300, 1e300) for k in ("variance", "scale")}
        numbers[layer]["out_scale"] = one.number("out_scale", 1e-300, 1e300, 1.0)   # runs before it: 1
    return {"settings": settings, "source": source, "layers": numbers}
