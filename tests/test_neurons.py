"""FFN neurons (Geva et al. 2021): the engine's "neurons" intermediate, `qkv.analysis.neurons`, `qkv neurons`.

Every check is an identity that can fail:
  - neurons·W_out + b_out is the recorded ffn_out (float32, 1e-5 of its size), gated (SmolLM2, stored GGUF
    weights; the Llama fixture) and not (MiniLM, the GPT-2 fixture); "neurons" is kept only when asked for;
  - a hook zeroing neuron i takes exactly h_i·W_out[i] out of ffn_out; hooks see the same values in a padded
    batch (model.forward) as one text at a time, and in generate with the KV cache as in one pass; a MoE
    layer refuses the hook and records none;
  - the report's top contexts are the largest activations of a brute-force run over every token of a small
    corpus (long texts cut into windows too), its statistics and its choice of neurons are theirs, and its
    promoted / suppressed tokens equal (W_out[i] ⊙ γ)·W_vocab computed directly in NumPy;
  - the command: its JSON, its files, one line and exit 2 for each mistake, a hostile corpus stays text.
"""

from __future__ import annotations

import html
import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, reference, run_main
from qkv.analysis.corpus import open_corpus, template_of, windows
from qkv.analysis.neurons import NeuronReport, neurons, value_logits
from qkv.runtime.errors import QkvError
from qkv.core.trace import DEFAULT_KEEP, Recorder

TEXT = "The capital of France is Paris, and the cat sat on the mat."
CORPUS = ["the cat sat on the mat", "a dog ran to the park and back", "the cat saw the dog",
          "birds fly south in winter", "we went to the market", "the mat was red and the cat was grey",
          "my friend reads books at night", "rain fell on the quiet town"]


def load(name):
    return qkv.load(MODELS / name)


@pytest.fixture(scope="module")
def gpt2():
    return load("gpt2")


@pytest.fixture(scope="module")
def llama():
    return load("llama_gqa")


@pytest.fixture(scope="module")
def smollm2():
    return qkv.load("smollm2")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return path


# ── the engine: the FFN's hidden ─────────────────────────────────────────────────

@pytest.mark.parametrize("name", ["smollm2", "minilm", "gpt2", "llama_gqa"])
def test_neurons_times_W_out_is_ffn_out(name, request):
    model = request.getfixturevalue(name) if name == "smollm2" else qkv.load(name) if name == "minilm" else load(name)
    t = model.run(TEXT, keep=("neurons", "ffn_out"))
    for layer in range(model.config.n_layers):
        ffn = model.weights.blocks[layer].ffn
        h, f = t.layer(layer).neurons, t.layer(layer).ffn_out                 # (n, d_ff), (n, d_model)
        assert h.shape == (len(t.ids), model.config.d_ff)
        y = h @ np.asarray(ffn.W_out) + (0 if ffn.b_out is None else ffn.b_out)
        assert np.abs(y - f).max() <= 1e-5 * max(1.0, float(np.abs(f).max())), layer


def test_neurons_are_kept_only_when_asked_for(gpt2):
    assert "neurons" not in DEFAULT_KEEP and "neurons" not in Recorder().keep
    t = gpt2.run(TEXT)
    assert t.layers[0].neurons is None and t.layers[0].ffn_out is not None
    with pytest.raises(QkvError, match=r"keep=\(\.\.\., 'neurons'\)"):
        t.layer(0).neurons
    kept = gpt2.run(TEXT, layers=[1], keep=("neurons",))
    assert kept.layer(1).neurons.shape == (len(kept.ids), gpt2.config.d_ff) and kept.layers[1].ffn_out is None


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa"])
def test_zeroing_a_neuron_takes_out_exactly_its_value(name):
    model = load(name)
    i = 7
    plain = model.run(TEXT, keep=("neurons", "ffn_out"))
    cut = model.run(TEXT, keep=("neurons", "ffn_out"),
                    hooks={"0.neurons": lambda h, layer: np.where(np.arange(h.shape[-1]) == i, 0, h)})
    assert np.all(cut.layer(0).neurons[:, i] == 0)
    W = np.asarray(model.weights.blocks[0].ffn.W_out)                         # (d_ff, d_model)
    taken = plain.layer(0).ffn_out - cut.layer(0).ffn_out                     # (n, d_model)
    want = plain.layer(0).neurons[:, i:i + 1] * W[i]                           # h_i·W_out[i]
    assert np.abs(taken - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))
    assert np.abs(taken).max() > 1e-3                                          # the neuron did write something
    assert not np.array_equal(plain.hidden, cut.hidden)


def test_hooks_on_neurons_in_a_padded_batch_see_each_row_as_one_text(llama):
    ref = reference("llama_gqa")
    ids, mask = ref["input_ids"], ref["attention_mask"]
    seen = {}

    def read(h, layer):
        seen[layer] = h.copy()                                                 # (B, n, d_ff)

    llama.forward(ids, mask, hooks={"neurons": read})
    for row in range(len(ids)):
        real = mask[row].astype(bool)
        alone = llama.run(ids[row][real], keep=("neurons",))
        for layer in range(llama.config.n_layers):
            assert np.abs(seen[layer][row][real] - alone.layer(layer).neurons).max() <= 1e-5, (row, layer)


def test_hooks_on_neurons_in_generate_with_the_cache(llama):
    prompt = reference("llama_gqa")["single_input_ids"][0, :6]
    kw = dict(temperature=0, stop_at_eos=False)
    steps = []
    out = llama.generate(prompt, 5, hooks={"1.neurons": lambda h, layer: steps.append(h.copy())}, **kw)[0]
    assert [s.shape[1] for s in steps] == [6, 1, 1, 1, 1]                      # prefill, then one token a step
    whole = llama.run(out[:-1], keep=("neurons",)).layer(1).neurons           # (n - 1, d_ff): every token read
    assert np.abs(np.concatenate([s[0] for s in steps]) - whole).max() <= 1e-5
    cut = {"0.neurons": lambda h, layer: np.where(np.arange(h.shape[-1]) < 48, 0, h)}
    cached, uncached = llama.generate(prompt, 8, hooks=cut, **kw), llama.generate(prompt, 8, hooks=cut, use_cache=False, **kw)
    assert cached.tolist() == uncached.tolist() != llama.generate(prompt, 8, **kw).tolist()


def test_a_pass_can_stop_after_a_layer(llama):
    """transformer(stop=k): blocks 0..k-1 only, the stream entering block k out, no logits."""
    from qkv.core.stack import transformer

    ids = reference("llama_gqa")["single_input_ids"][:, :9]
    rec = Recorder(layers=[0], keep=("neurons",))
    x, logits = transformer(llama.weights, llama.config, ids, np.ones_like(ids), rec=rec, stop=1)
    t = llama.run(ids[0], keep=("residual", "neurons"))
    assert logits is None and np.array_equal(x[0], t.layer(1).residual)
    assert np.array_equal(rec.store[0]["neurons"][0], t.layer(0).neurons)


def test_a_moe_layer_records_no_neurons_and_refuses_their_hook():
    model = load("mixtral")
    ids = reference("mixtral")["input_ids"][0]
    assert model.run(ids, keep=("neurons", "ffn_out")).layers[0].neurons is None
    with pytest.raises(QkvError, match="routes its FFN among .* experts"):
        model.run(ids, hooks={"neurons": lambda h, layer: None})
    with pytest.raises(QkvError, match="MoE"):
        neurons(model, 0, texts=CORPUS)


# ── the analysis ─────────────────────────────────────────────────────────────────

def brute_force(model, layer, texts, max_tokens=None):
    """(h (T, d_ff), where [(text, window, position)], ids [(window ids, position)]) over every token."""
    template = template_of(model.tokenizer)
    rows, where = [], []
    for t, text in enumerate(texts):
        ids, _ = model.tokenizer.encode(text)
        for w, piece in enumerate(windows(ids, max_tokens or len(ids), template)):
            rows.append(model.run(piece, layers=[layer], keep=("neurons",)).layer(layer).neurons)
            where += [(t, w, p) for p in range(len(piece))]
    return np.concatenate(rows), where


@pytest.mark.parametrize("max_tokens", [512, 5])                             # 5: texts cut into windows
def test_top_contexts_are_the_largest_activations(gpt2, max_tokens):
    C = 4
    r = neurons(gpt2, 1, texts=CORPUS, neuron=[0, 5, 77, -1], contexts=C, window=2, max_tokens=max_tokens)
    h, where = brute_force(gpt2, 1, CORPUS, max_tokens)
    assert r.tokens == len(h) and r.texts == len(CORPUS) and [n.index for n in r.neurons] == [0, 5, 77, 255]
    at = {w: k for k, w in enumerate(where)}
    for n in r.neurons:
        col = h[:, n.index]                                                    # (T,) every token's h_i
        assert [e.activation for e in n.examples] == pytest.approx(np.sort(col)[::-1][:C].tolist(), abs=1e-5)
        for e in n.examples:                                                   # each is where it says (texts that
            assert col[at[(e.text, e.window, e.position)]] == pytest.approx(e.activation, abs=1e-5)   # share a prefix tie)
        assert (n.max, n.min, n.mean, n.positive) == pytest.approx(
            (col.max(), col.min(), col.mean(), (col > 0).mean()), abs=1e-5)
        for e in n.examples:                                                   # the context: its own window's tokens
            assert e.activations[e.at] == pytest.approx(e.activation) and len(e.tokens) <= 5
            t, w, p = e.text, e.window, e.position
            ids, _ = gpt2.tokenizer.encode(CORPUS[t])
            piece = windows(ids, max_tokens, template_of(gpt2.tokenizer))[w]
            assert e.tokens == gpt2.tokenizer.labels(piece[max(0, p - 2):p + 3])


def test_the_chosen_neurons_are_the_most_active(gpt2):
    h, _ = brute_force(gpt2, 0, CORPUS)
    r = neurons(gpt2, 0, texts=CORPUS, top=3)
    assert [n.index for n in r.neurons] == np.argsort(-h.max(axis=0), kind="stable")[:3].tolist()
    on_text = gpt2.run(TEXT, layers=[0], keep=("neurons",)).layer(0).neurons.max(axis=0)
    r = neurons(gpt2, 0, texts=CORPUS, text=TEXT, top=3)
    assert [n.index for n in r.neurons] == np.argsort(-on_text, kind="stable")[:3].tolist()
    assert [n.on_text for n in r.neurons] == pytest.approx(np.sort(on_text)[::-1][:3].tolist())
    assert "on TEXT" in r.chosen


def test_promoted_tokens_equal_numpy(gpt2):
    """GPT-2 (LayerNorm): W_out[i] centred over d_model, times γ, times W_vocab."""
    r = neurons(gpt2, 1, texts=CORPUS, neuron=[3, 9], tokens=6)
    W, g = gpt2.weights.blocks[1].ffn.W_out, gpt2.weights.final_norm.weight
    for n in r.neurons:
        v = W[n.index].astype(np.float64)
        z = ((v - v.mean()) * g) @ gpt2.weights.W_vocab.astype(np.float64)    # (V,)
        assert [i for i, _, _ in n.promotes] == np.argsort(-z)[:6].tolist()
        assert [i for i, _, _ in n.suppresses] == np.argsort(z)[:6].tolist()
        assert [x for _, _, x in n.promotes] == pytest.approx(np.sort(z)[::-1][:6].tolist(), abs=1e-4)
        assert [t for _, t, _ in n.promotes] == gpt2.tokenizer.labels([i for i, _, _ in n.promotes])


def test_smollm2_stored_weights(smollm2):
    """SmolLM2 keeps its GGUF blocks: W_out dequantised for one layer, W_vocab multiplied in place."""
    r = neurons(smollm2, 20, texts=CORPUS[:3], neuron=[93], tokens=5, contexts=2)
    W = np.asarray(smollm2.weights.blocks[20].ffn.W_out)                      # (d_ff, d_model) float32
    z = (W[93] * smollm2.weights.final_norm.weight).astype(np.float64) @ np.asarray(smollm2.weights.W_vocab, np.float64)
    assert [i for i, _, _ in r.neurons[0].promotes] == np.argsort(-z)[:5].tolist()
    assert [x for _, _, x in r.neurons[0].promotes] == pytest.approx(np.sort(z)[::-1][:5].tolist(), rel=1e-4)
    assert value_logits(smollm2, W[[93]]).shape == (1, smollm2.config.vocab_size)


def test_an_encoder_without_lm_head_gives_contexts_only(minilm):
    r = neurons(minilm, -1, texts=CORPUS, top=2, contexts=3)
    assert r.layer == 5 and "no LM head" in r.vocab and r.sep == " "
    assert all(n.promotes == [] and len(n.examples) == 3 for n in r.neurons)
    with pytest.raises(QkvError, match="no LM head"):
        value_logits(minilm, np.zeros((1, 384), np.float32))


def test_as_json_shape(gpt2):
    r = neurons(gpt2, 0, texts=CORPUS, top=2, contexts=3, window=1, tokens=4)
    data = json.loads(json.dumps(r.as_json()))
    assert isinstance(r, NeuronReport)
    assert {"model", "layer", "d_ff", "activation", "chosen", "corpus", "texts", "tokens", "neurons", "vocab"} <= set(data)
    n = data["neurons"][0]
    assert {"index", "max", "min", "mean", "positive", "contexts", "promotes", "suppresses"} <= set(n)
    assert len(n["contexts"]) == 3 and len(n["promotes"]) == len(n["suppresses"]) == 4
    c = n["contexts"][0]
    assert c["tokens"][c["at"]] == c["token"] and len(c["tokens"]) == len(c["activations"]) <= 3
    assert set(n["promotes"][0]) == {"id", "token", "logit"}


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(layer=2), "layer 2 does not exist"),
    (dict(layer=-3), "layer -3 does not exist"),
    (dict(layer=0, neuron=256), "neuron 256 does not exist"),
    (dict(layer=0, neuron=[]), "no neuron given"),
    (dict(layer=0, top=0), "top=0"),
    (dict(layer=0, text=""), "the text is empty"),
    (dict(layer=0, texts="the cat"), "not one string"),
    (dict(layer=0, texts=["", ""]), "gave no tokens"),
])
def test_refusals(gpt2, kwargs, message):
    layer = kwargs.pop("layer")
    kwargs.setdefault("texts", CORPUS)
    with pytest.raises(QkvError, match=message):
        neurons(gpt2, layer, **kwargs)


def test_the_default_corpus_is_the_projects(gpt2):
    r = neurons(gpt2, 0, top=1, contexts=1)
    assert r.corpus == "docs/heads-corpus.txt" and r.texts == open_corpus(MODELS.parents[2] / r.corpus).count == 60


# ── the command ──────────────────────────────────────────────────────────────────

def test_command_json_and_files(monkeypatch, capsys, corpus_file, tmp_path):
    out = tmp_path / "n"
    code, stdout, err = run_main(monkeypatch, capsys, "neurons", "--model", str(MODELS / "gpt2"), "--layer", "-1",
                                 "--file", str(corpus_file), "--top", "2", "--contexts", "3", "--json", "--out", str(out))
    assert code == 0, err
    data = json.loads(stdout)                                                  # one JSON document, nothing else
    assert data["layer"] == 1 and len(data["neurons"]) == 2 and data["texts"] == len(CORPUS)
    assert sorted(p.name for p in out.iterdir()) == ["neurons.html", "neurons.json", "neurons.png", "neurons.svg"]
    assert json.loads((out / "neurons.json").read_text()) == json.loads(stdout)


def test_command_table(monkeypatch, capsys, corpus_file):
    code, stdout, err = run_main(monkeypatch, capsys, "neurons", "--model", str(MODELS / "gpt2"), "--layer", "0",
                                 "--file", str(corpus_file), "--neuron", "4,9", "--contexts", "2", "the cat")
    assert code == 0, err
    want = neurons(load("gpt2"), 0, texts=CORPUS, neuron=[4, 9], contexts=2, text="the cat")
    assert "neuron 4: max" in stdout and "neuron 9: max" in stdout and "max on TEXT" in stdout
    assert "promotes:" in stdout and "suppresses:" in stdout
    e = want.neurons[0].examples[0]
    assert f"[{e.token}]" in stdout and f"{e.activation:.3f}" in stdout


def test_a_hostile_corpus_stays_text(monkeypatch, capsys, tmp_path):
    path = tmp_path / "hostile.txt"
    path.write_text("<script>alert(1)</script>\n<img src=x onerror=alert(2)> & $x^2$ costs $5\n", encoding="utf-8")
    out = tmp_path / "n"
    code, _, err = run_main(monkeypatch, capsys, "neurons", "--model", "minilm", "--layer", "0", "--file", str(path),
                            "--top", "3", "--out", str(out))
    assert code == 0, err
    page = (out / "neurons.html").read_text(encoding="utf-8")
    assert "<script" not in page.lower() and "<img" not in page.lower()       # no tag from the corpus, no script at all
    assert html.escape("<") in page and "script" in page and "alert" in page  # the tokens are there, escaped
    assert "default-src 'none'" in page


@pytest.mark.parametrize(("args", "message"), [
    (["--layer", "2"], "layer 2 does not exist"),
    (["--layer", "-3"], "layer -3 does not exist"),
    (["--layer", "0", "--neuron", "999"], "neuron 999 does not exist"),
    (["--layer", "0", "--neuron", "a,b"], "is not a list of indices"),
    (["--layer", "0", "--neuron", "-1", "the cat"], "--neuron -1 is negative"),   # not "the last"
    (["--layer", "0", "--file", "no/such/file.txt"], "cannot read no/such/file.txt"),
    (["--layer", "0", "--file", "BINARY"], "looks binary"),
    (["--layer", "0", "--file", "EMPTY"], "holds no text"),
    (["--layer", "0", " "], "the text is empty"),
    (["--layer", "0", "--model", str(MODELS / "mixtral")], "MoE"),
    (["--layer", "0", "--model", "ko-en-tiny"], "encoder–decoder"),
])
def test_command_refuses_bad_input_in_one_line(monkeypatch, capsys, tmp_path, args, message):
    (tmp_path / "binary.bin").write_bytes(b"abc\x00def\n")
    (tmp_path / "empty.txt").write_text("\n  \n")
    args = [{"BINARY": str(tmp_path / "binary.bin"), "EMPTY": str(tmp_path / "empty.txt")}.get(a, a) for a in args]
    if "--model" not in args:
        args += ["--model", str(MODELS / "gpt2")]
    code, out, err = run_main(monkeypatch, capsys, "neurons", *args)
    assert code == 2, (out, err)
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
