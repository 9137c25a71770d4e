"""`qkv show TEXT --out DIR`: figures and the viewer written together, all or nothing."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from qkv.cli.app import cli
from conftest import MODELS, run_main




def test_show_out_writes_figures_and_viewer(tmp_path):
    out = tmp_path / "views"
    r = CliRunner().invoke(cli, ["show", "The cat sat on the mat", "--out", str(out)])
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["attention.html", "pipeline.html", "grid_layer0.png", "grid_layer0.svg", "heatmap_layer0_head2.png",
                            "heatmap_layer0_head2.svg", "overview.png", "overview.svg"])   # no temp folder left
    assert "0:[CLS] 1:the 2:cat" in r.output                          # the terminal view is still printed
    assert f"wrote 8 files to {out} (heatmap of head 2, the most focused of layer 0" in r.output
    for name in names:
        assert f"  {out / name}\n" in r.output
    assert (out / "heatmap_layer0_head2.png").read_bytes().startswith(b"\x89PNG")
    assert "all-MiniLM-L6-v2" in (out / "attention.html").read_text()


def test_show_out_for_a_decoder_and_a_chosen_head(tmp_path):
    r = CliRunner().invoke(cli, ["show", "the cat sat", "--model", str(MODELS / "gpt2"), "--layer", "1",
                                 "--head", "3", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "heatmap_layer1_head3.png").is_file() and (tmp_path / "grid_layer1.svg").is_file()
    assert "(heatmap of head 3):" in r.output
    page = (tmp_path / "pipeline.html").read_text()
    p = json.loads(re.search(r'class="qkv-pipeline-data">(.*?)</script>', page, re.S).group(1))
    assert p["start"]["layer"] == 1 and p["start"]["head"] == 3 and 1 in p["arithmetic"]["layers"]   # opens there


def test_unwritable_out_is_one_line_and_writes_nothing(monkeypatch, capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, out, err = run_main(monkeypatch, capsys, "show", "hi", "--out", str(blocker / "views"))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "cannot write to" in lines[0] and "choose a writable directory" in lines[0]
    assert [p.name for p in tmp_path.iterdir()] == ["file"] and blocker.read_text() == "x"


@pytest.mark.parametrize("args, message", [
    (["", "--out"], "the text is empty"),
    (["word " * 600, "--out"], "at most 512"),
    (["hi", "--layer", "9", "--out"], "layer 9 does not exist"),
])
def test_bad_input_with_out_touches_nothing(monkeypatch, capsys, tmp_path, args, message):
    target = tmp_path / "views"
    code, out, err = run_main(monkeypatch, capsys, "show", *args, str(target))
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err
    assert not target.exists()


def test_a_failing_viewer_leaves_no_partial_files(monkeypatch, capsys, tmp_path):
    import qkv.viz.html

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(qkv.viz.html, "viewer_html", broken)
    fresh, existing = tmp_path / "fresh", tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    for target in (fresh, existing):
        code, _, err = run_main(monkeypatch, capsys, "show", "the cat", "--model", str(MODELS / "bert"),
                                "--out", str(target))
        assert code == 2 and "No space left on device" in err and len(err.strip().splitlines()) == 1
    assert not fresh.exists()                                          # the directory it made is gone
    assert [p.name for p in existing.iterdir()] == ["notes.txt"]       # no figure, no temporary folder


def test_a_long_text_writes_the_viewer_with_each_rows_largest_weights(monkeypatch, tmp_path):
    """Past LONG_TOKENS, --out keeps each query row's largest weights in every layer (as many as --budget-mb
    holds) and the chosen layer's figures; the lens, rollout and the pipeline page are left out."""
    import qkv.viz.payload

    monkeypatch.setattr(qkv.viz.payload, "LONG_TOKENS", 20)
    text = "the cat sat on the mat and the dog ran to the park " * 4            # 48 tokens
    r = CliRunner().invoke(cli, ["show", text, "--model", str(MODELS / "gpt2"), "--layer", "1", "--budget-mb",
                                 "0.01", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "attention.html" in names and "pipeline.html" not in names and any(n.startswith("heatmap_layer1") for n in names)
    assert "the viewer keeps each query row's largest weights" in r.output
    page = (tmp_path / "attention.html").read_text()
    assert '"format":"top"' in page.replace(" ", "") and "largest weights" in page


@pytest.mark.parametrize("args, message", [
    (["word " * 30, "--max-tokens", "10"], "more than --max-tokens 10"),
    (["hi", "--budget-mb", "0"], "--budget-mb must be above 0"),
])
def test_max_tokens_and_budget_are_checked_before_anything_is_written(monkeypatch, capsys, tmp_path, args, message):
    target = tmp_path / "views"
    code, out, err = run_main(monkeypatch, capsys, "show", *args, "--model", str(MODELS / "gpt2"), "--out", str(target))
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not target.exists()
