"""`qkv show FEATURES.npy --model WHISPER --prefix TEXT`: the transcript's cross-attention over time, in the terminal and
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
                              "--prefix", "w5 w9 w11")
    assert code == 0, err
    assert "target (given): w5 w9 w11" in out and "0.14s" in out
    trace = qkv.load(model_dir).run(np.load(features), "w5 w9 w11")
    best = int(np.argmax(trace.cross.layer(1).attentions[0, 1]))       # head 0, the row that read w5
    assert f"{best * 0.02:.2f}s" in out


def test_show_out_writes_the_viewer_and_heatmaps(whisper, monkeypatch, capsys, tmp_path):
    model_dir, features = whisper
    code, out, err = run_main(monkeypatch, capsys, "show", str(features), "--model", str(model_dir),
                              "--prefix", "w5 w9", "--out", str(tmp_path / "o"))
    assert code == 0, err
    page = (tmp_path / "o" / "attention.html").read_text(encoding="utf-8")
    assert "0.08s" in page and any(p.suffix == ".png" for p in (tmp_path / "o").iterdir())


def _declaring(path, shape: tuple[int, ...]) -> None:
    """An .npy file whose header declares float32 SHAPE and which holds no data."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})


@pytest.mark.parametrize("make, args, message", [
    (None, ("--prefix", "w5"), "no features file"),
    (lambda p: np.save(p, np.array([{"a": 1}], dtype=object)), ("--prefix", "w5"), "not an .npy array of numbers"),
    (lambda p: np.save(p, np.zeros((6, 10), np.float32)), ("--prefix", "w5"),
     "declares float32 (6, 10); the model reads floats of shape (mels, frames) = (6, 16)"),
    # a header declaring more than the file holds: refused from the header, before an array is made
    (lambda p: _declaring(p, (6, 10 ** 12)), ("--prefix", "w5"),
     "declares float32 (6, 1000000000000); the model reads floats of shape (mels, frames) = (6, 16)"),
    (lambda p: _declaring(p, (6, 16)), ("--prefix", "w5"), "declares float32 (6, 16), 384 bytes of data, but holds 0"),
    (lambda p: np.save(p, np.zeros((6, 16), np.int64)), ("--prefix", "w5"), "floats of shape (mels, frames)"),
    (lambda p: np.save(p, np.zeros((6, 16), np.float32)), (), "give the transcript with --prefix"),
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


def test_show_ablates_heads_of_every_stack(whisper, monkeypatch, capsys):
    """--ablate names a head of any stack in the one key grammar (encoder.0.heads.1, cross.1.0, 0.heads.1: the
    decoder's): the pass printed is the ablated model's (once refused on encoder–decoders)."""
    from qkv.models.audio_model import AudioModel

    model_dir, features = whisper
    passes = []
    run = AudioModel.run
    monkeypatch.setattr(AudioModel, "run", lambda self, *a, **kw: passes.append(self.ablated) or run(self, *a, **kw))
    code, out, err = run_main(monkeypatch, capsys, "show", str(features), "--model", str(model_dir), "--prefix",
                              "w5 w9 w11", "--ablate", "encoder.0.heads.1,cross.1.0,0.heads.1")
    assert code == 0 and "target (given): w5 w9 w11" in out, err
    assert [{s: a and a.heads for s, a in p.items()} for p in passes] == [
        {"encoder": {0: (1,)}, "decoder": {0: (1,)}, "cross": {1: (0,)}}]
    code, _, err = run_main(monkeypatch, capsys, "show", str(features), "--model", str(model_dir), "--prefix", "w5",
                            "--ablate", "cross.0.residual")
    assert code == 2 and "cross-attention has" in err and len(err.strip().splitlines()) == 1
