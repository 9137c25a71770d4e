"""The TopK SAE's hand-written backward against live torch autograd (make test-live), on random shapes
beyond the committed fixtures: the loss with AuxK, some or all latents dead, b_dec applied or not; float64
within 1e-10 relative, float32 against the same float64 reference within 1e-5 (the fixture script's
`torch_loss` is the reference)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch  # module-level: without the reference stack these tests fail, never skip

from qkv.features.sae import SAEConfig, loss_and_grads

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_sae_fixtures import torch_loss  # noqa: E402

pytestmark = pytest.mark.live
NAMES = ("W_enc", "b_enc", "W_dec", "b_dec")

# (B, d_in, d_sae, k, k_aux, apply_b_dec_to_input, dead fraction, aux_coef)
SHAPES = [
    (64, 24, 96, 8, 12, True, 0.3, 1 / 32),
    (7, 5, 200, 1, 100, True, 0.9, 1 / 32),
    (33, 40, 80, 16, 20, False, 0.5, 0.25),
    (128, 16, 64, 64, 8, True, 1.0, 1 / 32),
    (50, 32, 256, 32, 16, True, 0.05, 1.0),
]


@pytest.mark.parametrize("case", range(len(SHAPES)))
def test_the_backward_equals_torch_autograd(case):
    B, d, n, k, k_aux, apply_b, dead_frac, coef = SHAPES[case]
    rng = np.random.default_rng(100 + case)
    x = rng.standard_normal((B, d)) * 3 - 1
    W_dec = rng.standard_normal((n, d))
    W_dec /= np.linalg.norm(W_dec, axis=1, keepdims=True)
    params = {"W_enc": W_dec.T + 0.5 * rng.standard_normal((d, n)), "b_enc": 0.2 * rng.standard_normal(n),
              "W_dec": W_dec, "b_dec": rng.standard_normal(d)}
    dead = rng.random(n) < dead_frac
    v = float(rng.uniform(0.1, 10))
    ref = [torch.tensor(params[name], requires_grad=True) for name in NAMES]
    loss = torch_loss(torch.tensor(x), *ref, torch.tensor(dead), k, k_aux, float(apply_b), coef, v)
    loss.backward()
    cfg = SAEConfig(d, n, k, apply_b_dec_to_input=apply_b)
    for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-5)):
        st = loss_and_grads({name: p.astype(dtype) for name, p in params.items()}, cfg, x.astype(dtype),
                            variance=v, dead=dead, k_aux=k_aux, aux_coef=coef)
        assert abs(st.loss - loss.item()) <= tol * abs(loss.item())
        for name, p in zip(NAMES, ref):
            want = p.grad.numpy()
            err = np.abs(st.grads[name].astype(np.float64) - want).max() / np.abs(want).max()
            assert err <= tol, (dtype, name, err)
