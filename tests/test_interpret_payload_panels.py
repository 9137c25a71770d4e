"""The viewer's attribution and causal-tracing sections (`viz.interpret_payload.attribute_section`,
`causal_section`, `analysis.sections.attribute_payload`), the causal-tracing figure
(`viz.causal_figures.causal_trace_figure`), and the colours they share with the figures
(`viz.palette`: the stops the page interpolates are matplotlib's maps).

The causal-tracing JSON is synthetic here (`causal_data`: shaped as `qkv trace-fact --out` writes it);
the attribution is a real one, of the GPT-2 fixture and of ko-en-tiny.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

import qkv
from conftest import MODELS
from test_viewer import XSS, data_of, random_trace
from qkv.analysis.input_attribution import attribute
from qkv.analysis.sections import attribute_payload
from qkv.runtime.errors import QkvError
from qkv.models.seq2seq import DecoderView
from qkv.viz import palette
from qkv.viz.causal_figures import causal_trace_figure
from qkv.viz.drawing import save_all
from qkv.viz.html import viewer_html
from qkv.viz.interpret_payload import (CAUSAL_DECIMALS, CAUSAL_KINDS, SCORE_DIGITS, attribute_section,
                                       causal_scale, causal_section)

ASSETS = Path(qkv.__file__).parent / "viz" / "assets"


def causal_data(L: int = 4, n: int = 6, tokens: list[str] | None = None, span=(1, 3), seed: int = 0) -> dict:
    """A causal-tracing JSON as `qkv trace-fact --out` writes it, with random tables (P in 0.05..0.9)."""
    rng = np.random.default_rng(seed)
    tokens = tokens or ["The", XSS, "␣Tower", "␣is", "␣in", "␣the"][:n]
    return {"model": "test-model", "text": "The " + XSS + " Tower is in the", "subject": XSS + " Tower",
            "subject_span": list(span), "tokens": tokens, "answer": 42, "answer_token": "␣Paris",
            "p_clean": 0.8, "p_corrupted": 0.1, "noise": 0.13404731657334582, "draws": 10, "seed": 3, "window": 3,
            "tables": {k: (0.05 + 0.85 * rng.random((L, n))).tolist() for k in CAUSAL_KINDS},
            "other": "ignored"}


def interpolate(stops, t: float) -> np.ndarray:
    """The colour at t in [0, 1] of a map linear between equally spaced STOPS (what the page computes)."""
    stops = np.asarray(stops, dtype=np.float64)
    x = np.clip(t, 0, 1) * (len(stops) - 1)
    k = min(int(np.floor(x)), len(stops) - 2)
    return stops[k] * (1 - (x - k)) + stops[k + 1] * (x - k)


# ── the colours: the page's stops are matplotlib's maps ─────────────────────────

@pytest.mark.parametrize(("name", "stops"), [(palette.DIVERGING, palette.DIVERGING_STOPS)] +
                         [(palette.CAUSAL_CMAPS[k], palette.CAUSAL_STOPS[k]) for k in CAUSAL_KINDS])
def test_the_pages_stops_draw_the_figures_colours(name, stops):
    from matplotlib import colormaps

    cmap = colormaps[name]
    for t in np.linspace(0, 1, 101):
        want = np.asarray(cmap(float(t))[:3]) * 255                       # its 256-entry table: ±1 entry
        assert np.abs(interpolate(stops, t) - want).max() <= 4.0, (name, t)
    assert np.abs(interpolate(stops, 0.5 if name == palette.DIVERGING else 0.0) - 247).max() <= 8   # white at "none"


def test_the_patching_panel_holds_the_same_diverging_stops():
    js = (ASSETS / "viewer_panels.js").read_text(encoding="utf-8")
    rdbu = json.loads(re.search(r"const RDBU = (\[\[.*?\]\]);", js, re.S).group(1))
    assert [tuple(c) for c in rdbu] == list(palette.DIVERGING_STOPS)


# ── the attribution section ─────────────────────────────────────────────────────

def test_attribute_section_keeps_the_attribution_and_its_scale():
    model = qkv.load(MODELS / "gpt2")
    a = attribute(model, "the cat sat on", method="ig", steps=8)
    s = attribute_payload(a)
    assert s == attribute_section(a.to_json())
    assert (s["tokens"], s["ids"], s["method"], s["steps"], s["target"]) == (a.tokens, a.ids, "ig", 8, a.target)
    assert np.allclose(s["scores"], a.scores, rtol=10.0 ** -(SCORE_DIGITS - 1), atol=0)
    assert s["scores"] == [float(f"{x:.6g}") for x in a.scores]
    assert s["max"] == pytest.approx(np.abs(a.scores).max()) and s["sum"] == pytest.approx(a.scores.sum())
    assert s["completeness_error"] == pytest.approx(a.completeness) and s["baseline_logit"] == a.baseline_logit
    assert s["sides"] is None and s["colours"] == [list(c) for c in palette.DIVERGING_STOPS]
    trace = model.run("the cat sat on", keep=("attentions",))
    data = data_of(viewer_html(trace, sections={"attribute": s}, view="attribute"))
    assert data["view"] == "attribute" and data["attribute"] == json.loads(json.dumps(s))
    plain = attribute_payload(attribute(model, "the cat sat on"))              # gradient × input: no IG fields
    assert plain["steps"] is None and plain["baseline"] is None and plain["completeness_error"] is None


def test_an_encoder_decoders_attribution_goes_with_its_decoders_trace():
    mt = qkv.load("ko-en-tiny")
    a = attribute(mt, "나는 학교에 간다", prefix="I go to")
    s = attribute_payload(a)
    assert s["sides"] == a.sides and s["sides"].count("target") == 4
    view = DecoderView(mt, "I go to")
    trace = view.run("나는 학교에 간다", keep=("attentions",))
    decoder = dataclasses.replace(trace, encoder=None, cross=None)
    data = data_of(viewer_html(decoder, sections={"attribute": s}, view="attribute"))
    assert data["attribute"]["tokens"] == a.tokens and data["labels"] == a.tokens[4:]


@pytest.mark.parametrize(("change", "message"), [
    ({"scores": [1.0, 2.0]}, "one id and one score per token"),
    ({"ids": [1]}, "one id and one score per token"),
    ({"tokens": [], "ids": [], "scores": []}, "one id and one score per token"),
    ({"scores": [1.0, float("nan"), 0.0]}, "not all finite"),
    ({"sides": ["source", "source", "source"]}, "'source' or 'target'"),
    ({"sides": ["source", "left", "target"]}, "'source' or 'target'"),
])
def test_a_bad_attribution_is_refused_in_one_line(change, message):
    good = {"tokens": ["a", "b", "c"], "ids": [1, 2, 3], "scores": [0.5, -0.25, 0.0], "method": "grad-x-input",
            "logit": 1.5, "target": 7}
    attribute_section(good)
    with pytest.raises(QkvError, match=message) as e:
        attribute_section({**good, **change})
    assert len(str(e.value).splitlines()) == 1


def test_an_attribution_of_another_text_is_refused_by_the_viewer():
    s = attribute_section({"tokens": ["a", "b"], "ids": [1, 2], "scores": [0.5, -0.5], "method": "saliency",
                           "logit": 1.0})
    with pytest.raises(QkvError, match="attribute section is about 2 tokens and the trace has 3"):
        viewer_html(random_trace(["x", "y", "z"]), sections={"attribute": s})


# ── the causal-tracing section ──────────────────────────────────────────────────

def test_causal_section_keeps_the_tables_and_each_maps_scale():
    data = causal_data()
    s = causal_section(data)
    L, n = 4, 6
    assert s["layers"] == L and s["tokens"] == data["tokens"] and s["subject_span"] == [1, 3]
    assert "other" not in s and (s["answer"], s["answer_token"], s["window"], s["draws"]) == (42, "␣Paris", 3, 10)
    for kind in CAUSAL_KINDS:
        t = np.asarray(data["tables"][kind])
        assert np.abs(np.asarray(s["tables"][kind]) - t).max() <= 0.5 * 10.0 ** -CAUSAL_DECIMALS + 1e-12
        assert s["top"][kind] == pytest.approx(max(0.8 - 0.1, t.max() - 0.1))
        assert s["colours"][kind] == [list(c) for c in palette.CAUSAL_STOPS[kind]]
        assert np.shape(s["tables"][kind]) == (L, n)
    page = data_of(viewer_html(random_trace(data["tokens"], causal=True), sections={"causal_trace": s},
                               view="causal_trace"))
    assert page["view"] == "causal_trace" and page["causal_trace"] == json.loads(json.dumps(s))
    assert page["causal"] is True                                           # the attention's own mask, untouched


def test_the_causal_scale_reaches_the_clean_probability_or_the_tables_max():
    t = np.array([[0.2, 0.3], [0.1, 0.5]])
    assert causal_scale(t, 0.9, 0.1) == pytest.approx(0.8)                   # p_clean − p_corrupted
    assert causal_scale(t, 0.4, 0.1) == pytest.approx(0.4)                   # the table's max − p_corrupted
    assert causal_scale(np.zeros((2, 2)), 0.1, 0.1) == 1.0                   # nothing to show: any scale


def test_a_causal_section_may_hold_fewer_tables():
    data = causal_data()
    del data["tables"]["attn"]
    s = causal_section(data)
    assert s["tables"]["attn"] is None and set(s["top"]) == set(s["colours"]) == {"hidden", "ffn"}


@pytest.mark.parametrize(("change", "message"), [
    ({"tables": {}}, "has no tables"),
    ({"tables": {"hidden": np.zeros((4, 5)).tolist()}}, r"hidden table is \(4, 5\), not layers × tokens"),
    ({"subject_span": [3, 3]}, "not inside the text's 6 tokens"),
    ({"subject_span": [4, 7]}, "not inside the text's 6 tokens"),
    ({"tables": {"hidden": np.full((4, 6), np.inf).tolist()}}, "non-finite"),
])
def test_a_bad_causal_trace_is_refused_in_one_line(change, message):
    with pytest.raises(QkvError, match=message) as e:
        causal_section({**causal_data(), **change})
    assert len(str(e.value).splitlines()) == 1


def test_ragged_tables_are_refused():
    data = causal_data()
    data["tables"]["ffn"] = np.zeros((3, 6)).tolist()                      # another run's layers
    with pytest.raises(QkvError, match=r"ffn table is \(3, 6\), not layers × tokens \(4, 6\)"):
        causal_section(data)


# ── the causal-tracing figure ───────────────────────────────────────────────────

def test_the_causal_trace_figure_draws_three_maps_and_writes_png_and_svg(tmp_path):
    data = causal_data(tokens=["The", "Eiffel", "␣Tower", "␣나는", "␣in", "␣the"])
    fig = causal_trace_figure(data)
    maps = [ax for ax in fig.axes if ax.images]
    assert len(maps) == 3
    for ax, kind in zip(maps, CAUSAL_KINDS):
        im = ax.images[0]
        want = np.asarray(data["tables"][kind]).T - data["p_corrupted"]    # tokens × layers: indirect effect
        assert np.allclose(im.get_array(), want) and im.get_array().shape == (6, 4)
        assert im.cmap.name == palette.CAUSAL_CMAPS[kind]
        assert (im.norm.vmin, im.norm.vmax) == (0.0, pytest.approx(causal_scale(np.asarray(data["tables"][kind]),
                                                                                0.8, 0.1)))
    rows = [t.get_text() for t in maps[0].get_yticklabels()]
    assert rows == ["The", "Eiffel*", "␣Tower*", "␣나는", "␣in", "␣the"]            # the subject's tokens marked
    assert "causal tracing" in fig._suptitle.get_text() and "␣Paris" in fig._suptitle.get_text()
    paths = save_all(tmp_path, [("trace", lambda: causal_trace_figure(data))], ("png", "svg"))
    assert sorted(p.name for p in paths) == ["trace.png", "trace.svg"]
    assert (tmp_path / "trace.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "trace.svg").read_text(encoding="utf-8")[:2000]


def test_the_causal_trace_figure_refuses_what_the_section_refuses():
    with pytest.raises(QkvError, match="has no tables"):
        causal_trace_figure({**causal_data(), "tables": {}})
