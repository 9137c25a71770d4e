"""Falcon-H1 (issue 47) against live transformers, on random checkpoints of other knob values than the committed
fixture: the mixer's output without a norm, its norm after the gate, mamba_d_ssm null (mamba_expand · hidden_size),
one group of B and C, every bias (attention, FFN, in_proj, out_proj) and none, no conv bias, another activation, a
head_dim of its own, another RoPE base, tied embeddings, chunks longer than the text, other µP multipliers, a
time_step_limit that clamps Δ.

Each case builds a seeded, perturbed FalconH1ForCausalLM, saves it, loads it with qkv and compares a right- and a
left-padded batch (every layer's input, logits within 1e-4 and the attention weights within 1e-5 at the real
positions, positions counted over the real tokens), greedy writing with and without the cache token for token (and a
left-padded batch of prompts), and each mixer's implied attention in float64; a model qkv saves is read back by
transformers with the same logits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import INIT_RANGE, TOL_ATTENTION, case_seed, padded_batch, save
from live_scan import NEW, build_scan, check_mamba2_identity, check_read_back, check_streams
from transformers import FalconH1Config, FalconH1ForCausalLM

import qkv

pytestmark = pytest.mark.live

MULTIPLIERS = dict(embedding_multiplier=1.3, lm_head_multiplier=0.7, mlp_multipliers=[0.8, 1.2], key_multiplier=0.6,
                   attention_in_multiplier=1.1, attention_out_multiplier=0.9, ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.3],
                   ssm_in_multiplier=0.95, ssm_out_multiplier=1.05)


def falcon_h1(d=32, layers=2, heads=4, kv=2, f=24, d_ssm=48, m_heads=6, m_head=8, state=8, groups=2, conv=4, chunk=4,
              vocab=211, **kw):
    return FalconH1Config(
        vocab_size=vocab, hidden_size=d, intermediate_size=f, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, mamba_d_ssm=d_ssm, mamba_n_heads=m_heads, mamba_d_head=m_head, mamba_d_state=state,
        mamba_n_groups=groups, mamba_d_conv=conv, mamba_chunk_size=chunk, initializer_range=INIT_RANGE, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, max_position_embeddings=128, attn_implementation="eager", **kw)


CASES = [
    pytest.param(falcon_h1(mamba_rms_norm=True, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
                           rope_parameters={"rope_type": "default", "rope_theta": 500.0}, **MULTIPLIERS),
                 id="norm-before-gate-biases-tied-rope500"),
    pytest.param(falcon_h1(d=24, heads=2, kv=1, d_ssm=None, mamba_expand=2, m_heads=4, m_head=12, groups=1,
                           head_dim=16, hidden_act="gelu", **MULTIPLIERS), id="no-norm-expand-one-group-head-dim-gelu"),
    pytest.param(falcon_h1(layers=1, mamba_rms_norm=True, mamba_norm_before_gate=False, mamba_proj_bias=True,
                           projectors_bias=True, mamba_conv_bias=False, chunk=64, m_heads=8, m_head=6,
                           rms_norm_eps=1e-6), id="norm-after-gate-proj-biases-no-conv-bias-chunk64"),
]


def check_batch(model, ours, vocab: int, side: str, seed: int) -> None:
    """A padded batch: every layer's input, the logits and the attention weights at the real positions."""
    ref, rec, real = check_streams(model, ours, vocab, side, seed, positions=True, attentions=True)
    for layer in range(ours.config.n_layers):
        for b in range(len(real)):
            got, want = rec.store[layer]["attentions"][b][:, real[b]], ref.attentions[layer][b].numpy()[:, real[b]]
            assert np.abs(got - want).max() < TOL_ATTENTION, (side, layer, b)


@pytest.mark.parametrize("config", CASES)
def test_falcon_h1(config, tmp_path, request):
    seed = case_seed(request)
    model = build_scan(FalconH1ForCausalLM, config, seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    for side in ("right", "left"):
        check_batch(model, ours, config.vocab_size, side, seed + 2)
    for lengths, side in (([9], "right"), ([9, 6], "left")):      # one prompt; a left-padded batch written together
        ids, mask = padded_batch(config.vocab_size, lengths, seed + 3, side=side)
        with torch.no_grad():
            want = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW,
                                  do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
        for cached in (True, False):
            got = ours.generate(ids, max_new_tokens=NEW, attention_mask=mask, stop_at_eos=False, use_cache=cached)
            assert np.array_equal(got, want), (lengths, cached)
    check_mamba2_identity(tmp_path / "hf")
    prompt = padded_batch(config.vocab_size, [9], seed + 5)[0]
    check_read_back(FalconH1ForCausalLM, model, ours, prompt, tmp_path / "ours")   # what qkv saves, transformers reads


def test_a_time_step_limit_clamps_delta(tmp_path):
    """time_step_limit (0.02, 0.3): the full passes equal transformers' (its one-token step does not clamp, so cached
    writing is not compared)."""
    model = build_scan(FalconH1ForCausalLM, falcon_h1(time_step_limit=(0.02, 0.3), **MULTIPLIERS), 51)
    save(model, tmp_path)
    ours = qkv.load(tmp_path)
    assert (ours.config.mamba.dt_min, ours.config.mamba.dt_max) == (0.02, 0.3)
    for side in ("right", "left"):
        check_batch(model, ours, 211, side, 52)
