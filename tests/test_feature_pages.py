"""Feature pages (`qkv.features.pages`, `viz.feature_figures`, `qkv sae features|show`).

Every check is an identity that can fail:
  - the report's statistics (how often each latent fires, its max and mean, its histogram) and its top
    contexts are those of a brute-force pass: each text run alone, its stream at the SAE's site encoded,
    every token but a decoder's first;
  - its promoted / suppressed tokens are (W_dec[j] ⊙ γ, centred: GPT-2's LayerNorm)·W_vocab computed here;
  - `text_features` (qkv sae show) lists exactly each token's non-zero latents, largest first;
  - the commands: JSON, files, the page (escaped, searchable), the model taken from cfg.json, one line and
    exit 2 for each mistake.
"""

from __future__ import annotations

import html
import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from test_steer import make_sae
from qkv.analysis.corpus import open_corpus
from qkv.runtime.errors import QkvError
from qkv.features.pages import HIST_BINS, feature_report, hist_edges, text_features
from qkv.viz.interpret_payload import features_section

CORPUS = ["the cat sat on the mat", "a dog ran to the park and back", "the cat saw the dog",
          "birds fly south in winter", "we went to the market", "the mat was red and the cat was grey",
          "my friend reads books at night", "rain fell on the quiet town"]


@pytest.fixture(scope="module")
def gpt2():
    return qkv.load(MODELS / "gpt2")


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory, gpt2):
    directory = tmp_path_factory.mktemp("sae") / "gpt2-l1"
    make_sae(directory, gpt2, name=str(MODELS / "gpt2"))
    return directory


@pytest.fixture(scope="module")
def sae(sae_dir):
    from qkv.features.saelens import load_saelens

    return load_saelens(sae_dir)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return path


def brute(model, sae):
    """(z (T, d_sae) on every token but each text's first, where (T, 2) text and position) text by text."""
    rows, where = [], []
    for t, text in enumerate(CORPUS):
        x = model.run(text, layers=[1], keep=("residual",)).layer(1).residual       # (n, d)
        z = sae.encode(x)                                                            # (n, d_sae)
        rows.append(z[1:])
        where += [(t, p) for p in range(1, len(z))]
    return np.concatenate(rows), np.array(where)


def test_statistics_and_contexts_are_a_brute_force_passs(gpt2, sae):
    z, where = brute(gpt2, sae)
    r = feature_report(gpt2, sae, CORPUS, top=10, contexts=3)
    assert r.tokens == len(z) and r.texts == len(CORPUS) and r.layer == 1 and r.site == "resid"
    fired = (z > 0).sum(axis=0)                                                      # (d_sae,)
    assert r.dead == int((fired == 0).sum())
    order = np.lexsort((-z.max(axis=0), -fired))[:10]
    assert [f.index for f in r.features] == order.tolist()                          # the most often firing
    edges = hist_edges()
    for f in r.features:
        col = z[:, f.index]
        on = col[col > 0]
        assert f.fired == len(on) and f.frequency == pytest.approx(len(on) / len(z))
        assert f.max == pytest.approx(on.max(), rel=1e-5) and f.mean == pytest.approx(on.mean(), rel=1e-4)
        want = np.histogram(np.clip(on, edges[0], edges[-1] * 0.999999), bins=edges)[0]
        assert f.histogram == want.tolist() and len(f.histogram) == HIST_BINS
        best = np.argsort(-col, kind="stable")[:3]
        assert [e.activation for e in f.examples] == pytest.approx(col[best].tolist(), rel=1e-5)
        for e, b in zip(f.examples, best):
            assert (e.text, e.position) == tuple(where[b])
            ids, _ = gpt2.encode(CORPUS[e.text])
            assert e.token == gpt2.tokenizer.label(int(ids[e.position]))
            assert e.activations[e.at] == pytest.approx(e.activation)


def test_promoted_tokens_are_the_decoder_row_through_the_unembedding(gpt2, sae):
    r = feature_report(gpt2, sae, CORPUS, features=[7, 2], contexts=2)
    assert [f.index for f in r.features] == [7, 2] and r.chosen == "the features asked for"
    w = gpt2.weights
    for f in r.features:
        v = sae.W_dec[f.index].astype(np.float64)
        v = (v - v.mean()) * w.final_norm.weight                                   # LayerNorm: centred, then γ
        logits = v @ np.asarray(w.W_vocab, dtype=np.float64)                       # (V,)
        top = np.argsort(-logits)[:10]
        assert [i for i, _, _ in f.promotes] == top.tolist()
        assert [x for _, _, x in f.promotes] == pytest.approx(logits[top].tolist(), rel=1e-4, abs=1e-5)
        assert [i for i, _, _ in f.suppresses] == np.argsort(logits)[:10].tolist()


def test_report_refuses_bad_features(gpt2, sae):
    with pytest.raises(QkvError, match="feature 96 does not exist"):
        feature_report(gpt2, sae, CORPUS, features=[96])
    with pytest.raises(QkvError, match="top="):
        feature_report(gpt2, sae, CORPUS, top=0)


def test_text_features_lists_each_tokens_latents(gpt2, sae):
    text = "the cat saw the dog"
    data = text_features(gpt2, sae, text, top=3, name="tiny")
    z = sae.encode(gpt2.run(text, layers=[1], keep=("residual",)).layer(1).residual)   # (n, d_sae)
    assert data["skipped"] == [0] and data["features"][0] == [] and len(data["tokens"]) == len(z)
    for t in range(1, len(z)):
        nz = np.nonzero(z[t])[0]
        assert sorted(data["features"][t]) == sorted(nz.tolist()) and len(nz) <= sae.config.k
        assert data["acts"][t] == sorted(data["acts"][t], reverse=True)
        assert data["acts"][t] == pytest.approx(z[t, data["features"][t]].tolist())
    section = features_section(data)
    assert section["max"] == pytest.approx(float(z[1:].max()), rel=1e-4) and section["top"] == 3
    with pytest.raises(QkvError, match="outside 0..95"):
        features_section({**data, "features": [[99]] + data["features"][1:], "acts": [[1.0]] + data["acts"][1:]})


def test_features_command_json_and_files(monkeypatch, capsys, sae_dir, corpus_file, tmp_path, gpt2, sae):
    out = tmp_path / "f"
    code, stdout, err = run_main(monkeypatch, capsys, "sae", "features", "--sae", str(sae_dir), "--file",
                                 str(corpus_file), "--top", "3", "--contexts", "2", "--json", "--out", str(out))
    assert code == 0, err                                                          # the model from cfg.json
    data = json.loads(stdout)
    assert len(data["features"]) == 3 and data["texts"] == len(CORPUS) and data["d_sae"] == 96
    assert sorted(p.name for p in out.iterdir()) == ["features.html", "features.json", "features.png", "features.svg"]
    assert json.loads((out / "features.json").read_text()) == data
    want = feature_report(gpt2, sae, open_corpus(corpus_file), top=3, contexts=2).as_json()
    assert data["features"] == json.loads(json.dumps(want["features"]))
    page = (out / "features.html").read_text(encoding="utf-8")
    assert page.count('<section class="card"') == 3 and 'type="search"' in page
    code, stdout, err = run_main(monkeypatch, capsys, "sae", "features", "--sae", str(sae_dir), "--file",
                                 str(corpus_file), "--feature", "4,9", "--tokens", "12")
    assert code == 0, err
    assert "feature 4: max" in stdout and "feature 9: max" in stdout and "promotes:" in stdout


def test_a_limit_stops_the_corpus_after_the_batch_that_reaches_it(gpt2, sae):
    whole = feature_report(gpt2, sae, CORPUS * 60, top=2)
    part = feature_report(gpt2, sae, CORPUS * 60, top=2, limit=1500)
    assert 1500 <= part.tokens < whole.tokens and part.texts < whole.texts


def test_a_hostile_corpus_stays_text_on_the_page(monkeypatch, capsys, sae_dir, tmp_path):
    path = tmp_path / "hostile.txt"
    path.write_text('<script>alert(1)</script>\n<img src=x onerror=alert(2)> & "quoted" $x^2$\n', encoding="utf-8")
    out = tmp_path / "f"
    code, _, err = run_main(monkeypatch, capsys, "sae", "features", "--sae", str(sae_dir), "--file", str(path),
                            "--top", "5", "--out", str(out))
    assert code == 0, err
    page = (out / "features.html").read_text(encoding="utf-8")
    assert page.lower().count("<script") == 1                                     # the search alone
    assert "<img" not in page.lower() and ">&lt;</span>" in page and ">&quot;</span>" in page   # the tokens, escaped


def test_show_command(monkeypatch, capsys, sae_dir, tmp_path, gpt2, sae):
    out = tmp_path / "s"
    code, stdout, err = run_main(monkeypatch, capsys, "sae", "show", "the cat saw the dog", "--sae", str(sae_dir),
                                 "--top", "2", "--json", "--out", str(out))
    assert code == 0, err
    data = json.loads(stdout)
    assert data == json.loads(json.dumps(text_features(gpt2, sae, "the cat saw the dog", top=2, name=str(sae_dir))))
    assert sorted(p.name for p in out.iterdir()) == ["features.html", "features.json"]
    code, stdout, err = run_main(monkeypatch, capsys, "sae", "show", "the cat saw the dog", "--sae", str(sae_dir),
                                 "--model", str(MODELS / "gpt2"))
    assert code == 0, err
    j, z = data["features"][1][0], data["acts"][1][0]
    assert f"{j} {z:.2f}" in stdout and "not read" in stdout


@pytest.mark.parametrize(("command", "args", "message"), [
    ("features", ["--file", "CORPUS", "--feature", "96"], "feature 96 does not exist"),
    ("features", ["--file", "CORPUS", "--feature", "a"], "is not a list of indices"),
    ("features", [], "give a corpus"),
    ("features", ["--file", "CORPUS", "--model", "NOMODEL"], "give --model"),
    ("features", ["--file", "CORPUS", "--model", "minilm"], "give the model the SAE was trained on"),
    ("show", ["the cat", "--model", "NOMODEL"], "give --model"),
    ("show", [" ", "--model", "GPT2"], "the text is empty"),
    ("show", ["the cat", "--model", "GPT2", "--sae", "no/such/dir"], "is not a directory"),
])
def test_commands_refuse_bad_input_in_one_line(monkeypatch, capsys, tmp_path, gpt2, corpus_file, sae_dir,
                                               command, args, message):
    nameless = tmp_path / "nameless"
    make_sae(nameless, gpt2)                                                       # cfg.json names no model
    unknown = tmp_path / "unknown"
    make_sae(unknown, gpt2, name="no-such-model")
    if "--model" in args and args[args.index("--model") + 1] == "NOMODEL":
        args = [{"CORPUS": str(corpus_file)}.get(a, a) for a in args if a not in ("--model", "NOMODEL")]
        for directory in (nameless, unknown):                  # no model named, or one qkv cannot load
            code, out, err = run_main(monkeypatch, capsys, "sae", command, *args, "--sae", str(directory))
            assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
        return
    args = [{"CORPUS": str(corpus_file), "GPT2": str(MODELS / "gpt2")}.get(a, a) for a in args]
    if "--sae" not in args:
        args += ["--sae", str(sae_dir)]
    code, out, err = run_main(monkeypatch, capsys, "sae", command, *args)
    assert code == 2, (out, err)
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
