"""The attribution graph page in a real browser (Debian's Chromium, Playwright, the network blocked; fixtures as in
test_browser.py), on the graphs of test_graph_page.fake_graph: every node and link drawn where its layer and
position say, the card on hover, a node's sub-graph kept on click, supernodes, a pinned path, both languages, and
the PNG, SVG and JSON downloads. Every expectation is computed here from the JSON, apart from the page.
"""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET

import pytest

from test_browser import assert_offline, browser, tab  # noqa: F401  (fixtures)
from test_browser_export import png_size
from test_graph_page import XSS, fake_graph, llama, real_graph  # noqa: F401  (fixtures)
from qkv.graphs.page import write_graph_page
from qkv.viz.words import en, ko

READY = "[data-qkv-graph][data-ready='1']"
SVG = "{http://www.w3.org/2000/svg}"


def short(s: str, n: int) -> str:
    return s[:n - 1] + "…" if len(s) > n else s


def open_graph(tab, graph: dict, path, lang: str = "en") -> float:
    """Write GRAPH's page and open it; the seconds from navigation to the graph drawn."""
    write_graph_page(graph, path, lang=lang)
    t0 = time.perf_counter()
    tab.page.goto(path.as_uri())
    tab.page.wait_for_selector(READY)
    return time.perf_counter() - t0


def state(tab) -> dict:
    return tab.page.eval_on_selector("[data-qkv-graph]", "e => Object.assign({}, e.dataset)")


def node(id_: str) -> str:
    """The shape of node ID (its group's box also holds a logit's or a supernode's slanted label)."""
    return f'.qkv-g-node[data-id="{id_}"] > :first-child'


def shown(tab) -> set[str]:
    return set(tab.page.eval_on_selector_all(".qkv-g-node:not(.qkv-g-off)", "ns => ns.map(n => n.dataset.id)"))


def reach(start: str, links: list[dict], back: bool) -> set[str]:
    """START and every node reached from it along the links (BACK: against them)."""
    seen, stack = {start}, [start]
    while stack:
        here = stack.pop()
        for l in links:
            a, b = (l["target"], l["source"]) if back else (l["source"], l["target"])
            if a == here and b not in seen:
                seen.add(b)
                stack.append(b)
    return seen


@pytest.fixture(scope="module")
def graph():
    return fake_graph(n=30, nodes=300, links=3000)


def test_the_page_draws_every_node_and_link_by_layer_and_position_offline(tab, graph, tmp_path):
    tab.page.context.set_offline(True)
    seconds = open_graph(tab, graph, tmp_path / "g.html")
    print(f"\nChromium opened the 30-token graph (300 nodes, 3000 links) in {seconds:.2f} s")
    page = tab.page
    ids = page.eval_on_selector_all(".qkv-g-node", "ns => ns.map(n => n.dataset.id)")
    assert sorted(ids) == sorted(d["id"] for d in graph["nodes"])
    assert page.eval_on_selector_all(".qkv-g-link", "ls => ls.length") == len(graph["links"])
    at = page.eval_on_selector_all(".qkv-g-node", """ns => ns.map(n => { const r = n.getBoundingClientRect();
        return [n.dataset.id, r.x + r.width / 2, r.y + r.height / 2]; })""")
    where = {i: (x, y) for i, x, y in at}
    by_id = {d["id"]: d for d in graph["nodes"]}
    for a in graph["nodes"]:                                   # rows: layers upwards; columns: positions rightwards
        for b in graph["nodes"][::17]:
            if a["layer"] < b["layer"]:
                assert where[a["id"]][1] > where[b["id"]][1] + 20, (a["id"], b["id"])
            if a["position"] < b["position"]:
                assert where[a["id"]][0] < where[b["id"]][0], (a["id"], b["id"])
    assert all(by_id[i]["kind"] == k for i, k in page.eval_on_selector_all(
        ".qkv-g-node", "ns => ns.map(n => [n.dataset.id, n.dataset.kind])"))
    tokens = page.eval_on_selector_all(".qkv-g-token", "ts => ts.map(t => t.textContent)")
    assert tokens == [short(t, 14) for t in graph["tokens"]]                     # the hostile one as text
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0
    scores = page.eval_on_selector_all(".qkv-g-table tr[data-score]",
                                       "rs => rs.map(r => [...r.cells].map(c => c.textContent))")
    assert scores == [["replacement", "0.7", "0.55"], ["completeness", "0.9", "0.86"]]
    assert page.text_content(".qkv-g-text") == graph["prompt"]
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_hovering_a_feature_shows_its_card(tab, graph, tmp_path):
    open_graph(tab, graph, tmp_path / "g.html")
    page = tab.page
    key = next(iter(graph["features"]))
    d = next(d for d in graph["nodes"] if d["kind"] == "feature" and f"{d['layer']}:{d['feature']}" == key)
    page.hover(node(d["id"]))
    assert state(tab)["hover"] == d["id"]
    card = ".qkv-g-card"
    token = graph["tokens"][d["position"]]
    assert page.text_content(f"{card} h3") == en.GRAPH["card_feature"].format(
        feature=d["feature"], layer=d["layer"], position=d["position"], token=token)
    facts = page.eval_on_selector_all(f"{card} dd", "ds => ds.map(x => x.textContent)")
    activation = d["activation"]
    assert facts[0] == str(float(f"{activation:.4g}"))
    promoted = page.eval_on_selector_all(f"{card} [data-list=promotes] .qkv-g-tok", "ts => ts.map(t => t.textContent)")
    assert promoted == [" up", XSS]
    context = page.eval_on_selector_all(f"{card} .qkv-g-context .qkv-g-ctok", "ts => ts.map(t => t.textContent)")
    assert context == ["a", XSS, "c"]
    assert page.text_content(f"{card} .qkv-g-peak") == XSS                       # the peak: its largest value
    inputs = [l for l in graph["links"] if l["target"] == d["id"]]
    assert page.locator(f"{card} h4", has_text="strongest inputs").count() == (1 if inputs else 0)
    hot = page.eval_on_selector_all(".qkv-g-link.qkv-g-hot", "ls => ls.length")
    assert hot == sum(d["id"] in (l["source"], l["target"]) for l in graph["links"])
    page.mouse.move(2, 2)
    assert state(tab)["hover"] == ""
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0
    assert tab.errors == []


def test_clicking_a_node_keeps_its_sub_graph(tab, graph, tmp_path):
    open_graph(tab, graph, tmp_path / "g.html")
    page = tab.page
    d = max((d for d in graph["nodes"] if d["kind"] == "feature"),
            key=lambda d: sum(d["id"] in (l["source"], l["target"]) for l in graph["links"]))
    page.click(node(d["id"]))
    assert state(tab)["kept"] == d["id"]
    up, down = reach(d["id"], graph["links"], back=True), reach(d["id"], graph["links"], back=False)
    assert shown(tab) == up | down and len(up | down) < len(graph["nodes"])
    kept = sum((l["source"] in up and l["target"] in up) or (l["source"] in down and l["target"] in down)
               for l in graph["links"])
    assert page.eval_on_selector_all(".qkv-g-link:not(.qkv-g-off)", "ls => ls.length") == kept
    page.click(".qkv-g-all")                                                     # everything again
    assert state(tab)["kept"] == "" and len(shown(tab)) == len(graph["nodes"])
    assert tab.errors == []


def test_selected_nodes_group_into_a_named_supernode(tab, graph, tmp_path):
    open_graph(tab, graph, tmp_path / "g.html")
    page = tab.page
    members = [d["id"] for d in graph["nodes"] if d["kind"] == "feature"][:3]
    page.click(".qkv-g-mode[data-mode=select]")
    for m in members:
        page.click(node(m))
    assert sorted(page.eval_on_selector_all(".qkv-g-node.qkv-g-sel", "ns => ns.map(n => n.dataset.id)")) == \
        sorted(members)
    page.fill(".qkv-g-name", XSS)
    page.click(".qkv-g-group")
    assert page.eval_on_selector_all(".qkv-g-node", "ns => ns.length") == len(graph["nodes"]) - 2
    sup = page.locator(".qkv-g-node[data-kind=super]")
    assert sup.count() == 1
    sid = sup.get_attribute("data-id")
    assert page.text_content(".qkv-g-node[data-kind=super] text") == short(XSS, 18)    # its name, as text
    rep = {m: sid for m in members}
    sums = {}
    for l in graph["links"]:
        s, t = rep.get(l["source"], l["source"]), rep.get(l["target"], l["target"])
        if s != t:
            sums[(s, t)] = sums.get((s, t), 0.0) + l["weight"]
    assert page.eval_on_selector_all(".qkv-g-link", "ls => ls.length") == len(sums)     # members' edges summed
    assert page.text_content(".qkv-g-super .qkv-g-supername") == XSS
    page.hover(node(sid))
    assert page.text_content(".qkv-g-card h3") == en.GRAPH["card_super"].format(name=XSS, count=3)
    page.click(".qkv-g-ungroup")
    assert page.eval_on_selector_all(".qkv-g-node", "ns => ns.length") == len(graph["nodes"])
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0
    assert tab.errors == []


def test_pinning_a_node_pins_the_strongest_path_through_it(tab, graph, tmp_path):
    open_graph(tab, graph, tmp_path / "g.html")
    page = tab.page
    d = next(d for d in graph["nodes"] if d["kind"] == "feature" and any(l["source"] == d["id"] for l in graph["links"])
             and any(l["target"] == d["id"] for l in graph["links"]))
    page.click(".qkv-g-mode[data-mode=path]")
    page.click(node(d["id"]))
    page_weight = {(l["source"], l["target"]): float(f"{l['weight']:.4g}") for l in graph["links"]}
    path, seen = [d["id"]], {d["id"]}
    for back in (True, False):                                                   # down, then up: the strongest edge
        here = d["id"]
        while True:
            options = [(abs(w), -i, s if back else t) for i, ((s, t), w) in enumerate(page_weight.items())
                       if (t if back else s) == here and (s if back else t) not in seen]
            if not options:
                break
            here = max(options)[2]
            seen.add(here)
            path.insert(0, here) if back else path.append(here)
    assert page.eval_on_selector_all(".qkv-g-steps li", "ls => ls.map(l => l.dataset.id)") == path
    assert path[-1].startswith("L:") and path[0].startswith("E:")
    assert page.eval_on_selector_all(".qkv-g-link.qkv-g-pin", "ls => ls.length") == len(path) - 1
    page.click(".qkv-g-clear")
    assert page.eval_on_selector_all(".qkv-g-node.qkv-g-pin", "ns => ns.length") == 0
    assert tab.errors == []


def test_the_page_speaks_korean_and_switches(tab, graph, tmp_path):
    open_graph(tab, graph, tmp_path / "g.html", lang="ko")
    page = tab.page
    assert state(tab)["lang"] == "ko"
    assert page.eval_on_selector_all(".qkv-g-mode", "bs => bs.map(b => b.textContent)") == \
        [ko.GRAPH[f"mode_{m}"] for m in ("subgraph", "select", "path")]
    assert page.text_content(".qkv-g-title") == ko.GRAPH["title"].format(model="tiny")
    page.click(".qkv-g-lang")
    assert state(tab)["lang"] == "en" and page.text_content(".qkv-g-title") == en.GRAPH["title"].format(model="tiny")
    assert tab.errors == []


def download(tab, kind: str) -> tuple[str, bytes]:
    with tab.page.expect_download() as d:
        tab.page.click(f".qkv-export-btn[data-export={kind}]")
    return d.value.suggested_filename, open(d.value.path(), "rb").read()


def test_export_saves_a_png_an_svg_and_the_json_with_the_view(tab, graph, tmp_path):
    open_graph(tab, graph, tmp_path / "g.html")
    page = tab.page
    members = [d["id"] for d in graph["nodes"] if d["kind"] == "feature"][:2]
    for m in members:
        page.click(node(m), modifiers=["Shift"])                                 # Shift+click selects in any mode
    page.fill(".qkv-g-name", "pair")
    page.click(".qkv-g-group")

    name, data = download(tab, "svg")
    assert name == "tiny-graph.svg"
    root = ET.fromstring(data.decode("utf-8"))
    assert root.tag == SVG + "svg"
    assert len(root.findall(f".//{SVG}path")) >= len(graph["links"]) - 10       # links (summed at the pair), diamonds
    texts = [t.text for t in root.iter(SVG + "text")]
    assert XSS in [t for t in texts] or short(XSS, 14) in texts                  # a token, as XML text
    assert "pair" in texts

    name, data = download(tab, "png")
    w, h, inked = png_size(data)
    assert name == "tiny-graph.png" and inked and w > 1000 and h > 500

    name, data = download(tab, "json")
    saved = json.loads(data)
    assert name == "tiny-graph.json" and saved["qkv_graph"] == 1
    assert [d["id"] for d in saved["nodes"]] == [d["id"] for d in graph["nodes"]]
    assert saved["supernodes"] == [{"name": "pair", "members": members}]

    write_graph_page(saved, tmp_path / "again.html")                             # the saved view opens grouped
    tab.page.goto((tmp_path / "again.html").as_uri())
    tab.page.wait_for_selector(READY)
    assert page.locator(".qkv-g-node[data-kind=super]").count() == 1
    assert tab.errors == [] and tab.dialogs == []
    assert_offline(tab)


def test_qkv_serve_has_a_graph_tab_that_opens_a_json_file(tab, tmp_path):
    from conftest import MODELS, running_server

    graph = fake_graph(n=12, nodes=80, links=300)
    (tmp_path / "g.json").write_text(json.dumps(graph), encoding="utf-8")
    (tmp_path / "bad.json").write_text(json.dumps({"qkv_graph": 1, "nodes": []}), encoding="utf-8")
    with running_server(str(MODELS / "gpt2")) as srv:
        page = tab.page
        page.goto(srv.url)
        page.click(".qkv-mode[data-mode='graph']")
        assert page.text_content(".qkv-graph-hint") == en.GRAPH["open"]
        page.select_option(".qkv-graph-lang", "ko")
        assert page.text_content(".qkv-graph-hint") == ko.GRAPH["open"]
        page.set_input_files(".qkv-graph-file", str(tmp_path / "bad.json"))
        page.wait_for_selector(".qkv-error:not([hidden])")
        assert page.text_content(".qkv-error").startswith(ko.GRAPH["bad_file"].split("{")[0])
        page.set_input_files(".qkv-graph-file", str(tmp_path / "g.json"))
        page.wait_for_selector(READY)
        assert page.eval_on_selector_all(".qkv-g-node", "ns => ns.length") == len(graph["nodes"])
        assert page.text_content(".qkv-g-title") == ko.GRAPH["title"].format(model="tiny")
        assert page.is_hidden(".qkv-error") and page.is_hidden("[data-qkv-root]")
        page.click(".qkv-mode[data-mode='attention']")                          # the other tabs hide it
        assert page.is_hidden(".qkv-graph-tab")
        assert all(u.startswith(srv.url) or u.startswith(("data:", "blob:")) for u in tab.requests), tab.requests
    assert tab.errors == [] and tab.dialogs == []


def test_a_real_graph_of_a_tiny_model_is_drawn(tab, real_graph, tmp_path):
    graph, _ = real_graph
    open_graph(tab, graph, tmp_path / "real.html")
    page = tab.page
    assert sorted(page.eval_on_selector_all(".qkv-g-node", "ns => ns.map(n => n.dataset.id)")) == \
        sorted(d["id"] for d in graph["nodes"])
    assert page.eval_on_selector_all(".qkv-g-link", "ls => ls.length") == len(graph["links"])
    d = next(d for d in graph["nodes"] if d["kind"] == "feature")
    page.hover(node(d["id"]))
    promoted = page.eval_on_selector_all(".qkv-g-card [data-list=promotes] .qkv-g-tok",
                                         "ts => ts.map(t => t.textContent)")
    assert promoted == [t for t, _ in graph["features"][f"{d['layer']}:{d['feature']}"]["promotes"]]
    assert tab.errors == []


def test_qkv_serve_with_transcoders_computes_a_prompts_graph(tab, tmp_path):
    import qkv
    from conftest import running_server
    from qkv.features.saelens import save_saelens
    from qkv.graphs.files import graph_json
    from qkv.graphs.graph import build_graph
    from qkv.graphs.prune import prune_graph
    from test_graph_cli import MODEL, random_transcoder

    model = qkv.load(MODEL)
    tcs = {layer: random_transcoder(model.config.d_model, layer, layer) for layer in range(model.config.n_layers)}
    for layer, sae in tcs.items():
        save_saelens(sae, tmp_path / "tc" / f"layer_{layer}")
    text = "the cat sat on"
    graph = build_graph(model, text, tcs)
    want = graph_json(graph, *prune_graph(graph), node_threshold=0.8, edge_threshold=0.98)
    with running_server(MODEL, transcoders=str(tmp_path / "tc")) as srv:
        page = tab.page
        page.goto(srv.url)
        page.click(".qkv-mode[data-mode='graph']")
        assert page.is_visible(".qkv-graph-ask") and page.text_content(".qkv-graph-ask button") == en.GRAPH["compute"]
        page.fill(".qkv-graph-ask textarea", text)
        page.click(".qkv-graph-ask button")
        page.wait_for_selector(READY)
        assert sorted(page.eval_on_selector_all(".qkv-g-node", "ns => ns.map(n => n.dataset.id)")) == \
            sorted(d["id"] for d in want["nodes"])
        assert page.eval_on_selector_all(".qkv-g-link", "ls => ls.length") == len(want["links"])
        d = next(d for d in want["nodes"] if d["kind"] == "feature")
        page.hover(node(d["id"]))
        assert page.locator(".qkv-g-card [data-list=promotes] .qkv-g-tok").count() == 5   # annotated by the server
    assert tab.errors == [] and tab.dialogs == []
