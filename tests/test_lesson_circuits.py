"""`qkv explain circuits` (qkv.graphs.lesson) on a tiny model with random TopK transcoders: its numbers against
independent recomputation in float64, both languages, and one line (exit 2) for what it cannot take."""

from __future__ import annotations

import numpy as np
import pytest
from rich.console import Console

import qkv
from conftest import MODELS, run_main
from qkv.graphs import lesson as circuits
from qkv.features.dictionaries import load_transcoders
from test_graph_cli import folders, random_transcoder  # noqa: F401  (the fixture, reused)

MODEL = str(MODELS / "llama_gqa")
TEXT = "the cat sat on"


@pytest.fixture(scope="module")
def built():
    model = qkv.load(MODEL, dtype=np.float64)
    d, L = model.config.d_model, model.config.n_layers
    tcs = {i: random_transcoder(d, i, i) for i in range(L)}
    return model, tcs, circuits.build(model, TEXT, transcoders=tcs, layer=1)


def test_numbers_against_float64_recomputation(built):
    model, tcs, le = built
    ids, _ = model.encode(TEXT)
    trace = model.run(TEXT, layers=[1], keep=("ffn_in", "ffn_out"))
    h, y = trace.layer(1).ffn_in[-1], trace.layer(1).ffn_out[-1]
    np.testing.assert_allclose(le.h, h, atol=1e-12)
    np.testing.assert_allclose(le.y, y, atol=1e-12)
    p = {k: v.astype(np.float64) for k, v in tcs[1].params.items()}
    pre = h @ p["W_enc"] + p["b_enc"]
    z = np.where(pre >= np.sort(pre)[-tcs[1].config.k], np.maximum(pre, 0), 0)
    np.testing.assert_allclose(le.recon, z @ p["W_dec"] + p["b_dec"], atol=1e-12)
    np.testing.assert_allclose(le.recon + le.error, y, atol=1e-12)
    assert le.n_active == np.count_nonzero(z)
    top = np.argsort(-z)[:len(le.features)]
    assert [f.index for f in le.features] == list(top)
    assert [f.z for f in le.features] == pytest.approx(z[top], abs=1e-12)
    w = model.weights
    lg = (p["W_dec"][top[0]] * w.final_norm.weight) @ np.asarray(w.W_vocab, np.float64)
    assert [v for _, v in le.features[0].promoted] == pytest.approx(np.sort(lg)[::-1][:len(le.features[0].promoted)])
    logits = model.forward(ids[None]).logits[0, -1].astype(np.float64)
    t = int(np.argmax(logits))
    assert le.logit_value == pytest.approx(logits[t] - logits.mean(), abs=1e-9)
    assert le.edges_sum + le.constant == pytest.approx(le.logit_value, abs=1e-9)
    assert le.edge.held == pytest.approx(le.edge.weight, abs=1e-9)
    assert le.edge.value * le.edge.gradient == pytest.approx(le.edge.weight, abs=1e-12)
    assert le.feature_edge is None or (le.feature_edge.kind == "feature"
                                       and le.feature_edge.held == pytest.approx(le.feature_edge.weight, abs=1e-9))
    assert all(v < 1e-9 for v in le.diffs.values()), le.diffs
    assert 0 <= le.replacement <= 1 and 0 <= le.completeness <= 1


def test_scores_match_the_inverse(built):
    """replacement and completeness against w·((I − Â)⁻¹ − I), the influence's plain form (a tiny graph)."""
    model, tcs, le = built
    graph = circuits.build_graph(model, TEXT, tcs, max_logits=circuits.MAX_LOGITS)
    A = np.abs(graph.adjacency.astype(np.float64))
    A_hat = A / np.maximum(A.sum(axis=1, keepdims=True), 1e-10)
    w = graph.logit_weights()
    inf = w @ (np.linalg.inv(np.eye(len(A)) - A_hat) - np.eye(len(A)))
    errs, embs = circuits._masks(graph)
    rep = inf[embs].sum() / (inf[embs].sum() + inf[errs].sum())
    comp = ((1 - A_hat[:, errs].sum(axis=1)) * (inf + w)).sum() / (inf + w).sum()
    assert le.replacement == pytest.approx(rep, abs=1e-9) and le.completeness == pytest.approx(comp, abs=1e-9)


def test_a_wrong_edge_would_fail_the_check(built):
    model, tcs, le = built
    graph = circuits.build_graph(model, TEXT, tcs, max_logits=1)
    t = graph.slices()["logit"].start
    row = graph.adjacency[t].astype(np.float64)
    s = int(np.argmax(np.abs(row[:t])))
    row[s] *= 1.01                                                     # one edge off by 1 %
    edge = circuits._edge(graph, s, int(graph.logit_ids[0]), row)
    with pytest.raises(RuntimeError, match="held forward pass"):
        circuits.same("the strongest edge redone by a held forward pass", edge.held, edge.weight, 1e-6, rel=True)


@pytest.mark.parametrize("lang, words", [("en", ["① The FFN box", "⑤", "error nodes", "replacement ="]),
                                         ("ko", ["① 레이어 1", "오차 노드", "completeness ="])])
def test_renders_in_both_languages(built, lang, words):
    console = Console(record=True, width=120)
    for part in circuits.render(built[2], lang):
        console.print(part)
    out = console.export_text()
    assert all(w in out for w in words), out


def test_cli_runs_with_transcoders(folders, monkeypatch, capsys):  # noqa: F811
    code, out, err = run_main(monkeypatch, capsys, "explain", "circuits", TEXT, "--model", MODEL, "--transcoders",
                              str(folders[0]), "--lang", "ko")
    assert code == 0, err
    assert "qkv explain circuits · " in out and "④" in out


@pytest.mark.parametrize("args, message", [
    ([], "give --transcoders DIR"),
    (["--transcoders", "x", "--head", "0"], "drop --head"),
    (["--transcoders", "x", "--out", "figs"], "draws no figures"),
])
def test_mistakes_give_one_line(monkeypatch, capsys, args, message):
    code, out, err = run_main(monkeypatch, capsys, "explain", "circuits", "--model", MODEL, *args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qkv: error: ") and message in lines[0], err
    assert "qkv transcoders train" in lines[0] or args, err                      # the missing DIR names the command


def test_other_topics_refuse_transcoders(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "explain", "gqa", "--transcoders", "x")
    assert code == 2 and "circuits" in err


def test_narrow_transcoders_are_one_line(folders, monkeypatch, capsys):  # noqa: F811
    assert load_transcoders(folders[2])
    code, _, err = run_main(monkeypatch, capsys, "explain", "circuits", "--model", MODEL, "--transcoders",
                            str(folders[2]))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "d_model" in err
