"""The speech `qkv train --task speech` learns from: digits spoken by espeak-ng, as sound at 16 kHz, with the
sample where each word starts.

    utterance i   words: 1–4 of "zero" … "nine"; a voice (an English accent of espeak-ng × a variant: m1, f2, …),
                  a speed (words a minute) and a pitch, each drawn from a generator of (split, i) alone
    speak         libespeak-ng (the library the espeak-ng program runs; its samples equal the program's, which adds
                  only silence at the end) → samples at 22,050 Hz and a word event at each word's first sample →
                  mono 16 kHz, the word starts and the end of the speech in 16 kHz samples
    a bank        N utterances spoken once (espeak-ng is the slow part) and kept, as samples, word boundaries and ids
    a batch       utterances drawn from the bank by (seed, step), each stretched in time by 0.9–1.1 (speed and
                  pitch together), moved later in its window by up to 0.25 s, scaled, and with a little white
                  noise added; then up to two bands of mel bins and two spans of frames hidden (SpecAugment; the same
                  generator): a resumed run sees the same batches as one never stopped

The voices a model is tested on are not those it learns from: other accents and other variants (HELD_OUT_*). A
missing espeak-ng is one QkvError naming the Debian package. Tests give their own `speak` (synthetic sound made
in NumPy) to the same code.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from ..inputs.audio import SAMPLE_RATE, to_16k
from ..runtime.errors import QkvError

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
MAX_WORDS = 4                                  # words an utterance says, at most
ACCENTS = ("en-us", "en", "en-gb-scotland", "en-gb-x-rp", "en-029")          # learned from
VARIANTS = ("", "m1", "m2", "m3", "m6", "m7", "m8", "f1", "f2", "f3", "f5", "klatt", "klatt2", "klatt3", "klatt4",
            "klatt5", "klatt6", "adam", "Alex", "Andy", "Annie", "anika", "aunty", "belinda", "benjamin", "boris",
            "caleb", "david", "Denis", "ed", "edward", "edward2", "Gene", "grandma", "grandpa", "gustave", "Hugo",
            "iven", "iven3", "Jacky", "john", "Lee", "linda", "Marco", "max", "Michael", "michel", "Mike", "norbert",
            "paul", "quincy", "rob", "robert", "sandro", "shelby", "steph", "steph3", "travis", "victor", "zac",
            "whisper")                                                        # "": the accent's own voice
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


class Spoken(NamedTuple):
    """One utterance as sound: SAMPLES (n,) float32 mono at 16 kHz and BOUNDS (k + 1,) int64: the sample where each
    of its k words starts, then where the speech ends."""

    samples: np.ndarray
    bounds: np.ndarray


class _Event(ctypes.Structure):
    """espeak_EVENT (speak_lib.h): what libespeak-ng reports beside the samples."""

    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint), ("text_position", ctypes.c_int),
                ("length", ctypes.c_int), ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", ctypes.c_char * 8)]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))
_SYNCHRONOUS, _RATE, _PITCH, _POS_CHARACTER = 2, 1, 3, 1          # espeak_AUDIO_OUTPUT, espeak_PARAMETER, positions
_LIST_END, _WORD, _END = 0, 1, 5                                  # espeak_EVENT_TYPE


class _Espeak:
    """libespeak-ng, opened once: speaks text into a list of sample chunks and word events (one at a time)."""

    def __init__(self):
        name = ctypes.util.find_library("espeak-ng") or "libespeak-ng.so.1"
        if shutil.which("espeak-ng") is None:
            raise QkvError("the speech task speaks its data with espeak-ng, which is not installed; run: "
                           "apt-get install espeak-ng")
        try:
            self.lib = ctypes.CDLL(name)
        except OSError:
            raise QkvError("the speech task speaks its data with libespeak-ng, which is not installed; run: "
                           "apt-get install espeak-ng") from None
        self.rate = self.lib.espeak_Initialize(_SYNCHRONOUS, 0, None, 0)      # its sample rate (22,050 Hz)
        if self.rate <= 0:
            raise QkvError("libespeak-ng could not start (no voice data?); run: apt-get install espeak-ng-data")
        self.chunks: list[np.ndarray] = []
        self.words: list[int] = []                                            # samples (at self.rate)
        self.end: int | None = None
        self._callback = _CALLBACK(self._heard)                               # kept: the library holds it
        self.lib.espeak_SetSynthCallback(self._callback)

    def _heard(self, wav, n: int, events) -> int:
        if n > 0:
            self.chunks.append(np.ctypeslib.as_array(wav, (n,)).copy())
        i = 0
        while events[i].type != _LIST_END:
            if events[i].type == _WORD and events[i].length > 0:             # (one of length 0 may close)
                self.words.append(events[i].sample)
            elif events[i].type == _END:
                self.end = events[i].sample
            i += 1
        return 0

    def speak(self, u: Utterance) -> tuple[np.ndarray, list[int], int | None]:
        """U's samples (n,) int16 at self.rate, the sample where each word starts, and where the speech ends."""
        if self.lib.espeak_SetVoiceByName(u.voice.encode()) != 0:
            raise QkvError(f"espeak-ng has no voice {u.voice}; check its voices (espeak-ng --voices=en)")
        self.lib.espeak_SetParameter(_RATE, u.speed, 0)
        self.lib.espeak_SetParameter(_PITCH, u.pitch, 0)
        self.chunks, self.words, self.end = [], [], None
        text = u.text.encode()
        self.lib.espeak_Synth(text, len(text) + 1, 0, _POS_CHARACTER, 0, 0, None, None)
        self.lib.espeak_Synchronize()
        samples = np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.int16)
        return samples, list(self.words), self.end


_ENGINE: _Espeak | None = None


def espeak(u: Utterance) -> Spoken:
    """U spoken by espeak-ng: samples (n,) float32 mono at 16 kHz and each word's first sample, then the end."""
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = _Espeak()
    samples, words, end = _ENGINE.speak(u)
    if len(words) != len(u.words):                                           # (never seen: one more try)
        samples, words, end = _ENGINE.speak(u)
    if len(samples) == 0 or len(words) != len(u.words):
        raise QkvError(f"espeak-ng spoke {u.text!r} with voice {u.voice} as {len(words)} words and {len(samples)} "
                       "samples; check its voices (espeak-ng --voices=en)")
    scale = SAMPLE_RATE / _ENGINE.rate
    bounds = np.round(np.array([*words, len(samples) if end is None else end]) * scale).astype(np.int64)
    return Spoken(to_16k(samples.astype(np.float32) / 32768, _ENGINE.rate, "espeak-ng's sound"), bounds)


Speaker = Callable[[Utterance], Spoken]


@dataclass
class Bank:
    """Utterances spoken once: their samples (one array, cut at `starts`, 16-bit as a WAV file holds them) and
    where their words start and end."""

    samples: np.ndarray              # (Σ n_i,) int16, 16 kHz, every utterance one after the other
    starts: np.ndarray               # (N + 1,) int64: utterance i is samples[starts[i]:starts[i + 1]]
    bounds: np.ndarray               # (N, MAX_WORDS + 1) int64: utterance i's `Spoken.bounds`, then −1s
    utterances: list[Utterance]

    def __len__(self) -> int:
        return len(self.utterances)

    def sound(self, i: int) -> np.ndarray:
        """Utterance I's samples (n,) float32 in [−1, 1)."""
        return self.samples[self.starts[i]:self.starts[i + 1]].astype(np.float32) / 32768

    def word_bounds(self, i: int) -> np.ndarray:
        """Utterance I's word boundaries (k + 1,) in samples from its start: each word's start, then the end."""
        b = self.bounds[i]
        return b[b >= 0]

    def to_arrays(self) -> dict[str, np.ndarray]:
        """What `from_arrays` reads back (the run keeps its bank in a file: a resume never speaks again)."""
        return {"samples": self.samples, "starts": self.starts, "bounds": self.bounds}


def speak_bank(count: int, held_out: bool, limit: int, speak: Speaker = espeak,
               arrays: dict[str, np.ndarray] | None = None) -> Bank:
    """Utterances 0 … COUNT − 1 of a set, spoken by SPEAK (or read from ARRAYS, a bank's `to_arrays`), each cut to
    at most LIMIT samples (its window) and rounded to 16 bits (a bank read back equals the one spoken)."""
    utterances = [utterance(i, held_out) for i in range(count)]
    if arrays is not None:
        return Bank(np.asarray(arrays["samples"], np.int16), np.asarray(arrays["starts"], np.int64),
                    np.asarray(arrays["bounds"], np.int64), utterances)
    spoken = [speak(u) for u in utterances]
    sounds = [np.round(np.clip(np.asarray(s.samples, np.float32)[:limit], -1, 32767 / 32768) * 32768).astype(np.int16)
              for s in spoken]
    starts = np.concatenate([[0], np.cumsum([len(s) for s in sounds])]).astype(np.int64)   # (N + 1,)
    bounds = np.full((count, MAX_WORDS + 1), -1, np.int64)                                # (N, MAX_WORDS + 1)
    for i, s in enumerate(spoken):
        bounds[i, :len(s.bounds)] = np.minimum(s.bounds, limit)
    return Bank(np.concatenate(sounds), starts, bounds, utterances)


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
