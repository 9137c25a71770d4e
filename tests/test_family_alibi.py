"""Group B — ALiBi: BLOOM, Falcon (every layout) and MPT against the committed fixtures, without torch.

The fixtures bloom, falcon, falcon_rw and mpt (tests/fixtures/make_fixtures.py) are also in FAMILY_FIXTURES,
so test_families.py checks their padded batch, every layer, single-sequence logits, float64 and left
padding, and test_decode_fast.py their one-token steps; here: the slopes, the refusals, the gradients
(fixtures from make_grad_fixtures.py), the tiled path at length, saving, and the CLI.
"""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.core.config import ModelConfig
from qkv.core.positions import alibi_bias, alibi_slopes, to_bfloat16
from qkv.train import gradients
from conftest import FIXTURES, MODELS, TOL_HIDDEN, edited, max_abs, reference, run_main

ALIBI = ("bloom", "falcon", "falcon_rw", "mpt")


@pytest.mark.parametrize("H, slopes", [
    (8, [2.0 ** -i for i in range(1, 9)]),                            # a power of two: 2^-8/H·(h+1)
    (4, [2.0 ** -i for i in (2, 4, 6, 8)]),
    (6, [2.0 ** -i for i in (2, 4, 6, 8, 1, 3)]),                     # 4 of the series for 4, then 2 of 8's odd ones
    (3, [2.0 ** -i for i in (4, 8, 2)]),
])
def test_alibi_slopes_follow_the_geometric_series(H, slopes):
    np.testing.assert_array_equal(alibi_slopes(H), np.float32(slopes))


@pytest.mark.parametrize("H", [1, 2, 3, 5, 6, 8, 12, 16, 20, 71])
def test_mpt_writes_the_same_slopes(H):
    """MPT's form: 2^(-8·(i+1)/P') over P' = 2^⌈log₂H⌉, odd-numbered first, then even, the first H."""
    p2 = 2 ** int(np.ceil(np.log2(H)))
    mpt = 2.0 ** (-8.0 * np.arange(1, p2 + 1) / p2)
    mpt = np.concatenate([mpt[1::2], mpt[::2]])[:H] if p2 != H else mpt
    np.testing.assert_allclose(alibi_slopes(H), mpt, rtol=1e-6)


def test_alibi_bias_counts_real_keys_only():
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    b = alibi_bias(mask, np.float32([0.5, 0.25]))                      # (B, H, 1, m)
    assert b.shape == (2, 2, 1, 5)
    np.testing.assert_array_equal(b[0, 0, 0], [0, 0, 0, 0.5, 1.0])   # left padding: the first real key is 0
    np.testing.assert_array_equal(b[1, 1, 0], [0, 0.25, 0.5, 0, 0])
    assert to_bfloat16(np.float32([1 + 2 ** -9]))[0] == 1.0           # bfloat16 keeps 8 bits of mantissa
    assert to_bfloat16(np.float32([1 + 3 * 2 ** -9]))[0] == 1 + 2 ** -7   # ties go to even


@pytest.mark.parametrize("name", ALIBI)
def test_gradients_equal_autograd(name):
    ref = np.load(FIXTURES / "grads" / f"{name}.npz")
    loss, grads = gradients(qkv.load(MODELS / name), ref["input_ids"], ref["attention_mask"])
    assert abs(loss - float(ref["loss"])) < 1e-5
    expected = {k[len("grad."):]: ref[k] for k in ref.files if k.startswith("grad.")}
    assert set(grads) == set(expected)
    for key, g_ref in expected.items():
        assert np.linalg.norm(grads[key] - g_ref) / np.linalg.norm(g_ref) < 1e-4, key


@pytest.mark.parametrize("name", ["bloom", "falcon_rw", "mpt"])           # mpt: its own softmax_scale too
def test_alibi_at_length_stays_tiled_and_equals_plain(name, monkeypatch):
    from qkv.core import attention

    model = qkv.load(MODELS / name).with_config(max_positions=512)
    ids = np.random.default_rng(0).integers(3, model.config.vocab_size, size=(1, 300))
    plain = model.forward(ids, attentions=False).logits
    monkeypatch.setattr(attention, "TILED_MIN_SCORES", 1)
    calls = []
    real = attention.tiled_attention
    monkeypatch.setattr(attention, "tiled_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    tiled = model.forward(ids, attentions=False).logits
    assert len(calls) == model.config.n_layers
    assert max_abs(tiled, plain) <= TOL_HIDDEN


@pytest.mark.parametrize("name", ALIBI)
def test_saved_model_reads_back_equal(name, tmp_path):
    model = qkv.load(MODELS / name)
    model.save(tmp_path / "m")
    back = qkv.load(tmp_path / "m")
    assert back.config == model.config
    ref = reference(name)
    a = model.forward(ref["input_ids"], ref["attention_mask"]).logits
    np.testing.assert_array_equal(back.forward(ref["input_ids"], ref["attention_mask"]).logits, a)


@pytest.mark.parametrize("name, change, message", [
    ("bloom", {"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm"),
    ("bloom", {"slow_but_exact": "yes"}, "true or false"),
    ("falcon", {"parallel_attn": False}, "parallel_attn=false cannot run"),
    ("falcon", {"num_kv_heads": 3}, "does not divide"),
    ("falcon", {"num_ln_in_parallel_attn": 3}, "not 1 or 2"),
    ("falcon_rw", {"num_ln_in_parallel_attn": 2}, "needs new_decoder_architecture"),
    ("falcon_rw", {"num_kv_heads": 1}, "needs new_decoder_architecture"),
    ("falcon", {"rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4, "factor": 2.0}}, "proportional"),
    ("mpt", {"attn_config": {"clip_qkv": 6.0}}, "clip_qkv"),
    ("mpt", {"attn_config": {"softmax_scale": -1}}, "softmax_scale"),
    ("mpt", {"attn_config": [1]}, "an object"),
])
def test_refused_in_one_line(tmp_path, name, change, message):
    with pytest.raises(QkvError, match=message):
        model = qkv.load(edited(tmp_path, name, change))
        model.forward(np.arange(3, 8))


def test_bloom_irrelevant_knobs_change_nothing(tmp_path):
    """pretraining_tp / slow_but_exact split W_O and W_out's products into summed slices: the same numbers."""
    ref = reference("bloom")
    a = qkv.load(MODELS / "bloom").forward(ref["input_ids"], ref["attention_mask"]).logits
    b = qkv.load(edited(tmp_path, "bloom", {"pretraining_tp": 2, "slow_but_exact": True}))
    np.testing.assert_array_equal(b.forward(ref["input_ids"], ref["attention_mask"]).logits, a)


def test_alibi_knobs_need_alibi():
    with pytest.raises(QkvError, match="need position='alibi'"):
        ModelConfig(family="x", vocab_size=10, d_model=8, n_layers=1, n_heads=2, d_ff=8, max_positions=8,
                    position="rope", alibi_scaled=True)


def test_falcon_layouts_read_as_knobs():
    rw, new = qkv.load(MODELS / "falcon_rw").config, qkv.load(MODELS / "falcon").config
    assert (rw.position, rw.alibi_scaled, rw.parallel_residual, rw.n_kv_heads) == ("alibi", True, False, 5)
    assert (new.position, new.parallel_residual, new.shared_norm, new.n_kv_heads) == ("rope", True, False, 2)
    assert qkv.load(MODELS / "bloom").config.position == "alibi"
    mpt = qkv.load(MODELS / "mpt").config
    assert (mpt.position, mpt.attn_scale, mpt.qkv_bias, mpt.tied_embeddings) == ("alibi", 0.3, False, False)


def test_cli_show_and_generate_run_on_alibi_models(tmp_path, monkeypatch, capsys):
    for name in ("bloom", "falcon_rw"):
        out = tmp_path / f"{name}.html"
        code, _, err = run_main(monkeypatch, capsys, "show", "The cat sat on the mat", "--model", str(MODELS / name),
                                "--out", str(out))
        assert code == 0 and out.stat().st_size > 0, err
        code, text, err = run_main(monkeypatch, capsys, "generate", "The cat", "--model", str(MODELS / name),
                                   "-n", "4", "-t", "0")
        assert code == 0 and text.strip(), err


def test_pipeline_page_names_the_slopes():
    from qkv.viz.pipeline import pipeline_html, pipeline_trace
    from qkv.viz.pipeline_payload import arch_of

    model = qkv.load(MODELS / "falcon_rw")
    slopes = arch_of(model)["alibi"]                                  # as S gets them: Falcon's ÷ √d_k
    np.testing.assert_allclose(slopes, alibi_slopes(5) / np.sqrt(8), rtol=1e-6)
    assert arch_of(qkv.load(MODELS / "falcon"))["alibi"] is None
    assert len(pipeline_html(model, pipeline_trace(model, "The cat sat on the mat"))) > 0


@pytest.mark.parametrize("topic", ["attention", "flash", "positions"])
def test_lessons_recompute_the_alibi_scores(topic, monkeypatch, capsys):
    code, text, err = run_main(monkeypatch, capsys, "explain", topic, "--model", str(MODELS / "falcon_rw"))
    assert code == 0, err
    if topic == "attention":
        assert "ALiBi" in text


def test_sparse_lesson_refuses_alibi_in_one_line(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "explain", "sparse", "--model", str(MODELS / "bloom"))
    assert code == 2 and "ALiBi" in err


def test_hooked_scores_carry_the_alibi_bias():
    """A hook on S sees the bias already added (S = Q·Kᵀ/√d_k + m·p + M), and an identity hook changes nothing."""
    model = qkv.load(MODELS / "bloom")
    ids = reference("bloom")["single_input_ids"][0, :9]
    seen = {}
    hooked = model.run(ids, hooks={"0.scores": lambda s, layer: seen.setdefault("s", s)})
    plain = model.run(ids)
    np.testing.assert_array_equal(hooked.logits, plain.logits)
    np.testing.assert_array_equal(seen["s"][0], plain.layer(0).scores)
