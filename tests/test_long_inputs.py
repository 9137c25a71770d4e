"""The engine at length: it takes the tiled path by itself, with the same numbers as the plain one."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv.core import attention, kernels
from conftest import FAMILY_FIXTURES, MODELS, TOL_ATTENTION, TOL_HIDDEN, max_abs, reference


@pytest.fixture
def always_tiled(monkeypatch):
    """Make every attention call without kept weights take the tiled path; count the calls."""
    calls = []
    real = kernels.tiled_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "TILED_MIN_SCORES", 1)
    monkeypatch.setattr(attention, "tiled_attention", counting)
    return calls


@pytest.mark.parametrize("name", FAMILY_FIXTURES)
def test_tiled_path_gives_the_reference_numbers(name, always_tiled):
    ref = reference(name)
    model = qkv.load(MODELS / name)
    out = model.forward(ref["input_ids"], ref["attention_mask"], ref.get("token_type_ids"), attentions=False)
    cfg = model.config                     # a soft-cap (Gemma 2), a bias per query and key (DeBERTa's position terms,
                                           # MPNet's relative bias) and an encoder's two-way window stay plain
    plain = cfg.attn_softcap or cfg.disentangled or model.weights.rel_bias is not None
    tiled = 0 if plain else sum(cfg.causal or cfg.window(i) is None for i in range(cfg.n_layers))
    assert len(always_tiled) == tiled                                 # no weights asked: tiled everywhere
    valid = ref["attention_mask"].astype(bool)
    assert max_abs(out.hidden[valid], ref["hidden"][valid]) <= TOL_HIDDEN
    if "logits" in ref:
        assert max_abs(out.logits[valid], ref["logits"][valid]) <= TOL_HIDDEN


def test_keeping_weights_takes_the_plain_path(always_tiled):
    model = qkv.load(MODELS / "gpt2")
    model.run(list(range(20)), layers=[0], keep=("attentions",))
    assert len(always_tiled) == model.config.n_layers - 1             # the kept layer ran plain


def test_long_input_switches_to_tiled_by_itself():
    model = qkv.load(MODELS / "llama_gqa").with_config(max_positions=4096)
    ids = np.random.default_rng(0).integers(3, model.config.vocab_size, size=(1, 1100))
    assert ids.shape[1] ** 2 >= attention.TILED_MIN_SCORES
    fast = model.forward(ids, attentions=False).logits
    plain = model.run(ids[0], keep=("attentions",), layers=[0, 1]).logits   # weights kept: plain everywhere
    assert max_abs(fast[0], plain) <= TOL_HIDDEN


def test_weights_of_chosen_heads_only(minilm):
    full = minilm.run("The cat sat on the mat", keep=("attentions", "scores"))
    some = minilm.run("The cat sat on the mat", keep=("attentions", "scores"), heads=[2, -1])
    assert some.head_ids == [2, 11] and some.attentions.shape == (6, 2, 8, 8)
    assert max_abs(some.attentions, full.attentions[:, [2, 11]]) <= TOL_ATTENTION
    assert np.array_equal(np.isinf(some.layer(0).scores), np.isinf(full.layer(0).scores[[2, 11]]))
    assert max_abs(some.hidden, full.hidden) <= TOL_HIDDEN
    with pytest.raises(qkv.QkvError, match="head 12 does not exist"):
        minilm.run("x", heads=[12])


def test_sliding_window_option(always_tiled):
    model = qkv.load(MODELS / "mistral").with_config(sliding_window=3)
    ids = reference("mistral")["single_input_ids"]
    tiled = model.forward(ids, attentions=False).logits
    trace = model.run(ids[0], keep=("attentions",))                   # plain, with the window in the mask
    a = trace.attentions
    far = np.tril(np.ones(a.shape[-2:], bool), -3)                   # 3 or more positions back
    assert (a[..., far] == 0).all() and (a[..., ~far & np.tril(np.ones_like(far))] > 0).all()
    assert max_abs(tiled[0], trace.logits) <= TOL_HIDDEN
    unwindowed = qkv.load(MODELS / "mistral").forward(ids, attentions=False).logits
    assert max_abs(tiled, unwindowed) > 1e-3                         # the window changes the answer
