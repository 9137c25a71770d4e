"""The attribution graph as a still picture (`qkv.viz.graph_figures`, `qkv graph-page G.json --out G.png`,
`qkv graph … --png`): which nodes and edges it draws, where, in which colour, and the files it writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.collections import PathCollection

import qkv
from conftest import run_main
from qkv.runtime.errors import QkvError
from qkv.viz import graph_figures as gf
from test_graph_page import fake_graph


def test_every_token_and_logit_and_the_most_influential_nodes_are_drawn():
    data = fake_graph(n=8, nodes=120, links=600, hostile=False)
    chosen = gf.chosen_nodes(data, 20)
    kinds = [n["kind"] for n in chosen]
    assert kinds.count("embedding") == 8 and kinds.count("logit") == 3
    inner = [n for n in chosen if n["kind"] in ("feature", "error")]
    rest = [n for n in data["nodes"] if n["kind"] in ("feature", "error") and n not in inner]
    assert len(inner) == 20 and min(n["influence"] for n in inner) >= max(n["influence"] for n in rest)
    fig = gf.graph_figure(data, most_nodes=20)
    dots = sum(len(c.get_offsets()) for c in fig.axes[0].collections if isinstance(c, PathCollection))
    assert dots == len(chosen)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [repr(t) for t in data["tokens"]]


def test_nodes_sit_at_their_position_and_layer():
    data = fake_graph(n=6, nodes=60, links=200, layers=5, hostile=False)
    nodes = gf.chosen_nodes(data, 30)
    at = gf.places(nodes, 5)
    for n in nodes:
        x, y = at[n["id"]]
        if n["kind"] == "logit":
            assert y == 6
        else:
            assert y == n["layer"] and abs(x - n["position"]) < 0.5


def test_edges_are_the_strongest_shares_of_their_targets_input_coloured_by_sign():
    data = fake_graph(n=6, nodes=60, links=300, hostile=False)
    ids = {n["id"] for n in gf.chosen_nodes(data, 30)}
    links = gf.chosen_links(data, ids, 25)
    total = {}
    for link in data["links"]:
        total[link["target"]] = total.get(link["target"], 0) + abs(link["weight"])
    every = sorted((abs(l["weight"]) / total[l["target"]] for l in data["links"]
                    if l["source"] in ids and l["target"] in ids), reverse=True)
    assert [share for _, share in links] == pytest.approx(every[:25])
    fig = gf.graph_figure(data, most_nodes=30, most_edges=25)
    lines = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) == 2]
    assert len(lines) == 25
    colours = sorted(ln.get_color() for ln in lines)
    signs = sorted(gf.RED if l["weight"] > 0 else gf.BLUE for l, _ in links)
    assert colours == signs


def test_graph_page_draws_a_picture_and_refuses_bad_names(tmp_path, monkeypatch, capsys):
    data = fake_graph(n=6, nodes=40, links=80)                          # a hostile token: drawn as text
    (tmp_path / "g.json").write_text(json.dumps(data), encoding="utf-8")
    for name in ("g.png", "g.svg"):
        code, _, err = run_main(monkeypatch, capsys, "graph-page", str(tmp_path / "g.json"), "--out",
                                str(tmp_path / name), "--lang", "ko")
        assert code == 0, err
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "g.svg").read_bytes()[:2000]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]      # no temporary file left
    with pytest.raises(QkvError, match="not a picture's name"):
        gf.save_graph_figure(data, tmp_path / "g.gif")
    code, _, err = run_main(monkeypatch, capsys, "graph-page", str(tmp_path / "g.json"), "--out",
                            str(tmp_path / "g.txt"))
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_qkv_graph_png_draws_the_pruned_graph(tmp_path, monkeypatch, capsys):
    from qkv.features.saelens import save_saelens
    from test_graph_cli import MODEL, TEXT, random_transcoder

    model = qkv.load(MODEL)
    for layer in range(model.config.n_layers):
        save_saelens(random_transcoder(model.config.d_model, layer, layer), tmp_path / "tc" / f"layer_{layer}")
    common = ("--quiet", "graph", TEXT, "--model", MODEL, "--transcoders", str(tmp_path / "tc"))
    code, _, err = run_main(monkeypatch, capsys, *common, "--json", str(tmp_path / "g.json"), "--png",
                            str(tmp_path / "g.png"))
    assert code == 0, err
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads((tmp_path / "g.json").read_text(encoding="utf-8"))
    fig = gf.graph_figure(data)
    dots = sum(len(c.get_offsets()) for c in fig.axes[0].collections if isinstance(c, PathCollection))
    assert dots == len(gf.chosen_nodes(data, 40)) and np.isfinite(dots)
    code, _, err = run_main(monkeypatch, capsys, *common, "--png", str(tmp_path / "g.jpg2"))
    assert code == 2 and "not a picture's name" in err and not (tmp_path / "g.jpg2").exists()
