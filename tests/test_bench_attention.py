"""qkv bench attention: FLOP counts, which sizes run, memory probes, the docs section and figure (no torch)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from qkv import QkvError
from qkv.core.attention import causal_mask, sliding_window_mask
from qkv.bench import attention as ab
from qkv.cli import bench as bench_cli
from qkv.bench import attention_report as ar

H, D = ab.HEADS, ab.D_HEAD


def test_flops_count_four_per_visible_pair_and_dimension():
    n = 1024
    assert ab.flops(n, causal=False) == 4 * n * n * D * H
    assert ab.flops(n, causal=True) == 2 * n * n * D * H
    for n, w in ((3, 2), (50, 7), (40, 40), (30, 64)):            # window: exactly the pairs it sees
        pairs = sliding_window_mask(n, w).sum()
        if n <= w:
            assert pairs == causal_mask(n).sum()
            assert ab.flops(n, True, "window", window=w) == 2 * n * n * D * H   # counted like causal
        else:
            assert ab.flops(n, True, "window", window=w) == 4 * pairs * D * H


def test_predicted_time_scales_from_the_largest_smaller_size():
    measured = {512: 0.1, 1024: 0.5}
    assert ab.predict_seconds(measured, 2048, 2) == pytest.approx(2.0)       # 0.5 · 2²
    assert ab.predict_seconds(measured, 4096, 1) == pytest.approx(2.0)       # 0.5 · 4
    assert ab.predict_seconds(measured, 256, 2) is None                      # nothing smaller
    assert ab.predict_seconds({}, 2048, 2) is None


def test_skip_reasons():
    assert ab.skip_reason("tiled", 65536, True, 100.0, 1200, True) is None
    assert ab.skip_reason("tiled", 65536, True, 2000.0, 1200, True) == "skipped: ~2000 s predicted"
    assert ab.skip_reason("window", 4096, False, None, 1200, True) == "n/a"
    assert ab.skip_reason("torch", 4096, True, None, 1200, False) == "no torch"
    assert ab.plain_bytes(16384) == 4 * H * 16384 ** 2
    assert ab.skip_reason("plain", 16384, True, None, 1200, True) == "skipped: needs 13 GB"
    assert ab.skip_reason("plain", 8192, True, None, 1200, True) is None       # 3.2 GB: runs


def test_memory_probe_sees_the_score_matrix_of_plain_and_not_of_tiled():
    """In fresh processes: plain holds H·n² scores, tiled a few blocks (n = 2048: 201 MB of scores)."""
    n = 2048
    plain = ab.probe_in_subprocess("plain", n, causal=True)
    tiled = ab.probe_in_subprocess("tiled", n, causal=True)
    assert plain["seconds"] > 0 and tiled["seconds"] > 0
    assert plain["peak_bytes"] >= ab.plain_bytes(n)
    assert tiled["peak_bytes"] < ab.plain_bytes(n) / 4


def test_each_method_computes_the_same_attention():
    n = 300
    arrays = ab.inputs(n)
    plain = ab.call("plain", n, True, arrays=arrays)()[0]
    tiled = ab.call("tiled", n, True, arrays=arrays)()
    window = ab.call("window", n, True, window=n, arrays=arrays)()        # a window as long as n: causal
    assert np.max(np.abs(tiled - plain)) < 1e-5 and np.max(np.abs(window - plain)) < 1e-5
    with pytest.raises(ValueError):
        ab.call("cuda", n, True, arrays=arrays)


def fake_result(torch: bool = True) -> dict:
    def r(s, n, causal, method, mb):
        return {"seconds": s, "peak_bytes": mb * 1e6, "rounds": 3, "gflops": ab.flops(n, causal, method) / s / 1e9}

    rows = []
    for causal in (True, False):
        for n, tp, tt in ((512, 0.01, 0.02), (2048, 0.5, 0.2)):
            methods = {"plain": r(tp, n, causal, "plain", 200), "tiled": r(tt, n, causal, "tiled", 20),
                       "window": r(tt, n, causal, "window", 20) if causal else {"skipped": "n/a"},
                       "torch": r(tt / 1.2, n, causal, "torch", 5) if torch else {"skipped": "no torch"}}
            rows.append({"n": n, "causal": causal, "methods": methods})
    rows[-1]["methods"]["plain"] = {"skipped": "skipped: needs 13 GB"}
    return {"shape": {"heads": H, "d_head": D, "batch": 1, "window": 1024, "dtype": "float32"},
            "machine": {"cpu": "Test CPU", "cores": 2, "python": "3.11", "numpy": "2.0",
                        "blas": {"internal_api": "openblas", "version": "0.3", "architecture": "Haswell",
                                 "num_threads": 2},
                        "env": {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": "1000000"}},
            "matmul_gflops": 60.0, "repeats": 3, "rows": rows, "torch": torch}


def test_crossover_is_where_tiled_stays_faster():
    res = fake_result()
    assert ar.crossover(res["rows"], causal=True) == 2048            # slower at 512, faster at 2048
    assert ar.ratio(res["rows"][1], "tiled", "plain") == pytest.approx(0.4)
    assert ar.ratio(res["rows"][3], "tiled", "plain") is None       # plain skipped


def test_markdown_section():
    linear = {"model": "MiniLM", "tokens": 60, "causal": False,
              "layers": [{"layer": 0, "relative_error": 0.5, "worst_relative_error": 0.9, "cosine": 0.8}]}
    text = ar.markdown(fake_result(), command="qkv bench attention --sizes 512", plot_path="images/a.png",
                       linear=linear, threshold_note="Tiled beats plain from n = 2048.")
    assert text.startswith("## Attention at length")
    assert "| 2048 | 0.500 s · 13 GF/s · 200 MB | 0.200 s · 32 GF/s · 20 MB |" in text
    assert "skipped: needs 13 GB" in text and "| 0.40× | 1.20× |" in text
    assert "![time and memory against n](images/a.png)" in text and "Tiled beats plain from n = 2048." in text
    assert "| 0 | 0.500 | 0.900 | 0.800 |" in text
    assert "OPENBLAS_CORETYPE=unset, OPENBLAS_L2_SIZE=1000000" in text and "qkv bench attention --sizes 512" in text
    bare = ar.markdown(fake_result(torch=False))
    assert "torch is not installed" in bare and "| tiled / torch |" not in bare


def test_plot_writes_a_png(tmp_path):
    path = ar.plot(fake_result(), tmp_path / "images" / "scaling.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("images/*.tmp*"))


def test_command_line_names_only_changed_options():
    assert bench_cli.attention_command_line(ab.SIZES, ab.REPEATS, ab.MAX_SECONDS, ab.WINDOW, None, None) == \
        "qkv bench attention"
    assert bench_cli.attention_command_line((512, 1024), 5, 60.0, 256, "docs/b.md", "docs/p.png") == (
        "qkv bench attention --sizes 512 --sizes 1024 --repeats 5 --max-seconds 60 --window 256 "
        "--out docs/b.md --plot docs/p.png")


def test_linear_attention_on_real_activations():
    res = ab.linear_vs_softmax("The cat sat on the mat because it was warm.")
    assert [la["layer"] for la in res["layers"]] == list(range(6)) and not res["causal"]
    for la in res["layers"]:
        assert 1e-3 < la["relative_error"] <= la["worst_relative_error"] and 0 < la["cosine"] <= 1 + 1e-6


def test_command_end_to_end_without_torch(tmp_path, monkeypatch):
    monkeypatch.setattr(ab, "have_torch", lambda: False)
    out, png = tmp_path / "benchmarks.md", tmp_path / "images" / "att.png"
    out.write_text("# Benchmarks\n\nprose kept\n")
    args = ["--sizes", "64", "--sizes", "128", "--repeats", "1", "--window", "32", "--no-linear",
            "--out", str(out), "--plot", str(png)]
    result = CliRunner().invoke(bench_cli.attention_command, args)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "prose kept" in text and text.count("<!-- bench:attention -->") == 1
    assert "torch is not installed" in text and "![time and memory against n](images/att.png)" in text
    assert "| 128 |" in text and png.read_bytes()[:4] == b"\x89PNG"


def test_bad_plot_path_is_a_user_error(tmp_path):
    result = CliRunner().invoke(bench_cli.attention_command, ["--sizes", "64", "--plot", str(tmp_path / "a.svg")])
    assert isinstance(result.exception, QkvError) and "must name a .png file" in str(result.exception)
    assert not list(tmp_path.iterdir())


def test_the_report_takes_the_exp_time_and_the_load_from_its_run():
    res = fake_result()
    res["exp_ns"], res["others_cores"] = 0.5, 0.3
    text = ar.markdown(res)
    # not causal, n = 2048: 0.2 s × 2 cores over 12 · 2048² scores = 7.95 ns a score; 0.5 / 7.95 = 6 %
    assert "exp took 0.50 ns an element on one core in this run" in text
    assert "tiled spent 7.95 ns of one core a score, so exp alone is about 6% of it" in text
    assert "Other processes kept 0.30 cores busy" in text
    for fixed in ("1.3 ns", "AVX2", "two full runs", "1.5–2×"):
        assert fixed not in text
    assert "*Background, not measured in this run:* with BLAS's own threads" in text


def test_the_threshold_note_says_what_this_run_found_and_labels_the_rest():
    note = ar.threshold_note(fake_result())
    assert note.startswith("Tiled beats plain causal from n = 2048, not causal: not faster at the sizes measured "
                           "in this run.")
    assert "*Background, not measured in this run:* that threshold was set from an earlier run" in note


def test_exp_time_is_a_positive_rate():
    assert 0.01 < ab.exp_ns(size=1 << 16, repeats=1) < 100
