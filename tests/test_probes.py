"""Linear probes with a control task (`qkv.analysis.probes`, `qkv probe`).

  - on a synthetic task whose label is linearly encoded in the activations, the probe scores ~100 % on held-out
    rows and the control task (random labels per word type, which the activations do not encode) stays near chance;
    when the activations encode the word type instead, the control task is learnt too and the selectivity falls;
  - selectivity = accuracy − control accuracy exactly; the split is stratified and the control labels are one per
    word type, drawn from the labels' own set;
  - the probe's direction is in the residual basis: with dimensions of very different scales it still points along
    the true separating direction (it would not without undoing the standardisation);
  - `qkv probe` prints and writes what probe_layers computes, its directions file is a control vector, and bad data
    is one line naming the line (exit 2).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv.analysis.probes import (check_probe_data, control_labels, probe_activations, probe_directions, probe_layers,
                                 read_probe_data, split, word_type)
from qkv.checkpoints.control_vector import read_control_vector
from qkv.runtime.errors import QkvError

WORDS = [f"w{k}" for k in range(40)]


def synthetic(n: int = 800, d: int = 16, encode_type: bool = False, seed: int = 0):
    """N texts "item i wK" (40 word types), activations (N, d) and labels: linearly encoded in the activations
    (label = [x·w > 0]), or, with ENCODE_TYPE, a function of the word type whose embedding the activations carry."""
    rng = np.random.default_rng(seed)
    types = rng.integers(0, len(WORDS), size=n)                                        # (N,)
    texts = [f"item {i} {WORDS[t]}" for i, t in enumerate(types)]
    if encode_type:
        table = rng.standard_normal((len(WORDS), d)) * 3.0                              # (40, d) type embeddings
        x = table[types] + 0.1 * rng.standard_normal((n, d))                            # (N, d)
        labels = ["a" if t % 2 else "b" for t in types]
    else:
        x = rng.standard_normal((n, d))                                                 # (N, d)
        w = rng.standard_normal(d)
        labels = ["a" if v > 0 else "b" for v in x @ w]
    return texts, labels, x


def test_a_linearly_encoded_label_is_read_and_the_control_is_not():
    texts, labels, x = synthetic()
    report = probe_activations({3: x}, texts, labels)
    p = report.layers[3]
    assert p.accuracy >= 0.97, p
    assert p.control_accuracy <= 0.75 and p.selectivity >= 0.2, p
    assert p.selectivity == p.accuracy - p.control_accuracy
    assert report.n_train + report.n_test == len(texts) and report.labels == ["a", "b"]


def test_when_the_activations_encode_the_word_type_the_control_is_learnt_too():
    texts, labels, x = synthetic(encode_type=True, d=64)             # 40 types in 64 dimensions: separable
    p = probe_activations({0: x}, texts, labels).layers[0]
    assert p.accuracy >= 0.95 and p.control_accuracy >= 0.9 and p.selectivity <= 0.1, p


def test_the_direction_is_in_the_residual_basis():
    rng = np.random.default_rng(4)
    d = 16
    scale = np.geomspace(0.01, 100.0, d)                                                # dimensions of unequal size
    x = rng.standard_normal((600, d)) * scale                                           # (N, d)
    w = rng.standard_normal(d) / scale                                                  # the true direction in x
    labels = ["neg" if v < 0 else "pos" for v in x @ w]
    texts = [f"t {i} {WORDS[i % 40]}" for i in range(len(x))]
    report = probe_activations({1: x}, texts, labels)
    got = probe_directions(report)[1]
    assert abs(np.linalg.norm(got) - 1.0) < 1e-12
    assert got @ (w / np.linalg.norm(w)) > 0.9                                          # towards "pos", the second
    assert report.layers[1].accuracy >= 0.9


def test_split_and_control_labels():
    labels = ["x"] * 12 + ["y"] * 8 + ["z"] * 4
    train, test = split(labels, 0.25, seed=1)
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(len(labels)))
    held = [labels[i] for i in test]
    assert (held.count("x"), held.count("y"), held.count("z")) == (3, 2, 1)
    texts = [f"a {WORDS[i % 5]}." for i in range(len(labels))]
    control = control_labels(texts, labels, seed=3)
    by_type: dict[str, set] = {}
    for t, c in zip(texts, control):
        by_type.setdefault(word_type(t), set()).add(c)
    assert all(len(v) == 1 for v in by_type.values()) and set(control) <= set(labels)
    assert word_type("The Cat, sat!") == "sat"


def test_probe_data_files(tmp_path):
    tsv = tmp_path / "d.tsv"
    tsv.write_text("good day\tpos\nbad day\tneg\n\n" * 4)
    assert read_probe_data(tsv) == (["good day", "bad day"] * 4, ["pos", "neg"] * 4)
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps({"text": f"t{i}", "label": i % 2}) + "\n" for i in range(8)))
    assert read_probe_data(jsonl)[1] == ["0", "1"] * 4


@pytest.mark.parametrize(("content", "name", "message"), [
    ("good day pos\n", "d.tsv", "line 1 is not TEXT<TAB>LABEL"),
    ("good\tpos\n\tneg\n", "d.tsv", "line 2 is not TEXT<TAB>LABEL"),
    ('{"text": "a", "label": "x"}\n{"text": 3}\n', "d.jsonl", 'line 2 has no "text"'),
    ('{"text": "a", "label": true}\n', "d.jsonl", '"label" must be'),
    ("{oops\n", "d.jsonl", "line 1 is not JSON"),
    ("a\tx\n" * 8, "d.tsv", "has 1 label"),
    ("a\tx\n" * 8 + "b\ty\n" * 3, "d.tsv", "label 'y' is on 3 texts"),
    ("", "d.tsv", "has 0 labels"),
])
def test_bad_probe_data_is_one_error(tmp_path, content, name, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(QkvError, match=message):
        read_probe_data(path)


def test_bad_probe_data_from_python():
    with pytest.raises(QkvError, match="one label per text"):
        check_probe_data(["a", "b"], ["x"])


# ── on a model, and the command ──────────────────────────────────────────────────────────────────────────

def data_file(tmp_path):
    lines = [f"the {a} sat on the {b}\t{'cat' if a == 'cat' else 'dog'}"
             for a in ("cat", "dog") for b in ("mat", "park", "hill", "road", "bed", "floor")]
    path = tmp_path / "animals.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_command_prints_and_writes_what_probe_layers_computes(monkeypatch, capsys, tmp_path):
    path = data_file(tmp_path)
    code, out, err = run_main(monkeypatch, capsys, "probe", "--model", str(MODELS / "gpt2"), "--data", str(path),
                              "--layer", "all", "--position", "mean", "--json", str(tmp_path / "p.json"),
                              "--out", str(tmp_path / "out"))
    assert code == 0, err
    data = json.loads((tmp_path / "p.json").read_text())
    texts, labels = read_probe_data(path)
    want = probe_layers(qkv.load(MODELS / "gpt2"), texts, labels, [0, 1], position="mean")
    assert [r["layer"] for r in data["layers"]] == [0, 1]
    for r in data["layers"]:
        p = want.layers[r["layer"]]
        assert r["accuracy"] == p.accuracy and r["control_accuracy"] == p.control_accuracy
        assert r["selectivity"] == pytest.approx(r["accuracy"] - r["control_accuracy"], abs=1e-15)
        assert f"{p.accuracy:.3f}" in out
    assert json.loads((tmp_path / "out" / "probes.json").read_text()) == data
    assert (tmp_path / "out" / "probes.png").stat().st_size > 1000 and (tmp_path / "out" / "probes.svg").is_file()
    vector = read_control_vector(tmp_path / "out" / "directions.gguf")
    assert list(vector.directions) == [1]                                     # llama.cpp steers blocks 1..L-1
    assert np.allclose(vector.directions[1], want.layers[1].direction, atol=1e-6)


@pytest.mark.parametrize(("args", "message"), [
    (["--layer", "7"], "layer 7"),
    (["--layer", "x"], "is not a layer"),
    (["--data", "no/such.tsv"], "cannot read"),
    (["--json", "."], "is a directory"),
])
def test_the_command_refuses_in_one_line(monkeypatch, capsys, tmp_path, args, message):
    base = {"--data": str(data_file(tmp_path))}
    base.update(dict(zip(args[::2], args[1::2])))
    code, out, err = run_main(monkeypatch, capsys, "probe", "--model", str(MODELS / "gpt2"),
                              *[x for kv in base.items() for x in kv])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_the_example_data_is_valid():
    from conftest import FIXTURES

    texts, labels = read_probe_data(FIXTURES / "steering" / "sentiment.tsv")
    assert len(texts) == 60 and sorted(set(labels)) == ["negative", "positive"]


def test_any_recorded_activation_can_be_probed(monkeypatch, capsys, tmp_path):
    from qkv.analysis.probes import POINTS
    from qkv.cli.steering import PROBE_POINTS

    assert PROBE_POINTS == POINTS
    path = data_file(tmp_path)
    texts, labels = read_probe_data(path)
    model = qkv.load(MODELS / "gpt2")
    report = probe_layers(model, texts, labels, [1], point="neurons")
    assert report.layers[1].direction.shape == (model.config.d_ff,) and report.as_json()["point"] == "neurons"
    with pytest.raises(QkvError, match="from a probe of 'residual_out'"):
        probe_directions(report)
    code, out, err = run_main(monkeypatch, capsys, "probe", "--model", str(MODELS / "gpt2"), "--data", str(path),
                              "--layer", "1", "--point", "attn_out", "--out", str(tmp_path / "o"))
    assert code == 0 and not (tmp_path / "o" / "directions.gguf").exists(), err
    code, out, err = run_main(monkeypatch, capsys, "probe", "--model", str(MODELS / "mixtral"), "--data", str(path),
                              "--layer", "0", "--point", "neurons")
    assert code == 2 and "records no 'neurons'" in err and "experts" in err and len(err.strip().splitlines()) == 1, err
