"""Where each word was heard (qkv.writing.timestamps, Transcription.words, `qkv transcribe --words`): token
timestamps equal to transformers' generate(return_token_timestamps=True) on the two tiny Whisper checkpoints of
tests/fixtures/make_transcribe_fixtures.py (token_timestamps_<k> of each case: short and long form, with and without
timestamps); the DTW against a brute-force least path and against transformers' loop written plainly (ties
included); words grouped as transformers' _combine_tokens_into_words groups them (its outputs written here)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.writing.timestamps import (alignment_heads, alignment_matrix, cut_positions, dtw, median_filter,
                                    split_words, token_timestamps, words_of)
from conftest import FIXTURES, run_main

WHISPER = FIXTURES / "whisper"
NAMES = ("tiny", "tiny_wide")
FRAME = 0.02                      # one encoder position: the tolerance of a token's time


@pytest.fixture(scope="module")
def models():
    return {name: qkv.load(WHISPER / name) for name in NAMES}


def _case(models, name: str, k: int):
    ref = np.load(WHISPER / name / "reference.npz")
    case = json.loads(str(ref["cases"]))[k]
    result = models[name].transcribe(ref[f"features_{k}"], language=case["language"], task=case["task"],
                                     timestamps=case["timestamps"], max_new_tokens=case["max_new_tokens"])
    return result, ref


@pytest.mark.parametrize("k", range(8))
@pytest.mark.parametrize("name", NAMES)
def test_token_timestamps_equal_transformers(models, name, k):
    """Each token's time within one 20 ms frame of transformers' (they agree exactly on these fixtures)."""
    result, ref = _case(models, name, k)
    np.testing.assert_array_equal(result.ids, ref[f"ids_{k}"][0])
    want = ref[f"token_timestamps_{k}"][0]
    mine = result.token_timestamps
    assert mine.shape == want.shape
    assert np.abs(mine - want).max() <= FRAME + 1e-6


@pytest.mark.parametrize("k", range(6))
@pytest.mark.parametrize("name", NAMES)
def test_a_sound_shorter_than_its_window_cuts_the_attention_as_transformers(models, name, k):
    """generate(…, attention_mask=2·S − 6 ones) crops the alignment heads' attention to (frames − seek) // 2
    positions before the DTW (what the pipeline does with a sound's mask): `frames` does the same."""
    from qkv.writing.timestamps import align

    result, ref = _case(models, name, k)
    frames = result.features.shape[1] - 6
    mine = token_timestamps(result, alignments=[align(result, 0, frames=frames)])
    want = ref[f"token_timestamps_cut_{k}"][0]
    assert mine.shape == want.shape and np.abs(mine - want).max() <= FRAME + 1e-6
    result.frames = frames                                       # what AudioModel.transcribe(path) records
    assert np.array_equal(result.token_timestamps, mine)


def test_the_cut_is_transformers_slice_taken_twice():
    """weights[..., :n // 2] on the batch, then again on each row: the same for n ≥ 0, twice for a window past the
    sound's end (n < 0: as transformers 5.25 does it)."""
    assert [cut_positions(10, n) for n in (25, 20, 7, 1, 0)] == [10, 10, 3, 1, 1]
    assert [cut_positions(40, n) for n in (-1, -11, -40)] == [38, 28, 1]


def test_a_sound_file_records_its_own_frames(models, tmp_path):
    import soundfile

    t = np.arange(4000) / 16000
    soundfile.write(tmp_path / "s.wav", (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32), 16000,
                    subtype="FLOAT")
    result = models["tiny"].transcribe(tmp_path / "s.wav", language="en", max_new_tokens=4)
    assert result.frames == 25                                   # ⌈4000 / 160⌉: WhisperFeatureExtractor's mask
    widths = [a.attention.shape[-1] for a in result.alignments]
    assert widths == [cut_positions(10, 25 - w.seek) for w in result.windows] and widths[0] == 10
    assert len(widths) > 1 and widths[1] < 10                    # a window past the sound's end: cut as there


def test_absolute_times_add_each_windows_offset(models):
    """Past 30 s each window's times start from its own seek; absolute ones add it (seconds = seek · 10 ms)."""
    result, _ = _case(models, "tiny_wide", 7)
    assert len(result.windows) >= 2
    relative, absolute = token_timestamps(result), token_timestamps(result, absolute=True)
    offsets = absolute - relative
    seeks = {round(w.seek * 0.01, 6) for w in result.windows}
    assert {round(o, 6) for o in offsets} <= seeks and offsets.max() > 0
    assert np.all(np.diff(offsets) >= -1e-9)


# ── the maths ───────────────────────────────────────────────────────────────────

def _plain_dtw(matrix: np.ndarray):
    """transformers' _dynamic_time_warping as it is written there (cell by cell), for the comparison."""
    n, S = matrix.shape
    cost = np.full((n + 1, S + 1), np.inf, dtype=np.float32)
    trace = -np.ones((n + 1, S + 1), dtype=np.float32)
    cost[0, 0] = 0
    for j in range(1, S + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = matrix[i - 1, j - 1] + c
            trace[i, j] = t
    trace[0, :], trace[:, 0] = 2, 1
    i, j, rows, cols = n, S, [], []
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        t = trace[i, j]
        i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
    return np.array(rows[::-1]), np.array(cols[::-1])


def _least_path_cost(matrix: np.ndarray) -> float:
    """The least sum over every monotone path from (0, 0) to (n−1, S−1) (steps right, down, diagonal), by
    enumerating the paths."""
    n, S = matrix.shape

    def paths(i: int, j: int):
        if (i, j) == (n - 1, S - 1):
            yield [(i, j)]
            return
        for di, dj in ((1, 1), (1, 0), (0, 1)):
            if i + di < n and j + dj < S:
                for rest in paths(i + di, j + dj):
                    yield [(i, j)] + rest

    return min(sum(matrix[c] for c in path) for path in paths(0, 0))


@pytest.mark.parametrize("shape", [(1, 1), (1, 4), (3, 1), (2, 3), (3, 4), (4, 4), (3, 5)])
def test_dtw_finds_the_least_path(shape):
    rng = np.random.default_rng(sum(shape))
    for _ in range(5):
        m = rng.normal(size=shape)
        rows, cols = dtw(m)
        assert (rows[0], cols[0]) == (0, 0) and (rows[-1], cols[-1]) == (shape[0] - 1, shape[1] - 1)
        steps = np.stack([np.diff(rows), np.diff(cols)], 1)
        assert all(tuple(s) in {(1, 1), (1, 0), (0, 1)} for s in steps)
        assert abs(m[rows, cols].sum() - _least_path_cost(m)) <= 1e-5


def test_dtw_equals_transformers_loop_ties_included():
    """Integer costs make many paths equally cheap: the path chosen is transformers' (diagonal, up, else left)."""
    rng = np.random.default_rng(7)
    for shape in [(3, 8), (6, 6), (9, 4), (12, 40)]:
        for m in (rng.integers(0, 3, size=shape).astype(np.float64), rng.normal(size=shape)):
            for mine, plain in zip(dtw(m), _plain_dtw(m)):
                np.testing.assert_array_equal(mine, plain)


def test_median_filter_reflects_at_the_ends():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 11))
    padded = np.pad(x, ((0, 0), (0, 0), (3, 3)), mode="reflect")
    want = np.stack([np.median(padded[..., t:t + 7], axis=-1) for t in range(11)], -1)
    np.testing.assert_array_equal(median_filter(x, 7), want)
    short = rng.normal(size=(2, 3))
    assert median_filter(short, 7) is short                      # 3 frames ≤ 7 // 2: left as it is, as there


def test_alignment_matrix_standardises_each_head_over_tokens():
    rng = np.random.default_rng(5)
    a = rng.random((2, 4, 9)).astype(np.float32)
    z = (a - a.mean(1, keepdims=True)) / a.std(1, keepdims=True)
    np.testing.assert_allclose(alignment_matrix(a, 1), z.mean(0), atol=1e-6)      # width 1: no filtering
    np.testing.assert_allclose(alignment_matrix(a, 3), median_filter(z, 3).mean(0), atol=1e-6)


# ── which heads ─────────────────────────────────────────────────────────────────

def _edited(tmp_path, name: str, generation: dict | None = None, config: dict | None = None):
    shutil.copytree(WHISPER / name, tmp_path / "m")
    for file, change in (("generation_config.json", generation), ("config.json", config)):
        if change:
            path = tmp_path / "m" / file
            path.write_text(json.dumps({k: v for k, v in (json.loads(path.read_text()) | change).items()
                                        if v is not None}))
    return qkv.load(tmp_path / "m")


def test_without_alignment_heads_the_upper_half_is_read(tmp_path, models):
    assert alignment_heads(models["tiny_wide"]) == ((1, 0), (1, 1))
    model = _edited(tmp_path, "tiny_wide", {"alignment_heads": None})
    assert alignment_heads(model) == ((1, 0), (1, 1), (1, 2))
    ref = np.load(WHISPER / "tiny_wide" / "reference.npz")
    result = model.transcribe(ref["features_0"])
    a = result.alignments[0]
    trace = result.trace(0)
    n_p, m = len(result.windows[0].prompt), len(result.windows[0].written)
    np.testing.assert_array_equal(a.attention, trace.cross.attentions[1, :, n_p:n_p + m - 1])


@pytest.mark.parametrize("generation, config, message", [
    ({"alignment_heads": [[2, 0]]}, None, "alignment_heads names layer 2, head 0"),
    (None, {"median_filter_width": 4}, "median_filter_width must be an odd whole number"),
])
def test_heads_or_filters_the_model_lacks_are_one_line(tmp_path, generation, config, message):
    model = _edited(tmp_path, "tiny", generation, config)
    with pytest.raises(QkvError, match=message):
        model.transcribe(np.zeros((8, 20), np.float32), language="en").words


# ── words ───────────────────────────────────────────────────────────────────────

class ByteTokens:
    """A tokenizer whose tokens are byte strings (as Whisper's byte-level BPE): a cut character decodes to U+FFFD."""

    def __init__(self, pieces):
        self.pieces = [p.encode() if isinstance(p, str) else p for p in pieces]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


HAN = "你好".encode()


@pytest.mark.parametrize("pieces, language, words, groups", [       # transformers' _combine_tokens_into_words
    ([" Hello", ",", " wor", "ld", "!", " (", "hi", ")", " \"", "ok", "\"", " -", "3"], "en",
     [" Hello,", " world!", " (hi)", " \"ok\"", " -3"], [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9, 10], [11, 12]]),
    ([" 안", "녕", "하", "세요", ".", " 네", "?"], "<|ko|>", [" 안녕하세요.", " 네?"], [[0, 1, 2, 3, 4], [5, 6]]),
    ([HAN[:2], HAN[2:4], HAN[4:], "。", " A"], "ja", ["你好。", " A"], [[0, 1, 2, 3], [4]]),
])
def test_words_are_grouped_as_transformers_groups_them(pieces, language, words, groups):
    assert split_words(ByteTokens(pieces), list(range(len(pieces))), language) == (words, groups)


@pytest.mark.parametrize("name, k", [("tiny", 5), ("tiny_wide", 7), ("tiny", 0)])
def test_each_word_spans_its_tokens_times(models, name, k):
    """A word runs from the time of the token before its first (0 for the very first) to its last token's time,
    absolute; the words hold every text token, in order."""
    result, _ = _case(models, name, k)
    times = token_timestamps(result, absolute=True)
    ids = result.ids.tolist()
    words = result.words
    assert [t for w in words for t in w.tokens] == [t for t in ids if t < 40]
    at = 0
    for w in words:
        first = ids.index(w.tokens[0], at)
        last = first + len(w.tokens) - 1                         # the fixtures' words hold no timestamp inside
        assert w.start == round(float(times[first - 1]) if first else 0.0, 2)
        assert w.end == round(float(times[last]), 2) and w.start <= w.end + 1e-9
        at = last + 1
    assert words == words_of(result)


def test_qkv_transcribe_words_prints_each_words_span(monkeypatch, capsys, tmp_path, models):
    ref = np.load(WHISPER / "tiny" / "reference.npz")
    np.save(tmp_path / "f.npy", ref["features_5"])
    code, out, err = run_main(monkeypatch, capsys, "transcribe", str(tmp_path / "f.npy"), "--model",
                              str(WHISPER / "tiny"), "--language", "ja", "--timestamps", "--words")
    assert code == 0, err
    words = models["tiny"].transcribe(ref["features_5"], language="ja", timestamps=True).words
    lines = out.splitlines()[-len(words):]
    assert lines == [f"{w.start:7.2f} → {w.end:7.2f}  {w.word.strip()}" for w in words]


# ── the view ────────────────────────────────────────────────────────────────────

def test_each_words_attention_row_is_its_tokens_rows_at_its_window(models):
    """word_attention: the mean over the alignment heads and the word's tokens of the rows the DTW read, placed
    at its window's start (20 ms a position); past the sound's end nothing is drawn."""
    from qkv.writing.timestamps import word_attention

    result, _ = _case(models, "tiny", 5)
    a = result.alignments[0]
    rows = word_attention(result)
    assert rows.shape == (len(result.words), 10)
    ids = result.ids.tolist()
    first = result.words[0]
    k = ids.index(first.tokens[0])                               # one window: its position among the written
    want = np.mean([a.attention[:, min(k + i, a.attention.shape[1] - 1)].mean(0) for i in range(len(first.tokens))], 0)
    np.testing.assert_allclose(rows[0], want, atol=1e-6)


def test_words_figure_draws_a_row_per_word_under_the_spectrogram(models):
    from qkv.viz.audio_words import MAX_WORDS, words_figure
    from qkv.writing.timestamps import Word, word_attention

    result, _ = _case(models, "tiny", 5)
    fig = words_figure(result.features, result.words, word_attention(result), model_name="tiny")
    top, bottom = fig.axes[:2]
    assert [t.get_text().split("  ")[0] for t in bottom.get_yticklabels()] == [w.word.strip() for w in result.words]
    assert len(bottom.patches) == len(result.words)                 # each word's span outlined
    many = [Word(" w", 0.0, 0.02, [5])] * (MAX_WORDS + 5)
    fig = words_figure(np.zeros((8, 20)), many, np.ones((len(many), 10)))
    assert len(fig.axes[1].get_yticklabels()) == MAX_WORDS and f"of {MAX_WORDS + 5} words" in fig.axes[0].get_title()
    with pytest.raises(QkvError, match="one attention row per word"):
        words_figure(np.zeros((8, 20)), many, np.ones((2, 10)))


def test_qkv_show_without_a_transcript_writes_one_and_prints_its_words(monkeypatch, capsys, tmp_path, models):
    ref = np.load(WHISPER / "tiny" / "reference.npz")
    np.save(tmp_path / "f.npy", ref["features_0"])
    code, out, err = run_main(monkeypatch, capsys, "show", str(tmp_path / "f.npy"), "--model", str(WHISPER / "tiny"))
    assert code == 0, err
    result = models["tiny"].transcribe(ref["features_0"])
    lines = out.splitlines()
    assert lines[0] == f"transcript: {result.text.strip()}"
    spans = [f"  {w.start:7.2f} → {w.end:7.2f}  {w.word.strip():<20} peak" for w in result.words]
    assert [l[:len(s)] for l, s in zip(lines[2:], spans)] == spans


def test_qkv_show_reads_a_sound_file_with_or_without_a_transcript(monkeypatch, capsys, tmp_path):
    """A 0.25 s sound is 3000 frames (150 windows of this 20-frame model): each window writes 3 tokens at most, to
    keep the test short."""
    import soundfile

    from qkv.models.audio_model import AudioModel

    transcribe = AudioModel.transcribe
    monkeypatch.setattr(AudioModel, "transcribe", lambda self, source, **kw: transcribe(self, source, max_new_tokens=3))

    t = np.arange(4000) / 16000
    soundfile.write(tmp_path / "s.wav", (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32), 16000)
    code, out, err = run_main(monkeypatch, capsys, "show", str(tmp_path / "s.wav"), "--model", str(WHISPER / "tiny"),
                              "--prefix", "ba be")
    assert code == 0 and "ba be" in out, err
    code, out, err = run_main(monkeypatch, capsys, "show", str(tmp_path / "s.wav"), "--model", str(WHISPER / "tiny"),
                              "--out", str(tmp_path / "o"))
    assert code == 0 and out.startswith("transcript: "), err
    names = {p.name for p in (tmp_path / "o").iterdir()}
    assert {"words.png", "words.svg", "words.html", "attention.html"} <= names
    page = (tmp_path / "o" / "words.html").read_text(encoding="utf-8")
    assert 'id="qkv-sound"' in page and "data:audio/wav;base64," in page and page.count('class="qkv-word"') >= 1


def test_the_page_embeds_the_sound_and_escapes_every_text():
    import base64
    import io
    import re
    import wave

    from qkv.viz.audio_words import PAGE_CSP, wav_bytes, words_page
    from qkv.writing.timestamps import Word

    samples = np.sin(np.arange(1600) / 5.0) * 0.5                                   # 0.1 s at 16 kHz
    with wave.open(io.BytesIO(wav_bytes(samples)), "rb") as w:
        back = np.frombuffer(w.readframes(w.getnframes()), "<i2") / 32767
        assert w.getframerate() == 16000 and w.getnchannels() == 1
    assert np.abs(back - samples).max() <= 1 / 32767
    words = [Word(' <script>alert(1)</script>', 0.0, 0.04, [1]), Word(' "quoted" & more', 0.04, 0.1, [2])]
    page = words_page(b"\x89PNG", words, samples, title="<b>title</b>")
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>title" not in page and "&quot;quoted&quot; &amp; more" in page
    assert PAGE_CSP in page and "media-src data:" in PAGE_CSP and "http" not in PAGE_CSP
    sound = re.search(r'data:audio/wav;base64,([A-Za-z0-9+/=]+)"', page).group(1)
    assert base64.b64decode(sound) == wav_bytes(samples)
    assert re.findall(r'data-start="([\d.]+)" data-end="([\d.]+)"', page) == [("0.00", "0.04"), ("0.04", "0.10")]
    assert "data:audio" not in words_page(b"\x89PNG", words) and "not played" in words_page(b"\x89PNG", words)
    long = words_page(b"\x89PNG", words, np.zeros(16000 * 601))
    assert "data:audio" not in long and "longer than 600 s" in long
