"""docs/guide.md and guide.ko.md name the same commands, checkpoints and pictures; the pictures exist and stay small;
and every command the guide runs on the repository's tiny checkpoints (tests/fixtures) or on a model qkv trained and
ships (digits-whisper, its examples found by name) runs as written."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from conftest import run_main

ROOT = Path(__file__).resolve().parents[1]
GUIDES = [ROOT / "docs" / "guide.md", ROOT / "docs" / "guide.ko.md"]
MAX_PICTURE = 200 << 10          # bytes: the guide's pictures are small PNGs (docs/make_guide_figures.py)


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def commands(page: str) -> list[str]:
    """Every `qkv …` of PAGE, inline or a line of a code block, its spaces and line breaks made single spaces; and
    the `python -c "…"` lines of its code blocks. In the order they appear."""
    found = []
    for m in re.finditer(r"`(qkv [^`]+)`|^(qkv .+|python -c .+)$", page, re.M):
        found.append(" ".join((m.group(1) or m.group(2)).split()))
    return found


def pictures(page: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\((images/[^)]+)\)", page)


def test_both_guides_name_the_same_commands_checkpoints_and_pictures():
    en, ko = (text(p) for p in GUIDES)
    assert sorted(set(commands(en))) == sorted(set(commands(ko)))
    assert pictures(en) == pictures(ko)
    fixtures = re.compile(r"tests/fixtures/[\w/]+")
    assert sorted(set(fixtures.findall(en))) == sorted(set(fixtures.findall(ko)))


def test_every_picture_and_checkpoint_the_guide_names_exists():
    for path in GUIDES:
        page = text(path)
        shown = pictures(page)
        assert shown, path.name
        for name in shown:
            picture = path.parent / name
            assert picture.is_file(), (path.name, name)
            assert picture.stat().st_size < MAX_PICTURE, (name, picture.stat().st_size)
        for name in set(re.findall(r"tests/fixtures/[\w/]+", page)):
            assert (ROOT / name / "config.json").is_file(), (path.name, name)


SHIPPED = ("--model digits-whisper",)                        # small models inside qkv: their commands run here too


def tiny_commands() -> list[str]:
    """The guide's commands on tests/fixtures checkpoints or shipped small models, with the python lines that make
    their inputs first."""
    found = commands(text(GUIDES[0]))
    return [c for c in found if c.startswith("python -c")] + [
        c for c in found if c.startswith("qkv ") and ("tests/fixtures/" in c or any(m in c for m in SHIPPED))]


def test_the_guide_runs_commands_on_tiny_checkpoints():
    found = tiny_commands()
    assert any("digits-whisper" in c for c in found) and any("esm" in c for c in found)
    assert any("explain linear" in c for c in found)


@pytest.mark.parametrize("command", [c for c in tiny_commands() if c.startswith("qkv ")])
def test_each_command_on_a_tiny_checkpoint_runs_as_written(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)                     # outputs (out/…) live here
    for line in tiny_commands():                    # the guide's own lines make its inputs
        if line.startswith("python -c"):
            exec(shlex.split(line)[2], {})          # noqa: S102 (the guide's text, run as the reader runs it)
    args = [a.replace("tests/fixtures/", f"{ROOT}/tests/fixtures/") for a in shlex.split(command)[1:]]
    code, out, err = run_main(monkeypatch, capsys, *args)
    assert code == 0, (command, err[-300:])
    assert out.strip(), command
    for a in args:                                   # each --out folder was written
        if a.startswith("out/"):
            assert any((tmp_path / a).iterdir()), (command, a)
