"""The logit lens against transformers (make test-live).

transformers' `output_hidden_states=True` gives L+1 states: [0] the embeddings, [l] the output
of block l, and [L] the last block's output *after* the final norm. Read through the model's
final norm (all but [L], which already had it) and its lm_head, row l must equal qkv's
`logit_lens` row l, within 1e-4 max-abs on the GPT-2 and Llama fixtures and 1e-3 on SmolLM2
(its logits are ~40 in size, as in tests/test_smollm2.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import qkv
from conftest import MODELS
from live_helpers import max_abs
from qkv.analysis import logit_lens
from qkv.checkpoints import smollm2_file

pytestmark = pytest.mark.live


def reference_lens(reference, ids: np.ndarray) -> np.ndarray:
    """(L+1, n, V): transformers' hidden states through its final norm and lm_head."""
    final_norm = reference.model.norm if hasattr(reference, "model") else reference.transformer.ln_f
    with torch.no_grad():
        states = reference(torch.as_tensor(ids[None]), output_hidden_states=True).hidden_states
        rows = [final_norm(h) for h in states[:-1]] + [states[-1]]           # the last is normed already
        return torch.cat([reference.lm_head(r) for r in rows]).numpy()


def eager(path, **kwargs):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager", **kwargs)
    return model.eval()


@pytest.mark.parametrize("name, tol", [("gpt2", 1e-4), ("llama_gqa", 1e-4), ("qwen2", 1e-4)])
def test_fixture_lens_equals_transformers(name, tol):
    model = qkv.load(MODELS / name)
    ids = np.random.default_rng(3).integers(0, model.config.vocab_size, 9)
    ours = logit_lens(model, ids.tolist())
    theirs = reference_lens(eager(MODELS / name), ids)
    error = max_abs(ours, theirs)
    print(f"{name}: logit lens {error:.2e}")
    assert error <= tol


def test_smollm2_lens_equals_transformers():
    path = smollm2_file()
    model = qkv.load("smollm2")
    ids, _ = model.encode("When Mary and John went to the store, John gave a drink to")
    ours = logit_lens(model, ids)
    theirs = reference_lens(eager(path.parent, gguf_file=path.name), ids)
    per_layer = np.abs(ours.astype(np.float64) - theirs).max(axis=(1, 2))
    print("smollm2: logit lens per layer " + " ".join(f"{e:.1e}" for e in per_layer))
    assert per_layer.max() <= 1e-3
