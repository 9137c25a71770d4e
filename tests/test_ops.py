"""ops: each function against its formula computed plainly in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from qkv.core import ops

finite = st.floats(-50, 50, allow_nan=False, width=32)


@given(arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 9)), elements=finite))
@settings(max_examples=60, deadline=None)
def test_softmax_is_exp_over_sum(x):
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    want = e / e.sum(axis=-1, keepdims=True)
    for got in (ops.softmax(x), ops.softmax_(x.copy())):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-6)
        np.testing.assert_allclose(got.sum(axis=-1), 1.0, atol=1e-5)


def test_softmax_survives_huge_scores_and_masked_rows():
    x = np.array([[1000.0, 999.0, -np.inf], [-np.inf, -np.inf, -np.inf]], dtype=np.float32)
    for got in (ops.softmax(x), ops.softmax_(x.copy())):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got[0], [1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1)), 0], atol=1e-6)
        assert (got[1] == 0).all()                     # fully masked row: zeros, not NaN


def test_softmax_saturates_without_scaling():
    """The guide's example: softmax([100, 1, 1]) ≈ [1, 0, 0]; scaled by 10 it spreads out."""
    sharp = ops.softmax(np.array([100.0, 1.0, 1.0], dtype=np.float32))
    soft = ops.softmax(np.array([10.0, 0.1, 0.1], dtype=np.float32))
    assert sharp[0] > 0.999999 and soft[0] < 0.9999


def test_layer_norm_and_rms_norm():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32) * 3 + 1
    g, b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    x64 = x.astype(np.float64)
    mu, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    np.testing.assert_allclose(ops.layer_norm(x, g, b, 1e-5), (x64 - mu) / np.sqrt(var + 1e-5) * g + b, atol=1e-5)
    rms = np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(ops.rms_norm(x, g, 1e-6), x64 / rms * g, atol=1e-5)
    assert ops.layer_norm(x, g, None, 1e-5).dtype == np.float32


def test_erf_float32_is_accurate_everywhere():
    x = np.linspace(-8, 8, 20001, dtype=np.float32)
    want = np.array([math.erf(float(v)) for v in x])
    assert np.max(np.abs(ops.erf(x) - want)) < 5e-7
    x64 = np.linspace(-3, 3, 7)
    assert np.array_equal(ops.erf(x64), [math.erf(v) for v in x64])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activations(dtype):
    x = np.linspace(-12, 12, 1001).astype(dtype)
    xs = [float(v) for v in x]
    gelu = [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in xs]
    tanh = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in xs]
    silu = [v / (1 + math.exp(-v)) for v in xs]
    tol = 2e-6 if dtype == np.float32 else 1e-12
    for fn, want in ((ops.gelu, gelu), (ops.gelu_tanh, tanh), (ops.silu, silu), (ops.relu, np.maximum(xs, 0))):
        got = fn(x.copy())
        assert got.dtype == dtype, fn.__name__
        np.testing.assert_allclose(got, want, atol=tol * 10, rtol=tol)


def test_silu_of_very_negative_input_is_quiet_and_zero():
    with np.errstate(all="raise"):
        assert ops.silu(np.array([-1000.0], dtype=np.float32))[0] == 0


def test_entropy_is_minus_sum_p_log_p():
    p = np.array([[0.5, 0.25, 0.25, 0.0], [1.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    want = [-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)), 0.0]     # 0·log 0 = 0
    np.testing.assert_allclose(ops.entropy(p), want, rtol=1e-12, atol=0)
    np.testing.assert_allclose(ops.entropy(p, bits=True), [1.5, 0.0], rtol=1e-12, atol=0)
    assert ops.entropy(p).dtype == np.float64 and not np.signbit(ops.entropy(p)[1])
