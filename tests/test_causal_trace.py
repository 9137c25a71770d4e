"""qkv trace-fact / qkv.analysis.causal_trace: every restored probability equals the one transformers gives with
ROME's hooks (fixtures made by tests/fixtures/make_causal_trace_fixtures.py), the batched passes equal one
restoration at a time through qkv's own hooks, and the command's output, files and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv.analysis import causal_trace as CT

FIXTURES = MODELS.parent / "causal_trace"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.npz"))
EIFFEL = "The Eiffel Tower is located in the city of"


def test_the_fixtures_are_there():
    assert len(NAMES) >= 8, NAMES


@pytest.fixture(scope="module", params=NAMES)
def case(request):
    return request.param, qkv.load(MODELS / request.param), dict(np.load(FIXTURES / f"{request.param}.npz"))


@pytest.mark.parametrize("window", [1, 2])
def test_every_restored_probability_equals_the_reference(case, window):
    name, model, ref = case
    r = CT.trace_tokens(model, ref["input_ids"], tuple(ref["span"]), ref["noise"], window=window)
    assert r.answer == int(ref["answer"]), name
    assert abs(r.p_clean - ref["p_clean"]) <= 1e-5 and abs(r.p_corrupted - ref["p_corrupted"]) <= 1e-5, name
    for kind, key in (("hidden", "hidden"), ("ffn", f"ffn_w{window}"), ("attn", f"attn_w{window}")):
        assert np.abs(r.tables[kind] - ref[key]).max() <= 1e-5, (name, kind, r.tables[kind], ref[key])
    # the cells known without a pass: before the subject, and block L-1's output
    L, n = r.tables["hidden"].shape
    s = int(ref["span"][0])
    assert r.skipped == 3 * L * s + (n - s), (name, r.skipped)


def test_batches_equal_one_restoration_at_a_time_through_the_hooks(monkeypatch):
    model = qkv.load(MODELS / "llama_gqa")
    ref = dict(np.load(FIXTURES / "llama_gqa.npz"))
    monkeypatch.setattr(CT, "MAX_TOKENS", 1)                                     # one restored value a pass
    one = CT.trace_tokens(model, ref["input_ids"], tuple(ref["span"]), ref["noise"], window=2)
    monkeypatch.undo()
    batched = CT.trace_tokens(model, ref["input_ids"], tuple(ref["span"]), ref["noise"], window=2)
    assert one.passes > batched.passes and one.runs == batched.runs
    for kind in CT.KINDS:
        assert np.abs(one.tables[kind] - batched.tables[kind]).max() <= 1e-6
    # one cell again by hand: model.run with a hook restoring layer 0's FFN output at the last subject token
    s, e = (int(v) for v in ref["span"])
    ids = ref["input_ids"]
    clean = model.run(ids, keep=("ffn_out",))
    rows = model.weights.tok_embed[ids][None].repeat(len(ref["noise"]), axis=0)
    rows[:, s:e] += ref["noise"]

    def restore(value, layer):
        value = value.copy()
        value[:, e - 1] = clean.layers[layer].ffn_out[e - 1]
        return value
    from qkv.core.hooks import Hooks
    from qkv.core.stack import transformer
    batch = np.repeat(ids[None], len(rows), axis=0)
    _, logits = transformer(model.weights, model.config, batch, np.ones(batch.shape, np.int64), tokens=rows,
                            hooks=Hooks({"0.ffn_out": restore}, model.config))
    p = CT._probability(logits[:, -1], batched.answer).mean()
    assert abs(p - batched.tables["ffn"][0, e - 1]) <= 1e-6                      # window 2 at layer 0: layer 0 only


def test_the_window_is_the_papers():
    assert list(CT.window_of(0, 10, 30)) == list(range(0, 5))
    assert list(CT.window_of(12, 10, 30)) == list(range(7, 17))
    assert list(CT.window_of(29, 10, 30)) == list(range(24, 30))
    assert list(CT.window_of(3, 1, 30)) == [3]
    assert list(CT.window_of(3, 3, 30)) == [2, 3, 4]


def test_the_subject_is_found_by_the_tokenizers_offsets():
    smol, minilm = qkv.load("smollm2"), qkv.load("minilm")
    assert CT.subject_span(smol, EIFFEL, "Eiffel Tower") == (1, 4)              # ␣E iffel ␣Tower
    assert CT.subject_span(smol, EIFFEL, "Tower") == (3, 4)
    assert CT.subject_span(minilm, EIFFEL, "Eiffel") == (2, 5)                  # [CLS] the e ##iff ##el
    with pytest.raises(qkv.QkvError, match="not in the text"):
        CT.subject_span(smol, EIFFEL, "Louvre")
    with pytest.raises(qkv.QkvError, match="empty"):
        CT.subject_span(smol, EIFFEL, "  ")


def test_noise_is_three_standard_deviations_of_the_embeddings_and_seeded():
    model = qkv.load(MODELS / "gpt2")
    std = float(np.asarray(model.weights.tok_embed, np.float64).std())          # every row: V ≤ STD_ROWS here
    assert model.weights.tok_embed.shape[0] <= CT.STD_ROWS and abs(CT.embedding_std(model) - std) <= 1e-9
    a = CT.trace_fact(model, "the cat sat on the", "cat sat", seed=4)
    b = CT.trace_fact(model, "the cat sat on the", "cat sat", seed=4)
    c = CT.trace_fact(model, "the cat sat on the", "cat sat", seed=5)
    assert abs(a.noise - 3 * std) <= 1e-12 and a.noise_scale == 3.0 and a.seed == 4
    assert all(np.array_equal(a.tables[k], b.tables[k]) for k in CT.KINDS)
    assert a.p_corrupted != c.p_corrupted


def test_smollm2_recalls_paris_through_the_subject():
    """What qkv measures on SmolLM2 (README, "Where a fact is recalled"): noise on "Eiffel Tower" drops
    P(␣Paris) from 0.70 to ~0.02; restoring the subject's "iffel" state brings a third back through the first
    ~22 layers; from layer ~23 on the fact sits at the last token, carried there by attention around layer 19.
    One noise draw (the README's figures average three; the same peaks, a third of make test's minute)."""
    model = qkv.load("smollm2")
    r = CT.trace_fact(model, EIFFEL, "Eiffel Tower", draws=1)
    assert r.answer_token == "␣Paris" and r.p_clean > 0.6 and r.p_corrupted < 0.05
    assert r.tables["hidden"].shape == (model.config.n_layers, 10)
    iffel, last = 2, 9
    assert r.effect("hidden")[:20, iffel].min() > 0.1                            # the subject's state, early layers
    layer, token, effect = r.peak("attn")
    assert token == last and 14 <= layer <= 24 and effect > 0.5
    assert r.effect("hidden")[-1, last] == pytest.approx(r.p_clean - r.p_corrupted)
    assert np.abs(r.effect("hidden")[:, 0]).max() == 0                          # before the subject: nothing


def test_a_stored_model_and_its_float32_copy_trace_alike():
    """A GGUF model kept as its Q4_1 blocks (the tiny llama fixture) traces as its dequantised float32 copy:
    the embeddings read from the stored table, every restored pass through the stored products."""
    path = MODELS.parent / "gguf" / "tiny-llama.gguf"
    stored, f32 = qkv.load(path), qkv.load(path, dtype="float32")
    assert type(stored.weights.blocks[0].attn.W_O).__name__ == "StoredMatrix"
    a = CT.trace_fact(stored, "Paris is the capital of", "Paris", draws=2, window=2)
    b = CT.trace_fact(f32, "Paris is the capital of", "Paris", draws=2, window=2)
    assert a.answer_token == b.answer_token and abs(a.p_clean - b.p_clean) <= 1e-5
    for k in CT.KINDS:
        assert a.tables[k].shape == (2, 19) and np.abs(a.tables[k] - b.tables[k]).max() <= 1e-5


def test_a_long_text_and_bad_noise_are_refused(monkeypatch):
    model = qkv.load(MODELS / "gpt2")
    monkeypatch.setattr(CT, "MAX_LENGTH", 3)
    with pytest.raises(qkv.QkvError, match="at most 3"):
        CT.trace_fact(model, "the cat sat on the", "cat")
    monkeypatch.undo()
    ids = model.encode("the cat sat on the")[0]
    with pytest.raises(qkv.QkvError, match="noise must be"):
        CT.trace_tokens(model, ids, (1, 2), np.zeros((2, 2, model.weights.tok_embed.shape[1])))
    with pytest.raises(qkv.QkvError, match="not within"):
        CT.trace_tokens(model, ids, (3, 99), np.zeros((2, 96, 8)))


# ── the command ──────────────────────────────────────────────────────────────────

def test_trace_fact_json_and_files(monkeypatch, capsys, tmp_path):
    out = tmp_path / "trace"
    code, text, err = run_main(monkeypatch, capsys, "trace-fact", "the cat sat on the", "--subject", "cat",
                               "--model", str(MODELS / "gpt2"), "--draws", "2", "--window", "1", "--json",
                               "--out", str(out))
    assert code == 0, err
    data = json.loads(text)
    assert set(data) >= {"tokens", "subject_span", "answer", "answer_token", "p_clean", "p_corrupted", "tables",
                         "peaks", "noise", "draws", "window"}
    assert data["draws"] == 2 and data["window"] == 1 and data["subject"] == "cat"
    n = len(data["tokens"])
    assert {k: np.asarray(v).shape for k, v in data["tables"].items()} == {k: (2, n) for k in CT.KINDS}
    assert sorted(p.name for p in out.iterdir()) == ["trace_fact.html", "trace_fact.json", "trace_fact.png",
                                                     "trace_fact.svg"]
    assert json.loads((out / "trace_fact.json").read_text())["tables"] == data["tables"]


def test_trace_fact_summary(monkeypatch, capsys):
    code, text, err = run_main(monkeypatch, capsys, "trace-fact", "the cat sat on the", "--subject", "cat sat",
                               "--model", str(MODELS / "gpt2"), "--token", " the")
    assert code == 0, err
    assert "P(␣the)" in text and "hidden state" in text and "FFN outputs" in text and "attention outputs" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--subject", "dog"], "is not in the text"),
    (["--subject", "cat", "--token", "catcatcat dog"], "not one"),
    (["--subject", "cat", "--draws", "0"], "0"),
    (["--subject", "cat", "--noise", "-1"], "-1"),
    (["--subject", "cat", "--window", "0"], "0"),
    (["--subject", "cat", "--model", "minilm"], "not a decoder"),
    (["--subject", "cat", "--model", "ko-en-tiny"], "not a decoder"),
    ([], "--subject"),
])
def test_trace_fact_refuses_bad_input_in_one_line(monkeypatch, capsys, args, message):
    code, out, err = run_main(monkeypatch, capsys, "trace-fact", "the cat sat on the", "--model",
                              str(MODELS / "gpt2"), *args)
    assert code == 2, (out, err)
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) <= 4, err
