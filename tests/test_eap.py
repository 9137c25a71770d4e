"""Edge attribution patching (qkv.analysis.eap, qkv.analysis.edges) and `qkv eap`.

Checks that can fail, float64 fixtures:
  - the edge-patching pass is the model: every edge kept (w = 0) gives the engine's clean logits and none kept
    (w = 1) its corrupt logits, within 1e-9, on every family the graph takes (RoPE, ALiBi, GQA/MQA, q/k norms,
    biases, parallel blocks, a routed FFN, Granite's multiplier, sliding windows);
  - the same with each head's q, k and v inputs receivers of their own (qkv=True);
  - EAP's score of every edge is d m / d w_sr of that pass at w = 0 (the edge carrying clean + ε(corrupt −
    clean)), by central differences (ε = 1e-5, truncation ~1e-10), within 1e-7 of the largest score, on five
    families (sequential, parallel, GQA with q/k norms, a routed FFN, ALiBi), and on three with q, k, v split
    (GQA; parallel with each head's q/k norms; OLMoE's norm over the whole projection and its routed FFN);
  - a head's q, k, v receivers' scores add up to its whole input's (1e-12);
  - EAP-IG's gradient at a point of the path is that run's: the first-order term of the edge-patched pass
    started there, by central differences, on every edge (two families);
  - EAP-IG with one Gauss–Legendre node is Δ·∂m/∂in_r at the midpoint embedding (recomputed here), and with 64
    nodes the embedding's edges add up to m(corrupt) − m(clean) within 1e-6 of it (Gauss–Legendre on a
    smooth path; EAP's are 1 % or more off);
  - the receivers' gradients add up to the engine's gradient of the token embeddings (input attribution's
    backward) within 1e-9;
  - a circuit of every edge has faithfulness 1 and of none 0 (1e-9);
  - refusals: output norms (OLMo 2, Gemma 2), encoders, unequal lengths; and the command's files.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from test_browser import browser, tab  # noqa: F401  (fixtures: Chromium, the network blocked)
from qkv.analysis.eap import curve_points, edge_attribution, faithfulness, patched_metric
from qkv.analysis.edges import EdgePatcher
from qkv.runtime.errors import QkvError

FAMILIES = ["llama_gqa", "gpt2", "phi", "gptj", "falcon", "falcon_rw", "mixtral", "qwen3", "stablelm", "granite",
            "qwen2_sliding", "smollm3", "bloom", "mpt", "gpt_neox", "llama_mqa"]
CHECKED = ["gpt2", "phi", "qwen3", "mixtral", "bloom"]           # every edge by finite differences
QKV = ["llama_gqa", "phi", "olmoe"]                              # … and with q, k, v inputs split (GQA, q/k norms)
N = 7


def pair(name: str):
    """A float64 model, clean ids, corrupt ids (two tokens changed) and (token, other) ids."""
    model = qkv.load(MODELS / name, dtype=np.float64)
    V = model.config.vocab_size
    clean = np.random.default_rng(5).integers(0, V, N)
    corrupt = clean.copy()
    corrupt[2], corrupt[4] = (clean[2] + 5) % V, (clean[4] + 9) % V
    return model, clean, corrupt, 3, 5


def metric(logits: np.ndarray) -> float:
    return float(logits[-1, 3] - logits[-1, 5])


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("qkv", [False, True])
def test_every_edge_kept_is_clean_and_none_the_corrupt_run(name, qkv):
    model, clean, corrupt, _, _ = pair(name)
    ep = EdgePatcher(model, N, qkv)
    theirs = ep.run(ep.embed(corrupt))
    S, R = ep.graph.n_senders, ep.graph.n_receivers
    want_clean = model.forward(clean[None], attentions=False).logits[0]          # (n, V)
    want_corrupt = model.forward(corrupt[None], attentions=False).logits[0]
    assert np.abs(ep.run(ep.embed(clean)).logits - want_clean).max() <= 1e-9
    assert np.abs(ep.run(ep.embed(clean), np.zeros((S, R)), theirs).logits - want_clean).max() <= 1e-9
    assert np.abs(ep.run(ep.embed(clean), np.ones((S, R)), theirs).logits - want_corrupt).max() <= 1e-9
    assert np.abs(want_clean - want_corrupt).max() > 1e-3                        # the two runs differ


@pytest.mark.parametrize("name, qkv", [(name, False) for name in CHECKED] + [(name, True) for name in QKV])
def test_eap_is_the_first_order_term_of_edge_patching(name, qkv):
    model, clean, corrupt, t, o = pair(name)
    a = edge_attribution(model, clean, corrupt, t, o, qkv=qkv)
    ep = EdgePatcher(model, N, qkv)
    x, theirs = ep.embed(clean), ep.run(ep.embed(corrupt))
    valid, eps = ep.graph.valid(), 1e-5
    fd = np.zeros_like(a.scores)
    for s, r in zip(*np.nonzero(valid)):
        w = np.zeros(valid.shape)
        w[s, r] = eps
        up = metric(ep.run(x, w, theirs).logits)
        w[s, r] = -eps
        fd[s, r] = (up - metric(ep.run(x, w, theirs).logits)) / (2 * eps)
    top = np.abs(a.scores).max()
    assert top > 0.1 and np.abs(a.scores[~valid]).max() == 0
    assert np.abs(fd - a.scores).max() <= 1e-7 * top
    assert np.isclose(a.clean, metric(model.forward(clean[None], attentions=False).logits[0]), atol=1e-9)


def test_a_head_reads_its_own_stream():
    """A head's receiver gradient is through its own Q, K, V only: the layer's heads differ from each other and
    add up (with the FFN's, through the stream) to the gradient of the whole stream."""
    model, clean, corrupt, t, o = pair("llama_gqa")
    ep = EdgePatcher(model, N)
    d = np.zeros((N, model.config.vocab_size))
    d[-1, t], d[-1, o] = 1.0, -1.0
    grads, _ = ep.receiver_gradients(clean, d)
    H = model.config.n_heads
    heads = grads[ep.graph.receiver(1, 0):ep.graph.receiver(1, 0) + H]          # layer 1's heads (H, n, d)
    assert np.abs(heads[0] - heads[1]).max() > 1e-3
    # ∂m/∂X₀ = Σ_r ∂m/∂in_r (X₀ reaches every receiver directly) = the engine's gradient of the token embeddings
    from qkv.analysis.input_attribution import Output, _gradient
    rows = model.weights.tok_embed[clean[None]]
    g, _ = _gradient(model, clean[None], rows, Output(-1, t, o))
    assert np.abs(grads.sum(axis=0) - g[0]).max() <= 1e-9
    # split into the q, k and v inputs, a head's three receivers' scores add up to its one's
    whole, split = (edge_attribution(model, clean, corrupt, t, o, qkv=q) for q in (False, True))
    for l in range(model.config.n_layers):
        for h in range(H):
            parts = sum(split.scores[:, split.graph.receiver(l, h, part)] for part in range(3))
            assert np.abs(parts - whole.scores[:, whole.graph.receiver(l, h)]).max() <= 1e-12
        ffn = split.scores[:, split.graph.receiver(l)] - whole.scores[:, whole.graph.receiver(l)]
        assert np.abs(ffn).max() <= 1e-12
    assert split.graph.n_edges > 2 * whole.graph.n_edges


def test_eap_ig_nodes():
    model, clean, corrupt, t, o = pair("llama_gqa")
    eap = edge_attribution(model, clean, corrupt, t, o)
    one = edge_attribution(model, clean, corrupt, t, o, ig_steps=1)
    ep = EdgePatcher(model, N)
    e = model.weights.tok_embed
    mid = (e[clean] + e[corrupt])[None] / 2                                       # α = ½ of the straight path
    d = np.zeros((N, model.config.vocab_size))
    d[-1, t], d[-1, o] = 1.0, -1.0
    g, _ = ep.receiver_gradients(clean, d, mid)
    delta = ep.run(ep.embed(corrupt)).outputs - ep.run(ep.embed(clean)).outputs
    want = np.einsum("snd,rnd->sr", delta, g) * ep.graph.valid()
    assert np.abs(one.scores - want).max() <= 1e-12 * np.abs(want).max()
    many = edge_attribution(model, clean, corrupt, t, o, ig_steps=64)
    gap = many.corrupted - many.clean
    assert abs(many.scores[0].sum() - gap) <= 1e-6 * abs(gap)                  # the embedding's edges: the integral
    assert abs(eap.scores[0].sum() - gap) > 1e-2 * abs(gap)                     # EAP's first order is not
    assert many.method == "eap-ig" and many.steps == 64 and eap.method == "eap"


@pytest.mark.parametrize("name", ["llama_gqa", "phi"])
def test_eap_ig_gradients_on_the_path(name):
    """EAP-IG's gradients at a point of the path (token embeddings ⅓ of the way from corrupt to clean) are that
    run's own: Δ'·∂m/∂in_r equals d m / d w_sr of the edge-patched pass started there (Δ' = out_s(corrupt) −
    out_s(there)), by central differences, on every edge."""
    model, clean, corrupt, t, o = pair(name)
    ep = EdgePatcher(model, N)
    e = model.weights.tok_embed
    point = (e[corrupt] + (e[clean] - e[corrupt]) / 3)[None]                     # (1, n, d) on the path
    d = np.zeros((N, model.config.vocab_size))
    d[-1, t], d[-1, o] = 1.0, -1.0
    g, _ = ep.receiver_gradients(clean, d, point)
    x = ep.embed(clean, point)
    there, theirs = ep.run(x), ep.run(ep.embed(corrupt))
    want = np.einsum("snd,rnd->sr", theirs.outputs - there.outputs, g)
    valid, eps = ep.graph.valid(), 1e-5
    for s, r in zip(*np.nonzero(valid)):
        w = np.zeros(valid.shape)
        w[s, r] = eps
        up = metric(ep.run(x, w, theirs).logits)
        w[s, r] = -eps
        fd = (up - metric(ep.run(x, w, theirs).logits)) / (2 * eps)
        assert abs(fd - want[s, r]) <= 1e-7 * np.abs(want).max()


@pytest.mark.parametrize("name", ["gpt2", "phi"])
def test_faithfulness_ends_and_curve(name):
    model, clean, corrupt, t, o = pair(name)
    a = edge_attribution(model, clean, corrupt, t, o)
    E = a.graph.n_edges
    ks = curve_points("3,10,all", E)
    assert ks == [0, 3, 10, E]
    f = faithfulness(model, a, ks)
    assert abs(f.normalised[-1] - 1) <= 1e-9 and abs(f.normalised[0]) <= 1e-9 and f.ks == ks
    assert abs(f.metric[0] - a.corrupted) <= 1e-9 and abs(f.metric[-1] - a.clean) <= 1e-9
    keep = a.circuit(10)
    assert keep.sum() == 10 and np.all(np.abs(a.scores[keep]).min() >= np.abs(a.scores[a.graph.valid() & ~keep]).max())
    assert patched_metric(model, a, keep) == f.metric[2]
    assert curve_points([5, 10 ** 9], E) == [0, 5, E]
    with pytest.raises(QkvError, match="edge counts"):
        curve_points("10,many", E)


@pytest.mark.parametrize("name, words", [("olmo2", "output"), ("gemma2", "output"), ("bert", "decoder")])
def test_refused_families(name, words):
    model = qkv.load(MODELS / name, dtype=np.float64)
    with pytest.raises(QkvError, match=words):
        EdgePatcher(model, 4)


def test_refused_inputs():
    model, clean, corrupt, t, o = pair("gpt2")
    with pytest.raises(QkvError, match="line up"):
        edge_attribution(model, clean, corrupt[:-1], t, o)
    with pytest.raises(QkvError, match="same"):
        edge_attribution(model, clean, corrupt, t, t)
    with pytest.raises(QkvError, match="ig-steps"):
        edge_attribution(model, clean, corrupt, t, o, ig_steps=-1)
    same = edge_attribution(model, clean, clean, t, o)                            # no answer moved
    assert np.abs(same.scores).max() == 0
    with pytest.raises(QkvError, match="same metric"):
        faithfulness(model, same, [0, 5])


def test_the_cli(tmp_path, monkeypatch, capsys):
    gpt2 = str(MODELS / "gpt2")
    out, js = tmp_path / "out", tmp_path / "eap.json"
    code, text, err = run_main(monkeypatch, capsys, "eap", "the cat sat on the mat", "the dog sat on the mat", "--model", gpt2, "--token", " a", "--other", " the",
                               "--curve", "5,20", "--top", "4", "--json", str(js), "--out", str(out))
    assert code == 0, err
    data = json.loads(js.read_text())
    assert data["method"] == "eap" and len(data["top_edges"]) >= 4
    points = data["faithfulness"]["points"]
    assert [p["edges"] for p in points] == [0, 5, 20, data["n_edges"]]
    assert abs(points[-1]["faithfulness"] - 1) < 1e-4 and abs(points[0]["faithfulness"]) < 1e-4
    assert {p.name for p in out.iterdir()} >= {"eap_curve.png", "eap_curve.svg", "eap.json", "eap.html"}
    page = (out / "eap.html").read_text()
    assert "QKV_EAP.boot()" in page and '"edges":[["' in page
    code, _, err = run_main(monkeypatch, capsys, "eap", "the cat sat on the mat", "the dog sat on the mat",
                            "--model", gpt2, "--token", " a", "--other", " the", "--qkv", "--ig-steps", "2",
                            "--curve", "all", "--json", str(js))
    data = json.loads(js.read_text())
    assert code == 0 and data["qkv"] and "L1.H3.v" in data["receivers"] and data["method"] == "eap-ig"
    assert [p["edges"] for p in data["faithfulness"]["points"]] == [0, data["n_edges"]]
    code, _, err = run_main(monkeypatch, capsys, "eap", "the cat sat", "the dog sat on the mat",
                            "--model", gpt2, "--token", " a", "--other", " the", "--out", str(tmp_path / "bad"))
    assert code == 2 and "line up" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


def test_the_page_escapes_its_texts():
    from qkv.viz.eap_figures import circuit_page

    hostile = "</script><img src=x onerror=alert(1)>"
    page = circuit_page({"model": hostile, "metric": hostile, "method": "eap", "steps": 0, "clean": hostile,
                         "corrupted": "b", "metric_clean": 1.0, "metric_corrupted": 0.0, "n_layers": 1, "n_heads": 1,
                         "parallel": False, "n_edges": 1, "edges": [["embed", "L0.H0", 0.5]], "curve": [[0, 0.0, 0.0]]})
    data = page.split('class="qkv-eap-data">')[1].split("</script>")[0]           # the JSON, up to its own end
    assert "<" not in data and ">" not in data and "onerror" in data              # all of it inside, escaped
    assert "<img" not in page and "&lt;/script&gt;" in page                       # the title escaped too


def test_the_page_in_a_browser(tmp_path, tab):  # noqa: F811  (tab: test_browser's fixture, imported above)
    """The circuit page in Chromium (test_browser's tab, the network blocked): drawn with the slider's count of
    edges, the slider redrawing, an edge's score and a component's sums on hover, the hostile prompt as text."""
    from qkv.analysis.eap import circuit_data
    from qkv.viz.eap_figures import circuit_page

    model, clean, corrupt, t, o = pair("llama_gqa")
    a = edge_attribution(model, clean, corrupt, t, o, qkv=True)
    f = faithfulness(model, a, curve_points("5,20", a.graph.n_edges))
    a.texts = ("<img src=x onerror=alert(1)>", "b")
    path = tmp_path / "eap.html"
    path.write_text(circuit_page(circuit_data(a, f)))
    tab.page.goto(path.as_uri())
    tab.page.wait_for_selector("[data-qkv-eap][data-ready='1']")
    root = "[data-qkv-eap]"
    assert tab.page.eval_on_selector(root, "e => e.dataset.shown") == "50"
    assert tab.page.eval_on_selector_all(".qkv-eap-circuit path", "ps => ps.length") == 50
    tab.page.eval_on_selector(".qkv-eap-controls input", "s => { s.value = '7'; s.dispatchEvent(new Event('input')); }")
    assert tab.page.eval_on_selector_all(".qkv-eap-circuit path", "ps => ps.length") == 7
    (s, r, v), = a.top(1)
    tab.page.dispatch_event(".qkv-eap-circuit path:last-of-type", "mouseenter")  # the strongest, drawn last
    assert tab.page.eval_on_selector(root, "e => e.dataset.hover") == f"{s}->{r}"
    assert f"{v:+.4g}"[:5] in tab.page.inner_text(".qkv-eap-info")
    assert "<img src=x onerror=alert(1)>" in tab.page.inner_text(root) and not tab.dialogs
    assert tab.page.eval_on_selector_all(".qkv-eap-curve circle", "cs => cs.length") == len(f.ks)
    tab.page.dispatch_event(".qkv-eap-circuit circle", "mouseenter")             # a component (L0.H0): its sums
    assert tab.page.eval_on_selector(root, "e => e.dataset.hover") == "L0.H0"
    assert "edges in" in tab.page.inner_text(".qkv-eap-info")
    assert not tab.errors and not tab.blocked
