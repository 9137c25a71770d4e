"""sampling: the draws follow softmax(filter(logits / T)), and the filters keep the right tokens."""

from __future__ import annotations

import numpy as np
import pytest

from qkv.runtime.errors import QkvError
from qkv.writing.sampling import Sampling, check_sampling, distribution, sample, top_k_filter, top_p_filter

# χ² critical values at significance 0.001, by degrees of freedom (tables; no SciPy needed).
CHI2_CRIT_0001 = {2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}

LOGITS = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert (counts[~keep] == 0).all(), "a token with zero probability was drawn"
    return float(np.sum((counts[keep] - expected[keep]) ** 2 / expected[keep]))


@pytest.mark.parametrize("T, k, p", [(1.0, None, None), (0.5, None, None), (2.0, None, None),
                                     (1.0, 3, None), (1.0, None, 0.8), (0.7, 4, 0.9)])
def test_draws_follow_the_distribution(T, k, p):
    probs = distribution(LOGITS[None], T, k, p)[0]
    want = np.exp(LOGITS / T)
    if k is not None:
        want[np.argsort(-LOGITS)[k:]] = 0
    if p is not None:                                       # recompute the nucleus by hand
        order = np.argsort(-want)
        mass = np.cumsum(want[order] / want.sum())
        want[order[np.argmax(mass >= p) + 1:]] = 0
    np.testing.assert_allclose(probs, want / want.sum(), atol=1e-12)
    rng = np.random.default_rng(1234)
    draws = np.concatenate([sample(np.tile(LOGITS, (100, 1)), rng, T, k, p) for _ in range(200)])   # 20 000
    counts = np.bincount(draws, minlength=len(LOGITS))
    dof = int((probs > 0).sum()) - 1
    assert chi_square(counts, probs) < CHI2_CRIT_0001[dof]


def test_a_wrong_distribution_would_be_caught():
    """The χ² check has power: draws at T=1 do not pass for T=0.7."""
    rng = np.random.default_rng(1234)
    draws = np.concatenate([sample(np.tile(LOGITS, (100, 1)), rng, 1.0) for _ in range(200)])
    counts = np.bincount(draws, minlength=len(LOGITS))
    assert chi_square(counts, distribution(LOGITS[None], 0.7)[0]) > CHI2_CRIT_0001[5]


def test_top_k_keeps_exactly_the_k_largest():
    x = np.array([[0.1, 3.0, -2.0, 2.5, 1.0]])
    assert np.isfinite(top_k_filter(x, 2)).tolist() == [[False, True, False, True, False]]
    assert np.isfinite(top_k_filter(x, 10)).all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.array([[0.05, 0.5, 0.1, 0.25, 0.1]])
    x = np.log(probs)
    assert np.isfinite(top_p_filter(x, 0.45)).tolist() == [[False, True, False, False, False]]
    assert np.isfinite(top_p_filter(x, 0.6)).tolist() == [[False, True, False, True, False]]
    assert np.isfinite(top_p_filter(x, 0.8)).sum() == 3          # 0.5 + 0.25 + one 0.1 = 0.85 ≥ 0.8
    assert np.isfinite(top_p_filter(x, 1e-9)).sum() == 1         # the top token always stays
    assert np.isfinite(top_p_filter(x, 1.0)).all()


def test_greedy_settings_take_the_argmax_without_randomness():
    rng = np.random.default_rng(0)
    x = np.array([[0.0, 5.0, 4.9], [9.0, 0.0, 1.0]])
    state = rng.bit_generator.state
    assert sample(x, rng, temperature=0).tolist() == [1, 0]
    assert sample(x, rng, top_k=1).tolist() == [1, 0]
    assert rng.bit_generator.state == state


def test_same_seed_same_draws():
    a = sample(np.tile(LOGITS, (50, 1)), np.random.default_rng(7))
    b = sample(np.tile(LOGITS, (50, 1)), np.random.default_rng(7))
    assert a.tolist() == b.tolist()


@pytest.mark.parametrize("T, k, p, msg", [(-0.1, None, None, "temperature"), (float("nan"), None, None, "temperature"),
                                          (1.0, 0, None, "top_k"), (1.0, 2.5, None, "top_k"),
                                          (1.0, None, 0.0, "top_p"), (1.0, None, 1.5, "top_p")])
def test_bad_settings(T, k, p, msg):
    with pytest.raises(QkvError, match=msg):
        check_sampling(T, k, p)


def test_settings_are_one_value_checked_when_made():
    assert Sampling() == Sampling(temperature=0.0, top_k=None, top_p=None, seed=None, stop_at_eos=True)   # greedy
    base = Sampling(temperature=0.7, top_k=5)
    assert Sampling.of(base, seed=3) == Sampling(temperature=0.7, top_k=5, seed=3)     # the rest kept
    assert Sampling.of(base) is base and Sampling.of(None, top_p=0.9) == Sampling(top_p=0.9)
    with pytest.raises(QkvError, match="top_k"):
        Sampling(top_k=0)
    with pytest.raises(TypeError, match="temprature"):
        Sampling.of(temprature=0)
    rng = Sampling(temperature=1.0, seed=7).rng()
    assert Sampling(temperature=1.0, seed=7).pick(np.tile(LOGITS, (50, 1)), rng).tolist() == \
        sample(np.tile(LOGITS, (50, 1)), np.random.default_rng(7)).tolist()
