"""`qkv train --task speech` (qkv.train.speech, speech_data, speech_backprop): Whisper's backward through its
convolutions, encoder, cross-attention and decoder against torch autograd (the committed fixture
grads/whisper_speech.npz, made by make_speech_fixtures.py), the tokenizer in Whisper's format, and the task run,
resumed bit for bit and saved as a Whisper checkpoint — on synthetic sound made in NumPy; espeak-ng itself (make test
installs it) for its word boundaries."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from qkv.cli.app import cli
from qkv.core.blocks import convolve
from qkv.core.weights import ConvWeights
from qkv.runtime.errors import QkvError
from qkv.train import speech, speech_data
from qkv.train.gradients import grads_by_name
from qkv.train.speech_backprop import conv_backward, loss_and_grads
from conftest import check_training_resumes, run_main

FIXTURES = Path(__file__).parent / "fixtures"


def test_gradients_equal_autograd():
    """Every parameter's gradient (the convolutions', both stacks', the tied table's, the encoder's positions) as
    torch's, float64: relative error ≤ 1e-5 (measured ~1e-15), loss within 1e-10."""
    ref = np.load(FIXTURES / "grads" / "whisper_speech.npz")
    model = qkv.load(FIXTURES / "models" / "whisper", dtype=np.float64)
    frames = np.ascontiguousarray(ref["input_features"].transpose(0, 2, 1))          # (B, frames, mels)
    loss, tree = loss_and_grads(model.weights, model.config, frames, ref["decoder_input_ids"], ref["labels"])
    assert abs(loss - float(ref["loss"])) < 1e-10
    grads = grads_by_name(tree, model.config)
    expected = {k[len("grad."):]: ref[k] for k in ref.files if k.startswith("grad.")}
    assert set(grads) == set(expected)                       # every parameter, the tied head once
    for key, g_ref in expected.items():
        err = np.linalg.norm(grads[key] - g_ref) / np.linalg.norm(g_ref)
        assert err < 1e-5, f"{key}: relative error {err:.2e}"


@pytest.mark.parametrize("stride", [1, 2])
def test_conv_backward_is_the_transpose_of_convolve(stride):
    """⟨conv(x), dy⟩ is linear in x and W: its gradients equal the central differences (float64)."""
    rng = np.random.default_rng(stride)
    x = rng.standard_normal((2, 9, 3))
    conv = ConvWeights(rng.standard_normal((9, 4)), rng.standard_normal(4), kernel=3, stride=stride, padding=1)
    dy = rng.standard_normal(convolve(x, conv).shape)
    dx, g = conv_backward(dy, x, conv)
    f = lambda x_, W_: float((convolve(x_, ConvWeights(W_, conv.b, 3, stride, 1)) * dy).sum())
    e = np.zeros_like(x)
    e[1, 4, 2] = 1e-6
    assert abs((f(x + e, conv.W) - f(x - e, conv.W)) / 2e-6 - dx[1, 4, 2]) < 1e-6
    E = np.zeros_like(conv.W)
    E[5, 1] = 1e-6
    assert abs((f(x, conv.W + E) - f(x, conv.W - E)) / 2e-6 - g.W[5, 1]) < 1e-6
    np.testing.assert_allclose(g.b, dy.sum(axis=(0, 1)))


def test_tokenizer_is_whispers_format():
    """One token a word (with its space), the prompt tokens of tiny.en around a text, the timestamps after them."""
    tok = speech.whisper_tokenizer()
    ids = tok.encode(" three one four", add_special_tokens=False).ids
    assert [tok.id_to_token(i) for i in ids] == ["Ġthree", "Ġone", "Ġfour"]
    full = tok.encode(" three one four").ids
    assert [tok.id_to_token(i) for i in (full[0], full[1], full[-1])] == \
        ["<|startoftranscript|>", "<|notimestamps|>", "<|endoftext|>"]
    notimestamps = tok.token_to_id("<|notimestamps|>")
    assert tok.token_to_id("<|0.00|>") == notimestamps + 1 and tok.token_to_id("<|3.00|>") == notimestamps + 151
    # transformers' WhisperTokenizer reading the same ids: tests/live/test_live_speech_tokenizer.py


def _tone(u: speech_data.Utterance) -> speech_data.Spoken:
    """Synthetic speech: each word 0.2 s of a tone of its own pitch (200 + 80·word Hz), 0.05 s apart; louder for a
    higher pitch of the voice. Word k starts at 0.25·k s."""
    t = np.arange(int(0.2 * speech_data.SAMPLE_RATE)) / speech_data.SAMPLE_RATE
    gap = np.zeros(int(0.05 * speech_data.SAMPLE_RATE), np.float32)
    parts = [np.concatenate([np.sin(2 * np.pi * (200 + 80 * w) * t) * (0.3 + u.pitch / 200), gap]) for w in u.words]
    bounds = np.arange(len(u.words) + 1) * int(0.25 * speech_data.SAMPLE_RATE)
    return speech_data.Spoken(np.concatenate(parts).astype(np.float32), bounds)


@pytest.fixture
def small_banks(monkeypatch):
    """The task on synthetic sound: the same code, a few utterances, NumPy's tones for espeak-ng."""
    monkeypatch.setattr(speech_data, "espeak", _tone)
    monkeypatch.setattr(speech, "TRAIN_UTTERANCES", 24)
    monkeypatch.setattr(speech, "HELD_OUT_UTTERANCES", 6)


ARGS = ["--layers", "1", "--heads", "2", "--d-model", "16", "--batch", "4", "--steps", "4", "--every", "2",
        "--checkpoint-every", "2"]


def test_speech_run_trains_resumes_and_saves_a_whisper(tmp_path, small_banks):
    out = tmp_path / "run"
    args = ["train", "--task", "speech", "--out", str(out), *ARGS]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "whisper 1 layers × 2 heads, d_model 16" in r.output and "words" in r.output
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log if "word_accuracy" in e] == [0, 2, 4]
    for name in ("model/config.json", "model/model.safetensors", "model/generation_config.json",
                 "model/tokenizer.json", "model/tokenizer_config.json", "model/preprocessor_config.json", "loss.png"):
        assert (out / name).is_file(), name
    assert len(list((out / "examples").glob("*.wav"))) == speech.EXAMPLES
    said = json.loads((out / "examples" / speech.EXAMPLES_FILE).read_text())
    assert [(out / "examples" / e["file"]).is_file() for e in said] == [True] * speech.EXAMPLES
    assert all(len(e["word_bounds_s"]) == len(e["text"].split()) + 1 for e in said)
    timing = json.loads((out / speech.TIMING_FILE).read_text())
    assert timing["alignment_heads"] and timing["word_end_error_ms"] >= 0 and timing["utterances"] == 6
    check_training_resumes(args, out, at=2, later=4)
    model = qkv.load(out / "model")
    assert type(model).__name__ == "AudioModel" and model.config.source_positions == 150
    assert set(model.rules.alignment_heads) <= {(0, 0), (0, 1)} and model.rules.alignment_heads
    assert model.rules.multilingual is False
    wav = sorted((out / "examples").glob("*.wav"))[0]
    written = model.transcribe(wav)                          # the 3 s window: one window, no timestamps
    assert len(written.windows) == 1 and written.features.shape == (80, 300)


def test_batches_depend_on_seed_and_step_alone(tmp_path, small_banks):
    from qkv.train.tasks import settings_for

    s = settings_for("speech", {"d_model": 16, "heads": 2, "layers": 1, "batch": 3})
    task = speech.SpeechTask(s, tmp_path / "tokenizer.json")
    again = speech.SpeechTask(s, tmp_path / "tokenizer.json")           # read back from the run's bank file
    assert (tmp_path / speech.BANK_FILE).is_file()
    a, b = task.batch(5), again.batch(5)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert a[0].shape == (3, 300, 80) and a[0].dtype == np.float32
    assert not np.array_equal(a[0], task.batch(6)[0])
    tgt_in, labels = a[1], a[2]
    np.testing.assert_array_equal(tgt_in[:, :2], [task.prompt] * 3)
    assert ((labels == -100) | (labels == np.roll(tgt_in, -1, axis=1)) | (np.arange(labels.shape[1]) ==
                                                                         labels.shape[1] - 1)).all()


def test_held_out_voices_are_never_learned_from():
    train = {speech_data.utterance(i).voice for i in range(400)}
    held = {speech_data.utterance(i, held_out=True).voice for i in range(400)}
    assert train and held and not train & held


def test_missing_espeak_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(speech_data.shutil, "which", lambda name: None)
    monkeypatch.setattr(speech_data, "_ENGINE", None)                   # as in a process that has not spoken yet
    with pytest.raises(QkvError, match="apt-get install espeak-ng"):
        speech_data.espeak(speech_data.utterance(0))
    code, _, err = run_main(monkeypatch, capsys, "train", "--task", "speech", "--out", str(tmp_path / "r"))
    assert code == 2 and "apt-get install espeak-ng" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()                                 # a run that never started leaves nothing


def test_speech_refuses_another_arch(tmp_path, monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "train", "--task", "speech", "--arch", "gpt2", "--out",
                            str(tmp_path / "r"))
    assert code == 2 and "speech a whisper" in err and len(err.strip().splitlines()) == 1


def test_training_starts_from_whispers_sinusoids(tmp_path, small_banks):
    """The encoder's positions start as transformers' WhisperEncoder's: [sin(p·ω_k) | cos(p·ω_k)],
    ω_k = 10000^(−k/(C/2 − 1)); row 0 is [0 … 0 | 1 … 1], row p's first channel sin(p)."""
    from qkv.checkpoints.families import family_of
    from qkv.models.fresh import init
    from qkv.train.tasks import settings_for

    table = speech.sinusoids(150, 16)
    np.testing.assert_array_equal(table[0], [0] * 8 + [1] * 8)
    np.testing.assert_allclose(table[7, [0, 7, 8]], [np.sin(7), np.sin(7 * 1e-4), np.cos(7)], rtol=1e-12)
    task = speech.SpeechTask(settings_for("speech", {"d_model": 16, "heads": 2, "layers": 1}),
                             tmp_path / "tokenizer.json")
    tensors = family_of("whisper").tensors(init(task.config).weights, task.config)
    start = task.initial(tensors)
    np.testing.assert_array_equal(start["model.encoder.embed_positions.weight"], table.astype(np.float32))
    assert start["model.decoder.embed_positions.weight"] is tensors["model.decoder.embed_positions.weight"]


def test_aligned_heads_are_those_whose_word_ends_land_nearest():
    """Each head's word ends (transformers' DTW over its cross-attention: the row reading word j starts where it
    first looks) against the words' true ends: a head whose row reading word j looks from where word j ends (at
    what it is about to write) is chosen; one looking at the word it just read (a word early), or at one place, is
    not; two equally good heads are chosen together (their mean is as near)."""
    B, k, S = 4, 3, 150
    ends = [np.array([0.4, 0.8, 1.2])] * B                       # seconds: positions 20, 40, 60
    cross = np.random.default_rng(0).uniform(0, 1e-3, (2, B, 3, 2 + k, S))     # (L, B, H, n, S): faint elsewhere
    for j, at in enumerate((20, 40, 60)):
        cross[0, :, 1, 2 + j, at:at + 20] = 1.0                  # row j: from word j's end on
        cross[1, :, 2, 2 + j, at:at + 20] = 1.0                  # … the same in another head
        cross[0, :, 2, 2 + j, at - 20:at] = 1.0                  # word j itself: a word early
    cross[:, :, 0, :, 10] = 1.0                                  # every row at one place
    one = speech.timing_error(cross, [(0, 1)], [k] * B, ends, [S] * B)
    early = speech.timing_error(cross, [(0, 2)], [k] * B, ends, [S] * B)
    assert one < 0.03 and early > 0.15
    heads, error = speech.aligned_heads(cross, [k] * B, ends, [S] * B)
    assert sorted(heads) == [[0, 1], [1, 2]] and error == pytest.approx(one, abs=0.02)
    single = speech.timing_error(cross, [(0, 1)], [1] * B, ends, [S] * B)
    assert np.isnan(single)                                      # one-word utterances are not measured


def test_espeak_word_bounds_are_its_word_events():
    """libespeak-ng's word events: k starts, rising, inside the sound, then its end; the bank keeps them."""
    u = speech_data.Utterance((3, 1, 4), "en-us", 160, 50)
    spoken = speech_data.espeak(u)
    assert len(spoken.bounds) == 4 and spoken.bounds[0] == 0 and (np.diff(spoken.bounds) > 1600).all()
    assert spoken.bounds[-1] <= len(spoken.samples) and len(spoken.samples) > 0.5 * speech_data.SAMPLE_RATE
    bank = speech_data.speak_bank(3, True, 48_000)
    again = speech_data.speak_bank(3, True, 48_000, arrays=bank.to_arrays())
    for i in range(3):
        b = again.word_bounds(i)
        assert len(b) == len(bank.utterances[i].words) + 1 and np.array_equal(b, bank.word_bounds(i))


def test_masks_hide_bands_and_spans():
    frames = np.random.default_rng(0).standard_normal((300, 80)).astype(np.float32)
    out = speech.masked(frames, np.random.default_rng(3))
    again = speech.masked(frames, np.random.default_rng(3))
    np.testing.assert_array_equal(out, again)                   # a function of the generator alone
    hidden = out == frames.mean()
    assert hidden.any() and (hidden.all(axis=0).sum() + hidden.all(axis=1).sum()) > 0
    assert hidden.all(axis=0).sum() <= 2 * speech.MEL_MASK and hidden.all(axis=1).sum() <= 2 * speech.TIME_MASK
    np.testing.assert_array_equal(out[~hidden], frames[~hidden])
