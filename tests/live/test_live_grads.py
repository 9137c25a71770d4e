"""qkv.train.gradients against live torch autograd, on random checkpoints of every decoder family
(the shapes of test_live_reference: GPT-2 tied/untied with tanh and erf GELU, Llama MHA/GQA/MQA with
RoPE scaling and attention biases, Qwen2, Mistral with a window that cuts), each on a right-padded batch.

The loss is transformers' with labels = input_ids and padding labelled −100. Tolerances (issue 12):
loss within 1e-5; each tensor's gradient within 1e-4 relative error ‖g − g_ref‖ / ‖g_ref‖, float32.
"""

from __future__ import annotations

import copy
import zlib

import numpy as np
import pytest
import torch
from transformers import GPT2LMHeadModel, GPTNeoXForCausalLM, PhiForCausalLM

import qkv
from qkv.train import gradients

from live_helpers import build, padded_batch, save
from test_live_families import CASES as NEOX_CASES, PHI_CASES
from test_live_reference import DECODER_CASES, GPT2_CASES, decoder_config, gpt2_config


FAMILY_CASES = ([pytest.param(GPTNeoXForCausalLM, *c.values, id=c.id) for c in NEOX_CASES]
                + [pytest.param(PhiForCausalLM, *c.values, id=c.id) for c in PHI_CASES])


def autograd(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    model.zero_grad()
    labels = torch.tensor(ids).masked_fill(torch.tensor(mask) == 0, -100)
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), labels=labels, use_cache=False)
    out.loss.backward()
    return out.loss.item(), {k: p.grad.numpy().copy() for k, p in model.named_parameters()}


# transformers 5 names GPT-NeoX's head lm_head in memory but writes it as embed_out (the checkpoint's name,
# which qkv's gradients use)
IN_FILE = {"lm_head.weight": "embed_out.weight"}


def check(model: torch.nn.Module, directory, ids: np.ndarray, mask: np.ndarray) -> None:
    save(model, directory)
    loss_ref, ref = autograd(model, ids, mask)
    if isinstance(model, GPTNeoXForCausalLM):
        ref = {IN_FILE.get(k, k): g for k, g in ref.items()}
    loss, grads = gradients(qkv.load(directory), ids, mask)
    assert abs(loss - loss_ref) < 1e-5, (loss, loss_ref)
    assert set(grads) == set(ref)
    worst = max((np.linalg.norm(grads[k] - g) / np.linalg.norm(g), k) for k, g in ref.items())
    assert worst[0] < 1e-4, f"{worst[1]}: relative error {worst[0]:.2e}"


@pytest.mark.parametrize("case", GPT2_CASES)
def test_gpt2(case, tmp_path):
    cfg = gpt2_config(case["d"], case["heads"], case.get("layers", 2), case["act"], case.get("inner"),
                      case["tied"], case.get("eps", 1e-5))
    model = build(GPT2LMHeadModel, cfg, seed=200 + case["d"])
    ids, mask = padded_batch(cfg.vocab_size, [11, 7, 2], seed=3)
    check(model, tmp_path, ids, mask)


@pytest.mark.parametrize(("cls", "config_cls", "kw", "lengths"), DECODER_CASES)
def test_decoder(cls, config_cls, kw, lengths, tmp_path, request):
    cfg = decoder_config(config_cls, **copy.deepcopy(kw))
    model = build(cls, cfg, seed=zlib.crc32(request.node.callspec.id.encode()) % 10_000)
    ids, mask = padded_batch(cfg.vocab_size, lengths, seed=4)
    check(model, tmp_path, ids, mask)



@pytest.mark.parametrize(("cls", "config"), FAMILY_CASES)
def test_parallel_and_partial_rotary_families(cls, config, tmp_path, request):
    """GPT-NeoX (parallel or sequential residual, partial RoPE) and Phi (one norm for both branches,
    q/k LayerNorm): every gradient equals autograd's."""
    model = build(cls, config, seed=zlib.crc32(request.node.callspec.id.encode()) % 10_000)
    ids, mask = padded_batch(config.vocab_size, [11, 7, 2], seed=5)
    check(model, tmp_path, ids, mask)
