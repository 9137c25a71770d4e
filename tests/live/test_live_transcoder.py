"""The transcoders' hand-written TopK (with AuxK, with W_skip) and JumpReLU (the straight-through threshold
gradient) backwards against live torch autograd (make test-live), float64 within 1e-10 relative."""

from __future__ import annotations

import numpy as np
import pytest
import torch  # module-level: without the reference stack these tests fail, never skip

from qkv.features.transcoder import jumprelu_loss_and_grads, topk_loss_and_grads
from test_transcoder import pair, transcoder

pytestmark = pytest.mark.live


def torch_topk_loss(params, x, y, k, variance, dead, k_aux, aux_coef):
    """The TopK transcoder's loss written plainly in torch (float64)."""
    p = {n: torch.tensor(v, requires_grad=True) for n, v in params.items()}
    X, Y = torch.tensor(x), torch.tensor(y)
    c = 1.0 / (len(x) * variance)
    pre = X @ p["W_enc"] + p["b_enc"]
    idx = torch.topk(pre, k, dim=1).indices
    z = torch.zeros_like(pre).scatter(1, idx, torch.relu(pre.gather(1, idx)))
    y_hat = z @ p["W_dec"] + p["b_dec"] + (X @ p["W_skip"] if "W_skip" in p else 0)
    loss = c * ((Y - y_hat) ** 2).sum()
    if dead is not None and dead.any():
        ka = min(k_aux, int(dead.sum()))
        masked = torch.where(torch.tensor(dead), pre, torch.tensor(-np.inf, dtype=pre.dtype))
        ia = torch.topk(masked, ka, dim=1).indices
        z_aux = torch.zeros_like(pre).scatter(1, ia, torch.relu(pre.gather(1, ia)))
        e = (Y - y_hat).detach()
        loss = loss + c * aux_coef * ((e - z_aux @ p["W_dec"]) ** 2).sum()
    loss.backward()
    return float(loss.detach()), {n: t.grad.numpy() for n, t in p.items()}


@pytest.mark.parametrize("dead_count, skip", [(0, False), (10, False), (3, True), (32, False)])
def test_the_topk_backward_equals_torch_autograd(dead_count, skip):
    """Loss (FVU + AuxK on the FFN's output) and every gradient equal torch autograd's in float64 (≤ 1e-10
    relative): no dead latent, some, fewer than k_aux (with W_skip), all."""
    sae = transcoder(skip=skip)
    x, y = pair()
    dead = np.zeros(32, bool)
    dead[np.random.default_rng(2).permutation(32)[:dead_count]] = True
    st = topk_loss_and_grads(sae.params, sae.config, x, y, variance=1.7, dead=dead, k_aux=5, aux_coef=0.25)
    loss, ref = torch_topk_loss(sae.params, x, y, 4, 1.7, dead, 5, 0.25)
    assert abs(st.loss - loss) <= 1e-10 * loss and (st.aux > 0) == (dead_count > 0)
    assert set(st.grads) == set(ref)
    for name, g in ref.items():
        assert np.abs(st.grads[name] - g).max() <= 1e-10 * np.abs(g).max(), name


def torch_jumprelu_loss(params, x, y, variance, l0_coef, eps):
    """The paper's pseudo-code in torch: JumpReLU and the step as autograd Functions with the rectangle-kernel
    straight-through gradients for θ (and none to pre through the jump)."""

    def kernel(pre, theta):
        u = (pre - theta) / eps
        return ((u > -0.5) & (u < 0.5)).to(pre.dtype)

    class JumpReLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, pre, theta):
            ctx.save_for_backward(pre, theta)
            return pre * (pre > theta).to(pre.dtype)

        @staticmethod
        def backward(ctx, g):
            pre, theta = ctx.saved_tensors
            return (pre > theta).to(pre.dtype) * g, (-(theta / eps) * kernel(pre, theta) * g).sum(0)

    class Step(torch.autograd.Function):
        @staticmethod
        def forward(ctx, pre, theta):
            ctx.save_for_backward(pre, theta)
            return (pre > theta).to(pre.dtype)

        @staticmethod
        def backward(ctx, g):
            pre, theta = ctx.saved_tensors
            return torch.zeros_like(pre), (-(1.0 / eps) * kernel(pre, theta) * g).sum(0)

    p = {n: torch.tensor(v, requires_grad=True) for n, v in params.items()}
    X, Y = torch.tensor(x), torch.tensor(y)
    pre = X @ p["W_enc"] + p["b_enc"]
    y_hat = JumpReLU.apply(pre, p["threshold"]) @ p["W_dec"] + p["b_dec"] + (X @ p["W_skip"] if "W_skip" in p else 0)
    loss = ((Y - y_hat) ** 2).sum() / (len(x) * variance) + l0_coef * Step.apply(pre, p["threshold"]).sum(1).mean()
    loss.backward()
    return float(loss.detach()), {n: t.grad.numpy() for n, t in p.items()}


@pytest.mark.parametrize("skip", [False, True])
def test_the_jumprelu_backward_equals_torch_autograd(skip):
    """FVU + λ·L0 and its gradients, θ's by the straight-through estimators, equal the paper's pseudo-code run by
    torch autograd (float64, ≤ 1e-10); ε wide enough that many pre-activations fall in the kernel, so θ's
    gradient is far from 0 and a missing term would show."""
    sae = transcoder("jumprelu", skip=skip)
    x, y = pair(B=32)
    st = jumprelu_loss_and_grads(sae.params, sae.config, x, y, variance=1.3, l0_coef=0.05, bandwidth=0.4)
    loss, ref = torch_jumprelu_loss(sae.params, x, y, 1.3, 0.05, 0.4)
    assert abs(st.loss - loss) <= 1e-10 * loss
    assert np.count_nonzero(ref["threshold"]) > 10
    for name, g in ref.items():
        assert np.abs(st.grads[name] - g).max() <= 1e-10 * np.abs(g).max(), name
    without = jumprelu_loss_and_grads(sae.params, sae.config, x, y, variance=1.3, l0_coef=0.0, bandwidth=0.4)
    assert np.abs(without.grads["threshold"] - ref["threshold"]).max() > 1e-3 * np.abs(ref["threshold"]).max()
