"""Attention rollout (Abnar & Zuidema 2020): Â_l = ½·mean_h A_l + ½·I with rows renormalised,
R_1 = Â_1, R_l = Â_l·R_{l−1}. Checked: rows sum to 1 (1e-12), equal to a hand-written loop
over a random trace (1e-12), a decoder's rollout stays lower-triangular (exactly 0 above the
diagonal), on MiniLM (encoder) and SmolLM2 (decoder)."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv.analysis import attention_rollout
from qkv.runtime.errors import QkvError
from qkv.core.trace import LayerTrace, Trace

TOL = 1e-12


def random_trace(L: int = 3, H: int = 2, n: int = 5, causal: bool = False, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    S = rng.normal(size=(L, H, n, n)) * 2
    if causal:
        S = np.where(np.tril(np.ones((n, n), bool)), S, -np.inf)
    A = np.exp(S - S.max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)                                             # (L, H, n, n)
    return Trace(tokens=[f"t{i}" for i in range(n)], ids=np.arange(n), hidden=None, logits=None,
                 layers={l: LayerTrace(l, attentions=A[l]) for l in range(L)}, causal=causal)


def by_hand(A: np.ndarray) -> np.ndarray:
    """The paper's recipe, one loop per index."""
    L, H, n, _ = A.shape
    R = np.zeros((L, n, n))
    previous = None
    for l in range(L):
        Ahat = np.zeros((n, n))
        for i in range(n):
            for j in range(n):
                Ahat[i, j] = 0.5 * sum(A[l, h, i, j] for h in range(H)) / H + 0.5 * (i == j)
            Ahat[i] /= Ahat[i].sum()
        if previous is None:
            R[l] = Ahat
        else:
            for i in range(n):
                for j in range(n):
                    R[l, i, j] = sum(Ahat[i, k] * previous[k, j] for k in range(n))
        previous = R[l]
    return R


@pytest.mark.parametrize("causal", [False, True])
def test_equals_the_hand_written_loop(causal):
    trace = random_trace(causal=causal, seed=int(causal))
    R = attention_rollout(trace)
    assert R.shape == (3, 5, 5)
    assert np.abs(R - by_hand(trace.attentions)).max() <= TOL
    assert np.abs(R.sum(-1) - 1).max() <= TOL


def test_the_first_layer_is_half_attention_half_identity():
    trace = random_trace(L=1)
    assert np.abs(attention_rollout(trace)[0] - (0.5 * trace.attentions[0].mean(0) + 0.5 * np.eye(5))).max() <= TOL


def test_an_encoder(minilm):
    trace = minilm.run("The cat sat on the mat because it was tired.", keep=("attentions",))
    R = attention_rollout(trace)
    n = len(trace.tokens)
    assert R.shape == (minilm.config.n_layers, n, n)
    assert np.abs(R.sum(-1) - 1).max() <= 1e-6 and (R >= 0).all()
    assert np.triu(R, 1).max() > 1e-3                                         # an encoder looks both ways


def test_a_decoder_stays_lower_triangular():
    model = qkv.load("smollm2")
    trace = model.run("The capital of France is Paris, and the capital of Italy is", keep=("attentions",))
    R = attention_rollout(trace)
    assert R.shape == (30, len(trace.tokens), len(trace.tokens))
    assert np.abs(R.sum(-1) - 1).max() <= 1e-6
    assert np.array_equal(np.triu(R, 1), np.zeros_like(R))
    assert R[:, 0, 0] == pytest.approx(1.0)                                    # the first token sees only itself


@pytest.mark.parametrize("run, message", [
    (dict(layers=[1, 2]), "every layer from 0"),
    (dict(heads=[0]), "every head"),
    (dict(keep=("q",)), "attention weights"),
])
def test_a_trace_that_lacks_something_says_so(minilm, run, message):
    with pytest.raises(QkvError, match=message):
        attention_rollout(minilm.run("A short text.", **{"keep": ("attentions",), **run}))
