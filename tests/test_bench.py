"""The benchmark machinery, without torch and without timing anything real.

No wall-clock assertions: the timing helper runs on a fake clock, and the measurement
itself (`qkv bench forward`) is exercised only up to the point where it needs torch.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from qkv.bench import forward as fwd
from qkv.cli.bench import bench, forward_command
from qkv.bench.common import cpu_snapshot, machine_facts, others_cores, time_interleaved, write_section
from qkv.runtime.errors import QkvError


class FakeClock:
    """A clock that each run advances by a chosen amount: time_interleaved sees exact durations."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_time_interleaved_returns_medians_and_skips_warmup():
    clock = FakeClock()
    durations = {"a": iter([100.0, 1.0, 5.0, 3.0]), "b": iter([100.0, 2.0, 2.0, 8.0])}   # first = warm-up
    order = []

    def run(name):
        def f():
            order.append(name)
            clock.now += next(durations[name])
        return f

    got = time_interleaved({"a": run("a"), "b": run("b")}, repeats=3, warmup=1, clock=clock)
    assert got == {"a": 3.0, "b": 2.0}                     # medians of (1, 5, 3) and (2, 2, 8)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]   # the order rotates every round


def test_cpu_snapshot_counts_this_process():
    snap = cpu_snapshot()
    if snap is None:
        pytest.skip("no /proc/stat here")
    assert snap[1] >= snap[2] >= 0


def test_time_interleaved_settles_before_every_run_without_timing_the_sleep():
    clock, slept = FakeClock(), []

    def sleep(seconds):
        slept.append(seconds)
        clock.now += seconds                                 # sleeping passes time, outside the timing

    def run():
        clock.now += 2.0

    got = time_interleaved({"a": run, "b": run}, repeats=2, warmup=1, clock=clock, settle=0.3, sleep=sleep)
    assert got == {"a": 2.0, "b": 2.0}
    assert slept == [0.3] * 6                                # (1 warm-up + 2) rounds × 2 runs


def test_time_interleaved_needs_a_repeat():
    with pytest.raises(ValueError):
        time_interleaved({"a": lambda: None}, repeats=0)


def test_write_section_creates_the_file(tmp_path):
    path = tmp_path / "docs" / "benchmarks.md"
    write_section(path, "forward", "## Forward\n\nfirst run")
    text = path.read_text()
    assert text.startswith("# Benchmarks\n")
    assert "<!-- bench:forward -->\n## Forward\n\nfirst run\n<!-- /bench:forward -->" in text


def test_write_section_replaces_only_its_own_section(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text("# Benchmarks\n\nIntro prose.\n\n"
                    "<!-- bench:forward -->\nold forward\n<!-- /bench:forward -->\n\n"
                    "Between the sections.\n\n"
                    "<!-- bench:generation -->\ngeneration numbers\n<!-- /bench:generation -->\n\nThe end.\n")
    write_section(path, "forward", "new forward")
    text = path.read_text()
    assert "old forward" not in text and text.count("new forward") == 1
    for kept in ("Intro prose.", "Between the sections.", "generation numbers", "The end."):
        assert kept in text
    assert text.index("new forward") < text.index("Between the sections.")   # stays where it was
    write_section(path, "forward", "new forward")
    assert path.read_text() == text                                           # rewriting is idempotent


def test_write_section_appends_a_missing_section(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text("# Benchmarks\n\n<!-- bench:generation -->\ngen\n<!-- /bench:generation -->\n")
    write_section(path, "forward", "fwd")
    text = path.read_text()
    assert text.index("gen\n") < text.index("<!-- bench:forward -->\nfwd\n<!-- /bench:forward -->")


def test_write_section_body_with_backslashes_is_kept_verbatim(tmp_path):
    path = tmp_path / "benchmarks.md"
    write_section(path, "forward", "old")
    write_section(path, "forward", r"C:\new \1 \g<0>")
    assert r"C:\new \1 \g<0>" in path.read_text()


def test_machine_facts_report_the_openblas_variables_without_touching_them(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Prescott")
    monkeypatch.delenv("OPENBLAS_L2_SIZE", raising=False)
    facts = machine_facts()
    assert facts["env"] == {"OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_L2_SIZE": None}
    assert "numpy" in facts and "internal_api" in facts["blas"]


def test_others_cores_is_the_machines_cpu_time_minus_ours_over_wall_time():
    start, end = (10.0, 500.0, 3.0), (20.0, 522.0, 20.0)     # (wall, machine CPU s, our CPU s)
    assert others_cores(start, end) == pytest.approx(0.5)    # (22 - 17) / 10
    assert others_cores(start, (20.0, 510.0, 20.0)) == 0.0   # clock granularity never goes negative
    assert others_cores(None, end) is None


def result_dict() -> dict:
    """What `measure` returns, with made-up numbers."""
    return {
        "model": dict(fwd.GPT2_SMALL, parameters=124_439_808, dtype="float32", batch=1, seed=0),
        "machine": {"cpu": "Test CPU", "cores": 2, "python": "3.11.7", "numpy": "2.4.6",
                    "blas": {"internal_api": "openblas", "version": "0.3.31", "architecture": "Haswell",
                             "num_threads": 2},
                    "env": {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": "1048576"},
                    "torch": {"version": "2.13.0+cpu", "threads": 2, "cpu_capability": "AVX2"},
                    "transformers": "5.24.0"},
        "others_cores": 0.04,
        "repeats": 7, "warmup": 1, "settle_s": 0.3,
        "rows": [{"tokens": 128, "qkv_ms": 210.4, "transformers_ms": 350.0, "ratio": 0.601, "eager_ms": 360.0,
                  "max_abs_logits": 3e-6},
                 {"tokens": 512, "qkv_ms": 1000.0, "transformers_ms": 1400.0, "ratio": 0.714, "eager_ms": 1500.0,
                  "max_abs_logits": 4e-6}],
    }


def test_markdown_has_the_table_the_facts_and_the_command():
    text = fwd.markdown(result_dict(), command="qkv bench forward --out docs/benchmarks.md")
    assert text.startswith("## Forward (prefill)")
    assert "| 128 | 210 | 350 | 0.60× | 360 | 0.58× |" in text
    assert "| 512 | 1000 | 1400 | 0.71× | 1500 | 0.67× |" in text
    assert "max abs difference 4.0e-06" in text                       # the worst row
    assert "with 0.3 s of sleep before each run" in text
    assert "kernel Haswell, 2 threads" in text and "torch 2.13.0+cpu (2 threads" in text
    assert "OPENBLAS_CORETYPE=unset, OPENBLAS_L2_SIZE=1048576" in text
    assert "Other processes kept 0.04 cores busy" in text
    assert "```sh\nqkv bench forward --out docs/benchmarks.md\n```" in text


def test_markdown_without_eager_has_four_columns():
    result = result_dict()
    for row in result["rows"]:
        del row["eager_ms"]
    text = fwd.markdown(result)
    assert "eager" not in text and "| 128 | 210 | 350 | 0.60× |" in text


def test_the_documented_command_reproduces_the_options():
    assert forward_command(fwd.TOKENS, fwd.REPEATS, True, "docs/benchmarks.md") == fwd.COMMAND
    assert forward_command((64,), 3, False, None) == "qkv bench forward --tokens 64 --repeats 3 --no-eager"


def test_importing_the_bench_cli_does_not_import_torch():
    code = ("import sys, qkv.cli.bench, qkv.bench.forward; "
            "print([m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_without_transformers_the_command_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)          # `import torch` now raises ImportError
    r = CliRunner().invoke(bench, ["forward", "--tokens", "8"])
    assert isinstance(r.exception, QkvError)
    message = str(r.exception)
    assert "\n" not in message and "make bench" in message and "pip install torch==2.13.0 transformers" in message


def test_a_length_beyond_the_context_is_a_user_error(monkeypatch):
    monkeypatch.setattr(fwd, "reference_stack", lambda: (None, None))   # get past the import check
    with pytest.raises(QkvError, match="outside 1..1024"):
        fwd.measure(tokens=(2048,))


# ── the pieces every report is built from (bench/markdown.py) ───────────────────

from qkv.bench import markdown as md  # noqa: E402
from qkv.bench.common import time_rounds  # noqa: E402


def test_table_aligns_each_column_as_asked():
    assert md.table(["name", "n"], [["a", "1"], ["b", "22"]], "lr") == [
        "| name | n |", "|---|---:|", "| a | 1 |", "| b | 22 |"]


def test_background_is_labelled_and_targets_say_met_or_not():
    assert md.background("found earlier.").startswith("*Background, not measured in this run:* ")
    assert md.target("≥ 2×", 2.5, 2.0, "2.50×") == "≥ 2× (here 2.50×: met)"
    assert md.target("≥ 2×", 1.5, 2.0, "1.50×") == "≥ 2× (here 1.50×: not met)"


def test_join_separates_paragraphs_and_keeps_line_groups_together():
    assert md.join("a", None, ["b", "c"], [], "d") == "a\n\nb\nc\n\nd"


def test_time_rounds_keeps_every_round_and_interleaved_takes_their_median():
    clock = FakeClock()
    steps = iter([9.0, 1.0, 4.0, 2.0])                        # the first is the warm-up

    def run():
        clock.now += next(steps)

    assert time_rounds({"a": run}, repeats=3, warmup=1, clock=clock) == {"a": [1.0, 4.0, 2.0]}


def test_the_forward_report_labels_what_it_did_not_measure():
    text = fwd.markdown(result_dict())
    for sentence in ("OpenBLAS keeps its threads spinning", "slows down far more than torch"):
        line = next(p for p in text.split("\n\n") if sentence in p)
        assert "*Background, not measured in this run:*" in line


# ── qkv bench tune / qkv bench all ───────────────────────────────────────────────

def test_bench_tune_measures_stores_and_prints(monkeypatch, tmp_path):
    from qkv.runtime import tuning

    monkeypatch.setenv("QKV_CACHE", str(tmp_path))
    monkeypatch.delenv(tuning.ENV, raising=False)
    made = tuning.Choices(decode=2, prefill=1, attention=2, q_block=64, k_block=512, source="measured")
    monkeypatch.setattr(tuning, "measure", lambda: (made, {"decode": {1: 0.002, 2: 0.001}}))
    try:
        r = CliRunner().invoke(bench, ["tune"])
        assert r.exit_code == 0, r.output
        assert "decode: 2 BLAS thread(s)" in r.output and "q_block: 64, k_block: 512" in r.output
        assert tuning.read_cache(tmp_path / tuning.FILE).numbers() == made.numbers()
        assert tuning.choices().numbers() == made.numbers()             # this process uses them from now on
    finally:
        tuning.forget()


def test_bench_all_names_only_options_its_commands_have():
    from qkv.cli.bench import all_commands

    titles = [t for t, _, _ in all_commands()]
    assert titles[0] == "tune"
    assert {t.split()[0] for t in titles} >= {"forward", "generate", "attention", "train", "heads", "patch"}
    assert "forward --model smollm2" in titles and "generate --model smollm2" in titles
    for title, command, options in all_commands():
        params = {p.name for p in command.params}
        assert set(options) <= params, title
        if title != "tune":
            assert "out" in params, title


def test_bench_all_runs_each_benchmark_with_out_and_skips(monkeypatch, tmp_path):
    import click

    from qkv.cli import bench as cli

    ran = []

    def fake(title):
        @click.command()
        @click.option("--out", default=None)
        @click.option("--plot", "plot_path", default=None)
        @click.option("--sizes", multiple=True, type=int)
        def command(**kwargs):
            ran.append((title, kwargs))
        return command
    real = cli.all_commands()
    monkeypatch.setattr(cli, "all_commands", lambda: [(t, fake(t), dict(o)) for t, _, o in real])
    out = str(tmp_path / "b.md")
    r = CliRunner().invoke(bench, ["all", "--out", out, "--plot", "p.png", "--skip", "patch", "--skip", "heads"])
    assert r.exit_code == 0, r.output
    titles = [t for t, _ in ran]
    assert titles == [t for t, _, _ in real if t.split()[0] not in ("patch", "heads")]
    for title, kwargs in ran:
        assert kwargs.get("out") == (None if title == "tune" else out)
    attention = dict(ran)["attention"]
    assert attention["plot_path"] == "p.png" and max(attention["sizes"]) <= 8192
    r = CliRunner().invoke(bench, ["all", "--skip", "nothing"])
    assert isinstance(r.exception, QkvError) and "--skip nothing" in str(r.exception)
