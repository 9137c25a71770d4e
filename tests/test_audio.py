"""Sound in (qkv.inputs.audio): sound files read, made mono and resampled to 16 kHz, and log-mel features equal to
transformers' WhisperFeatureExtractor (tests/fixtures/make_transcribe_fixtures.py: audio_features.npz) on sounds
this test writes itself (tests/fixtures/sounds.py: sines, a chord, noise, a chirp, a click; 8 to 48 kHz; 1 to 3
channels; 80 and 128 mel bins; a sound longer than 30 s); bad audio refused in one line each."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import soundfile

from qkv import QkvError
from qkv.inputs import audio
from conftest import FIXTURES

sys.path.insert(0, str(FIXTURES))
from sounds import SOUNDS, sound  # noqa: E402

TOL_FEATURES = 1e-4              # max abs against WhisperFeatureExtractor (float32 torch STFT there, float64 here)


@pytest.fixture(scope="module")
def ref():
    return np.load(FIXTURES / "audio_features.npz")


@pytest.mark.parametrize("mels", [80, 128])
@pytest.mark.parametrize("name", sorted(SOUNDS))
def test_features_equal_whisper_feature_extractor(tmp_path, ref, name, mels):
    data, rate = sound(name)
    path = tmp_path / f"{name}.wav"
    soundfile.write(path, data, rate, subtype="FLOAT")                    # exact float32 samples
    features, read = audio.sound_features(path, mels)
    assert (read.source_rate, read.channels) == (rate, data.shape[1])
    assert features.shape == (mels, 3000) and features.dtype == np.float32
    assert np.abs(features - ref[f"{name}/{mels}"]).max() <= TOL_FEATURES


@pytest.mark.parametrize("mels", [80, 128])
def test_a_sound_longer_than_30_s_keeps_every_frame_and_cuts_into_windows(ref, mels):
    data, _ = sound("long")
    features = audio.log_mel(data[:, 0], mels)
    assert features.shape == (mels, int(ref[f"long/{mels}/frames"]))         # n // 160 frames, as padding="longest"
    mine = np.concatenate([features[:, 2990:3010], features[:, -20:]], axis=1)
    assert np.abs(mine - ref[f"long/{mels}"]).max() <= TOL_FEATURES
    w = audio.windows(features)
    assert w.shape == (2, mels, 3000)
    np.testing.assert_array_equal(w[0], features[:, :3000])
    rest = features.shape[1] - 3000
    np.testing.assert_array_equal(w[1, :, :rest], features[:, 3000:])
    assert not w[1, :, rest:].any()                                          # zeros, as generate pads a window


def test_the_filters_and_window_are_whispers():
    """Slaney mel filters: each triangle's area-normalisation 2 / width; the periodic Hann window."""
    f = audio.mel_filters(80)
    assert f.shape == (201, 80) and (f >= 0).all() and (f.max(axis=0) > 0).all()
    np.testing.assert_allclose(audio.hann(), np.hanning(401)[:-1], atol=1e-12)
    np.testing.assert_allclose(audio.mel_to_hz(audio.hz_to_mel([0, 500, 1000, 4000, 8000])), [0, 500, 1000, 4000, 8000])
    assert audio.hz_to_mel(1000.0) == pytest.approx(15.0)


def test_channels_are_averaged_and_the_rate_becomes_16k(tmp_path):
    t = np.arange(48_000) / 48_000                                          # 1 s at 48 kHz
    left, right = np.sin(2 * np.pi * 1000 * t), 0.5 * np.sin(2 * np.pi * 1000 * t)
    soundfile.write(tmp_path / "s.wav", np.stack([left, right], 1).astype(np.float32), 48_000, subtype="FLOAT")
    read = audio.read_sound(tmp_path / "s.wav")
    assert len(read.samples) == 16_000 and read.seconds == 1.0
    spectrum = np.abs(np.fft.rfft(read.samples))                            # 1 Hz bins
    assert np.argmax(spectrum) == 1000                                       # the tone kept its pitch
    assert np.abs(read.samples[2000:14000]).max() == pytest.approx(0.75, abs=0.01)   # the mean of 1 and 0.5


@pytest.mark.parametrize("fmt, subtype, tol", [("FLAC", "PCM_16", 1 / 16384), ("OGG", "VORBIS", None)])
def test_flac_and_ogg_are_read(tmp_path, fmt, subtype, tol):
    data, rate = sound("sine_16k_mono")
    path = tmp_path / f"s.{fmt.lower()}"
    soundfile.write(path, data, rate, format=fmt, subtype=subtype)
    read = audio.read_sound(path)
    assert read.source_rate == 16_000 and abs(len(read.samples) - len(data)) <= 0
    if tol is not None:
        assert np.abs(read.samples - data[:, 0]).max() <= tol
    else:                                                                     # lossy: the same loudness
        assert np.sqrt(np.mean(read.samples ** 2)) == pytest.approx(np.sqrt(np.mean(data ** 2)), rel=0.1)


def _fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    return tmp_path / "fifo"


def _link_to_fifo(tmp_path):
    os.symlink(_fifo(tmp_path), tmp_path / "link.wav")
    return tmp_path / "link.wav"


def _written(tmp_path, data, rate=16_000, subtype="FLOAT"):
    soundfile.write(tmp_path / "s.wav", np.asarray(data, np.float32), rate, subtype=subtype)
    return tmp_path / "s.wav"


@pytest.mark.parametrize("make, message", [
    (lambda p: (p / "t.wav").write_text("not a sound") and p / "t.wav", "is not a sound file"),
    (lambda p: _written(p, np.zeros((0, 1))), "holds no samples"),
    (lambda p: _written(p, [[0.1], [np.nan], [0.2]]), "NaN or infinite"),
    (lambda p: _written(p, [[0.1], [np.inf]]), "NaN or infinite"),
    (lambda p: _written(p, np.zeros((7300, 1)), rate=1, subtype="PCM_16"), r"longer than qkv reads \(2 h\)"),
    (_fifo, "a FIFO"),
    (_link_to_fifo, "a FIFO"),
    (lambda p: p, "directory"),
    (lambda p: p / "missing.wav", "no sound file"),
])
def test_bad_audio_is_one_line(tmp_path, make, message):
    with pytest.raises(QkvError, match=message) as e:
        audio.read_sound(make(tmp_path))
    assert "\n" not in str(e.value)


def test_a_device_is_refused_before_reading():
    with pytest.raises(QkvError, match="device"):
        audio.read_sound("/dev/zero")


def test_bad_samples_and_mels_are_one_line():
    with pytest.raises(QkvError, match="empty or not finite"):
        audio.log_mel(np.zeros(0))
    with pytest.raises(QkvError, match="n_mels"):
        audio.log_mel(np.zeros(100), 0)
