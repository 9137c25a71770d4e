"""No command writes, deletes or replaces a file outside the folder it was given: a link planted as --out, or at
any sub-folder a command creates or uses (a translation's encoder/ and cross/, a run's checkpoints/ and model/, an
SAE's checkpoints/), is refused in one line before the work starts, and the link's target is left as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import MODELS, run_main

TINY_RUN = ["train", "--task", "induction", "--steps", "4", "--checkpoint-every", "2", "--every", "2", "--layers", "1",
            "--heads", "2", "--d-model", "16", "--batch", "2", "--vocab", "16", "--half", "4", "--min-half", "2"]


def target(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A folder outside the command's, with files in it: what a planted link points at."""
    t = tmp_path / "elsewhere"
    t.mkdir()
    files = {"trace.npz": b"precious", "trace.json": b"{}", "step-00000002.npz": b"keep me", "config.json": b"{}"}
    for name, data in files.items():
        (t / name).write_bytes(data)
    return t, files


def untouched(t: Path, files: dict[str, bytes]) -> bool:
    return {p.name: p.read_bytes() for p in t.iterdir()} == files


def refused(code: int, out: str, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "link" in lines[0], (code, out, err)
    return lines[0]


def test_show_out_as_a_link_is_refused(monkeypatch, capsys, tmp_path):
    t, files = target(tmp_path)
    (tmp_path / "views").symlink_to(t)
    refused(*run_main(monkeypatch, capsys, "show", "the cat sat", "--model", str(MODELS / "gpt2"),
                      "--out", str(tmp_path / "views")))
    assert untouched(t, files)


def planted(tmp_path: Path, name: str, sub: str) -> Path:
    """TMP_PATH/NAME, itself a link to the target (SUB "") or a real folder with a link at NAME/SUB."""
    d = tmp_path / name
    if sub:
        d.mkdir()
    (d / sub if sub else d).symlink_to(tmp_path / "elsewhere")
    return d


@pytest.mark.parametrize("sub", ["", "encoder", "cross"])
def test_a_translations_trace_folders_are_never_links(monkeypatch, capsys, tmp_path, sub):
    t, files = target(tmp_path)
    d = planted(tmp_path, "trace", sub)
    line = refused(*run_main(monkeypatch, capsys, "translate", "나는 학교에 간다", "--model", "ko-en-tiny",
                             "--trace", str(d)))
    assert "qkv does not write through links" in line
    assert untouched(t, files) and (not sub or sorted(p.name for p in d.iterdir()) == [sub])


@pytest.mark.parametrize("sub", ["", "checkpoints", "model"])
def test_a_new_runs_folders_are_never_links(monkeypatch, capsys, tmp_path, sub):
    t, files = target(tmp_path)
    d = planted(tmp_path, "run", sub)
    refused(*run_main(monkeypatch, capsys, *TINY_RUN, "--out", str(d)))
    assert untouched(t, files)


@pytest.mark.parametrize("sub", ["checkpoints", "model"])
def test_resuming_a_run_whose_folder_was_replaced_by_a_link_is_refused(monkeypatch, capsys, tmp_path, sub):
    d = tmp_path / "run"
    code, out, err = run_main(monkeypatch, capsys, *TINY_RUN[:4], "2", *TINY_RUN[5:], "--out", str(d))
    assert code == 0, err
    t, files = target(tmp_path)
    if (d / sub).exists():
        os.rename(d / sub, tmp_path / "moved")
    (d / sub).symlink_to(t)
    refused(*run_main(monkeypatch, capsys, *TINY_RUN, "--out", str(d)))         # 4 steps: it would continue
    assert untouched(t, files)


@pytest.mark.parametrize("out, message", [
    ("/proc/qkv-run", "cannot write to --out /proc/qkv-run"),
    ("dangling", "is a link"),
])
def test_a_run_folder_that_cannot_be_made_is_one_line(monkeypatch, capsys, tmp_path, out, message):
    if out == "dangling":
        (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
        out = str(tmp_path / "dangling")
    code, _, err = run_main(monkeypatch, capsys, *TINY_RUN, "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "nowhere").exists()


def test_an_activation_store_and_an_sae_are_never_written_through_links(monkeypatch, capsys, tmp_path):
    t, files = target(tmp_path)
    (tmp_path / "acts").symlink_to(t)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\n" * 40)
    refused(*run_main(monkeypatch, capsys, "activations", "--model", str(MODELS / "gpt2"), "--layer", "0",
                      "--file", str(corpus), "--tokens", "64", "--out", str(tmp_path / "acts")))
    assert untouched(t, files)
    code, _, err = run_main(monkeypatch, capsys, "activations", "--model", str(MODELS / "gpt2"), "--layer", "0",
                            "--file", str(corpus), "--tokens", "64", "--out", str(tmp_path / "real"))
    assert code == 0, err
    for sae in ("sae", "sae2/checkpoints"):
        (tmp_path / sae).parent.mkdir(exist_ok=True)
        (tmp_path / sae).symlink_to(t)
        refused(*run_main(monkeypatch, capsys, "sae", "train", "--acts", str(tmp_path / "real"), "--latents", "16",
                          "--k", "2", "--batch", "16", "--steps", "2", "--out", str(tmp_path / sae.split("/")[0])))
        assert untouched(t, files)
