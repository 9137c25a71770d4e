"""`qkv rollout`: raw attention, attention rollout and attention flow side by side.

Checked: the printed strongest source of every position equals the argmax of the computed
raw attention (last layer, mean of heads), rollout R_L and flow, with its value to 2 decimals,
on MiniLM (encoder) and SmolLM2 (decoder); the figure's panels hold exactly those arrays and
flow ≥ rollout in every cell (rollout is one feasible flow; 1e-12); PNG + SVG written; user
mistakes are one line and exit 2, leaving no output folder behind.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
import qkv.viz.drawing
from conftest import run_main
from qkv.analysis import attention_flow, attention_rollout

TOL = 1e-12


def table_rows(stdout: str) -> list[list[tuple[int, str, float]]]:
    """The table's rows: per position, the (index, label, value) of each column after the token."""
    rows = []
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) < 4 or not cells[0].isdigit():
            continue
        assert int(cells[0]) == len(rows)
        parsed = []
        for cell in cells[2:]:
            j, label, value = cell.split(" ")
            parsed.append((int(j), label, float(value)))
        rows.append(parsed)
    return rows


def expected(model, text: str, flow: bool) -> tuple[list[str], list[np.ndarray]]:
    trace = model.run(text, keep=("attentions",))
    raw = trace.attentions[-1].astype(np.float64).mean(axis=0)                 # (n, n)
    arrays = [raw, attention_rollout(trace)[-1]] + ([attention_flow(trace)] if flow else [])
    return trace.labels, arrays


@pytest.mark.parametrize("source, text", [("minilm", "The cat sat on the mat."),
                                          ("smollm2", "When Mary and John went to the store")])
def test_printed_sources_are_the_argmax_of_raw_rollout_and_flow(monkeypatch, capsys, source, text):
    code, stdout, err = run_main(monkeypatch, capsys, "rollout", text, "--model", source, "--flow")
    assert code == 0, err
    labels, arrays = expected(qkv.load(source), text, flow=True)
    rows = table_rows(stdout)
    assert len(rows) == len(labels)
    for i, row in enumerate(rows):
        assert len(row) == 3
        for (j, label, value), m in zip(row, arrays):
            assert j == int(np.argmax(m[i])) and label == labels[j]
            assert value == pytest.approx(m[i, j], abs=0.005)


def test_without_flow_two_columns(monkeypatch, capsys):
    code, stdout, err = run_main(monkeypatch, capsys, "rollout", "A small test.")
    assert code == 0, err
    assert "flow" not in stdout
    labels, (raw, R) = expected(qkv.load("minilm"), "A small test.", flow=False)
    rows = table_rows(stdout)
    assert [[j for j, _, _ in row] for row in rows] == [[int(raw[i].argmax()), int(R[i].argmax())]
                                                         for i in range(len(labels))]


@pytest.fixture
def figures(monkeypatch):
    """Every figure `qkv` saves through viz.drawing.save_figure, still written to disk."""
    saved = []
    original = qkv.viz.drawing.save_figure

    def keep(fig, out_dir, name, *args, **kwargs):
        saved.append((name, fig))
        return original(fig, out_dir, name, *args, **kwargs)

    monkeypatch.setattr(qkv.viz.drawing, "save_figure", keep)
    return saved


@pytest.mark.parametrize("source, text, causal", [("minilm", "Rollout follows attention.", False),
                                                  ("smollm2", "The capital of France is", True)])
def test_figure_holds_the_three_arrays_and_flow_is_at_least_rollout(monkeypatch, capsys, tmp_path, figures,
                                                                    source, text, causal):
    out = tmp_path / "fig"
    code, stdout, err = run_main(monkeypatch, capsys, "rollout", text, "--model", source, "--flow", "--out", str(out))
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["rollout.html", "rollout.png", "rollout.svg"]
    assert (out / "rollout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "rollout.svg").read_text()[:200].lstrip().startswith("<?xml")
    [(name, fig)] = figures
    assert name == "rollout"
    panels = [ax.images[0].get_array() for ax in fig.axes if ax.images]      # raw, rollout, flow
    assert len(panels) == 3
    _, arrays = expected(qkv.load(source), text, flow=True)
    n = len(arrays[0])
    for shown, m in zip(panels, arrays):
        assert shown.shape == (n, n)
        assert np.abs(np.ma.getdata(shown) - m).max() <= TOL
        assert np.array_equal(np.ma.getmaskarray(shown), np.triu(np.ones((n, n), bool), 1) if causal
                              else np.zeros((n, n), bool))                    # a decoder's later tokens grey
    raw, R, F = (np.ma.getdata(p) for p in panels)
    assert (F >= R - TOL).all() and (F <= 1 + TOL).all()
    assert not np.allclose(F, R)                                              # the panels do differ


def test_without_flow_the_figure_has_two_panels(monkeypatch, capsys, tmp_path, figures):
    code, _, err = run_main(monkeypatch, capsys, "rollout", "Two panels.", "--out", str(tmp_path / "f"))
    assert code == 0, err
    [(_, fig)] = figures
    assert sum(1 for ax in fig.axes if ax.images) == 2


@pytest.mark.parametrize("args, message", [
    (("rollout", "The capital of France is a city on the river Seine, famous for its tower and its museums",
      "--model", "smollm2", "--flow"), "too slow"),
    (("rollout", ""), "empty"),
    (("rollout", "Hi", "--model", "no-such-model"), "no model"),
])
def test_mistakes_are_one_line_and_leave_no_folder(monkeypatch, capsys, tmp_path, args, message):
    out = tmp_path / "never"
    code, stdout, err = run_main(monkeypatch, capsys, *args, "--out", str(out))
    assert code == 2 and err.startswith("qkv: error:") and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_unwritable_out_fails_before_the_work(monkeypatch, capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, stdout, err = run_main(monkeypatch, capsys, "rollout", "Hi", "--out", str(blocker / "sub"))
    assert code == 2 and err.startswith("qkv: error: cannot write") and stdout == ""
