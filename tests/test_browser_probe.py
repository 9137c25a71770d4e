"""The viewer's probe panel (`qkv probe --out` writes probe.html, viz.probe_panel): the page's data equals the
ProbeReport Python computes, hovering a layer's row reads its numbers, a hostile label and text stay text, no request
leaves the page. In a real browser as test_browser.py (Debian's Chromium, the network blocked); the section
builder's own checks without one."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

import qkv
from conftest import MODELS
from test_browser import assert_offline, browser, open_viewer, tab  # noqa: F401  (fixtures)
from test_viewer import XSS, data_of
from qkv.analysis.probes import probe_layers
from qkv.cli.app import cli
from qkv.runtime.errors import QkvError
from qkv.viz.probe_panel import probe_section

MODEL = MODELS / "llama_gqa"
WORDS = {XSS: [f"{XSS} the cat is sad", "a day so bad", "what a mess", "awful weather", "the dog is angry"],
         "plain": ["the cat is happy", "a day so good", "what a joy", "lovely weather", "the dog is glad"]}
TEXTS = [t for ts in WORDS.values() for t in ts]
LABELS = [label for label, ts in WORDS.items() for _ in ts]


def numbers(text: str) -> list[float]:
    return [float(x.replace("−", "-")) for x in re.findall(r"[−+]?\d+\.\d+", text)]


def test_probe_page_holds_the_reports_numbers_and_reads_them_on_hover(tab, tmp_path):
    data = tmp_path / "probe.tsv"
    data.write_text("".join(f"{t}\t{y}\n" for t, y in zip(TEXTS, LABELS)), encoding="utf-8")
    out = tmp_path / "probes"
    r = CliRunner().invoke(cli, ["probe", "--model", str(MODEL), "--data", str(data), "--out", str(out)])
    assert r.exit_code == 0, r.output
    model = qkv.load(MODEL)
    report = probe_layers(model, TEXTS, LABELS, range(model.config.n_layers))
    P = data_of((out / "probe.html").read_text(encoding="utf-8"))["probe"]
    assert P["layers"] == sorted(report.layers) and P["labels"] == report.labels == sorted(WORDS)
    for key in ("accuracy", "control_accuracy", "selectivity", "train_accuracy"):
        assert P[key] == pytest.approx([getattr(report.layers[l], key) for l in P["layers"]], abs=1e-6), key
    assert P["majority"] == pytest.approx(report.majority, abs=1e-6)
    assert (P["n_train"], P["n_test"], P["text"]) == (report.n_train, report.n_test, TEXTS[0])   # the file's first
    assert P["positions"] == len(model.run(TEXTS[0]).labels)

    open_viewer(tab, out / "probe.html")
    page = tab.page
    assert tab.state()["view"] == "probe"
    assert page.text_content(".qkv-tab[aria-pressed=true]") == "Probes"
    rows = page.eval_on_selector_all(".qkv-probe-row", "rs => rs.map(r => r.dataset.layer)")
    assert rows == [str(l) for l in P["layers"]]
    about = page.eval_on_selector_all(".qkv-probe .qkv-about-line", "ls => ls.map(l => l.textContent)")
    assert about[1] == f"labels {XSS} / plain"                                  # the hostile label, as text
    assert about[-1] == f"attention the other tabs show “{TEXTS[0]}”"
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0
    for layer, probe in report.layers.items():
        page.hover(f".qkv-probe-row[data-layer='{layer}']")
        text = page.text_content(".qkv-probe .qkv-readout")
        assert text.startswith(f"layer {layer}: accuracy "), text
        shown = numbers(text.split(":", 1)[1])                                   # accuracy, control, selectivity, train
        want = [probe.accuracy, probe.control_accuracy, probe.selectivity, probe.train_accuracy]
        assert shown == pytest.approx(want, abs=5e-4 + 1e-9), (text, want)       # 3 decimals shown
        assert page.get_attribute(f".qkv-probe-row[data-layer='{layer}']", "class") == "qkv-probe-row qkv-chosen"
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_the_section_orders_the_layers_and_refuses_an_empty_report():
    report = {"model": "m", "labels": ["a", "b"], "n_train": 6, "n_test": 2, "position": "last", "majority": 0.5,
              "layers": [{"layer": 3, "accuracy": 1.0, "train_accuracy": 1.0, "control_accuracy": 0.5,
                          "selectivity": 0.5},
                         {"layer": 1, "accuracy": 2 / 3, "train_accuracy": 0.75, "control_accuracy": 0.75,
                          "selectivity": 2 / 3 - 0.75}]}
    P = probe_section(report, text="t", positions=4)
    assert P["layers"] == [1, 3] and P["accuracy"] == [0.666667, 1.0] and P["selectivity"] == [-0.083333, 0.5]
    assert P["point"] == "residual_out" and P["positions"] == 4
    with pytest.raises(QkvError, match="no layer"):
        probe_section({**report, "layers": []}, text="t", positions=4)
