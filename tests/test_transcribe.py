"""Whisper writes (qkv.writing.transcribe, AudioModel.transcribe, `qkv transcribe`): ids equal to transformers'
WhisperForConditionalGeneration.generate(num_beams=1) on two tiny random checkpoints with a full
generation_config.json (tests/fixtures/make_transcribe_fixtures.py: whisper/tiny, whisper/tiny_wide), eight cases
each: language detected or given (code or token), transcribe or translate, with and without timestamps,
max_new_tokens or the config's max_length, inputs longer than one window (long-form, window by window). Every
greedy choice there has a gap of at least 1e-3, so the ids do not depend on rounding."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import soundfile

import qkv
from qkv import QkvError
from qkv.writing.transcribe import WhisperRules, apply_rules, segments_of, timestamp_rules
from conftest import FIXTURES, run_main

WHISPER = FIXTURES / "whisper"
NAMES = ("tiny", "tiny_wide")
TOL_PROBS = 1e-5


@pytest.fixture(scope="module")
def models():
    return {name: qkv.load(WHISPER / name) for name in NAMES}


def _reference(name: str):
    ref = np.load(WHISPER / name / "reference.npz")
    return ref, json.loads(str(ref["cases"]))


def _case(ref, case, k, model):
    return model.transcribe(ref[f"features_{k}"], language=case["language"], task=case["task"],
                            timestamps=case["timestamps"], max_new_tokens=case["max_new_tokens"])


@pytest.mark.parametrize("k", range(8))
@pytest.mark.parametrize("name", NAMES)
def test_ids_equal_transformers_generate(models, name, k):
    ref, cases = _reference(name)
    result = _case(ref, cases[k], k, models[name])
    np.testing.assert_array_equal(result.ids, ref[f"ids_{k}"][0])
    times = np.array([[seg.start, seg.end] for seg in result.segments])             # generate(return_segments=True)
    assert times.shape == ref[f"segments_{k}"].shape and np.abs(times - ref[f"segments_{k}"]).max() <= 1e-9
    np.testing.assert_array_equal(models[name].generate(ref[f"features_{k}"], language=cases[k]["language"],
                                                        task=cases[k]["task"], timestamps=cases[k]["timestamps"],
                                                        max_new_tokens=cases[k]["max_new_tokens"]), ref[f"ids_{k}"])


def test_the_prompt_and_language_detection(models):
    """The prompt of each case (start, language, task, notimestamps) and, when no language is given, the softmax
    over the language tokens equal to transformers' logits after the start token."""
    ref, cases = _reference("tiny")
    model = models["tiny"]
    prompts = [_case(ref, c, k, model).windows[0].prompt for k, c in enumerate(cases)]
    detected = [_case(ref, c, k, model) for k, c in enumerate(cases) if c["language"] is None]
    assert prompts[1] == [41, 43, 49, 53]                   # ko, transcribe added, no timestamps
    assert prompts[2] == [41, 44, 48, 53]                   # de, translate
    assert prompts[3] == [41, 42, 49]                       # en with timestamps: no <|notimestamps|>
    assert prompts[5] == [41, 46, 49]                       # "<|ja|>" as a token
    assert prompts[0][2:] == [49, 53]                       # forced_decoder_ids' task after the detected language
    for k, c in enumerate(cases):
        if c["language"] is None:
            z = ref[f"language_logits_{k}"].astype(np.float64)
            p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
            result = _case(ref, c, k, model)
            names = [f"<|{l}|>" for l in ("en", "ko", "de", "fr", "ja", "zh")]
            mine = np.array([result.language_probs[n] for n in names])
            assert np.abs(mine - p).max() <= TOL_PROBS
            assert result.language == names[int(np.argmax(p))] and result.windows[0].prompt[1] == 42 + np.argmax(p)
    assert len(detected) == 3


def test_long_form_runs_window_by_window(models):
    ref, cases = _reference("tiny_wide")
    result = _case(ref, cases[7], 7, models["tiny_wide"])
    assert len(result.windows) >= 2 and result.windows[0].seek == 0 and result.windows[1].seek > 0
    assert all(w.prompt == result.windows[0].prompt for w in result.windows)
    assert [s.start for s in result.segments] == sorted(s.start for s in result.segments)


@pytest.mark.parametrize("k", [0, 3, 6])
def test_every_written_token_is_the_rules_argmax_of_a_whole_pass(models, k):
    """The KV-cache decoding against the trace's teacher-forced pass (no cache): each written token is the argmax
    of the trace's logits at the row before it under the rules; the trace keeps each token's cross-attention."""
    ref, cases = _reference("tiny")
    model = models["tiny"]
    result = _case(ref, cases[k], k, model)
    stamps = bool(cases[k]["timestamps"] or k == 6)
    for w, window in enumerate(result.windows):
        trace = result.trace(w)
        n = len(window.prompt) + len(window.written) - (window.written[-1:] == [model.rules.eos])
        assert trace.cross.attentions.shape == (2, 2, n, 10)
        np.testing.assert_allclose(trace.cross.attentions.sum(-1), 1, atol=1e-5)
        ids = list(window.prompt)
        for token in window.written:
            scores = apply_rules(trace.logits[len(ids) - 1], ids, len(window.prompt), model.rules, stamps)
            assert int(np.argmax(scores)) == token
            ids.append(token)


RULES = WhisperRules(decoder_start=41, eos=40, pad=40, no_timestamps=53, max_initial_timestamp=3,
                     suppress=(3,), begin_suppress=(0, 40))


def test_the_timestamp_rules():
    V, begin = 100, 54
    flat = np.zeros(V)
    first = timestamp_rules(flat.copy(), [], True, RULES)
    assert np.isinf(first[:begin]).all() and np.isfinite(first[begin:begin + 4]).all() and np.isinf(first[58:]).all()
    end_likely = flat.copy()
    end_likely[40] = 10.0                                          # the end token beats the timestamps together
    lone = timestamp_rules(end_likely, [5, 60], False, RULES)      # after a lone timestamp: a timestamp ≥ it, or end
    assert np.isinf(lone[:40]).all() and np.isfinite(lone[40]) and np.isinf(lone[begin:60]).all()
    assert np.isfinite(lone[60:]).all()
    opening = timestamp_rules(flat.copy(), [60], False, RULES)     # the window's first timestamp opens a segment
    assert np.isinf(opening[begin:]).all() and np.isfinite(opening[:40]).all()
    pair = timestamp_rules(flat.copy(), [60, 61], False, RULES)    # after a pair: no timestamp
    assert np.isinf(pair[begin:]).all() and np.isfinite(pair[:40]).all()
    text = timestamp_rules(flat.copy(), [60, 5], False, RULES)     # after text: timestamps past the last one
    assert np.isinf(text[begin:61]).all() and np.isfinite(text[61:]).all() and np.isinf(text[53])
    likely = flat.copy()
    likely[begin:] = 1.0                                           # the timestamps together beat every text token
    assert np.isinf(timestamp_rules(likely, [60, 5], False, RULES)[:begin]).all()
    both = apply_rules(flat, [41, 42, 49], 3, RULES, False)        # the first written position
    assert np.isinf(both[[0, 3, 40]]).all() and np.isfinite(np.delete(both, [0, 3, 40])).all()
    assert np.isinf(apply_rules(flat, [41, 42, 49, 7], 3, RULES, False)[3]) and np.isfinite(
        apply_rules(flat, [41, 42, 49, 7], 3, RULES, False)[[0, 40]]).all()


def test_segments_cut_at_timestamp_pairs():
    b = 54
    parts, moved = segments_of([b, 5, 6, b + 10, b + 10, 7, b + 20], b, 1.0, 20)
    assert [p.ids for p in parts] == [[b, 5, 6, b + 10], [b + 10, 7, b + 20]]     # cut between the pair
    assert [(p.start, p.end) for p in parts] == [(1.0, 1.2), (1.2, 1.4)] and moved == 20   # a lone one ends it
    parts, moved = segments_of([b, 5, b + 4, b + 4, 8, 9], b, 0.0, 20)            # stopped mid-segment
    assert [p.ids for p in parts] == [[b, 5, b + 4, b + 4]] and moved == 8        # seek to its last pair
    parts, moved = segments_of([5, 6], b, 0.5, 17)                               # no timestamps: the whole window
    assert parts[0].ids == [5, 6] and parts[0].end == pytest.approx(0.66) and moved == 17   # 8 whole positions


def test_text_and_segments_read_the_tokenizer(models):
    ref, cases = _reference("tiny")
    model = models["tiny"]
    result = _case(ref, cases[5], 5, model)
    words = [t for t in result.ids.tolist() if t < 54]
    assert result.text == model.tokenizer.decode(words, skip_special_tokens=True)
    assert " ".join(s.text for s in result.segments).split() == result.text.split()


def test_a_sound_file_is_transcribed_from_its_path(models, tmp_path):
    """A file → read_sound → log_mel (3000 frames: long-form for this 20-frame model) → the same ids as the
    features given directly."""
    from qkv.inputs.audio import log_mel

    t = np.arange(4000) / 16000
    soundfile.write(tmp_path / "s.wav", (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32), 16000, subtype="FLOAT")
    model = models["tiny"]
    a = model.transcribe(tmp_path / "s.wav", language="en", max_new_tokens=4)
    b = model.transcribe(log_mel(soundfile.read(tmp_path / "s.wav", dtype="float32")[0], 8), language="en",
                         max_new_tokens=4)
    np.testing.assert_array_equal(a.ids, b.ids)
    assert len(a.windows) > 1 and a.features.shape == (8, 3000)


@pytest.mark.parametrize("kwargs, message", [
    (dict(language="xx"), "language 'xx' is not one this checkpoint writes"),
    (dict(task="summarise"), "task 'summarise'"),
    (dict(max_new_tokens=40), "tiny's 40 target positions; give max_new_tokens of at most 36"),
    (dict(max_new_tokens=0), "max_new_tokens must be a whole number"),
])
def test_bad_requests_are_one_line(models, kwargs, message):
    ref, _ = _reference("tiny")
    with pytest.raises(QkvError, match=message):
        models["tiny"].transcribe(ref["features_0"], **kwargs)


def test_long_form_needs_timestamps_and_features_their_mels(models):
    ref, _ = _reference("tiny")
    with pytest.raises(QkvError, match="leave timestamps on"):
        models["tiny"].transcribe(ref["features_6"], timestamps=False)
    with pytest.raises(QkvError, match=r"shape \(8, frames\)"):
        models["tiny"].transcribe(np.zeros((6, 20), np.float32))
    with pytest.raises(QkvError, match="inf or NaN"):
        models["tiny"].transcribe(np.full((8, 20), np.nan, np.float32))


def _edited(tmp_path, change: dict):
    shutil.copytree(WHISPER / "tiny", tmp_path / "m")
    path = tmp_path / "m" / "generation_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | change))
    return qkv.load(tmp_path / "m")


@pytest.mark.parametrize("change, kwargs, message", [
    ({"num_beams": 4}, {}, "num_beams=4; qkv's transcribe decodes greedily"),
    ({"no_speech_threshold": 0.6}, {}, "no_speech_threshold"),
    ({"is_multilingual": False}, {"language": "en"}, "English-only"),
    ({"lang_to_id": None}, {"language": "en"}, "has no lang_to_id"),
    ({"no_timestamps_token_id": None}, {"timestamps": True}, "cannot write timestamps"),
    ({"suppress_tokens": [-1]}, {}, "suppress_tokens must be token ids"),
    ({"forced_decoder_ids": [[1, None], [3, 49]]}, {}, "forced_decoder_ids do not follow"),
])
def test_generation_configs_qkv_cannot_follow_are_one_line(tmp_path, change, kwargs, message):
    model = _edited(tmp_path, change)
    with pytest.raises(QkvError, match=message):
        model.transcribe(np.zeros((8, 20), np.float32), **kwargs)


def test_without_a_generation_config_the_config_json_rules(tmp_path):
    """openai's older checkpoints: no generation_config.json; config.json's suppress lists (ids past a tiny
    vocabulary dropped, as transformers' processors match no logit with them), no languages, no timestamps."""
    shutil.copytree(WHISPER / "tiny", tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").unlink()
    model = qkv.load(tmp_path / "m")
    assert model.rules.lang_to_id == {} and model.rules.no_timestamps is None and model.rules.max_length == 20
    result = model.transcribe(np.zeros((8, 20), np.float32))
    assert result.language is None and result.windows[0].prompt == [41]
    assert len(result.ids) == 20                 # max_length 20, raised by the 1-token prompt as transformers does


# ── the command ──────────────────────────────────────────────────────────────────

def test_qkv_transcribe_prints_the_detected_language_and_the_text(monkeypatch, capsys, tmp_path):
    ref, cases = _reference("tiny")
    np.save(tmp_path / "f.npy", ref["features_0"])
    code, out, err = run_main(monkeypatch, capsys, "transcribe", str(tmp_path / "f.npy"), "--model",
                              str(WHISPER / "tiny"), "--ids")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("language (detected): en ")
    model = qkv.load(WHISPER / "tiny")
    expected = model.transcribe(ref["features_0"])
    assert lines[1] == expected.text.strip()
    assert lines[2] == "ids: " + " ".join(map(str, ref["ids_0"][0].tolist()))


def test_qkv_transcribe_with_timestamps_prints_segments(monkeypatch, capsys, tmp_path):
    ref, _ = _reference("tiny")
    np.save(tmp_path / "f.npy", ref["features_3"])
    code, out, err = run_main(monkeypatch, capsys, "transcribe", str(tmp_path / "f.npy"), "--model",
                              str(WHISPER / "tiny"), "--language", "en", "--timestamps")
    assert code == 0, err
    assert "language (detected)" not in out and out.startswith("[   0.")


@pytest.mark.parametrize("args, message", [
    (["nothing.wav"], "no sound file nothing.wav"),
    (["f.npy", "--language", "xx"], "language 'xx'"),
    (["f.npy", "--max-new-tokens", "99"], "target positions"),
])
def test_qkv_transcribe_mistakes_are_one_line(monkeypatch, capsys, tmp_path, args, message):
    np.save(tmp_path / "f.npy", np.zeros((8, 20), np.float32))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(monkeypatch, capsys, "transcribe", *args, "--model", str(WHISPER / "tiny"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_the_generation_configs_own_language_and_task_are_the_defaults(tmp_path, models):
    """A generation_config.json holding language and task (as generate leaves them after one call): read as
    transformers reads them, the same ids as giving them."""
    ref, _ = _reference("tiny")
    model = _edited(tmp_path, {"language": "ko", "task": "translate"})
    mine = model.transcribe(ref["features_0"])
    given = models["tiny"].transcribe(ref["features_0"], language="ko", task="translate")
    assert mine.windows[0].prompt == [41, 43, 48, 53] and mine.language_probs is None
    np.testing.assert_array_equal(mine.ids, given.ids)


def test_qkv_transcribe_reads_a_wav_file(monkeypatch, capsys, tmp_path):
    """A 0.25 s, 22.05 kHz stereo WAV: read, mono, 16 kHz, 3000 frames — long-form for this 20-frame model, so
    segments with times are printed."""
    t = np.arange(5512) / 22050
    tone = 0.3 * np.sin(2 * np.pi * 440 * t)
    soundfile.write(tmp_path / "s.wav", np.stack([tone, -tone / 2], 1).astype(np.float32), 22050)
    code, out, err = run_main(monkeypatch, capsys, "transcribe", str(tmp_path / "s.wav"), "--model",
                              str(WHISPER / "tiny"), "--language", "ko", "-n", "2")
    assert code == 0, err
    assert out.startswith("[   0.00 → ") and "language (detected)" not in out


def test_the_text_models_writing_arguments_are_refused(models):
    """What the decoders' analyses would pass (generate(ids, n, temperature=0)) is one line, not a TypeError."""
    with pytest.raises(QkvError, match="writes greedily from sound"):
        models["tiny"].generate(np.zeros((8, 20), np.float32), 5, temperature=0)
