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

import zlib

import numpy as np
import pytest
import torch
from live_helpers import INIT_RANGE, TOL_ATTENTION, TOL_HIDDEN, decoder_positions, padded_batch, perturb_, save
from transformers import FalconH1Config, FalconH1ForCausalLM

import qkv
from qkv.core.mamba2 import implied_attention, mixer_parts
from qkv.core.stack import transformer
from qkv.core.trace import Recorder

pytestmark = pytest.mark.live

NEW = 8
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


def build(config, seed: int) -> FalconH1ForCausalLM:
    torch.manual_seed(seed)
    model = FalconH1ForCausalLM(config)
    perturb_(model, seed + 1)
    return model.float().eval()


def check_batch(model, ours, vocab: int, side: str, seed: int) -> None:
    """A padded batch: every layer's input, the logits and the attention weights at the real positions."""
    ids, mask = padded_batch(vocab, [11, 7, 9], seed, side=side)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True,
                    output_attentions=True, position_ids=torch.from_numpy(decoder_positions(mask)), use_cache=False)
    rec = Recorder(keep=("residual", "attentions"))
    _, logits = transformer(ours.weights, ours.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert np.abs(logits - ref.logits.numpy())[real].max() < TOL_HIDDEN
    for layer in range(ours.config.n_layers):
        assert np.abs(rec.store[layer]["residual"] - ref.hidden_states[layer].numpy())[real].max() < TOL_HIDDEN
        for b in range(len(ids)):
            got, want = rec.store[layer]["attentions"][b][:, real[b]], ref.attentions[layer][b].numpy()[:, real[b]]
            assert np.abs(got - want).max() < TOL_ATTENTION, (side, layer, b)


def check_identity(path) -> None:
    """Each layer's mixer: its implied attention applied to the scan's input is the scan's output, float64."""
    ours64 = qkv.load(path, dtype=np.float64)
    ids = padded_batch(ours64.config.vocab_size, [13], 5)[0]
    trace = ours64.run(ids[0].tolist(), keep=("attn_in",))
    for layer in range(ours64.config.n_layers):
        f = mixer_parts(trace.layer(layer).attn_in[None], ours64.weights.blocks[layer].mixer, ours64.config.mamba,
                        ours64.config.activation)
        y = np.einsum("bhts,bshp->bthp", implied_attention(f.dt, f.A, f.Bm, f.Cm), f.x)
        assert np.abs(y - f.y).max() < 1e-9


@pytest.mark.parametrize("config", CASES)
def test_falcon_h1(config, tmp_path, request):
    seed = zlib.crc32(request.node.callspec.id.encode()) % 10_000
    model = build(config, seed)
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
    check_identity(tmp_path / "hf")
    prompt = padded_batch(config.vocab_size, [9], seed + 5)[0]
    back = FalconH1ForCausalLM.from_pretrained(ours.save(tmp_path / "ours")).eval()
    with torch.no_grad():
        a = back(input_ids=torch.from_numpy(prompt)).logits.numpy()
        b = model(input_ids=torch.from_numpy(prompt)).logits.numpy()
    assert np.abs(a - b).max() < 1e-5


def test_a_time_step_limit_clamps_delta(tmp_path):
    """time_step_limit (0.02, 0.3): the full passes equal transformers' (its one-token step does not clamp, so cached
    writing is not compared)."""
    model = build(falcon_h1(time_step_limit=(0.02, 0.3), **MULTIPLIERS), 51)
    save(model, tmp_path)
    ours = qkv.load(tmp_path)
    assert (ours.config.mamba.dt_min, ours.config.mamba.dt_max) == (0.02, 0.3)
    for side in ("right", "left"):
        check_batch(model, ours, 211, side, 52)
