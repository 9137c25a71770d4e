"""gpt-oss (issue 47) against live transformers, on random checkpoints of other knob values than the committed
fixture: GptOssConfig's own layer pattern (sliding, full, … by default) or every layer full or its own list, windows
that cut hard (2) or not at all, 2 to 8 experts with top-1 to top-3 (top-1: each token's one weight is 1), clamps
that bite (swiglu_limit 0.3) or not (7.0), swiglu_alpha 1.0 or 1.702, YaRN with and without truncation or no
RoPE scaling, MHA / GQA / MQA, head_dim ≠ d/H, with and without attention biases, tied or untied.

Each case builds a seeded, perturbed model, saves it, loads it with qkv and compares a right- and a left-padded
batch (hidden states and logits within 1e-4, attention weights — which sum to less than 1 by the sinks' share —
within 1e-5), the router's choice against transformers' router logits, greedy generation with and without the KV
cache token for token, a model qkv saves read back by transformers with equal logits, and every gradient (the
sinks', the router bias', the fused experts' and their biases') against torch autograd.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from live_helpers import (INIT_RANGE, build, check_decoder_gradients, check_decoder_live, check_saved_by_qkv_on,
                          max_abs, padded_batch, save)
from test_live_grads import autograd
from transformers import GptOssConfig, GptOssForCausalLM

import qkv

pytestmark = pytest.mark.live

NEW = 8


def gpt_oss(d=48, heads=4, kv=2, layers=3, ff=24, E=4, k=2, window=4, types=None, rope=None, tied=False,
            vocab=211, **kw):
    return GptOssConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                        head_dim=kw.pop("head_dim", d // heads), num_hidden_layers=layers, intermediate_size=ff,
                        num_local_experts=E, num_experts_per_tok=k, sliding_window=window, layer_types=types,
                        max_position_embeddings=128, tie_word_embeddings=tied, initializer_range=INIT_RANGE,
                        rope_parameters=rope or {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                                 "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                 "rope_theta": 1e4},
                        pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager", **kw)


CASES = [
    pytest.param(gpt_oss(), id="default-pattern-window4-E4-k2-yarn"),
    pytest.param(gpt_oss(d=64, heads=4, kv=1, head_dim=24, layers=2, E=8, k=3, types=["full_attention"] * 2,
                         swiglu_limit=0.3, swiglu_alpha=1.0, attention_bias=False, tied=True),
                 id="all-full-mqa-dk24-E8-k3-limit0.3-alpha1-nobias-tied"),
    pytest.param(gpt_oss(heads=6, kv=6, head_dim=8, E=2, k=1, window=2, swiglu_limit=1.0,
                         types=["full_attention", "sliding_attention", "sliding_attention"],
                         rope={"rope_type": "default", "rope_theta": 3e4}),
                 id="mha-window2-E2-k1-limit1-no-scaling"),
    pytest.param(gpt_oss(layers=4, window=6, E=4, k=2, rms_norm_eps=1e-6,
                         rope={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16,
                               "beta_fast": 16.0, "beta_slow": 2.0, "truncate": True, "rope_theta": 5e4}),
                 id="L4-window6-yarn8-truncate"),
]


def hf_router(model, ids: np.ndarray) -> list[np.ndarray]:
    """transformers' router logits per layer (n, E) on one sequence: x·W + b, whose top-k it takes."""
    with torch.no_grad():
        out = model(torch.from_numpy(ids), output_router_logits=True)
    return [r.float().numpy() for r in out.router_logits]


@pytest.mark.parametrize("config", CASES)
def test_gpt_oss(config, tmp_path, request):
    label = request.node.callspec.id
    model = build(GptOssForCausalLM, config, seed=zlib.crc32(label.encode()) % 10_000)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    cfg = ours.config
    assert cfg.attn_sinks and cfg.glu_limit == config.swiglu_limit and cfg.glu_alpha == config.swiglu_alpha
    assert [cfg.window(i) for i in range(config.num_hidden_layers)] == [
        config.sliding_window if t == "sliding_attention" else None for t in config.layer_types]
    check_decoder_live(model, ours, config.vocab_size, label, NEW)
    prompt = padded_batch(config.vocab_size, [9], seed=12, low=3)[0]
    trace = ours.run(prompt[0], keep=("router", "experts", "expert_weights"))
    for layer, logits in enumerate(hf_router(model, prompt)):
        top = np.argsort(-logits, -1, kind="stable")[:, :config.num_experts_per_tok]
        assert np.array_equal(np.sort(trace.layer(layer).experts, -1), np.sort(top, -1)), layer
        e = np.exp(np.take_along_axis(logits, top, -1) - logits.max(-1, keepdims=True))
        assert max_abs(np.sort(trace.layer(layer).expert_weights, -1), np.sort(e / e.sum(-1, keepdims=True), -1)) < 1e-5
    check_saved_by_qkv_on(GptOssForCausalLM, model, ours, prompt, tmp_path / "qkv")   # a model qkv saves, read back
    check_decoder_gradients(model, ours, autograd)
