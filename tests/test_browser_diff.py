"""The viewer's model-diff panel and the attribution panel's forward methods in a real browser (Debian's
Chromium, Playwright, the network blocked; fixtures as in test_browser.py): `qkv diff --out` writes diff.html
opened on its panel, whose maps have the JSON's shape and whose cells read the JSON's numbers on hover;
`qkv attribute --method shapley --out` states the efficiency sum on its panel."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from test_browser import assert_offline, browser, open_viewer, tab  # noqa: F401  (fixtures)
from test_browser_interpret import hover_cell
from qkv.cli.app import cli

MODEL = str(Path(__file__).parent / "fixtures" / "models" / "llama_gqa")
TEXT = "the cat sat on the mat"


def test_qkv_diff_writes_a_page_whose_maps_read_the_json(tab, tmp_path):
    out = tmp_path / "diff"
    r = CliRunner().invoke(cli, ["diff", TEXT, "--model", MODEL, "--requantize-b", "Q4_0", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "diff.json").read_text(encoding="utf-8"))
    open_viewer(tab, out / "diff.html")
    page = tab.page
    assert tab.state()["view"] == "diff"
    assert page.text_content(".qkv-tab[aria-pressed=true]") == "Model diff"
    L, H, n = len(data["js"]), len(data["js"][0]), len(data["tokens"])
    for name, rows, cols in (("js", L, H), ("kl", L + 1, n), ("far", L + 1, n)):
        d = page.eval_on_selector(f".qkv-heat-diff-{name}", "e => Object.assign({}, e.dataset)")
        assert (int(d["rows"]), int(d["cols"])) == (rows, cols)
    layer, head = data["top_heads"][0]["layer"], data["top_heads"][0]["head"]
    hover_cell(page, ".qkv-heat-diff-js", layer, head)
    text = page.text_content(".qkv-diff .qkv-readout")
    assert text.startswith(f"layer {layer}, head {head}: JS ") and text.endswith(" bits"), text
    assert abs(float(re.findall(r"JS ([-\d.e]+)", text)[0]) - data["js"][layer][head]) <= 1e-3 * data["js"][layer][head]
    hover_cell(page, ".qkv-heat-diff-kl", L, n - 1)
    text = page.text_content(".qkv-diff .qkv-readout")
    assert text.startswith(f"stream row {L}, token {n - 1} ") and "nats" in text
    assert abs(float(re.findall(r"lens KL ([-\d.e]+)", text)[0]) - data["lens_kl"][L][n - 1]) <= 1e-3 * data["lens_kl"][L][n - 1]
    about = page.eval_on_selector_all(".qkv-diff .qkv-about-line", "ls => ls.map(l => l.textContent)")
    assert about[0] == f"A {data['model_a']}" and about[1] == f"B {data['model_b']}"
    assert about[2].startswith(f"moved most L{layer}.H{head} ")
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_a_shapley_attribution_page_states_its_efficiency(tab, tmp_path):
    out = tmp_path / "attr"
    r = CliRunner().invoke(cli, ["attribute", TEXT, "--model", MODEL, "--method", "shapley", "--spans", "words",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "attribute.json").read_text(encoding="utf-8"))
    open_viewer(tab, out / "attribute.html")
    page = tab.page
    assert tab.state()["view"] == "attribute"
    lines = tab.page.eval_on_selector_all(".qkv-attribute .qkv-about-line", "ls => ls.map(l => l.textContent)")
    assert lines[1].startswith("method Shapley values")
    gap = data["logit"] - data["baseline_logit"]
    assert lines[2] == (f"sum baseline {data['baseline']}: Σ scores = {sum(data['scores']):.4f}, "
                        f"z(x) − z(b) = {gap:.4f} (efficiency)")
    toks = page.eval_on_selector_all(".qkv-attr-tok", "ts => ts.map(t => t.textContent)")
    assert toks == data["tokens"]
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)
