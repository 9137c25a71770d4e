"""The attribution graph page (`qkv.graphs.page`): the HTML a graph's JSON becomes, its bounds, its words in both
languages, the annotations of its feature nodes, and `qkv graph-page`.

Graphs here are made by `fake_graph` (the schema of graphs/page.py's doc, exactly: random nodes by layer × position,
links from a lower layer to a higher one) so the page is tested apart from the graph's own computation; the browser
tests (test_browser_graph.py) draw the same graphs.
"""

from __future__ import annotations

import json
import re
import string

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv.features.sae import SAE, SAEConfig
from qkv.graphs import page as gp
from qkv.runtime.errors import QkvError
from qkv.viz.html import asset
from qkv.viz.words import en, ko

XSS = "<img src=x onerror=alert(1)>"


def fake_graph(n: int = 30, nodes: int = 300, links: int = 3000, layers: int = 6, seed: int = 0,
               hostile: bool = True) -> dict:
    """A graph of the schema: n embeddings, 3 logits at the last position, error nodes and features filling NODES,
    LINKS distinct links from a lower layer to a higher one with weights of both signs; token 1 hostile."""
    rng = np.random.default_rng(seed)
    tokens = [f" w{i}" for i in range(n)]
    if hostile:
        tokens[1] = XSS
    out = [{"id": f"E:{p}", "kind": "embedding", "layer": -1, "position": p, "token": tokens[p],
            "influence": float(rng.random() / n)} for p in range(n)]
    logits = [{"id": f"L:{100 + k}", "kind": "logit", "layer": layers, "position": n - 1, "token": f" out{k}",
               "token_id": 100 + k, "probability": 0.5 / (k + 1), "logit": 10.0 - k, "influence": 0.3 / (k + 1)}
              for k in range(3)]
    errors = [{"id": f"R:{layer}:{p}", "kind": "error", "layer": layer, "position": p, "norm": float(rng.random()),
               "influence": 0.01} for layer in range(layers) for p in range(0, n, 3)][:nodes // 5]
    feats, seen = [], set()
    while len(out) + len(errors) + len(feats) + len(logits) < nodes:
        layer, p, f = int(rng.integers(layers)), int(rng.integers(n)), int(rng.integers(64))
        if (layer, p, f) not in seen:
            seen.add((layer, p, f))
            feats.append({"id": f"F:{layer}:{p}:{f}", "kind": "feature", "layer": layer, "position": p, "feature": f,
                          "activation": float(rng.random() * 5), "influence": float(rng.random() / 10)})
    every = out + feats + errors + logits
    pairs = set()
    while len(pairs) < links:
        a, b = rng.integers(len(every), size=2)
        s, t = every[a], every[b]
        if s["layer"] < t["layer"] and t["kind"] in ("feature", "logit") and s["kind"] != "logit":
            pairs.add((int(a), int(b)))
    link = [{"source": every[a]["id"], "target": every[b]["id"], "weight": float(rng.normal())}
            for a, b in sorted(pairs)]
    note = {"promotes": [[" up", 2.0], [XSS, 1.0]], "suppresses": [[" down", -1.0]],
            "contexts": [{"tokens": ["a", XSS, "c"], "values": [0.0, 3.0, 1.0]}]}
    return {"qkv_graph": 1, "model": "tiny", "prompt": "".join(tokens), "tokens": tokens, "ids": list(range(n)),
            "layers": layers, "d_model": 16, "transcoders": "random TopK transcoders",
            "target": {"token": " out0", "id": 100},
            "scores": {"replacement": 0.7, "completeness": 0.9,
                       "replacement_pruned": 0.55, "completeness_pruned": 0.86},
            "thresholds": {"node": 0.8, "edge": 0.98}, "nodes": every, "links": link,
            "features": {f"{d['layer']}:{d['feature']}": note for d in feats[:5]}}


def data_of(document: str) -> dict:
    """The JSON the page carries (its script.qkv-graph-data)."""
    m = re.search(r'<script type="application/json" class="qkv-graph-data">(.*?)</script>', document, re.S)
    return json.loads(m.group(1))


# ── the HTML ─────────────────────────────────────────────────────────────────────

def test_hostile_tokens_are_data_never_markup():
    graph = fake_graph(n=8, nodes=40, links=60)
    graph["model"] = graph["prompt"] = XSS
    document = gp.graph_page(graph)
    assert XSS not in document and "<img" not in document                       # only as escaped JSON / text
    assert "&lt;img src=x onerror=alert(1)&gt;" in document                      # the <title>, escaped
    data = data_of(document)
    assert data["graph"]["tokens"][1] == XSS and data["graph"]["model"] == XSS    # the same text, as data
    assert data["graph"]["features"][next(iter(data["graph"]["features"]))]["contexts"][0]["tokens"][1] == XSS
    assert "innerHTML" not in asset("graph.js") and "insertAdjacentHTML" not in asset("graph.js")
    assert "script-src 'unsafe-inline'" in document and "default-src 'none'" in document   # no network at all


def test_a_pruned_30_token_graph_page_stays_under_10_MB(tmp_path):
    graph = fake_graph(n=30, nodes=300, links=3000)
    path = gp.write_graph_page(graph, tmp_path / "graph.html")
    size = path.stat().st_size
    print(f"\na 30-token graph of 300 nodes and 3000 links: a page of {size / 1e6:.2f} MB")
    assert size <= 10 * 1024 * 1024
    shown = data_of(path.read_text(encoding="utf-8"))["graph"]
    assert len(shown["nodes"]) == 300 and len(shown["links"]) == 3000
    assert "links_total" not in shown


def test_the_page_keeps_every_node_and_link_with_its_numbers_rounded():
    graph = fake_graph(n=10, nodes=60, links=200)
    shown = gp.check_graph(graph)
    assert [d["id"] for d in shown["nodes"]] == [d["id"] for d in graph["nodes"]]
    for a, b in zip(shown["links"], graph["links"]):
        assert (a["source"], a["target"]) == (b["source"], b["target"])
        assert abs(a["weight"] - b["weight"]) <= 5e-4 * abs(b["weight"])            # 4 significant digits
    assert shown["scores"] == graph["scores"] and shown["target"] == graph["target"]


def test_past_the_bound_the_strongest_links_are_kept(monkeypatch):
    graph = fake_graph(n=10, nodes=60, links=200)
    monkeypatch.setattr(gp, "MAX_LINKS", 50)
    shown = gp.check_graph(graph)
    assert len(shown["links"]) == 50 and shown["links_total"] == 200
    cut = sorted(abs(l["weight"]) for l in graph["links"])[-50]
    assert min(abs(l["weight"]) for l in shown["links"]) >= gp._round(cut)
    monkeypatch.setattr(gp, "MAX_NODES", 59)
    with pytest.raises(QkvError, match="prune the graph harder"):
        gp.check_graph(graph)


@pytest.mark.parametrize("change, message", [
    (lambda g: g.pop("qkv_graph"), "has no qkv_graph"),
    (lambda g: g["nodes"][0].update(kind="neuron"), r"nodes\[0\]: kind must be one of"),
    (lambda g: g["links"][0].update(target="F:99:0:0"), r"links\[0\]\.target 'F:99:0:0' is not a node"),
    (lambda g: g["links"][0].update(weight=float("nan")), r"links\[0\]: weight must be a number"),
    (lambda g: g["nodes"].append(dict(g["nodes"][0])), "the same id"),
    (lambda g: g["nodes"][0].update(position=99), r"nodes\[0\]: position must be"),
    (lambda g: g["tokens"].__setitem__(0, "x" * 201), "at most 4,096 tokens of at most 200 characters"),
    (lambda g: g["features"][next(iter(g["features"]))].update(promotes=[["a"]]), r"promotes must be a list of"),
])
def test_a_broken_graph_is_one_error_naming_what_is_wrong(change, message):
    graph = fake_graph(n=6, nodes=30, links=40)
    change(graph)
    with pytest.raises(QkvError, match=message):
        gp.graph_page(graph)


def test_read_graph_refuses_what_is_not_a_graph(tmp_path):
    (tmp_path / "g.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(QkvError, match="not a JSON object"):
        gp.read_graph(tmp_path / "g.json")
    with pytest.raises(QkvError, match="unknown language 'fr'"):
        gp.graph_page(fake_graph(n=4, nodes=12, links=10), lang="fr")


# ── the words ────────────────────────────────────────────────────────────────────

def test_every_label_is_a_word_in_both_languages_and_graph_js_uses_them_all():
    assert en.GRAPH.keys() == ko.GRAPH.keys()
    script = asset("graph.js")
    used = set(re.findall(r'this\.t\("(\w+)"[,)]', script))                          # this.t("key") …
    lists = {"mode_": ("subgraph", "select", "path"), "hint_": ("subgraph", "select", "path"),
             "kind_": ("embedding", "feature", "error", "logit", "super")}
    for prefix, names in lists.items():                                         # … this.t("mode_" + m) …
        assert f'this.t("{prefix}" + ' in script
        used |= {prefix + n for n in names}
    used |= {"replacement", "completeness", "promotes", "suppresses", "inputs", "outputs", "activation", "norm",
             "logit", "influence"}                                               # … this.t(key) over a list of keys
    used |= set(re.findall(r'graphWords\(\)\.(\w+)', asset("app.js")))             # and `qkv serve`'s Graph tab
    assert used == en.GRAPH.keys()                                               # every label the scripts show, no more
    for lang, table in (("en", en.GRAPH), ("ko", ko.GRAPH)):
        data = data_of(gp.graph_page(fake_graph(n=4, nodes=12, links=10), lang=lang))
        assert data["lang"] == lang and data["words"] == {"en": en.GRAPH, "ko": ko.GRAPH}
    fields = lambda s: {f for _, f, _, _ in string.Formatter().parse(s) if f}
    assert all(fields(en.GRAPH[k]) == fields(ko.GRAPH[k]) for k in en.GRAPH)


# ── annotations ──────────────────────────────────────────────────────────────────

def random_transcoders(model, d_sae: int = 64, k: int = 4, seed: int = 0) -> dict[int, SAE]:
    """A TopK transcoder per layer of MODEL, random float64 weights (reading d_model, writing d_model)."""
    rng = np.random.default_rng(seed)
    d = model.config.d_model
    out = {}
    for layer in range(model.config.n_layers):
        params = {"W_enc": rng.normal(size=(d, d_sae)) / np.sqrt(d), "b_enc": rng.normal(size=d_sae) * 0.1,
                  "W_dec": rng.normal(size=(d_sae, d)) / np.sqrt(d_sae), "b_dec": np.zeros(d)}
        out[layer] = SAE(SAEConfig(d_in=d, d_sae=d_sae, k=k, layer=layer, site="ffn_in"), params)
    return out


@pytest.fixture(scope="module")
def llama():
    return qkv.load(MODELS / "llama_gqa", dtype=np.float64)


def test_annotate_reads_each_features_logit_lens_and_its_top_contexts(llama):
    tcs = random_transcoders(llama)
    graph = fake_graph(n=4, nodes=14, links=12, layers=llama.config.n_layers, hostile=False)
    graph["features"] = {}
    corpus = ["the cat sat on the mat", "a dog ran to the park", "birds fly south", "we went to the market"]
    out = gp.annotate(graph, llama, tcs, corpus, top=3, contexts=2, window=2)
    assert "features" not in graph or graph["features"] == {}                   # the graph itself is not changed
    feats = {(d["layer"], d["feature"]) for d in graph["nodes"] if d["kind"] == "feature"}
    assert set(out["features"]) == {f"{l}:{f}" for l, f in feats}
    w = llama.weights
    for layer, f in feats:
        note = out["features"][f"{layer}:{f}"]
        v = (tcs[layer].W_dec[f] * w.final_norm.weight) @ np.asarray(w.W_vocab, dtype=np.float64)   # (V,) by hand
        up = np.argsort(-v, kind="stable")[:3]
        assert [t for t, _ in note["promotes"]] == [llama.tokenizer.label(int(i)) for i in up]
        assert np.allclose([x for _, x in note["promotes"]], v[up], rtol=1e-3, atol=1e-5)
        assert [x for _, x in note["suppresses"]] == sorted(x for _, x in note["suppresses"])
        assert len(note["contexts"]) <= 2
        best = []                                                                # the contexts by hand
        for text in corpus:
            ids = llama.encode(text)[0]
            x = llama.run(text, keep=("ffn_in",)).layer(layer).ffn_in
            z = tcs[layer].encode(x)[:, f]
            z[0] = 0                                                             # the attention sink: left out
            if z.max() > 0:
                p = int(np.argmax(z))
                best.append((z[p], [llama.tokenizer.label(int(i)) for i in ids[max(0, p - 2):p + 3]]))
        best.sort(key=lambda b: -b[0])
        assert [c["tokens"] for c in note["contexts"]] == [t for _, t in best[:2]]
        assert np.allclose([max(c["values"]) for c in note["contexts"]], [z for z, _ in best[:2]], rtol=1e-3)
    assert data_of(gp.graph_page(out))["graph"]["features"].keys() == out["features"].keys()


def test_annotate_cuts_a_long_text_into_pieces(llama):
    """A corpus text longer than the model reads at once (a play, a book) is read in pieces of max_tokens, each
    piece's first token left out as the attention sink: the contexts equal a by-hand pass over each piece."""
    tcs = random_transcoders(llama)
    graph = fake_graph(n=4, nodes=14, links=12, layers=llama.config.n_layers, hostile=False)
    long = " ".join(["the cat sat on the mat and a dog ran to the park while birds fly south"] * 20)
    ids = [int(i) for i in llama.tokenizer.encode(long)[0]]
    assert len(ids) > llama.config.max_positions                                # more than one pass can read
    out = gp.annotate(graph, llama, tcs, [long], contexts=3, window=1, max_tokens=16, limit=10**6)
    read = 0
    for d in graph["nodes"]:
        if d["kind"] != "feature":
            continue
        layer, f = d["layer"], d["feature"]
        best = []
        for start in range(0, len(ids), 16):
            piece = ids[start:start + 16]
            if len(piece) < 2:
                continue
            z = tcs[layer].encode(llama.run(piece, keep=("ffn_in",)).layer(layer).ffn_in)[:, f]
            z[0] = 0
            if z.max() > 0:
                p = int(np.argmax(z))
                best.append((z[p], [llama.tokenizer.label(i) for i in piece[max(0, p - 1):p + 2]]))
        best.sort(key=lambda b: -b[0])
        got = out["features"][f"{layer}:{f}"]["contexts"]
        assert [c["tokens"] for c in got] == [t for _, t in best[:3]]
        read += len(got)
    assert read > 0                                                              # some feature fired somewhere


def test_annotate_needs_a_transcoder_for_every_layer_of_the_graph(llama):
    tcs = random_transcoders(llama)
    graph = fake_graph(n=4, nodes=14, links=12, layers=llama.config.n_layers, hostile=False)
    layer = next(d["layer"] for d in graph["nodes"] if d["kind"] == "feature")
    del tcs[layer]
    with pytest.raises(QkvError, match=f"features of layer {layer} but no transcoder"):
        gp.annotate(graph, llama, tcs)


@pytest.fixture(scope="module")
def real_graph(llama):
    """The pruned graph of a prompt on the tiny Llama (qkv.graphs: build_graph, prune_graph, graph_json) over random
    TopK transcoders, annotated with a small corpus: (graph, transcoders)."""
    from qkv.graphs.files import graph_json
    from qkv.graphs.graph import build_graph
    from qkv.graphs.prune import prune_graph

    tcs = random_transcoders(llama)
    text = "the cat sat on the mat"
    graph = build_graph(llama, text, tcs)
    pruned, scores = prune_graph(graph, 0.8, 0.98)
    data = graph_json(graph, pruned, scores, node_threshold=0.8, edge_threshold=0.98, prompt=text,
                      transcoders="random TopK transcoders")
    return gp.annotate(data, llama, tcs, ["the cat sat on the mat", "a dog ran to the park", "birds fly south"]), tcs


def test_a_real_graph_of_a_tiny_model_becomes_a_page(real_graph):
    graph, _ = real_graph
    shown = data_of(gp.graph_page(graph))["graph"]
    assert [d["id"] for d in shown["nodes"]] == [d["id"] for d in graph["nodes"]]
    assert [(l["source"], l["target"]) for l in shown["links"]] == [(l["source"], l["target"]) for l in graph["links"]]
    feats = {f"{d['layer']}:{d['feature']}" for d in graph["nodes"] if d["kind"] == "feature"}
    assert feats and set(shown["features"]) == feats
    assert all(len(a["promotes"]) == len(a["suppresses"]) == gp.TOKENS for a in shown["features"].values())
    assert any(a["contexts"] for a in shown["features"].values())
    assert shown["scores"] == {k: gp._round(v) for k, v in graph["scores"].items()}


# ── the command ──────────────────────────────────────────────────────────────────

def test_qkv_graph_page_writes_the_page_of_a_json_file(tmp_path, monkeypatch, capsys):
    graph = fake_graph(n=6, nodes=30, links=40)
    (tmp_path / "g.json").write_text(json.dumps(graph), encoding="utf-8")
    code, out, _ = run_main(monkeypatch, capsys, "graph-page", str(tmp_path / "g.json"), "--out",
                            str(tmp_path / "g.html"), "--lang", "ko")
    assert code == 0 and "wrote" in out and "30 nodes, 40 links" in out
    data = data_of((tmp_path / "g.html").read_text(encoding="utf-8"))
    assert data["lang"] == "ko" and len(data["graph"]["nodes"]) == 30
    (tmp_path / "bad.json").write_text(json.dumps({"qkv_graph": 2}), encoding="utf-8")
    code, _, err = run_main(monkeypatch, capsys, "graph-page", str(tmp_path / "bad.json"), "--out",
                            str(tmp_path / "b.html"))
    assert code == 2 and "is version 2 of qkv's graph JSON" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b.html").exists()


def test_qkv_graph_writes_its_page_annotated_from_a_corpus(tmp_path, monkeypatch, capsys):
    from qkv.features.saelens import save_saelens
    from test_graph_cli import MODEL, TEXT, random_transcoder

    model = qkv.load(MODEL)
    for layer in range(model.config.n_layers):
        save_saelens(random_transcoder(model.config.d_model, layer, layer), tmp_path / "tc" / f"layer_{layer}")
    (tmp_path / "corpus.txt").write_text("the cat sat on the mat\na dog ran to the park\nbirds fly south\n",
                                         encoding="utf-8")
    common = ("--quiet", "graph", TEXT, "--model", MODEL, "--transcoders", str(tmp_path / "tc"))
    code, _, err = run_main(monkeypatch, capsys, *common, "--json", str(tmp_path / "g.json"), "--page",
                            str(tmp_path / "g.html"), "--page-corpus", str(tmp_path / "corpus.txt"))
    assert code == 0, err
    graph = json.loads((tmp_path / "g.json").read_text(encoding="utf-8"))
    shown = data_of((tmp_path / "g.html").read_text(encoding="utf-8"))["graph"]
    assert [d["id"] for d in shown["nodes"]] == [d["id"] for d in graph["nodes"]]
    feats = {f"{d['layer']}:{d['feature']}" for d in graph["nodes"] if d["kind"] == "feature"}
    assert set(shown["features"]) == feats and any(a["contexts"] for a in shown["features"].values())
    for extra, message in ((("--page-corpus", "english"), "give --page FILE.html too"),
                           (("--page", str(tmp_path / "g.txt")), "is not an .html file name")):
        code, _, err = run_main(monkeypatch, capsys, *common, *extra)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_server_without_transcoders_computes_no_graph():
    from qkv.web.app import App
    from qkv.web.server import HttpError

    app = App(str(MODELS / "llama_gqa"))
    with pytest.raises(HttpError, match="no transcoders") as e:
        app.graph({"text": "the cat"})
    assert e.value.status == 400
    assert '"graph_compute":false' in app.page()


def test_page_corpus_takes_every_named_corpus(tmp_path):
    """--page-corpus english (a mix of two named corpora) is opened by name, as shakespeare and kjv are, not as a file."""
    from qkv.cli.graph_page import check_page
    from qkv.features.corpora import NAMES

    for name in NAMES:
        texts = check_page(str(tmp_path / "g.html"), name)
        assert texts.name == name and texts.count > 0
