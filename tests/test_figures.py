"""viz.figures: heatmaps, grids and overviews render for encoders and decoders, files are valid and atomic."""

from __future__ import annotations

import io
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import qkv
from qkv.core.trace import LayerTrace, Trace
from qkv.viz import drawing, figures, palette
from conftest import MODELS, PATIENCE

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def traces():
    """A short text through the tiny encoder (bert) and decoder (gpt2) fixtures, every layer."""
    out = {}
    for name in ("bert", "gpt2"):
        model = qkv.load(MODELS / name)
        out[name] = (model, model.run("the cat sat on the mat", keep=("attentions",)))
    return out


def synthetic(attn: np.ndarray) -> Trace:
    """A trace holding only the given attention weights (L, H, n, n)."""
    n = attn.shape[-1]
    return Trace(tokens=[f"t{i}" for i in range(n)], ids=np.arange(n), hidden=None, logits=None,
                 layers={i: LayerTrace(layer=i, attentions=a) for i, a in enumerate(attn)})


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_save_figures_writes_valid_png_and_svg(traces, tmp_path, name):
    model, trace = traces[name]
    paths = figures.save_figures(trace, tmp_path / "out", model_name=name, layer=-1, head=3,
                                 causal=model.config.causal)
    stems = ["heatmap_layer1_head3", "grid_layer1", "overview"]
    assert [p.name for p in paths] == [f"{s}.{f}" for s in stems for f in ("png", "svg")]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in paths)  # no temp files
    for p in paths:
        data = p.read_bytes()
        if p.suffix == ".png":
            assert data.startswith(PNG_SIGNATURE)
        else:
            assert ET.fromstring(data).tag.endswith("svg")
    svg = (tmp_path / "out" / "heatmap_layer1_head3.svg").read_text()
    assert f"{name} · layer 1 · head 3" in svg                   # the title names model, layer and head


def _pixel(fig, ax, x: float, y: float) -> np.ndarray:
    """RGB of the rendered figure at data coordinates (x = key, y = query)."""
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())[..., :3]
    px, py = ax.transData.transform((x, y))
    return img[int(round(img.shape[0] - py)), int(round(px))].astype(int)


def test_decoder_heatmap_shows_the_causal_mask(traces):
    from matplotlib import colormaps

    _, trace = traces["gpt2"]
    n = len(trace.tokens)
    fig = figures.head_heatmap(trace, 0, 1)
    ax = fig.axes[0]
    zero = (np.array(colormaps[palette.CMAP](0.0)[:3]) * 255).astype(int)
    for i, j in [(0, n - 1), (1, 3), (n - 2, n - 1)]:            # key after query: masked, weight exactly 0
        assert trace.layer(0).attentions[1, i, j] == 0
        rgb = _pixel(fig, ax, j + 0.25, i + 0.25)
        assert np.abs(rgb - zero).max() > 60, (i, j, rgb)         # not drawn as a weight of 0
        assert rgb.max() - rgb.min() < 10                         # grey
    # an encoder's near-zero cells do use the colormap's colour for 0
    a = np.full((4, 4), 1e-4) + np.eye(4) * (1 - 4e-4)              # rows sum to 1, nothing exactly 0
    enc = synthetic(a[None, None])
    fig = figures.head_heatmap(enc, 0, 0)
    assert figures.masked_cells(enc, 0) is None
    assert np.abs(_pixel(fig, fig.axes[0], 3.3, 0.3) - zero).max() < 10


def test_masked_cells(traces, minilm):
    _, dec = traces["gpt2"]
    n = len(dec.tokens)
    assert np.array_equal(figures.masked_cells(dec, 0), np.triu(np.ones((n, n), bool), 1))
    assert figures.masked_cells(traces["bert"][1], 0) is None
    assert figures.masked_cells(dec, 0, causal=False) is None
    kept = qkv.load(MODELS / "gpt2").run("the cat sat", layers=[0], keep=("scores", "attentions"))
    m = len(kept.tokens)
    assert np.array_equal(figures.masked_cells(kept, 0), np.triu(np.ones((m, m), bool), 1))  # from -∞ scores


def test_small_heatmaps_write_every_weight(traces):
    _, trace = traces["bert"]
    n = len(trace.tokens)
    fig = figures.head_heatmap(trace, 0, 0, model_name="tiny")
    ax = fig.axes[0]
    assert len(ax.texts) == n * n
    a = trace.layer(0).attentions[0]
    shown = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    for (i, j), text in shown.items():
        assert text == ("0" if a[i, j] < 0.005 else f"{a[i, j]:.2f}".lstrip("0"))
    assert [t.get_text() for t in ax.get_yticklabels()] == trace.tokens
    assert ax.get_title() == "tiny · layer 0 · head 0"


def test_long_inputs_stay_readable():
    n = 200
    a = np.random.default_rng(0).dirichlet(np.full(n, 0.1), size=(2, 12, n))   # (L, H, n, n) rows sum to 1
    trace = synthetic(a)
    fig = figures.head_heatmap(trace, 1, 0)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert len(ax.texts) == 0 and 20 <= len(labels) <= drawing.MAX_LABELS
    assert labels[1] == "5 t5"                                    # thinned labels carry their index
    assert max(fig.get_size_inches()) <= 12
    for fig in (fig, figures.layer_grid(trace, 1)):
        png = io.BytesIO()
        fig.savefig(png, format="png")
        assert png.getvalue().startswith(PNG_SIGNATURE)


def test_grid_and_overview_have_a_panel_per_head(traces):
    _, trace = traces["gpt2"]
    grid = figures.layer_grid(trace, 0, model_name="m")
    assert [ax.get_title() for ax in grid.axes if ax.get_title()] == ["h0", "h1", "h2", "h3"]
    overview = figures.model_overview(trace)
    images = [ax for ax in overview.axes if ax.images]
    assert len(images) == 2 * 4 and len(overview.axes) == 2 * 4 + 1   # L × H panels + the colour bar
    assert {ax.get_ylabel() for ax in overview.axes} >= {"layer 0", "layer 1"}


def test_focused_head_is_the_sharpest():
    a = np.full((1, 3, 4, 4), 0.25)
    a[0, 1] = np.eye(4)                                           # head 1: one key per row
    assert figures.focused_head(synthetic(a), 0) == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"head": 4}, "head 4 does not exist"),
    ({"layer": 5}, "layer 5 was not kept"),
    ({"formats": ("png", "gif")}, "cannot write figures as"),
])
def test_bad_requests_raise_qkv_error(traces, tmp_path, kwargs, message):
    with pytest.raises(qkv.QkvError, match=message):
        figures.save_figures(traces["gpt2"][1], tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_unwritable_directory_leaves_nothing(traces, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(qkv.QkvError, match="cannot write figures to .*choose a writable directory"):
        figures.save_figures(traces["bert"][1], blocker / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["file"] and blocker.read_text() == "x"


def test_a_failure_midway_leaves_no_file(traces, tmp_path, monkeypatch):
    render = drawing.render_figure
    calls = []

    def fail_third(fig, path, fmt):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        render(fig, path, fmt)

    monkeypatch.setattr(drawing, "render_figure", fail_third)
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(qkv.QkvError, match="No space left"):
        figures.save_figures(traces["bert"][1], tmp_path)
    assert len(calls) == 3
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]     # the two finished files are gone too
    calls.clear()
    with pytest.raises(qkv.QkvError):
        figures.save_figures(traces["bert"][1], tmp_path / "new")
    assert not (tmp_path / "new").exists()                          # a directory it made is removed


def test_tokens_are_never_mathtext(tmp_path):
    trace = synthetic(np.full((1, 1, 2, 2), 0.5))
    trace.tokens = ["$x$", "a$b"]
    paths = figures.save_figures(trace, tmp_path, formats=("svg",))
    assert all(p.exists() for p in paths)
    ax = figures.head_heatmap(trace, 0, 0).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [r"\$x\$", r"a\$b"]


def test_importing_qkv_does_not_import_matplotlib():
    code = "import sys, qkv, qkv.viz.figures; print('matplotlib' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PATIENCE)
    assert r.stdout.strip() == "False", r.stderr


def test_causality_comes_from_the_trace_never_from_zeros():
    a = np.tril(np.ones((3, 3)))
    a /= a.sum(-1, keepdims=True)                                   # a decoder's pattern: exact zeros above
    t = synthetic(a[None, None])
    assert t.causal is None and figures.masked_cells(t, 0) is None  # not said: nothing hatched
    t.causal = True
    assert np.array_equal(figures.masked_cells(t, 0), np.triu(np.ones((3, 3), bool), 1))
    assert figures.masked_cells(t, 0, causal=False) is None         # the caller may still say otherwise


def test_cross_attention_draws_queries_by_keys():
    a = np.full((1, 2, 3, 5), 0.2)                                  # (L, H, n_q, n_k)
    t = Trace(tokens=["a", "b", "c"], ids=np.arange(3), hidden=None, logits=None, causal=False, model="m",
              source_tokens=["v", "w", "x", "y", "z"], layers={0: LayerTrace(layer=0, attentions=a[0])})
    ax = figures.head_heatmap(t, 0, 1).axes[0]
    assert [x.get_text() for x in ax.get_yticklabels()] == ["a", "b", "c"]
    assert [x.get_text() for x in ax.get_xticklabels()] == ["v", "w", "x", "y", "z"]
    assert ax.get_title() == "m · layer 0 · head 1"
    assert figures.layer_grid(t, 0) is not None and figures.model_overview(t) is not None


@pytest.mark.parametrize("n", [44, 100])
def test_heatmap_tick_labels_never_overlap(minilm, n):
    """At 44 and 100 tokens the heatmap's key labels (turned 60°, anchored at their right end) and query labels are
    each clear of their neighbours: every label's own box, turned as drawn, shares no area with the next one's."""
    import math

    words = ("the cat sat on the mat while the old dog watched from across a quiet garden " * 8).split()[:n - 2]
    trace = minilm.run(" ".join(words), keep=("attentions",))
    assert len(trace.tokens) == n
    fig = figures.head_heatmap(trace, 0, 0)
    fig.canvas.draw()
    renderer, ax = fig.canvas.get_renderer(), fig.axes[0]

    def turned(label) -> list[tuple[float, float]]:
        angle = label.get_rotation()
        label.set_rotation(0)
        e = label.get_window_extent(renderer)                    # unturned, aligned right / top at its anchor
        label.set_rotation(angle)
        c, s = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        ax_, ay = (e.x1, e.y1) if angle else (e.x0, e.y0)
        return [(ax_ + (x - ax_) * c - (y - ay) * s, ay + (x - ax_) * s + (y - ay) * c)
                for x, y in [(e.x0, e.y0), (e.x1, e.y0), (e.x1, e.y1), (e.x0, e.y1)]]

    def overlap(a, b) -> bool:                                   # separating axis theorem, convex polygons
        for poly in (a, b):
            for (x1, y1), (x2, y2) in zip(poly, poly[1:] + poly[:1]):
                pa = [(y2 - y1) * x + (x1 - x2) * y for x, y in a]
                pb = [(y2 - y1) * x + (x1 - x2) * y for x, y in b]
                if max(pa) <= min(pb) or max(pb) <= min(pa):
                    return False
        return True

    for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
        boxes = [turned(t) for t in labels if t.get_text()]
        assert len(boxes) >= 20
        assert not any(overlap(a, b) for k, a in enumerate(boxes) for b in boxes[k + 1:k + 4])
