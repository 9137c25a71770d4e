"""`qkv bench viewer`: the page `qkv show --out` writes, opened in Chromium for real (a tiny GPT-2 here, a budget
small enough that the longer text keeps each row's largest weights; docs/benchmarks.md has SmolLM2 at 4,096)."""

from __future__ import annotations

from click.testing import CliRunner

from qkv.bench import viewer as vb
from qkv.cli.bench import bench, viewer_command_line
from conftest import MODELS


def test_a_short_run_measures_both_kinds_of_page_and_reports_them(tmp_path):
    model = str(MODELS / "gpt2")
    result = vb.measure((24, 60), repeats=1, model_source=model, budget_mb=0.01)
    small, big = result["rows"]
    assert (small["tokens"], small["format"], small["k"]) == (24, "dense", None)
    assert (big["tokens"], big["format"]) == (60, "top") and 1 <= big["k"] <= 32
    for row in result["rows"]:
        assert row["mb"] > 0 and 0 < row["first_paint_s"] < 300 and row["hover_ms"] > 0 and len(row["loads"]) == 1
    text = vb.markdown(result, viewer_command_line((24, 60), 1, model, 0.01, None))
    assert text.startswith("## The viewer at length\n")
    assert f"| 60 | each row's {big['k']} largest | {big['mb']:.1f} | {big['first_paint_s']:.2f} |" in text
    assert "| 24 | every weight |" in text and "kernel" in text
    assert "qkv bench viewer --model " in text and "--tokens 24 --tokens 60 --repeats 1 --budget-mb 0.01" in text


def test_the_command_writes_its_section(tmp_path):
    out = tmp_path / "b.md"
    r = CliRunner().invoke(bench, ["viewer", "--model", str(MODELS / "gpt2"), "--tokens", "20", "--repeats", "1",
                                   "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "<!-- bench:viewer -->" in out.read_text() and "| 20 | every weight |" in out.read_text()
