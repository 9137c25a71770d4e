"""DeBERTa (v1) and DeBERTa-v2/v3: disentangled attention against transformers' committed references
(tests/fixtures/make_fixtures.py: deberta_v3, deberta_v2 with the convolution beside its first layer, deberta; the
padded batch and every layer are in test_families.py), and what is its own: S = c2c + (c2p + p2c) to the bit, each
term read and replaced by hooks, the knobs refused in one line, a save read back, gradients equal to torch
autograd's (and the terms' backward to finite differences), the viewer's Disentangled tab."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.core.disentangled import Disentangled, log_buckets, relative_rows
from conftest import (MODELS, TOL_ATTENTION, check_encoder_saved_reads_back, check_gradients, check_left_padding,
                      check_single_sequence, edited, max_abs, reference, run_main)

DEBERTAS = ("deberta_v3", "deberta_v2", "deberta")
MASKED_LM = DEBERTAS
TERMS = ("scores_c2c", "scores_c2p", "scores_p2c")


@pytest.mark.parametrize("name", DEBERTAS)
def test_left_padding_equals_reference(name):
    check_left_padding(name, logits=name in MASKED_LM)


@pytest.mark.parametrize("name", DEBERTAS)
def test_single_sequence_equals_reference(name):
    """17 tokens: distances past the buckets' linear part (deberta_v3: ±4) and past the clamp (deberta_v2: ±6,
    deberta: ±8) are read."""
    check_single_sequence(name, logits=name in MASKED_LM)


def test_the_fixtures_cover_the_knobs():
    v3, v2, v1 = (qkv.load(MODELS / n).config for n in DEBERTAS)
    assert v3.disentangled == Disentangled(("c2p", "p2c"), 64, buckets=8, share_key=True, norm=True)
    assert v3.position == "relative" and v3.head_names == "lm_predictions" and v3.type_vocab_size == 0
    assert v2.disentangled == Disentangled(("c2p", "p2c"), 6) and v2.position == "learned"
    assert v2.head_names == "cls.predictions" and v2.type_vocab_size == 2 and v2.first_conv == (3, "gelu")
    assert v3.first_conv is None and v1.first_conv is None
    assert v1.disentangled == Disentangled(("c2p", "p2c"), 8) and v1.head_names == "cls.predictions"
    assert v1.attn_scale == pytest.approx(1 / np.sqrt(8 * 4))          # c2p|p2c|p2p: v1 counts all three
    assert v3.attn_scale == pytest.approx(1 / np.sqrt(8 * 3))


@pytest.mark.parametrize("name", DEBERTAS)
def test_the_three_terms_sum_to_the_scores_the_softmax_read(name):
    """The recorded S + M is c2c + (c2p + p2c) exactly where a key is seen (−∞ where it is padding), and c2c is
    Q·Kᵀ·s of the recorded q and k."""
    ref = reference(name)
    trace_keep = ("q", "k", "scores", "attentions", *TERMS)
    model = qkv.load(MODELS / name)
    for row in range(2):
        n = int(ref["attention_mask"][row].sum())
        t = model.run(ref["input_ids"][row, :n], keep=trace_keep)
        for layer in range(model.config.n_layers):
            L = t.layer(layer)
            assert L.scores_c2p.shape == L.scores.shape == (model.config.n_heads, n, n)
            assert np.array_equal(L.scores, L.scores_c2c + (L.scores_c2p + L.scores_p2c))
            c2c = np.matmul(L.q, L.k.swapaxes(-1, -2)) * np.float32(model.config.attn_scale)
            assert max_abs(L.scores_c2c, c2c) <= 1e-5
            if not ref.get("token_type_ids", np.zeros((2, 1)))[row].any():    # (run reads no token types)
                assert max_abs(L.attentions, ref["attentions"][layer, row][:, :n, :n]) <= TOL_ATTENTION


def test_a_padded_batch_hides_the_padding_in_s_not_in_the_terms():
    ref = reference("deberta_v3")
    model = qkv.load(MODELS / "deberta_v3")
    from qkv.core.trace import Recorder
    from qkv.core.stack import transformer

    rec = Recorder(keep=("scores", *TERMS))
    transformer(model.weights, model.config, ref["input_ids"], ref["attention_mask"], rec=rec)
    s = rec.store[0]
    pad = ~ref["attention_mask"].astype(bool)                             # (B, n) padding keys
    summed = s["scores_c2c"] + (s["scores_c2p"] + s["scores_p2c"])
    hidden = np.broadcast_to(pad[:, None, None, :], summed.shape)
    assert np.isneginf(s["scores"][hidden]).all() and np.isfinite(summed).all()
    assert np.array_equal(s["scores"][~hidden], summed[~hidden])


def test_one_term_alone_sums_as_well():
    """The same weights with one position term (pos_att_type "c2p" or "p2c"): S = c2c + that term."""
    model = qkv.load(MODELS / "deberta_v2")
    ids = reference("deberta_v2")["single_input_ids"][0]
    for kept in ("c2p", "p2c"):
        one = model.with_config(disentangled=replace(model.config.disentangled, terms=(kept,)))
        t = one.run(ids, keep=("scores", *TERMS))
        assert t.layers[0].scores_c2p is None if kept == "p2c" else t.layers[0].scores_p2c is None
        L = t.layer(1)
        assert np.array_equal(L.scores, L.scores_c2c + getattr(L, f"scores_{kept}"))


def test_hooks_read_the_terms_and_replace_the_position_ones():
    model = qkv.load(MODELS / "deberta_v3")
    ids = reference("deberta_v3")["single_input_ids"][0]
    seen = []
    plain = model.run(ids)
    read = model.run(ids, hooks={name: (lambda v, layer, name=name: seen.append((name, layer, v.shape)))
                                 for name in TERMS})
    assert len(seen) == 3 * model.config.n_layers and np.array_equal(plain.hidden, read.hidden)
    zeroed = model.run(ids, hooks={"scores_c2p": lambda v, layer: 0, "scores_p2c": lambda v, layer: 0})
    without = model.with_config(disentangled=None).run(ids)                # S = Q·Kᵀ·s alone, the same s
    assert np.array_equal(zeroed.hidden, without.hidden)
    assert max_abs(zeroed.hidden, plain.hidden) > 1e-3                     # the terms did move the stream
    one_head = model.run(ids, hooks={"1.scores_c2p.2": lambda v, layer: np.zeros_like(v)})
    assert not one_head.layer(1).scores_c2p[2].any() and one_head.layer(1).scores_c2p[1].any()


@pytest.mark.parametrize("name, key, message", [
    ("deberta_v3", "scores_c2c", "c2c is read only"),
])
def test_c2c_is_read_only(name, key, message):
    model = qkv.load(MODELS / name)
    with pytest.raises(QkvError, match=message) as e:
        model.run([5, 6, 7], hooks={key: lambda v, layer: v * 2})
    assert "\n" not in str(e.value)


def test_models_without_the_terms_refuse_their_hooks():
    with pytest.raises(QkvError, match="no c2p term") as e:
        qkv.load(MODELS / "bert").run([5, 6, 7], hooks={"scores_c2p": lambda v, layer: None})
    assert "\n" not in str(e.value)
    model = qkv.load(MODELS / "deberta_v2")
    one = model.with_config(disentangled=replace(model.config.disentangled, terms=("c2p",)))
    with pytest.raises(QkvError, match="no p2c term"):
        one.run([5, 6, 7], hooks={"scores_p2c": lambda v, layer: None})
    with pytest.raises(QkvError, match="only disentangled attention"):
        qkv.load(MODELS / "bert").run([5, 6, 7]).layer(0).scores_c2c


def test_relative_rows_bucket_far_distances_and_clamp():
    """δ(i, j) = clamp(bucket(i − j) + k, 0, 2k − 1): the distances near 0 as they are, far ones log-spaced."""
    d = Disentangled(("c2p", "p2c"), 64, buckets=8)
    r = np.arange(-20, 21)
    b = log_buckets(r, 8, 64)
    assert np.array_equal(b[np.abs(r) <= 4], r[np.abs(r) <= 4])              # linear up to buckets/2
    assert np.array_equal(b, -b[::-1]) and (np.diff(b) >= 0).all() and b.max() < 8
    c2p, p2c = relative_rows(17, d)
    assert c2p[0, 0] == 8 and c2p[3, 0] == 11 and c2p[0, 3] == 5 and c2p.min() >= 0 and c2p.max() <= 15
    assert np.array_equal(p2c, c2p.T)                                         # bucket is odd
    c2p, _ = relative_rows(17, Disentangled(("c2p",), 6))
    assert c2p[16, 0] == 11 and c2p[0, 16] == 0                               # clamped at ±6: rows 0 … 11


@pytest.mark.parametrize("name, change, message", [
    ("deberta_v3", {"conv_kernel_size": 4}, "conv_kernel_size=4"),
    ("deberta_v2", {"conv_groups": 2}, "conv_groups=2"),
    ("deberta_v2", {"conv_act": "mish"}, "conv_act='mish'"),
    ("deberta_v3", {"embedding_size": 16}, "embedding_size=16"),
    ("deberta_v3", {"attention_head_size": 4}, "attention_head_size=4"),
    ("deberta", {"talking_head": True}, "talking_head=true"),
    ("deberta", {"tie_word_embeddings": False}, "legacy=true with tie_word_embeddings=false"),
    ("deberta_v3", {"pos_att_type": 5}, "pos_att_type"),
    ("deberta_v3", {"position_buckets": 1}, "position_buckets=1"),
    ("deberta_v3", {"share_att_key": "yes"}, "share_att_key"),
    ("deberta_v3", {"legacy": True}, "cls.predictions"),                    # the file holds lm_predictions
])
def test_what_cannot_run_is_refused_in_one_line(tmp_path, name, change, message):
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(edited(tmp_path, name, change))
    assert "\n" not in str(e.value)


def test_relative_attention_off_keeps_the_scale_of_its_terms():
    """relative_attention false: no position terms, but the scale still counts pos_att_type (as transformers
    computes it); and a checkpoint that still holds the position projections is refused (never read)."""
    from qkv.checkpoints.families import config_of

    hf = json.loads((MODELS / "deberta_v2" / "config.json").read_text()) | {"relative_attention": False}
    cfg = config_of(hf)
    assert cfg.disentangled is None and cfg.attn_scale == pytest.approx(1 / np.sqrt(8 * 3))
    assert config_of(hf | {"pos_att_type": None}).attn_scale == pytest.approx(1 / np.sqrt(8))


def test_a_model_without_terms_reads_no_table(tmp_path):
    model = qkv.load(MODELS / "deberta_v2")
    plain = model.with_config(disentangled=None)
    plain.save(tmp_path / "plain")
    hf = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert hf["relative_attention"] is False and hf["pos_att_type"] == ["c2p", "p2c"]   # the scale's count
    again = qkv.load(tmp_path / "plain")
    assert again.config == plain.config and again.weights.rel_embed is None
    assert again.run([5, 6, 7]).layers[0].scores_c2p is None


@pytest.mark.parametrize("name", DEBERTAS)
def test_save_reads_back_equal(tmp_path, name):
    check_encoder_saved_reads_back(tmp_path, name, logits=name in MASKED_LM)


@pytest.mark.parametrize("name", DEBERTAS)
def test_masked_lm_gradients_equal_autograd(name):
    """grads/<name>.npz (make_grad_fixtures.py): transformers' *ForMaskedLM loss and torch autograd's gradient of
    every parameter it reaches (the position projections, the relative table and its norm among them), within 1e-4
    relative error — or, for a gradient that is 0 but for rounding (K's bias, and c2p's projection bias b_Kr: the
    same for every key a query sees), within 1e-6."""
    grads = check_gradients(qkv.load(MODELS / name), name, labels=True, atol=1e-6)
    assert any("rel_embeddings" in k for k in grads)                     # the same names as autograd's


def test_the_terms_backward_equals_finite_differences():
    """terms_backward against central differences in float64, for both terms, share_att_key off and on: dq, dk, dP
    and the projections' gradients of L = Σ G ⊙ (c2p + p2c)."""
    from qkv.core.disentangled import RelativeTable, position_terms, terms_backward
    from qkv.core.weights import AttentionWeights

    rng = np.random.default_rng(0)
    B, H, n, dk, d = 2, 2, 5, 3, 6
    for share in (False, True):
        dis = Disentangled(("c2p", "p2c"), 8, buckets=4, share_key=share)
        P = rng.standard_normal((8, d))
        W = {f: rng.standard_normal((d, H * dk)) for f in ("W_Q", "W_K", "W_Qr", "W_Kr")}
        b = {f: rng.standard_normal(H * dk) for f in ("b_Q", "b_K", "b_Qr", "b_Kr")}
        w = AttentionWeights(W_V=None, W_O=None, **W, **b)
        q, k, G = rng.standard_normal((B, H, n, dk)), rng.standard_normal((B, H, n, dk)), rng.standard_normal((B, H, n, n))
        rows = relative_rows(n, dis)

        def loss(q=q, k=k, P=P, w=w):
            s = w if not share else replace(w, W_Qr=w.W_Q, b_Qr=w.b_Q, W_Kr=w.W_K, b_Kr=w.b_K)
            t = position_terms(q, k, s.W_Qr, s.b_Qr, s.W_Kr, s.b_Kr, RelativeTable(P, *rows), dis, 0.7)
            return float((G * (t["c2p"] + t["p2c"])).sum())

        dq, dkk, dP, g = terms_backward(G, q, k, w, RelativeTable(P, *rows), dis, 0.7)

        def numeric(x, f):
            out, eps = np.zeros_like(x), 1e-6
            for i in np.ndindex(x.shape):
                up, down = x.copy(), x.copy()
                up[i] += eps
                down[i] -= eps
                out[i] = (f(up) - f(down)) / (2 * eps)
            return out

        assert max_abs(dq, numeric(q, lambda x: loss(q=x))) < 1e-6
        assert max_abs(dkk, numeric(k, lambda x: loss(k=x))) < 1e-6
        assert max_abs(dP, numeric(P, lambda x: loss(P=x))) < 1e-6
        names = ("W_K", "b_K", "W_Q", "b_Q") if share else ("W_Kr", "b_Kr", "W_Qr", "b_Qr")
        assert set(g) == set(names)
        for name in names:
            want = numeric(getattr(w, name), lambda x, name=name: loss(w=replace(w, **{name: x})))
            assert max_abs(g[name], want) < 1e-6, name


def test_show_writes_the_disentangled_panel_and_the_pipeline(monkeypatch, capsys, tmp_path):
    """`qkv show --out` on DeBERTa: the viewer carries the three tables of every layer (the Disentangled tab), equal to
    the trace's to f16's precision, and the pipeline page is written (its S = scale·q·kᵀ + c2p + p2c)."""
    from test_viewer import data_of
    from qkv.viz.wire import decode

    code, out, err = run_main(monkeypatch, capsys, "show", "the cat [MASK] on the mat", "--model",
                              str(MODELS / "deberta_v3"), "--out", str(tmp_path))
    assert code == 0, err
    data = data_of((tmp_path / "attention.html").read_text())
    section = data["disentangled"]
    assert section["layers"] == [0, 1] and section["terms"] == ["c2c", "c2p", "p2c"]
    model = qkv.load(MODELS / "deberta_v3")
    trace = model.run("the cat [MASK] on the mat")
    for name in section["terms"]:
        want = np.stack([getattr(trace.layer(i), f"scores_{name}") for i in (0, 1)])
        assert np.allclose(decode(section["tables"][name]), want, rtol=1e-3, atol=1e-3)
    assert (tmp_path / "pipeline.html").is_file()


def test_identity_hooks_everywhere_change_no_bit():
    """Every point of every layer hooked (the three tables too), each hook returning its input: the same numbers
    to the bit, S and A hooked included (attention then runs step by step, the terms still in S)."""
    from qkv.core.trace import DISENTANGLED, INTERMEDIATES

    model = qkv.load(MODELS / "deberta_v3")
    ids = reference("deberta_v3")["single_input_ids"][0]
    names = [n for n in INTERMEDIATES] + [n for n in DISENTANGLED if n != "scores_c2c"]
    plain = model.run(ids, keep=names)
    hooked = model.run(ids, keep=names, hooks={n: (lambda v, layer: v) for n in names})
    assert np.array_equal(plain.hidden, hooked.hidden) and np.array_equal(plain.logits, hooked.logits)
    for layer in range(model.config.n_layers):
        for name in names:
            assert np.array_equal(getattr(plain.layer(layer), name), getattr(hooked.layer(layer), name)), name
