"""qkv.train.optim without torch: AdamW against the formula written out in float64, resume bit for
bit from a state_dict, clip_grad_norm, the warm-up + cosine schedule, and bad settings.
(tests/live/test_live_train_optim.py checks the same against torch and transformers.)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from safetensors.numpy import load as st_load, save as st_save

from qkv.runtime.errors import QkvError
from qkv.train.optim import AdamW, clip_grad_norm, global_norm, lr_at, no_decay_1d

SHAPES = {"wte": (11, 8), "h.0.attn.W": (8, 24), "h.0.attn.b": (24,), "ln_f.weight": (8,), "conv": (2, 3, 4)}
HYPER = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def make_params(dtype=np.float32, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(dtype) for k, s in SHAPES.items()}


def make_grads(step: int, dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([1, step])
    return {k: (rng.standard_normal(s) * rng.uniform(0.01, 3)).astype(dtype) for k, s in SHAPES.items()}


def reference_adamw(params, grads_seq, lrs, betas, eps, weight_decay, decay):
    """The AdamW formula as the docstring writes it, in float64."""
    b1, b2 = betas
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, (grads, lr) in enumerate(zip(grads_seq, lrs), start=1):
        for k in p:
            g = grads[k].astype(np.float64)
            if decay[k]:
                p[k] = p[k] - lr * weight_decay * p[k]
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            m_hat = m[k] / (1 - b1 ** t)
            v_hat = v[k] / (1 - b2 ** t)
            p[k] = p[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p, m, v


LRS = [3e-2, 1e-2, 0.0, 5e-3, 2e-2, 1e-2, 1e-3, 4e-2]


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_adamw_follows_the_formula(dtype, tol):
    params = make_params(dtype)
    start = {k: v.copy() for k, v in params.items()}
    grads_seq = [make_grads(t, dtype) for t in range(len(LRS))]
    opt = AdamW(params, lr=1e-3, **HYPER)
    assert opt.decay == {"wte": True, "h.0.attn.W": True, "h.0.attn.b": False, "ln_f.weight": False, "conv": True}
    for g, lr in zip(grads_seq, LRS):
        opt.step(g, lr=lr)
    want, m, v = reference_adamw(start, grads_seq, LRS, HYPER["betas"], HYPER["eps"], HYPER["weight_decay"], opt.decay)
    for k in SHAPES:
        assert params[k].dtype == dtype
        scale = np.abs(want[k]).max()
        assert np.abs(params[k] - want[k]).max() <= tol * scale, k
        assert np.abs(opt.m[k] - m[k]).max() <= tol * np.abs(m[k]).max(), k
        assert np.abs(opt.v[k] - v[k]).max() <= tol * np.abs(v[k]).max(), k
    assert opt.step_count == len(LRS)


def test_adamw_updates_in_place_so_views_see_it():
    params = make_params()
    view = params["h.0.attn.W"][:, :8]                  # as W_Q is a view of W_QKV's columns
    ids = {k: id(v) for k, v in params.items()}
    before = view.copy()
    AdamW(params, lr=1e-2).step(make_grads(0))
    assert {k: id(v) for k, v in params.items()} == ids
    assert not np.array_equal(view, before) and np.array_equal(view, params["h.0.attn.W"][:, :8])


def test_weight_decay_is_decoupled_and_skips_1d_by_default():
    """Zero gradients: m = v = 0, so only the decay moves θ: θ·(1 − lr·λ)ᵗ, and 1-D arrays stay."""
    params = make_params(np.float64)
    start = {k: v.copy() for k, v in params.items()}
    opt = AdamW(params, lr=0.1, weight_decay=0.5)
    zeros = {k: np.zeros_like(v) for k, v in params.items()}
    for _ in range(3):
        opt.step(zeros)
    for k in SHAPES:
        factor = 1.0 if start[k].ndim == 1 else (1 - 0.1 * 0.5) ** 3
        np.testing.assert_allclose(params[k], start[k] * factor, rtol=1e-14, atol=0)
    assert no_decay_1d("b", np.zeros(3)) and not no_decay_1d("W", np.zeros((3, 3)))


def test_custom_no_decay_and_zero_weight_decay():
    params = make_params(np.float64)
    start = {k: v.copy() for k, v in params.items()}
    zeros = {k: np.zeros_like(v) for k, v in params.items()}
    AdamW(params, lr=0.1, weight_decay=0.5, no_decay=lambda name, p: name == "wte").step(zeros)
    assert np.array_equal(params["wte"], start["wte"])
    np.testing.assert_allclose(params["h.0.attn.b"], start["h.0.attn.b"] * 0.95, rtol=1e-15)
    params = make_params(np.float64)
    AdamW(params, lr=0.1, weight_decay=0.0).step(zeros)
    assert all(np.array_equal(params[k], start[k]) for k in SHAPES)


def test_resume_from_state_dict_is_bit_for_bit():
    """One run of 10 steps; another stopped after 4, its params and optimizer state saved (through
    safetensors, as a checkpoint would), restored into a new AdamW, continued: equal arrays."""
    grads_seq = [make_grads(t) for t in range(10)]
    lrs = [lr_at(t, lr=1e-2, warmup=3, total=10) for t in range(10)]
    whole = make_params()
    opt = AdamW(whole, lr=1e-2, **HYPER)
    for g, lr in zip(grads_seq, lrs):
        opt.step(g, lr)

    first = make_params()
    opt1 = AdamW(first, lr=1e-2, **HYPER)
    for g, lr in zip(grads_seq[:4], lrs[:4]):
        opt1.step(g, lr)
    saved_params = st_load(st_save(first))
    saved_state = st_load(st_save(opt1.state_dict()))
    opt1.step(grads_seq[4], lrs[4])                     # the interrupted run went on a bit: must not matter

    resumed = {k: v.copy() for k, v in saved_params.items()}
    opt2 = AdamW(resumed, lr=1e-2, **HYPER)
    opt2.load_state_dict(saved_state)
    assert opt2.step_count == 4
    for g, lr in zip(grads_seq[4:], lrs[4:]):
        opt2.step(g, lr)
    for k in SHAPES:
        assert np.array_equal(resumed[k], whole[k]), k
        assert np.array_equal(opt2.m[k], opt.m[k]) and np.array_equal(opt2.v[k], opt.v[k]), k


def test_state_dict_is_a_copy():
    params = make_params()
    opt = AdamW(params)
    opt.step(make_grads(0))
    state = opt.state_dict()
    assert set(state) == {"step"} | {f"{p}.{k}" for k in SHAPES for p in "mv"}
    assert state["step"].dtype == np.int64 and state["step"].tolist() == [1]
    m = state["m.wte"].copy()
    opt.step(make_grads(1))
    assert np.array_equal(state["m.wte"], m)


def _bad(state, key, value=None):
    state = dict(state)
    if value is None:
        del state[key]
    else:
        state[key] = value
    return state


@pytest.mark.parametrize("change, words", [
    (lambda s: _bad(s, "m.wte"), "lacks m.wte"),
    (lambda s: _bad(s, "step"), "lacks step"),
    (lambda s: _bad(s, "m.other", np.zeros(3, np.float32)), "unknown m.other"),
    (lambda s: _bad(s, "v.conv", np.zeros((2, 3), np.float32)), r"v.conv is float32 \(2, 3\)"),
    (lambda s: _bad(s, "v.conv", np.zeros((2, 3, 4), np.float64)), "v.conv is float64"),
    (lambda s: _bad(s, "step", np.array([1.5])), "step must be one integer"),
    (lambda s: _bad(s, "step", np.array([-1])), "step must be one integer"),
    (lambda s: {}, "lacks"),
])
def test_mismatched_state_is_one_line(change, words):
    params = make_params()
    opt = AdamW(params)
    opt.step(make_grads(0))
    state = opt.state_dict()
    m_before = opt.m["wte"].copy()
    fresh = AdamW(make_params())
    with pytest.raises(QkvError, match=words) as e:
        fresh.load_state_dict(change(state))
    assert "\n" not in str(e.value) and "resume from the checkpoint" in str(e.value)
    assert fresh.step_count == 0 and not fresh.m["wte"].any() and np.array_equal(opt.m["wte"], m_before)


def test_step_needs_the_parameters_names_and_shapes():
    opt = AdamW(make_params())
    grads = make_grads(0)
    with pytest.raises(ValueError, match="missing"):
        opt.step({k: v for k, v in grads.items() if k != "wte"})
    with pytest.raises(ValueError, match="shape"):
        opt.step(grads | {"wte": np.zeros((8, 11), np.float32)})


# ── clip_grad_norm ──────────────────────────────────────────────────────────────

def test_clip_scales_down_to_max_norm_and_returns_the_norm_before():
    grads = make_grads(0)
    want = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
    before = {k: v.copy() for k, v in grads.items()}
    assert want > 1.0
    norm = clip_grad_norm(grads, 1.0)
    assert abs(norm - want) <= 1e-6 * want
    coef = 1.0 / (want + 1e-6)
    for k in grads:
        np.testing.assert_allclose(grads[k], before[k] * coef, rtol=1e-6)
    assert abs(global_norm(grads) - 1.0) < 1e-5


def test_clip_leaves_small_gradients_alone():
    grads = make_grads(0)
    before = {k: v.copy() for k, v in grads.items()}
    norm = clip_grad_norm(grads, 1e6)
    assert norm < 1e6 and all(np.array_equal(grads[k], before[k]) for k in grads)


def test_global_norm_of_known_arrays():
    assert global_norm({"a": np.array([3.0, 0.0], np.float32), "b": np.array([[4.0]], np.float32)}) == 5.0


# ── lr_at ───────────────────────────────────────────────────────────────────────

def test_lr_at_key_points():
    kw = dict(lr=1e-3, warmup=100, total=1100)
    assert lr_at(0, **kw) == 0.0
    assert lr_at(50, **kw) == pytest.approx(5e-4, rel=1e-15)
    assert lr_at(100, **kw) == 1e-3                     # the top, after warm-up
    assert lr_at(600, **kw) == pytest.approx(5e-4, rel=1e-12)          # half way down the cosine
    assert lr_at(350, **kw) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 4)), rel=1e-12)
    assert lr_at(1100, **kw) == 0.0
    assert lr_at(5000, **kw) == 0.0                     # past the end it stays down
    values = [lr_at(s, **kw) for s in range(1101)]
    assert all(a <= b for a, b in zip(values[:100], values[1:101]))    # rising, then falling
    assert all(a >= b for a, b in zip(values[100:], values[101:]))


def test_lr_at_with_min_lr_and_without_warmup():
    kw = dict(lr=1e-3, warmup=0, total=1000, min_lr=1e-4)
    assert lr_at(0, **kw) == 1e-3
    assert lr_at(500, **kw) == pytest.approx(5.5e-4, rel=1e-12)
    assert lr_at(1000, **kw) == pytest.approx(1e-4, rel=1e-12)
    assert lr_at(2000, **kw) == pytest.approx(1e-4, rel=1e-12)
    assert lr_at(5, lr=1e-3, warmup=10, total=20, min_lr=1e-4) == pytest.approx(5e-4)   # warm-up from 0


# ── bad settings ────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("kw, words", [
    (dict(lr=0), "lr must be > 0"),
    (dict(lr=-1e-3), "lr must be > 0"),
    (dict(lr=float("nan")), "lr must be a finite number"),
    (dict(lr="fast"), "lr must be a finite number"),
    (dict(betas=(1.0, 0.999)), r"beta1 must be in \[0, 1\)"),
    (dict(betas=(0.9, -0.1)), r"beta2 must be in \[0, 1\)"),
    (dict(betas=(0.9,)), "betas must be two numbers"),
    (dict(eps=0), "eps must be > 0"),
    (dict(weight_decay=-0.1), "weight_decay must be ≥ 0"),
])
def test_bad_adamw_settings(kw, words):
    with pytest.raises(QkvError, match=words) as e:
        AdamW(make_params(), **kw)
    assert "\n" not in str(e.value)


def test_bad_params_and_step_lr():
    with pytest.raises(QkvError, match="at least one parameter"):
        AdamW({})
    with pytest.raises(QkvError, match="must be a float array"):
        AdamW({"ids": np.arange(3)})
    with pytest.raises(QkvError, match="lr must be ≥ 0"):
        AdamW(make_params()).step(make_grads(0), lr=-1.0)


@pytest.mark.parametrize("max_norm", [0, -1.0, float("inf")])
def test_bad_max_norm(max_norm):
    grads = make_grads(0)
    before = {k: v.copy() for k, v in grads.items()}
    with pytest.raises(QkvError, match="max_norm must be") as e:
        clip_grad_norm(grads, max_norm)
    assert "\n" not in str(e.value) and all(np.array_equal(grads[k], before[k]) for k in grads)


@pytest.mark.parametrize("step, kw, words", [
    (0, dict(lr=1e-3, warmup=20, total=10), r"warmup \(20\) is longer than the run"),
    (0, dict(lr=0.0, warmup=0, total=10), "lr must be > 0"),
    (0, dict(lr=1e-3, warmup=-1, total=10), "warmup must be a whole number"),
    (0, dict(lr=1e-3, warmup=0, total=0), "total must be ≥ 1"),
    (-1, dict(lr=1e-3, warmup=0, total=10), "step must be a whole number"),
    (1.5, dict(lr=1e-3, warmup=0, total=10), "step must be a whole number"),
    (0, dict(lr=1e-3, warmup=0, total=10, min_lr=2e-3), r"min_lr must be in \[0, lr"),
])
def test_bad_schedule(step, kw, words):
    with pytest.raises(QkvError, match=words) as e:
        lr_at(step, **kw)
    assert "\n" not in str(e.value)


def test_global_norm_fast_form_equals_the_plain_form():
    rng = np.random.default_rng(5)
    grads = {"big": (rng.standard_normal((700, 300)) * 0.01 + 0.003).astype(np.float32),
             "odd": rng.standard_normal((3, 5, 7)).astype(np.float32), "f64": rng.standard_normal(70_000)}
    plain = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
    assert abs(global_norm(grads) - plain) <= 1e-6 * plain
