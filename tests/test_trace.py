"""trace: what Model.run keeps, and that the kept intermediates fit together as the math says."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv.core.attention import merge_heads
from qkv.core.ops import softmax
from conftest import MODELS


@pytest.fixture(scope="module")
def gpt2():
    return qkv.load(MODELS / "gpt2")


def test_keeps_only_what_was_asked(minilm):
    t = minilm.run("The cat sat on the mat", layers=[1, -1], keep=("attentions", "q"))
    assert t.layer_ids == [1, 5]
    assert t.attentions.shape == (2, 12, 8, 8)
    assert t.layer(1).q.shape == (12, 8, 32) and t.layers[1].k is None and t.layers[5].scores is None
    for name in ("k", "scores", "residual"):                  # not kept: one error naming keep=, never None
        with pytest.raises(qkv.QkvError, match=rf"^{name} of layer 5 was not kept in this trace; run the model "
                                               rf"with keep=\(\.\.\., '{name}'\)"):
            getattr(t.layer(5), name)
    with pytest.raises(qkv.QkvError, match="not kept"):
        t.layer(0)
    with pytest.raises(qkv.QkvError, match="unknown intermediate"):
        minilm.run("x", keep=("nope",))
    with pytest.raises(qkv.QkvError, match="layers 0..5"):
        minilm.run("x", layers=[6])


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama_gqa"])
def test_intermediates_fit_together(name):
    model = qkv.load(MODELS / name)
    w, cfg = model.weights, model.config
    t = model.run(list(range(3, 12)))
    for i in range(cfg.n_layers):
        lt = t.layer(i)
        np.testing.assert_allclose(softmax(lt.scores), lt.attentions, atol=1e-6)      # A = softmax(S)
        G = cfg.n_heads // cfg.n_kv_heads
        np.testing.assert_allclose(lt.heads, lt.attentions @ np.repeat(lt.v, G, axis=0), atol=1e-5)  # Z = A·V
        b = w.blocks[i].attn
        out = merge_heads(lt.heads[None])[0] @ b.W_O + (0 if b.b_O is None else b.b_O)
        np.testing.assert_allclose(out, lt.attn_out, atol=1e-5)                      # Concat(heads)·W_O
        if cfg.norm_place == "pre" and i + 1 < cfg.n_layers:
            np.testing.assert_allclose(lt.residual + lt.attn_out + lt.ffn_out, t.layer(i + 1).residual, atol=1e-5)


def test_causal_models_never_look_ahead(gpt2):
    a = gpt2.run(list(range(10)), keep=("attentions",)).attentions
    assert (np.triu(a, 1) == 0).all()
    np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-5)


def test_forward_without_attentions_gives_the_same_states(gpt2):
    ids = np.arange(1, 9)[None]
    a, b = gpt2.forward(ids), gpt2.forward(ids, attentions=False)
    assert b.attentions is None and np.array_equal(a.logits, b.logits)


def test_trace_of_text_has_tokens_and_logits(gpt2):
    t = gpt2.run("the cat sat")
    assert len(t.tokens) == len(t.ids) == t.hidden.shape[0] == t.logits.shape[0]
    assert t.text == "the cat sat" and t.logits.shape[1] == gpt2.config.vocab_size


# what a trace knows about itself ------------------------------------------------

def test_a_trace_knows_its_model_family_causality_and_spelling(gpt2, minilm):
    t = gpt2.run("the cat sat", keep=("attentions",))
    assert (t.model, t.family, t.causal, t.spelling) == (gpt2.name, "gpt2", True, "byte-level")
    from qkv.core.labels import visible

    assert "Ġs" in t.tokens and "␣s" in t.labels                      # "Ġs" is " s": the tokenizer's decode says so
    assert t.labels == [visible(gpt2.tokenizer.decode([i])) for i in t.ids]
    assert t.key_labels == t.labels                                    # self-attention: keys are the tokens
    b = minilm.run("The cat sat", keep=("attentions",))
    assert (b.model, b.family, b.causal, b.spelling) == ("all-MiniLM-L6-v2", "bert", False, "plain")
    assert b.labels == b.tokens == ["[CLS]", "the", "cat", "sat", "[SEP]"]
    assert gpt2.generate("the cat", 2, temperature=0, trace=True).causal is True


def test_saved_traces_keep_what_they_know_and_old_ones_still_load(gpt2, tmp_path):
    import json

    from qkv.core.trace import Trace

    t = gpt2.run("the cat\nsat", keep=("attentions",))
    back = Trace.load(t.save(tmp_path / "new"))
    assert (back.model, back.family, back.causal, back.spelling) == (gpt2.name, "gpt2", True, "byte-level")
    assert back.tokens == t.tokens and back.labels == t.labels and "↵" in back.labels
    assert np.array_equal(back.attentions, t.attentions)
    assert Trace.load(t.save(tmp_path / "named", "other")).model == "other"
    # a trace saved before these fields existed: it loads, and says it does not know
    old = tmp_path / "old"
    t.save(old)
    meta = json.loads((old / "trace.json").read_text())
    (old / "trace.json").write_text(json.dumps({k: meta[k] for k in ("model", "text", "tokens", "layers",
                                                                       "prompt_length")}))
    back = Trace.load(old)
    assert (back.model, back.family, back.causal, back.spelling) == (gpt2.name, "", None, "plain")
    assert back.labels == t.tokens                                     # shown as spelled, never guessed
    # a trace written compressed, with the full matrices (before causal traces kept their lower triangles)
    full = tmp_path / "full"
    t.save(full)
    with np.load(full / "trace.npz") as z:
        arrays = {k: z[k] for k in z.files}
    n = len(t.ids)
    assert set(arrays) == {"ids", "layers", "attentions_lower"} and arrays["attentions_lower"].shape[-1] == n * (n + 1) // 2
    np.savez_compressed(full / "trace.npz", ids=arrays["ids"], layers=arrays["layers"], attentions=t.attentions)
    assert np.array_equal(Trace.load(full).attentions, t.attentions)


def test_only_a_causal_self_attention_is_saved_as_lower_triangles(gpt2, minilm, tmp_path):
    import zipfile

    from qkv.core.trace import Trace

    for model, packed in ((gpt2, True), (minilm, False)):
        t = model.run("the cat sat on the mat", keep=("attentions",))
        d = t.save(tmp_path / model.config.family)
        with zipfile.ZipFile(d / "trace.npz") as z:
            names = set(z.namelist())
            assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())   # stored: writing is quick
        assert ("attentions_lower.npy" in names) == packed and ("attentions.npy" in names) != packed
        assert np.array_equal(Trace.load(d).attentions, t.attentions)
    t = gpt2.run("the cat sat", keep=("attentions",))
    t.layers[1].attentions[0, 0, 2] = 0.5                              # a hook's weights past the diagonal
    assert np.array_equal(Trace.load(t.save(tmp_path / "hooked")).attentions, t.attentions)   # kept whole


def test_a_trace_holds_cross_attention_of_any_shape():
    from qkv.core.trace import LayerTrace, Trace

    a = np.full((1, 2, 3, 5), 0.2)                                     # (L, H, n_q, n_k): 3 queries, 5 keys
    t = Trace(tokens=["a", "Ġb", "c"], ids=np.arange(3), hidden=None, logits=None, spelling="byte-level",
              causal=False, source_tokens=["x", "Ġy", "z", "w", "."],
              layers={0: LayerTrace(layer=0, attentions=a[0])})
    assert t.attentions.shape == (1, 2, 3, 5)
    assert t.labels == ["a", "␣b", "c"] and t.key_labels == ["x", "␣y", "z", "w", "."]


def test_a_trace_prints_a_short_summary_not_its_arrays(minilm):
    """A notebook cell ending in a trace shows what it holds in a few lines (it printed 114 KB of arrays)."""
    trace = minilm.run("The cat sat on the mat " * 20)
    text = repr(trace)
    assert len(text) < 1000 and len(text.splitlines()) <= 6 and "array(" not in text
    assert text.startswith(f"Trace of {minilm.name} (bert): {len(trace.tokens)} tokens")
    assert "layers 0–5: residual, q, k, v, scores, attentions" in text and "more)" in text
    assert f"attentions {trace.attentions.shape}" in text
    assert "array(" not in repr(trace.layers[0]) and "kept=['residual'" in repr(trace.layers[0])
    few = minilm.run("a b", layers=[0, 5], keep=("attentions",))
    assert "layers 0, 5: attentions" in repr(few)
