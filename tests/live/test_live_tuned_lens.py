"""The tuned lens's hand-written gradient against torch autograd (make test-live).

transformers' hidden states [l] (l < L) of a fixture in float64, translated h + h·A_l + b_l, read through the
model's own final norm (its weights, computed in float64: `final_norm`) and lm_head (Gemma 2: its final soft cap),
KL(final ‖ lens) averaged over positions and differentiated by autograd: qkv.analysis.tuned_lens.layer_loss on the
same rows must give the same loss and the same dA_l, db_l, within 1e-9 relative (max |a − b| / max |b|) in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import qkv
from conftest import MODELS
from qkv.analysis import tuned_lens as tl

pytestmark = pytest.mark.live

TEXT = "The cat sat on the mat, and then the dog"


def final_norm(ref, h: torch.Tensor) -> torch.Tensor:
    """The model's final norm with its own weights, in h's float64: transformers' RMSNorm modules compute in
    float32 (`hidden_states.to(torch.float32)`), which would make the reference, not qkv, the less exact side."""
    norm = ref.model.norm if hasattr(ref, "model") else ref.transformer.ln_f
    if isinstance(norm, torch.nn.LayerNorm):
        return norm(h)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    gain = 1 + norm.weight if "Gemma" in type(norm).__name__ else norm.weight     # Gemma: x̂·(1 + w)
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * gain


def rel(a, b) -> float:
    b = np.asarray(b, np.float64)
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


@pytest.mark.parametrize("family", ["llama_gqa", "gpt2", "gemma2", "qwen2"])
def test_gradient_equals_torch_autograd(family):
    path = MODELS / family
    model = qkv.load(path, dtype=np.float64)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation="eager").eval()
    ids, _ = model.encode(TEXT)
    with torch.no_grad():
        out = ref(torch.as_tensor(np.asarray(ids)[None]), output_hidden_states=True)
    cap = getattr(ref.config, "final_logit_softcapping", None)
    log_p = torch.log_softmax(out.logits[0], dim=-1)                       # (n, V) the model's own
    rng = np.random.default_rng(0)
    lens = tl.identity_lens(model, np.float64)
    lens.A[:] = rng.normal(0, 0.05, lens.A.shape)
    lens.b[:] = rng.normal(0, 0.05, lens.b.shape)
    for layer in range(model.config.n_layers):
        h = out.hidden_states[layer][0]                                    # (n, d)
        A = torch.tensor(lens.A[layer], requires_grad=True)
        b = torch.tensor(lens.b[layer], requires_grad=True)
        z = ref.lm_head(final_norm(ref, h + h @ A + b))                    # (n, V)
        if cap:
            z = torch.tanh(z / cap) * cap
        loss = torch.sum(log_p.exp() * (log_p - torch.log_softmax(z, dim=-1)), dim=-1).mean()
        loss.backward()
        got, dA, db = tl.layer_loss(model, lens, layer, h.numpy(), log_p.numpy())
        assert got == pytest.approx(loss.item(), rel=1e-9)
        assert rel(dA, A.grad.numpy()) < 1e-9 and rel(db, b.grad.numpy()) < 1e-9, (family, layer)
