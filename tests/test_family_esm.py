"""ESM-2 (model_type esm) against transformers' committed references (tests/fixtures/make_fixtures.py, make_esm): the
padded batch, every layer and the tokenizer's ids are in test_families.py; here left padding, the 17-residue
sequence, token_dropout's rescaling (row 0 holds a <mask>), the contact map equal to EsmModel.predict_contacts,
the tokenizer read from vocab.txt as EsmTokenizer splits, the knobs refused in one line, a save read back, and the
CLI (show, heads, rollout) on the fixture."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.analysis.contacts import apc, contact_features, contacts, head_scores, predict, symmetrize
from conftest import (MODELS, TOL_HIDDEN, check_encoder_saved_reads_back, check_left_padding,
                      check_single_sequence, edited, max_abs, reference, run_main)

TOL_CONTACTS = 1e-5                    # contact probabilities (σ of float32 attentions' sums), max abs


def test_left_padding_and_a_longer_sequence_equal_the_reference():
    """Positions 0…n−1 whatever the mask, as transformers numbers ESM's RoPE: a left-padded row's real tokens
    equal transformers' left-padded run (not the row alone)."""
    check_left_padding("esm", logits=True)
    check_single_sequence("esm", logits=True)


def test_token_dropout_rescales_the_row_holding_a_mask():
    """Row 0 holds one <mask> among 11 real tokens: E[ids]·0.88/(1 − 1/11), the <mask> row zeroed; row 1 none:
    E[ids]·0.88. The knobs are read, and without them the logits move far from transformers'."""
    ref = reference("esm")
    model = qkv.load(MODELS / "esm")
    cfg = model.config
    assert (cfg.mask_dropout_id, cfg.embedding_multiplier, cfg.position, cfg.norm_place) == (32, 0.88, "rope", "pre")
    assert (ref["input_ids"][0] == 32).sum() == 1 and not (ref["input_ids"][1] == 32).any()
    valid = ref["attention_mask"].astype(bool)
    model.config = cfg.with_(mask_dropout_id=None)                       # only the constant 0.88 left
    out = model.forward(ref["input_ids"], ref["attention_mask"])
    assert max_abs(out.logits[1][valid[1]], ref["logits"][1][valid[1]]) <= TOL_HIDDEN   # no <mask>: unchanged
    assert max_abs(out.logits[0], ref["logits"][0]) > 1e-3
    model.config = cfg.with_(mask_dropout_id=None, embedding_multiplier=1.0)
    assert max_abs(model.forward(ref["single_input_ids"]).logits, ref["single_logits"]) > 1e-3


def test_embeddings_of_a_masked_row_are_scaled_as_transformers_scales_them():
    """blocks.embed on row 0: E[ids]·0.88 / (1 − 1/11), the <mask> row 0 (an exact identity, float64); a row of
    <mask> only is refused in one line."""
    from qkv.core.blocks import embed

    model = qkv.load(MODELS / "esm", dtype=np.float64)
    ids = reference("esm")["input_ids"][:1]
    x = embed(model.weights, model.config, ids, np.arange(ids.shape[1])[None])
    want = model.weights.tok_embed[ids] * 0.88 / (1 - 1 / 11)
    want[ids == 32] = 0
    np.testing.assert_allclose(x, want, rtol=1e-12, atol=0)
    with pytest.raises(QkvError, match="every token of a row is <mask>"):
        embed(model.weights, model.config, np.full((1, 3), 32), np.arange(3)[None])


def test_contacts_equal_predict_contacts():
    """Every layer's attention, pads' and <eos>'s rows and columns zeroed, <cls> and the last column dropped,
    symmetrised, APC-corrected, the regression, σ: transformers' EsmModel.predict_contacts on the padded batch
    (row 1 right-padded) and on the 17-residue sequence, within TOL_CONTACTS."""
    ref = reference("esm")
    model = qkv.load(MODELS / "esm")
    w = model.weights
    out = model.forward(ref["input_ids"], ref["attention_mask"])
    P = predict(contact_features(out.attentions, ref["input_ids"], ref["attention_mask"]), w.W_contact, w.b_contact)
    assert P.shape == ref["contacts"].shape == (2, 9, 9)
    assert max_abs(P, ref["contacts"]) <= TOL_CONTACTS
    one = model.forward(ref["single_input_ids"])
    P = predict(contact_features(one.attentions, ref["single_input_ids"]), w.W_contact, w.b_contact)
    assert max_abs(P, ref["single_contacts"]) <= TOL_CONTACTS
    assert w.W_contact.shape == (12,) and w.b_contact.shape == (1,)


def test_contacts_need_the_regression_and_the_apc():
    """Without APC, or with the regression's weights zeroed, the map moves away from transformers' (the test above
    would fail on a wrong step)."""
    ref = reference("esm")
    model = qkv.load(MODELS / "esm")
    out = model.forward(ref["single_input_ids"])
    A = np.asarray(out.attentions, np.float64)[:, 0, :, 1:-1, 1:-1].reshape(12, 15, 15)
    raw = 1 / (1 + np.exp(-(np.einsum("cij,c->ij", symmetrize(A), model.weights.W_contact) + model.weights.b_contact)))
    assert max_abs(raw, ref["single_contacts"][0]) > 10 * TOL_CONTACTS
    flat = predict(contact_features(out.attentions, ref["single_input_ids"]), np.zeros(12), model.weights.b_contact)
    assert max_abs(flat, ref["single_contacts"]) > 10 * TOL_CONTACTS


def test_apc_is_the_average_product_correction():
    """APC(X) = X − (X·1)(1ᵀ·X)/(1ᵀ·X·1): each corrected map sums to 0, and a rank-one X (a row's pull times a
    column's) is removed entirely."""
    gen = np.random.default_rng(0)
    r, c = gen.random(7), gen.random(7)
    np.testing.assert_allclose(apc(np.outer(r, c)), 0, atol=1e-15)
    X = gen.random((3, 7, 7))
    assert np.abs(apc(X).sum((-1, -2))).max() < 1e-12


def test_contact_map_and_best_heads():
    """contacts(model, sequence): the map over the residues (symmetric), each head's r with it, the best heads by r;
    head_scores is Pearson's r over the pairs at least 6 apart (np.corrcoef)."""
    model = qkv.load(MODELS / "esm")
    cm = contacts(model, "NLYIQWLKDGGPSSGRPPPS")
    assert cm.residues == list("NLYIQWLKDGGPSSGRPPPS") and cm.predicted.shape == (20, 20)
    np.testing.assert_array_equal(cm.predicted, cm.predicted.T)
    assert cm.features.shape == (3, 4, 20, 20) and cm.scores.shape == (3, 4)
    (layer, head, r), *_ = cm.best_heads(3)
    assert r == cm.scores.max()
    i, j = np.triu_indices(20, k=6)
    assert abs(np.corrcoef(cm.features[layer, head][i, j], cm.predicted[i, j])[0, 1] - r) < 1e-12
    flat = cm.features.reshape(12, 20, 20)
    assert np.allclose(head_scores(flat, cm.predicted), cm.scores.ravel())
    (a, b, p), = cm.top_contacts(1)
    assert b - a >= 6 and p == max(cm.predicted[x, y] for x, y in zip(i, j))


def test_tokenizer_reads_vocab_txt_as_esm_tokenizer_splits():
    """No tokenizer.json: vocab.txt read as EsmTokenizer reads it — one residue a token, <mask> whole, a lower-case
    letter and an unknown one each <unk>, <cls> … <eos> around; the ids EsmTokenizer gave."""
    ref = reference("esm")
    assert not (MODELS / "esm" / "tokenizer.json").exists()
    model = qkv.load(MODELS / "esm")
    ids, tokens = model.encode(str(ref["masked_text"]))
    assert ids.tolist() == ref["masked_text_ids"].tolist()
    assert tokens[0] == "<cls>" and tokens[-1] == "<eos>" and "<mask>" in tokens
    assert model.tokenizer.pad_token_id == 1


@pytest.mark.parametrize("change, message", [
    ({"position_embedding_type": "absolute"}, "position_embedding_type 'absolute' is not supported"),
    ({"is_folding_model": True}, "is_folding_model=true is not supported"),
    ({"is_decoder": True}, "is_decoder=true is not supported"),
    ({"mask_token_id": None}, "token_dropout=true needs mask_token_id"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_parameters"),
])
def test_knobs_it_cannot_run_are_refused_in_one_line(tmp_path, change, message):
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(edited(tmp_path, "esm", change))
    assert "\n" not in str(e.value)


def test_emb_layer_norm_before_is_read():
    """ESM-1b's LayerNorm on the embeddings (emb_layer_norm_before) is a knob: its tensors are then required."""
    from qkv.checkpoints.families import config_of

    hf = {**reference_config(), "emb_layer_norm_before": True}
    assert config_of(hf).embed_norm and not config_of(reference_config()).embed_norm


def reference_config() -> dict:
    import json

    return json.loads((MODELS / "esm" / "config.json").read_text())


def test_saved_reads_back(tmp_path):
    """Model.save writes an EsmForMaskedLM (its contact head too) that reads back to the bit."""
    check_encoder_saved_reads_back(tmp_path, "esm")
    again = qkv.load(tmp_path / "saved")
    np.testing.assert_array_equal(again.weights.W_contact, qkv.load(MODELS / "esm").weights.W_contact)


@pytest.mark.parametrize("command, text", [("show", "MKTAYIAKQR"), ("heads", "MKTAYIAKQR"), ("rollout", "MKTAYIAKQR"),
                                           ("attribute", "MKT<mask>YIAKQR"), ("lens", "MKT<mask>YIAKQR")])
def test_cli_runs_on_a_sequence(monkeypatch, capsys, command, text):
    """qkv show / heads / rollout on a protein's sequence: each residue its own label, and show's contacts; attribute
    and lens on one with a <mask> (token_dropout's factor, forward and backward)."""
    code, out, err = run_main(monkeypatch, capsys, command, text, "--model", str(MODELS / "esm"))
    assert code == 0, err
    if command == "show":
        assert "0:<cls> 1:M 2:K 3:T 4:A 5:Y" in out
        best = contacts(qkv.load(MODELS / "esm"), "MKTAYIAKQR").best_heads(1)[0]
        assert "contacts (ESM's contact head" in out and f"L{best[0]}.H{best[1]} r {best[2]:+.2f}" in out


def test_pipeline_page_runs(tmp_path):
    """The pipeline page of a sequence through ESM is written."""
    from qkv.viz.pipeline import save_pipeline

    path = save_pipeline(qkv.load(MODELS / "esm"), "MKTAYIAKQR", tmp_path / "p.html")
    assert path.stat().st_size > 10_000


def test_backward_equals_finite_differences_with_and_without_a_mask():
    """token_dropout is a constant factor per row of E[ids]·s (0 on <mask>, 1/(1 − r) elsewhere): the backward's
    gradient of Σ logits·G equals central finite differences (float64, relative 1e-6) on entries of E (a residue's
    row, and <mask>'s: only the tied head's share, its input row being zeroed), W_Q, W_head — on row 0 of the batch (one <mask> among 11 tokens) and on
    the 17-token sequence (none)."""
    from qkv.core.backward import backward, taped

    ref = reference("esm")
    model = qkv.load(MODELS / "esm", dtype=np.float64)
    w, cfg = model.weights, model.config
    for ids in (ref["input_ids"][:1], ref["single_input_ids"]):
        mask = np.ones_like(ids)
        G = np.random.default_rng(0).normal(size=(1, ids.shape[1], cfg.vocab_size))

        def loss() -> float:
            return float((model.forward(ids, mask).logits * G).sum())

        h, logits, tape = taped(w, cfg, ids, mask)
        grads = backward(G, h, logits, w, cfg, tape)
        checked = [(w.tok_embed, grads.tok_embed, (int(ids[0, 3]), 5)), (w.blocks[1].attn.W_Q, grads.blocks[1].attn.W_Q,
                   (4, 7)), (w.W_head, grads.W_head, (2, 9))]
        if (ids == 32).any():
            checked.append((w.tok_embed, grads.tok_embed, (32, 5)))
        for array, grad, at in checked:
            keep, eps = array[at], 1e-5
            array[at] = keep + eps
            up = loss()
            array[at] = keep - eps
            down = loss()
            array[at] = keep
            assert abs((up - down) / (2 * eps) - grad[at]) <= 1e-6 * max(1.0, abs(grad[at]))


def test_rope_speeds_kept_in_16_bits_are_refused(tmp_path):
    """transformers turns q and k by the inv_freq a file keeps; the engine by rope_theta's: equal in the fixture (read
    as it is), and a file whose speeds were rounded to float16 is refused in one line, not run with other angles."""
    import shutil

    from safetensors.numpy import load_file, save_file

    name = "esm.encoder.layer.*.attention.self.rotary_embeddings.inv_freq"
    stored = load_file(str(MODELS / "esm" / "model.safetensors"))
    d = qkv.load(MODELS / "esm").config.d_head
    np.testing.assert_allclose(stored[name], 1 / 1000.0 ** (np.arange(0, d, 2) / d), rtol=1e-6)
    shutil.copytree(MODELS / "esm", tmp_path / "m")
    stored[name] = stored[name].astype(np.float16).astype(np.float32)
    save_file(stored, str(tmp_path / "m" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(QkvError, match="RoPE speeds .* are not rope_theta=1000's") as e:
        qkv.load(tmp_path / "m")
    assert "\n" not in str(e.value)
