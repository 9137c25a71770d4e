"""The next-token distribution against torch and transformers (make test-live): softmax(z / T),
transformers' TemperatureLogitsWarper, Categorical entropy and topk, on SmolLM2's real logits.
Tolerances: float64 against float64, 1e-12 max abs (entropy 1e-9).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import qkv
from qkv.writing.nexttoken import distribution, entropy, next_token_logits, top_tokens

pytestmark = pytest.mark.live

PROMPT = "The capital of France is"
TEMPERATURES = [0.3, 0.5, 1.0, 2.0]
TOL = 1e-12


@pytest.fixture(scope="module")
def z() -> np.ndarray:
    """The logits of the token after PROMPT, (V,) float32."""
    model = qkv.load("smollm2")
    return next_token_logits(model, model.encode(PROMPT)[0])


@pytest.mark.parametrize("T", TEMPERATURES)
def test_distribution_equals_torch_softmax_of_logits_over_T(z, T):
    want = torch.softmax(torch.from_numpy(z).double() / T, dim=-1).numpy()
    got = distribution(z, T)
    assert got.dtype == np.float64 and got.shape == z.shape
    assert np.abs(got - want).max() < TOL and abs(got.sum() - 1) < TOL


@pytest.mark.parametrize("T", TEMPERATURES)
def test_distribution_equals_transformers_temperature_warper(z, T):
    from transformers.generation.logits_process import TemperatureLogitsWarper

    scores = TemperatureLogitsWarper(T)(torch.zeros(1, 1, dtype=torch.long), torch.from_numpy(z).double()[None])
    want = torch.softmax(scores, dim=-1)[0].numpy()
    assert np.abs(distribution(z, T) - want).max() < TOL


@pytest.mark.parametrize("T", [0.5, 1.0, 2.0])
def test_entropy_equals_torch_categorical_in_bits(z, T):
    P = distribution(z, T)
    want = torch.distributions.Categorical(probs=torch.from_numpy(P)).entropy().item() / math.log(2)
    assert abs(float(entropy(P)) - want) < 1e-9
    

def test_top_tokens_equal_torch_topk(z):
    P = distribution(z, 1.0)
    ids, p = top_tokens(P, 10)
    values, indices = torch.topk(torch.from_numpy(P), 10)
    assert ids.tolist() == indices.tolist() and np.allclose(p, values.numpy(), atol=0)
    order = [top_tokens(distribution(z, T), 10)[0].tolist() for T in (0.3, 1, 3)]
    assert order[0] == order[1] == order[2]                                    # T > 0 never reorders
