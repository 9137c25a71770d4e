"""qkv.train.gradients against torch autograd, from the committed fixtures (tests/fixtures/grads/,
made by make_grad_fixtures.py): every decoder family, a padded batch, float32.

Tolerances (issue 12): the loss within 1e-5; each tensor's gradient within 1e-4 relative error
‖g − g_ref‖ / ‖g_ref‖.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import qkv
from qkv.runtime.errors import QkvError
from qkv.train import gradients

FIXTURES = Path(__file__).parent / "fixtures"
DECODERS = ("gpt2", "llama_gqa", "llama_mqa", "mistral", "qwen2", "gpt_neox", "gpt_neox_sequential", "qwen3", "phi",
            "gemma", "olmo2")        # parallel residual, partial RoPE, q/k norms, √d embeddings, output norms


def _reference(name: str):
    ref = np.load(FIXTURES / "grads" / f"{name}.npz")
    model = qkv.load(FIXTURES / "models" / name)
    if int(ref["sliding_window"]):
        model = model.with_config(sliding_window=int(ref["sliding_window"]))
    return model, ref


@pytest.mark.parametrize("name", DECODERS)
def test_gradients_equal_autograd(name):
    model, ref = _reference(name)
    loss, grads = gradients(model, ref["input_ids"], ref["attention_mask"])
    assert abs(loss - float(ref["loss"])) < 1e-5
    expected = {k[len("grad."):]: ref[k] for k in ref.files if k.startswith("grad.")}
    assert set(grads) == set(expected)                       # every parameter, a tied head once
    for key, g_ref in expected.items():
        assert grads[key].shape == g_ref.shape, key
        err = np.linalg.norm(grads[key] - g_ref) / np.linalg.norm(g_ref)
        assert err < 1e-4, f"{key}: relative error {err:.2e}"


def test_the_window_matters():
    """Without Mistral's window of 5 the loss differs from the reference: the fixture tests the window."""
    model, ref = _reference("mistral")
    unwindowed = model.with_config(sliding_window=None)
    assert abs(gradients(unwindowed, ref["input_ids"], ref["attention_mask"])[0] - float(ref["loss"])) > 1e-3


def test_padding_is_not_learned():
    """Changing a padded token changes nothing: not the loss, not a gradient."""
    model, ref = _reference("gpt2")
    ids, mask = ref["input_ids"].copy(), ref["attention_mask"]
    loss, grads = gradients(model, ids, mask)
    ids[mask == 0] = 5
    loss2, grads2 = gradients(model, ids, mask)
    assert loss == loss2
    for key in grads:
        np.testing.assert_allclose(grads[key], grads2[key], atol=1e-7, err_msg=key)


def test_loss_mask_counts_only_chosen_positions():
    model, ref = _reference("llama_gqa")
    ids = ref["input_ids"][:1]
    only = np.zeros(ids.shape, bool)
    only[0, 3] = True                                        # the prediction of token 4 from position 3
    loss, _ = gradients(model, ids, loss_mask=only)
    logits = model.forward(ids).logits[0, 3].astype(np.float64)
    expected = -(logits[ids[0, 4]] - np.log(np.exp(logits - logits.max()).sum()) - logits.max())
    assert loss == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("ids, message", [
    ([[5]], "at least 2 real tokens"),
    ([[5, 6, 7]], "shape of input_ids"),
])
def test_bad_input(ids, message):
    model, _ = _reference("gpt2")
    with pytest.raises(QkvError, match=message):
        gradients(model, ids, loss_mask=None if message.startswith("at") else np.ones((1, 2), bool))


def test_encoders_are_refused():
    with pytest.raises(QkvError, match="decoder"):
        gradients(qkv.load(FIXTURES / "models" / "bert"), [[1, 2, 3]])
