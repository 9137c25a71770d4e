"""`qkv train`: every file a run writes, a text model that `qkv generate` and `qkv show` use, and
one line + exit code 2 for each bad input (without leaving a directory behind)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import qkv
from qkv.cli.app import cli
from conftest import PATIENCE, run_main

TINY = ["--layers", "1", "--heads", "2", "--d-model", "16", "--batch", "4"]
KOREAN = "고양이가 매트 위에 앉았다. 강아지가 공을 쫓았다. 아이들이 마당에서 놀았다.\n" * 40


def test_induction_run_writes_every_file(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["train", "--task", "induction", "--out", str(out), *TINY, "--vocab", "8",
                                 "--half", "4", "--min-half", "3", "--steps", "12", "--every", "4",
                                 "--checkpoint-every", "6"])
    assert r.exit_code == 0, r.output
    assert "llama 1 layers × 2 heads, d_model 16, attention-only" in r.output
    for name in ("run.json", "log.jsonl", "loss.png", "induction.png", "before.html", "after.html",
                 "checkpoints/step-00000006.npz", "checkpoints/step-00000012.npz",
                 "model/config.json", "model/model.safetensors"):
        assert (out / name).is_file(), name
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == list(range(13))
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "seconds"} <= set(log[1])
    records = [e for e in log if "induction" in e]
    assert [e["step"] for e in records] == [0, 4, 8, 12]
    assert np.shape(records[-1]["induction"]) == (1, 2)                        # L × H
    assert {"loss_repeated", "loss_first", "induction_best"} <= set(records[-1])
    model = qkv.load(out / "model")
    assert model.config.d_ff == 0 and model.config.position == "rope"
    assert model.forward(np.arange(9)[None] % 8).logits.shape == (1, 9, 8)


@pytest.mark.parametrize("arch, tokenizer", [("gpt2", "char"), ("llama", "bpe")])
def test_text_model_on_korean_is_an_ordinary_checkpoint(tmp_path, arch, tokenizer):
    text = tmp_path / "ko.txt"
    text.write_text(KOREAN, encoding="utf-8")
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["train", "--text", str(text), "--out", str(out), *TINY, "--context", "24",
                                 "--arch", arch, "--tokenizer", tokenizer, "--vocab-size", "300",
                                 "--steps", "20", "--every", "10", "--lr", "0.01"])
    assert r.exit_code == 0, r.output
    assert [line.split()[1] for line in r.output.splitlines() if line.startswith("step ")] == ["0", "10", "20"]
    for name in ("tokenizer.json", "loss.png", "before.html", "after.html", "model/tokenizer.json"):
        assert (out / name).is_file(), name
    model = qkv.load(out / "model")
    assert model.config.family == arch
    assert "고양이" in model.tokenizer.decode(model.tokenizer.encode("고양이가")[0])
    written = model.generate("고양이가", max_new_tokens=5, temperature=0)
    assert isinstance(written, str) and written
    g = CliRunner().invoke(cli, ["generate", "고양이가", "--model", str(out / "model"), "-n", "5", "-t", "0"])
    assert g.exit_code == 0 and g.output.startswith("고양이가"), g.output
    s = CliRunner().invoke(cli, ["show", "고양이가 앉았다", "--model", str(out / "model")])
    assert s.exit_code == 0 and "layer 0" in s.output, s.output


def _mistake(monkeypatch, capsys, *args: str) -> str:
    code, out, err = run_main(monkeypatch, capsys, "train", *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qkv: error: "), err
    return lines[0]


@pytest.mark.parametrize("args, message", [
    (["--task", "sorting"], "unknown task 'sorting'"),
    (["--task", "induction", "--steps", "0"], "--steps 0 must be positive"),
    (["--task", "induction", "--lr", "0"], "--lr 0.0 must be a positive number"),
    (["--task", "induction", "--lr", "-1"], "--lr -1.0 must be a positive number"),
    (["--task", "induction", "--d-model", "30", "--heads", "4"], "--d-model 30 is not a multiple of --heads 4"),
    (["--task", "induction", "--min-half", "9", "--half", "8"], "--min-half 9 is more than --half 8"),
    (["--task", "induction", "--steps", "10", "--warmup", "20"], "--warmup 20 is longer than the run"),
    (["--task", "induction", "--threads", "0"], "--threads 0: this machine has"),
    (["--task", "induction", "--vocab", "1099511627776"], "with a vocabulary of 1,099,511,627,776 needs about"),
    (["--task", "induction", "--d-model", "1048576", "--heads", "4"], "more than half this machine's memory"),
    (["--text", "NO-SUCH-FILE"], "no such file: NO-SUCH-FILE"),
    (["--task", "induction", "--arch", "bert"], "unknown --arch 'bert'; choose gpt2 or llama"),
])
def test_bad_settings_give_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    out = tmp_path / "run"
    line = _mistake(monkeypatch, capsys, *args, "--out", str(out))
    assert message in line
    assert not out.exists()                                                    # nothing left behind


def test_bad_text_files(tmp_path, monkeypatch, capsys):
    empty, latin1, short = tmp_path / "empty.txt", tmp_path / "latin1.txt", tmp_path / "short.txt"
    empty.write_text("  \n", encoding="utf-8")
    latin1.write_bytes("café".encode("latin-1"))
    short.write_text("abc " * 20, encoding="utf-8")
    out = tmp_path / "run"
    assert "is empty" in _mistake(monkeypatch, capsys, "--text", str(empty), "--out", str(out))
    assert "is not UTF-8" in _mistake(monkeypatch, capsys, "--text", str(latin1), "--out", str(out))
    assert "fewer than one --context window of 128" in _mistake(monkeypatch, capsys, "--text", str(short),
                                                                   "--out", str(out))
    assert "unknown --tokenizer 'words'; choose char or bpe" in _mistake(
        monkeypatch, capsys, "--text", str(short), "--tokenizer", "words", "--out", str(out))
    assert not out.exists()


def test_an_out_that_is_not_a_run(tmp_path, monkeypatch, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    assert "holds other files, not a qkv training run" in _mistake(
        monkeypatch, capsys, "--task", "induction", "--out", str(tmp_path / "full"))
    assert "is a file" in _mistake(monkeypatch, capsys, "--task", "induction", "--out", str(tmp_path / "file"))
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"
    assert "give --out DIR" in _mistake(monkeypatch, capsys, "--task", "induction")
    assert "not both" in _mistake(monkeypatch, capsys, "--task", "induction", "--text", "x", "--out", "y")


def test_settings_that_disagree_with_the_run(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["train", "--task", "induction", "--out", str(out), *TINY, "--vocab", "8",
                                 "--half", "4", "--min-half", "3", "--steps", "4", "--every", "2"])
    assert r.exit_code == 0, r.output
    assert "holds a run with --lr 0.001, not 0.5" in _mistake(monkeypatch, capsys, "--out", str(out), "--lr", "0.5")
    text = tmp_path / "t.txt"
    text.write_text("abc " * 400)
    assert "holds a run of --task induction, not text" in _mistake(monkeypatch, capsys, "--text", str(text), "--out", str(out))


def test_a_text_run_follows_its_text_not_its_path(tmp_path, monkeypatch, capsys):
    text, moved = tmp_path / "a.txt", tmp_path / "b.txt"
    text.write_text("abcd efg " * 300, encoding="utf-8")
    out = tmp_path / "run"
    args = ["train", "--out", str(out), *TINY, "--context", "16", "--steps", "4", "--every", "2"]
    r = CliRunner().invoke(cli, [*args, "--text", str(text)])
    assert r.exit_code == 0, r.output
    text.rename(moved)
    assert "no such file" in _mistake(monkeypatch, capsys, "--out", str(out))         # where is it now?
    r = CliRunner().invoke(cli, [*args, "--text", str(moved)])                          # the same bytes: fine
    assert r.exit_code == 0 and "resuming from step 4 of 4 (complete)" in r.output, r.output
    moved.write_text("other words " * 300, encoding="utf-8")
    assert "is not the text the run" in _mistake(monkeypatch, capsys, "--text", str(moved), "--out", str(out))


def test_in_a_terminal_the_bar_and_the_records_keep_their_own_lines(tmp_path):
    """Under a pseudo-terminal (what a user's shell is), each record line starts a line of its own: rich
    prints it above the bar instead of two streams writing into one line (`…0:00:58step     50  loss`);
    the files list names before.html, which the last line tells the user to open."""
    import os
    import pty
    import re
    import subprocess
    import sys

    out = tmp_path / "run"
    args = [sys.executable, "-m", "qkv", "train", "--task", "induction", "--out", str(out), *TINY, "--vocab", "8",
            "--half", "4", "--min-half", "3", "--steps", "40", "--every", "4", "--checkpoint-every", "20"]
    parent, child = pty.openpty()
    env = dict(os.environ, COLUMNS="120", LINES="40", TERM="xterm-256color")
    proc = subprocess.Popen(args, stdin=child, stdout=child, stderr=child, env=env, close_fds=True)
    os.close(child)
    raw = b""
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:                                           # the child closed the terminal
            break
        if not chunk:
            break
        raw += chunk
    assert proc.wait(timeout=PATIENCE) == 0, raw.decode(errors="replace")[-2000:]
    text = raw.decode(errors="replace")
    records = [m.start() for m in re.finditer(r"step +\d+  (loss \d|repeated half)", text)]
    assert len(records) == 11                                     # steps 0, 4, …, 40
    for at in records:                                            # nothing printable just before a record
        before = text[max(0, at - 1):at]
        assert before in ("\n", "\r", "") or before.isspace() or text[:at].endswith(("m", "K", "\x1b[?25l")), \
            repr(text[max(0, at - 40):at + 20])
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert re.search(r"\d:\d\d(:\d\d)?step +\d", plain) is None   # the bar's clock never runs into a record
    listed = re.split(r"^open ", plain[plain.index("files to"):], flags=re.M)[0]     # the list, not the last line
    assert "before.html" in listed and "after.html" in listed
