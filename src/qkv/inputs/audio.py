"""Sound in, for Whisper: read a sound file, make it mono at 16 kHz, and turn it into log-mel features.

    file ─read_sound─▶ samples (n_in, channels) at its own rate ─mean of channels─▶ mono
         ─soxr "HQ" (librosa.load(path, sr=16000)'s default)─▶ (n,) float32 at 16 kHz
    (n,) ─log_mel─▶ (mels, frames): as transformers' WhisperFeatureExtractor makes them
        pad with silence to 30 s (480,000 samples) when shorter; a longer sound keeps every sample
        STFT: Hann window of n_fft = 400 samples (25 ms), hop 160 (10 ms), the signal reflected by 200 at
        each end, |FFT|² → (frames + 1, 201); the last frame dropped
        mel: the Slaney-style triangular filters (0 – 8 kHz, area-normalised) → (mels, frames)
        log10(max(mel, 1e-10)), floored at (its maximum − 8), then (x + 4) / 4
    (mels, frames) ─windows─▶ (W, mels, 3000): consecutive 30 s windows, the last padded with zeros, as
        Whisper's long-form generate pads the window it reads

Every sound is checked here, once, before it is decoded where that is possible: a regular file (a FIFO, a device,
a directory, or a link to one is refused without waiting), a format libsndfile reads (WAV, FLAC, OGG, …), at most
MAX_SECONDS long (from its header), at least one sample, and only finite samples. Each problem is one QkvError
that names it and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import open_regular

SAMPLE_RATE = 16_000             # what every Whisper reads
N_FFT = 400                      # 25 ms at 16 kHz
HOP = 160                        # 10 ms: one log-mel frame
CHUNK_SECONDS = 30               # one window of the encoder: 3000 frames
WINDOW_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE                      # 480,000
WINDOW_FRAMES = WINDOW_SAMPLES // HOP                             # 3,000
MAX_SECONDS = 2 * 3600           # a longer sound is refused from its header (2 h: 720,000 frames of features)
RESAMPLE_QUALITY = "HQ"          # soxr's "HQ", what librosa.load(path, sr=16000) uses (res_type "soxr_hq")
STFT_BLOCK = 8192                # frames transformed at once (bounds the memory of a long sound)


@dataclass
class Sound:
    """A sound as Whisper hears it: mono samples at 16 kHz, and what the file held."""

    samples: np.ndarray          # (n,) float32 in [-1, 1], 16 kHz, the mean of the file's channels
    source_rate: int             # the file's sample rate (Hz)
    channels: int                # the file's channel count
    path: str | None = None

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def read_sound(path: str | os.PathLike) -> Sound:
    """A sound file (WAV, FLAC, OGG, … what libsndfile reads) → Sound: mono (the mean of its channels), resampled to
    16 kHz with soxr at RESAMPLE_QUALITY, float32. One QkvError for each kind of bad input (see the module
    docstring)."""
    import soundfile

    name = os.fspath(path)
    try:
        with open_regular(name) as f, soundfile.SoundFile(f) as sound:
            rate, channels, frames = sound.samplerate, sound.channels, sound.frames
            _check_header(name, rate, frames)
            data = sound.read(dtype="float32", always_2d=True)           # (n_in, channels)
    except FileNotFoundError:
        raise QkvError(f"no sound file {name}; give a WAV, FLAC or OGG file") from None
    except soundfile.LibsndfileError as e:
        raise QkvError(f"{name} is not a sound file libsndfile reads ({str(e)[:80]}); give a WAV, FLAC or OGG "
                       "file") from None
    except OSError as e:
        raise QkvError(f"cannot read {name}: {e.strerror or e}; give a regular sound file") from None
    return Sound(to_16k(data, rate, name), rate, channels, name)


def _check_header(name: str, rate: int, frames: int) -> None:
    """What the file's header says: some samples, a sane rate, at most MAX_SECONDS."""
    if rate <= 0:
        raise QkvError(f"{name} declares a sample rate of {rate} Hz; give a sound file with a positive rate")
    if frames <= 0:
        raise QkvError(f"{name} holds no samples; give a sound that is not empty")
    if frames > MAX_SECONDS * rate:
        raise QkvError(f"{name} lasts {frames / rate / 3600:.1f} h, longer than qkv reads ({MAX_SECONDS // 3600} h); "
                       "cut it into shorter files (e.g. sox IN OUT trim 0 1:00:00)")


def to_16k(data: np.ndarray, rate: int, name: str = "the sound") -> np.ndarray:
    """Samples (n_in, channels) or (n_in,) at RATE → (n,) float32 mono at 16 kHz: the mean of the channels
    (librosa's to_mono), then soxr at RESAMPLE_QUALITY when RATE is not 16 kHz. Refuses an empty or non-finite
    sound."""
    x = np.asarray(data, dtype=np.float32)
    x = x[:, None] if x.ndim == 1 else x                                 # (n_in, channels)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise QkvError(f"{name} holds no samples ({x.shape}); give a sound that is not empty")
    if not np.isfinite(x).all():
        raise QkvError(f"{name} holds NaN or infinite samples; give a sound of finite samples")
    mono = x.mean(axis=1, dtype=np.float32)                              # (n_in,)
    if rate != SAMPLE_RATE:
        import soxr

        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality=RESAMPLE_QUALITY).astype(np.float32)   # (n,)
    if len(mono) == 0:
        raise QkvError(f"{name} is too short to hold one sample at 16 kHz; give a longer sound")
    return np.ascontiguousarray(mono)


# ── log-mel features ──────────────────────────────────────────────────────────────

def hz_to_mel(f):
    """The Slaney mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor 6.4)."""
    f = np.asarray(f, dtype=np.float64)
    log_part = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) * 27.0 / np.log(6.4)
    return np.where(f >= 1000.0, log_part, 3.0 * f / 200.0)


def mel_to_hz(m):
    """The inverse of hz_to_mel."""
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((m - 15.0) * np.log(6.4) / 27.0), 200.0 * m / 3.0)


def mel_filters(n_mels: int, n_fft: int = N_FFT, rate: int = SAMPLE_RATE, f_max: float = 8000.0) -> np.ndarray:
    """(1 + n_fft/2, n_mels) triangular filters: filter m rises from edge m to edge m + 1 and falls to edge m + 2,
    the n_mels + 2 edges evenly spaced in mels from 0 Hz to f_max; each scaled by 2 / (its width in Hz), so every
    filter has the same area (Slaney's normalisation, as WhisperFeatureExtractor's mel_filter_bank)."""
    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(f_max), n_mels + 2))       # (n_mels + 2,) Hz
    freqs = np.linspace(0, rate // 2, 1 + n_fft // 2)                                    # (F,) the FFT bins' Hz
    width = np.diff(edges)                                                               # (n_mels + 1,)
    to_edge = edges[None, :] - freqs[:, None]                                            # (F, n_mels + 2)
    rising = -to_edge[:, :-2] / width[:-1]                                               # (F, n_mels)
    falling = to_edge[:, 2:] / width[1:]                                                 # (F, n_mels)
    tri = np.maximum(0.0, np.minimum(rising, falling))                                   # (F, n_mels)
    return tri * (2.0 / (edges[2:] - edges[:-2]))[None, :]                               # (F, n_mels)


def hann(n: int = N_FFT) -> np.ndarray:
    """The periodic Hann window (torch.hann_window's): 0.5 − 0.5·cos(2πk/n), k = 0..n−1."""
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)                             # (n,)


def mel_energies(samples: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """|STFT|² of SAMPLES (n,) through the mel FILTERS (F, mels): centred (reflected by n_fft/2 at each end), Hann
    window, hop 160 → (1 + n//160, mels). In blocks of STFT_BLOCK frames, so a long sound never holds its whole
    spectrogram (2 h: 720,000 frames × 201 bins)."""
    x = np.pad(np.asarray(samples, dtype=np.float64), N_FFT // 2, mode="reflect")       # (n + n_fft,)
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP]                   # (T + 1, n_fft) a view
    window = hann()
    out = np.empty((len(frames), filters.shape[1]))                                      # (T + 1, mels)
    for a in range(0, len(frames), STFT_BLOCK):
        spec = np.fft.rfft(frames[a:a + STFT_BLOCK] * window, axis=-1)                  # (b, F) complex
        out[a:a + STFT_BLOCK] = (spec.real ** 2 + spec.imag ** 2) @ filters             # (b, mels)
    return out


def log_mel(samples: np.ndarray, n_mels: int = 80, window: int = WINDOW_SAMPLES) -> np.ndarray:
    """Mono 16 kHz samples (n,) → log-mel features (n_mels, frames) float32, equal to transformers'
    WhisperFeatureExtractor(feature_size=n_mels): a sound of at most 30 s padded with silence to 30 s (3000
    frames, its padding="max_length"); a longer one keeps all n // 160 frames (padding="longest",
    truncation=False: what Whisper's long-form generate reads). Formula: see the module docstring.
    window: the samples of one window (WhisperFeatureExtractor's n_samples, chunk_length · 16,000; a model of
    shorter windows, as `qkv train --task speech` makes, pads to its own)."""
    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    if len(x) == 0 or not np.isfinite(x).all():
        raise QkvError("the samples are empty or not finite; give a sound of finite samples")
    if not 1 <= int(n_mels) <= 512:
        raise QkvError(f"n_mels must be between 1 and 512, got {n_mels}; Whisper uses 80 (large-v3: 128)")
    if len(x) < window:
        x = np.pad(x, (0, window - len(x)))                                             # (480000,) silence after
    mel = mel_energies(x, mel_filters(int(n_mels)))[:-1]                                 # (T, n_mels) last dropped
    logs = np.log10(np.maximum(mel, 1e-10)).T                                            # (n_mels, T)
    logs = np.maximum(logs, logs.max() - 8.0)
    return ((logs + 4.0) / 4.0).astype(np.float32)                                       # (n_mels, T)


def windows(features: np.ndarray, frames: int = WINDOW_FRAMES) -> np.ndarray:
    """Log-mel features (mels, T) → (W, mels, frames): consecutive windows of FRAMES (30 s), the last padded with
    zeros (as generate pads the window it reads), W = ⌈T / frames⌉."""
    mels, T = features.shape
    count = max(1, -(-T // frames))
    out = np.zeros((count, mels, frames), dtype=features.dtype)                          # (W, mels, frames)
    for w in range(count):
        part = features[:, w * frames:(w + 1) * frames]
        out[w, :, :part.shape[1]] = part
    return out


def sound_features(path: str | os.PathLike, n_mels: int = 80, window: int = WINDOW_SAMPLES
                   ) -> tuple[np.ndarray, Sound]:
    """A sound file → (its log-mel features (n_mels, frames), the Sound read): read_sound then log_mel (padded to
    WINDOW samples)."""
    sound = read_sound(path)
    return log_mel(sound.samples, n_mels, window), sound
