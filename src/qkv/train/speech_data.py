"""The speech `qkv train --task speech` learns from: digits spoken by espeak-ng, as sound at 16 kHz.

    utterance i   words: 1–4 of "zero" … "nine"; a voice (an English accent of espeak-ng × a variant: m1, f2, …),
                  a speed (words a minute) and a pitch, each drawn from a generator of (split, i) alone
    speak         espeak-ng -v ACCENT+VARIANT -s SPEED -p PITCH --stdout "three one four" → WAV → mono 16 kHz
    a bank        N utterances spoken once (espeak-ng is the slow part) and kept, as samples and word ids
    a batch       utterances drawn from the bank by (seed, step), each stretched in time by 0.9–1.1 (speed and
                  pitch together), moved later in its window by up to 0.25 s, scaled, and with a little white
                  noise added (the same generator): a resumed run sees the same batches as one never stopped

The voices a model is tested on are not those it learns from: other accents and other variants (HELD_OUT_*). A
missing espeak-ng is one QkvError naming the Debian package. Tests give their own `speak` (synthetic sound made
in NumPy) to the same code.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..inputs.audio import SAMPLE_RATE, to_16k
from ..runtime.errors import QkvError

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
MAX_WORDS = 4                                  # words an utterance says, at most
ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029")          # learned from
VARIANTS = ("", "m1", "m2", "m3", "m6", "m7", "f1", "f2", "f3", "f5", "klatt", "klatt2", "klatt4", "adam",
            "anika", "benjamin", "david", "edward", "linda", "john", "max", "michel", "paul", "iven")   # "": its own
HELD_OUT_ACCENTS = ("en-us-nyc", "en-gb-x-gbclan", "en-gb-x-gbcwmd")          # tested on: never learned from
HELD_OUT_VARIANTS = ("m4", "f4", "m5")
SPEEDS = (130, 190)                            # words a minute (espeak-ng's -s), drawn between
PITCHES = (25, 75)                             # espeak-ng's -p (0–99)
SHIFT_SECONDS = 0.25                           # a batch moves each utterance later by up to this
STRETCH = (0.9, 1.1)                           # … and makes it longer or shorter by a factor between (pitch alike)
TRAIN_SPLIT, TEST_SPLIT = 0, 1                 # the generators' first number: the two sets never share an utterance


@dataclass(frozen=True)
class Utterance:
    """What one utterance says and how: word ids (into WORDS), espeak-ng's voice, speed and pitch."""

    words: tuple[int, ...]
    voice: str
    speed: int
    pitch: int

    @property
    def text(self) -> str:
        return " ".join(WORDS[w] for w in self.words)


def utterance(i: int, held_out: bool = False) -> Utterance:
    """Utterance I of the training set (or of the held-out set: other voices), a function of (set, I) alone."""
    rng = np.random.default_rng([TEST_SPLIT if held_out else TRAIN_SPLIT, i])
    accents, variants = (HELD_OUT_ACCENTS, HELD_OUT_VARIANTS) if held_out else (ACCENTS, VARIANTS)
    words = tuple(int(w) for w in rng.integers(0, len(WORDS), int(rng.integers(1, MAX_WORDS + 1))))
    accent, variant = accents[rng.integers(len(accents))], variants[rng.integers(len(variants))]
    return Utterance(words, accent + (f"+{variant}" if variant else ""), int(rng.integers(*SPEEDS, endpoint=True)),
                     int(rng.integers(*PITCHES, endpoint=True)))


def espeak(u: Utterance) -> np.ndarray:
    """U spoken by espeak-ng → samples (n,) float32, mono at 16 kHz."""
    import soundfile

    program = shutil.which("espeak-ng")
    if program is None:
        raise QkvError("the speech task speaks its data with espeak-ng, which is not installed; run: "
                       "apt-get install espeak-ng")
    done = subprocess.run([program, "-v", u.voice, "-s", str(u.speed), "-p", str(u.pitch), "--stdout", u.text],
                          capture_output=True, timeout=60)
    if done.returncode != 0 or not done.stdout:
        raise QkvError(f"espeak-ng could not speak {u.text!r} with voice {u.voice}: "
                       f"{done.stderr.decode(errors='replace').strip()[:120]}; check its voices (espeak-ng --voices=en)")
    data, rate = soundfile.read(io.BytesIO(done.stdout), dtype="float32", always_2d=True)   # (n_in, channels)
    return to_16k(data, rate, "espeak-ng's sound")


Speaker = Callable[[Utterance], np.ndarray]


@dataclass
class Bank:
    """Utterances spoken once: their samples (one array, cut at `starts`, 16-bit as a WAV file holds them)."""

    samples: np.ndarray              # (Σ n_i,) int16, 16 kHz, every utterance one after the other
    starts: np.ndarray               # (N + 1,) int64: utterance i is samples[starts[i]:starts[i + 1]]
    utterances: list[Utterance]

    def __len__(self) -> int:
        return len(self.utterances)

    def sound(self, i: int) -> np.ndarray:
        """Utterance I's samples (n,) float32 in [−1, 1)."""
        return self.samples[self.starts[i]:self.starts[i + 1]].astype(np.float32) / 32768

    def to_arrays(self) -> dict[str, np.ndarray]:
        """What `from_arrays` reads back (the run keeps its bank in a file: a resume never speaks again)."""
        return {"samples": self.samples, "starts": self.starts}


def speak_bank(count: int, held_out: bool, limit: int, speak: Speaker = espeak,
               arrays: dict[str, np.ndarray] | None = None) -> Bank:
    """Utterances 0 … COUNT − 1 of a set, spoken by SPEAK (or read from ARRAYS, a bank's `to_arrays`), each cut to
    at most LIMIT samples (its window) and rounded to 16 bits (a bank read back equals the one spoken)."""
    utterances = [utterance(i, held_out) for i in range(count)]
    if arrays is not None:
        return Bank(np.asarray(arrays["samples"], np.int16), np.asarray(arrays["starts"], np.int64), utterances)
    sounds = [np.round(np.clip(np.asarray(speak(u), np.float32)[:limit], -1, 32767 / 32768) * 32768).astype(np.int16)
              for u in utterances]
    starts = np.concatenate([[0], np.cumsum([len(s) for s in sounds])]).astype(np.int64)   # (N + 1,)
    return Bank(np.concatenate(sounds), starts, utterances)


def placed(sound: np.ndarray, window: int, rng: np.random.Generator | None) -> np.ndarray:
    """SOUND (n,) in a window of WINDOW samples (n ≤ window): with RNG, moved later by up to SHIFT_SECONDS (as
    much as fits), stretched in time by a factor of STRETCH (as fits: its speed and pitch change together, as
    another speaker's would), scaled by 0.3–1 and with white noise 30–60 dB under its loudest sample; without, as
    it is."""
    out = np.zeros(window, np.float32)                                       # (window,)
    if rng is None:
        out[:len(sound)] = sound
        return out
    factor = min(rng.uniform(*STRETCH), window / len(sound))
    n = min(window, int(len(sound) * factor))
    sound = np.interp(np.linspace(0, len(sound) - 1, n), np.arange(len(sound)), sound)   # (n,) linear
    room = min(window - len(sound), int(SHIFT_SECONDS * SAMPLE_RATE))
    at = int(rng.integers(0, room + 1))
    gain = rng.uniform(0.3, 1.0)
    out[at:at + len(sound)] = sound * gain
    peak = float(np.abs(out).max()) or 1.0
    noise = rng.standard_normal(window) * peak * 10 ** (-rng.uniform(30, 60) / 20)     # (window,)
    return (out + noise).astype(np.float32)
