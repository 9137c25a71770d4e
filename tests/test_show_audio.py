"""`qkv show FEATURES.npy --model WHISPER --target TEXT`: the transcript's cross-attention over time, in the terminal and
with --out, on the committed Whisper fixture given a word-level tokenizer; bad features refused in one line."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

import qkv
from conftest import MODELS, reference, run_main


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    """The whisper fixture with a tokenizer.json: <pad> <s> </s> <start>, then w4 … w59."""
    out = tmp_path_factory.mktemp("whisper") / "m"
    shutil.copytree(MODELS / "whisper", out)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<start>": 3} | {f"w{i}": i for i in range(4, 60)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    features = out.parent / "sound.npy"
    np.save(features, reference("whisper")["input_features"][0])
    return out, features


def test_show_prints_where_each_word_looks_in_time(whisper, monkeypatch, capsys):
    model_dir, features = whisper
    code, out, err = run_main(monkeypatch, capsys, "show", str(features), "--model", str(model_dir),
                              "--target", "w5 w9 w11")
    assert code == 0, err
    assert "target (given): w5 w9 w11" in out and "0.14s" in out
    trace = qkv.load(model_dir).run(np.load(features), "w5 w9 w11")
    best = int(np.argmax(trace.cross.layer(1).attentions[0, 1]))       # head 0, the row that read w5
    assert f"{best * 0.02:.2f}s" in out


def test_show_out_writes_the_viewer_and_heatmaps(whisper, monkeypatch, capsys, tmp_path):
    model_dir, features = whisper
    code, out, err = run_main(monkeypatch, capsys, "show", str(features), "--model", str(model_dir),
                              "--target", "w5 w9", "--out", str(tmp_path / "o"))
    assert code == 0, err
    page = (tmp_path / "o" / "attention.html").read_text(encoding="utf-8")
    assert "0.08s" in page and any(p.suffix == ".png" for p in (tmp_path / "o").iterdir())


def _declaring(path, shape: tuple[int, ...]) -> None:
    """An .npy file whose header declares float32 SHAPE and which holds no data."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})


@pytest.mark.parametrize("make, args, message", [
    (None, ("--target", "w5"), "no features file"),
    (lambda p: np.save(p, np.array([{"a": 1}], dtype=object)), ("--target", "w5"), "not an .npy array of numbers"),
    (lambda p: np.save(p, np.zeros((6, 10), np.float32)), ("--target", "w5"),
     "declares float32 (6, 10); the model reads floats of shape (mels, frames) = (6, 16)"),
    # a header declaring more than the file holds: refused from the header, before an array is made
    (lambda p: _declaring(p, (6, 10 ** 12)), ("--target", "w5"),
     "declares float32 (6, 1000000000000); the model reads floats of shape (mels, frames) = (6, 16)"),
    (lambda p: _declaring(p, (6, 16)), ("--target", "w5"), "declares float32 (6, 16), 384 bytes of data, but holds 0"),
    (lambda p: np.save(p, np.zeros((6, 16), np.int64)), ("--target", "w5"), "floats of shape (mels, frames)"),
    (lambda p: np.save(p, np.zeros((6, 16), np.float32)), (), "give the transcript with --target"),
])
def test_bad_input_is_one_line(whisper, monkeypatch, capsys, tmp_path, make, args, message):
    model_dir, _ = whisper
    path = tmp_path / "x.npy"
    if make is not None:
        make(path)
    code, out, err = run_main(monkeypatch, capsys, "show", str(path), "--model", str(model_dir), *args,
                              "--out", str(tmp_path / "o"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
