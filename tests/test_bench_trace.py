"""`qkv bench trace`: what --trace adds to a chat reply, measured for real on SmolLM2 (a short reply here;
docs/benchmarks.md has the 137-token run), and its report."""

from __future__ import annotations

from click.testing import CliRunner

from qkv.bench import trace as trb
from qkv.cli.bench import bench, trace_command_line


def test_a_short_run_times_both_sides_and_reports_the_ratio_against_the_target(tmp_path):
    result = trb.measure(new_tokens=3, repeats=1, lens=True)
    assert result["tokens"][1] == 3 and result["ratio"] == result["traced_s"] / result["plain_s"]
    assert result["lens_ratio"] == result["lens_s"] / result["plain_s"]
    assert set(result["rounds"]) == {"plain", "traced", "lens"} and all(len(v) == 1 for v in result["rounds"].values())
    assert list(result["parts"]) == ["trace from the recording", "rollout", "trace.npz + trace.json", "attention.html"]
    assert set(result["bytes"]) == {"trace.npz", "trace.json", "attention.html"} and result["bytes"]["trace.npz"] > 0
    text = trb.markdown(result, trace_command_line(3, 1, True, None))
    assert text.startswith("## Tracing a generation\n")
    assert f"| `qkv chat --trace DIR` | {result['traced_s']:.2f} | **{result['ratio']:.2f}×** |" in text
    assert "| `qkv chat --trace DIR --lens` |" in text
    assert f"Target: --trace ≤ 1.2× the plain reply (here {result['ratio']:.2f}×: " in text
    assert ("met)" if result["ratio"] <= 1.2 else "not met)") in text
    assert "kernel" in text and "qkv bench trace --new-tokens 3 --repeats 1" in text


def test_the_command_writes_its_section(tmp_path):
    out = tmp_path / "b.md"
    r = CliRunner().invoke(bench, ["trace", "--new-tokens", "2", "--repeats", "1", "--no-lens", "--out", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "<!-- bench:trace -->" in text and "--lens` |" not in text
    assert "qkv bench trace --new-tokens 2 --repeats 1 --no-lens --out" in text
