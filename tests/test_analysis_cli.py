"""`qkv heads`: the table, the JSON object, the files of --out, and one line + exit 2 per mistake."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from conftest import MODELS
from qkv.analysis.stats import STATS
from qkv.cli.app import cli, main

SENTENCE = "The cat sat on the mat."


def heads(*args: str):
    r = CliRunner().invoke(cli, ["heads", *args])
    assert r.exit_code == 0, (r.output, r.exception)
    return r


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`qkv ARGS` through the real entry point (what a user runs), in this process."""
    monkeypatch.setattr(sys, "argv", ["qkv", *args])
    with pytest.raises(SystemExit) as e:
        main()
        sys.exit(0)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_json_is_one_object_with_every_statistic_as_layers_by_heads():
    data = json.loads(heads(SENTENCE, "--json").stdout)                  # exactly one JSON document
    assert (data["model"], data["layers"], data["heads"], data["texts"]) == ("all-MiniLM-L6-v2", 6, 12, 1)
    assert list(data["stats"]) == list(STATS)
    for name in STATS:
        grid = data["stats"][name]
        assert len(grid) == 6 and all(len(row) == 12 for row in grid)
        assert all(isinstance(v, float) for row in grid for v in row)
    assert data["roles"][0][2] == "previous"
    assert data["stats"]["prev"][0][2] > 0.85
    assert len(data["roles"]) == 6 and all(len(row) == 12 for row in data["roles"])


def test_the_table_names_layer_0_head_2_previous():
    r = heads(SENTENCE)
    row0 = next(line for line in r.stdout.splitlines() if line.strip().startswith("0 │"))
    assert row0.split("│")[3].split()[0] == "prev"                       # column h2
    assert "more than 50%" in r.stdout


def test_a_decoder_shows_cls_and_sep_as_not_applicable():
    args = ["the cat sat on the mat, the cat ran.", "--model", str(MODELS / "gpt2")]
    data = json.loads(heads(*args, "--json").stdout)
    assert data["stats"]["cls"] == [[None] * 4] * 2 and data["stats"]["sep"] == [[None] * 4] * 2
    assert "cls" in data["not_applicable"]
    assert "not applicable" in heads(*args).stdout


def test_stat_prints_its_numbers():
    r = heads(SENTENCE, "--stat", "prev")
    assert "prev: attention to the previous token" in r.stdout
    row0 = next(line for line in r.stdout.splitlines()[::-1] if line.strip().startswith("0 │"))
    assert float(row0.split("│")[3]) > 0.85


def test_a_corpus_run_reports_the_failed_text_and_goes_on(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(f"{SENTENCE}\n\n\x01\x02\nA dog ran after the cat.\n")
    r = heads("--file", str(path), "--json")
    data = json.loads(r.stdout)
    assert data["texts"] == 2
    assert data["failed"] == [{"index": 1, "line": 3, "error": "the text gives no tokens"}]
    assert "text 1 (line 3) skipped: the text gives no tokens" in r.stderr


def test_out_writes_the_json_a_map_per_statistic_and_the_viewer(tmp_path):
    out = tmp_path / "heads"
    heads(SENTENCE, "--out", str(out), "--json")
    names = {p.name for p in out.iterdir()}
    for name in [*STATS, "roles"]:
        assert {f"heads-{name}.png", f"heads-{name}.svg"} <= names
    assert (out / "heads-prev.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "heads.json").read_text())["roles"][0][2] == "previous"
    viewer = (out / "viewer.html").read_text()
    assert "previous" in viewer and "[CLS]" in viewer


def test_a_corpus_run_with_a_checkpoint_gives_the_same_json_when_run_again(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(f"{SENTENCE}\nA dog ran after the cat.\n")
    ckpt = tmp_path / "run.npz"
    first = heads("--file", str(path), "--checkpoint", str(ckpt), "--json").stdout
    assert ckpt.exists()
    assert heads("--file", str(path), "--checkpoint", str(ckpt), "--json").stdout == first
    assert heads("--file", str(path), "--json").stdout == first


@pytest.mark.parametrize("args, message", [
    ([], "give either TEXT(s) or --file"),
    (["hi", "--file", "x.txt"], "give either TEXT(s) or --file"),
    ([""], "the text is empty"),
    (["--file", "no-such-file.txt"], "cannot read no-such-file.txt"),
    (["hi", "--stat", "sep", "--model", str(MODELS / "gpt2")], "'sep' does not apply"),
    (["hi", "--stat", "bogus"], "unknown statistic 'bogus'"),
    (["hi", "--address", "auto"], "--address is for the Ray backend"),
    (["hi", "--window", "1"], "--window 1 is outside 2..512"),
    (["hi", "--model", str(MODELS / "llama_mqa")], "no tokenizer.json"),
    (["hi", "--checkpoint", "run.npz"], "--checkpoint needs a corpus file"),
])
def test_mistakes_give_one_line_and_exit_2(monkeypatch, capsys, args, message):
    code, out, err = run_main(monkeypatch, capsys, "heads", *args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err


@pytest.mark.parametrize("content, message", [
    (b"", "holds no text"),
    (b"   \n\t \n", "holds no text"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "looks binary"),
    (b"\xff\xfe\xfd\n", "not valid UTF-8"),            # its only text fails: nothing to analyse
])
def test_bad_corpus_files_give_one_line_and_exit_2(monkeypatch, capsys, tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    code, out, err = run_main(monkeypatch, capsys, "heads", "--file", str(path), "--json")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_a_line_that_is_not_utf8_is_reported_and_skipped(monkeypatch, capsys, tmp_path):
    """One undecodable line fails alone (README: a text that fails is reported and skipped)."""
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"The cat sat on the mat.\nA bad \xff\xfe line.\nDogs bark at night.\n")
    code, out, err = run_main(monkeypatch, capsys, "heads", "--file", str(path), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["texts"] == 2 and [f["line"] for f in report["failed"]] == [2]
    assert "line 2" in err and "not valid UTF-8" in err


def test_a_failed_run_leaves_no_out_folder(monkeypatch, capsys, tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"\xff\xfe\xfd\n")                  # its only text fails: the run fails
    out = tmp_path / "out"
    code, _, err = run_main(monkeypatch, capsys, "heads", "--file", str(path), "--out", str(out))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert not out.exists()                                   # nor its checkpoint


def test_an_unwritable_out_directory_fails_before_the_work(monkeypatch, capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_main(monkeypatch, capsys, "heads", SENTENCE, "--out", str(blocker / "sub"))
    assert code == 2 and "cannot write" in err
