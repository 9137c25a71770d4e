"""`qkv graph` (qkv.cli.graph) on a tiny model with random transcoders written in SAELens's layout, one folder per
layer: the scores and tables it prints, the JSON it writes (read back with every key checked), and one line with
exit code 2 for each mistake."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv.features.sae import SAE, SAEConfig
from qkv.features.saelens import save_saelens
from qkv.graphs.files import check_graph_json, read_graph_file, write_graph
from qkv.runtime.errors import QkvError

MODEL = str(MODELS / "llama_gqa")
TEXT = "the cat sat on"


def random_transcoder(d: int, layer: int, seed: int, d_sae: int = 32, k: int = 4) -> SAE:
    rng = np.random.default_rng(seed)
    params = {"W_enc": rng.standard_normal((d, d_sae)) / np.sqrt(d), "b_enc": 0.1 * rng.standard_normal(d_sae),
              "W_dec": rng.standard_normal((d_sae, d)) / np.sqrt(d_sae), "b_dec": 0.1 * rng.standard_normal(d)}
    cfg = SAEConfig(d_in=d, d_sae=d_sae, k=k, apply_b_dec_to_input=False, d_out=d, layer=layer, site="ffn_in",
                    site_out="ffn_out")
    return SAE(cfg, {name: a.astype(np.float32) for name, a in params.items()})


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(every layer's transcoders, only layer 0's, ones of the wrong width) as folders of SAELens directories."""
    model = qkv.load(MODEL)
    d, L = model.config.d_model, model.config.n_layers
    root = tmp_path_factory.mktemp("transcoders")
    good, some, narrow = root / "good", root / "some", root / "narrow"
    for layer in range(L):
        save_saelens(random_transcoder(d, layer, layer), good / f"layer_{layer}")
        save_saelens(random_transcoder(8, layer, layer), narrow / f"layer_{layer}")
    save_saelens(random_transcoder(d, 0, 0), some / "layer_0")
    return good, some, narrow


def test_graph_prints_scores_nodes_and_edges_and_writes_its_json(folders, monkeypatch, capsys, tmp_path):
    out = tmp_path / "graph.json"
    code, stdout, err = run_main(monkeypatch, capsys, "--quiet", "graph", TEXT, "--model", MODEL, "--transcoders",
                                 str(folders[0]), "--json", str(out), "--max-logits", "3")
    assert code == 0, err
    assert "replacement" in stdout and "completeness" in stdout and "most influential nodes" in stdout
    assert "strongest direct effects" in stdout
    graph = read_graph_file(out)
    logits = [n for n in graph["nodes"] if n["kind"] == "logit"]
    assert 1 <= len(logits) <= 3 and graph["target"] is None
    assert graph["layers"] == 2 and graph["d_model"] == 64 and graph["tokens"] and graph["prompt"] == TEXT
    assert {n["kind"] for n in graph["nodes"]} >= {"embedding", "logit"}
    assert all(0 <= graph["scores"][k] <= 1 for k in graph["scores"])
    assert graph["thresholds"] == {"node": 0.8, "edge": 0.98}
    ids = {n["id"] for n in graph["nodes"]}
    assert graph["links"] and all(l["source"] in ids and l["target"] in ids for l in graph["links"])
    assert "2 per-layer transcoders" in graph["transcoders"] and "/" not in graph["transcoders"]
    from qkv.graphs.page import read_graph
    assert len(read_graph(out)["nodes"]) == len(graph["nodes"])               # the page reads it too


def test_a_target_token_gets_its_logit_node(folders, monkeypatch, capsys, tmp_path):
    model = qkv.load(MODEL)
    target = model.tokenizer.decode([42])
    out = tmp_path / "g.json"
    code, stdout, err = run_main(monkeypatch, capsys, "--quiet", "graph", TEXT, "--model", MODEL, "--transcoders",
                                 str(folders[0]), "--token", target, "--json", str(out), "--max-logits", "1",
                                 "--node-threshold", "0.5")
    assert code == 0, err
    graph = read_graph_file(out)
    assert graph["target"] == {"token": target, "id": 42} and graph["thresholds"]["node"] == 0.5
    assert "L:42" in {n["id"] for n in graph["nodes"]}
    assert "strongest direct effects" in stdout and f"logit {target!r}" in " ".join(stdout.split())
    code, again, err = run_main(monkeypatch, capsys, "--quiet", "graph", TEXT, "--model", MODEL, "--transcoders",
                                str(folders[0]), "--target", target, "--max-logits", "1", "--node-threshold", "0.5")
    assert code == 0 and "--target is now --token" in err and again == stdout


@pytest.mark.parametrize("which, extra, message", [
    (2, (), "maps 8 → 8 numbers, but"),
    (1, (), "no transcoder for layer(s) 1"),
    (None, (), "is not a directory"),
    (0, ("--node-threshold", "2"), "node threshold must be a number from 0 to 1"),
    (0, ("--token", "no such single token at all"), "is not one token"),
    (0, ("--max-logits", "0"), "max_logits must be a whole number"),
    (0, ("--intervene", "L0:F1@0=0"), "position 0 is held in the graph"),
])
def test_mistakes_are_one_line_and_exit_2(folders, monkeypatch, capsys, tmp_path, which, extra, message):
    where = str(tmp_path / "nothing") if which is None else str(folders[which])
    code, stdout, err = run_main(monkeypatch, capsys, "graph", TEXT, "--model", MODEL, "--transcoders", where, *extra)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err


def test_the_first_token_is_held_unless_keep_first(folders, monkeypatch, capsys, tmp_path):
    """The attention sink's FFN outputs are constants by default (no feature node at position 0, "held": [0]);
    --keep-first gives it nodes, and an edit there is then allowed."""
    graphs = {}
    for flag in ((), ("--keep-first", "--intervene", "L0:F1@0=0")):
        out = tmp_path / f"g{len(flag)}.json"
        code, stdout, err = run_main(monkeypatch, capsys, "--quiet", "graph", TEXT, "--model", MODEL,
                                     "--transcoders", str(folders[0]), "--json", str(out), "--node-threshold", "1",
                                     "--edge-threshold", "1", *flag)
        assert code == 0, err
        graphs[flag] = read_graph_file(out)
    held, kept = graphs[()], graphs[flag]
    assert held["held"] == [0] and kept["held"] == []
    first = [n for n in held["nodes"] if n["kind"] in ("feature", "error") and n["position"] == 0]
    assert all(n["kind"] == "error" and n["norm"] == 0 for n in first)
    assert any(n["kind"] == "feature" and n["position"] == 0 for n in kept["nodes"])


def test_the_json_is_checked_key_by_key(folders, monkeypatch, capsys, tmp_path):
    out = tmp_path / "graph.json"
    assert run_main(monkeypatch, capsys, "--quiet", "graph", TEXT, "--model", MODEL, "--transcoders",
                    str(folders[0]), "--json", str(out))[0] == 0
    good = json.loads(out.read_text())
    check_graph_json(good)
    node = next(i for i, n in enumerate(good["nodes"]) if n["kind"] == "feature")
    for broken, message in [
        (lambda g: g.pop("scores"), "has no scores"),
        (lambda g: g.update(qkv_graph=2), "version 2"),
        (lambda g: g["scores"].update(replacement=1.5), "replacement must be a number from 0 to 1"),
        (lambda g: g.update(target=None) or g.pop("target"), "has no target"),
        (lambda g: g["nodes"][node].update(feature=-1), "feature must be a whole number"),
        (lambda g: g["nodes"][node].update(id="F:0:0:0", layer=1), "does not match"),
        (lambda g: g["nodes"].append(dict(g["nodes"][0])), "same id"),
        (lambda g: g["links"][0].update(source="F:9:9:9"), "is not a node of the graph"),
        (lambda g: g["links"][0].pop("weight"), "has no weight"),
        (lambda g: g.update(ids=g["ids"][:-1]), "one whole number"),
    ]:
        bad = json.loads(json.dumps(good))
        broken(bad)
        with pytest.raises(QkvError, match=message):
            check_graph_json(bad)
        with pytest.raises(QkvError, match=message):
            write_graph(tmp_path / "bad.json", bad)                           # never written unchecked
    (tmp_path / "text.json").write_text("[1, 2]")
    with pytest.raises(QkvError, match="not a JSON object"):
        read_graph_file(tmp_path / "text.json")
