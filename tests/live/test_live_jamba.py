"""Jamba (issue 47) against live transformers, on random checkpoints of other knob values than the committed fixture:
other layouts of attention and Mamba layers (none, every one, every third), of routed FFNs (none: num_experts 1, every
layer, top-1, top-all), GQA / MHA, head_dim ≠ hidden / heads, the Mamba sizes (state, expand, conv taps, Δ's rank),
in/out biases, no conv bias, a GELU conv and FFN, tied or untied, another ε.

Each case builds a seeded, perturbed JambaForCausalLM, saves it, loads it with qkv and compares a right- and a
left-padded batch (the stream entering every layer, final hidden states and logits within 1e-4, the attention layers'
weights within 1e-5, at the real positions), greedy writing with and without the hybrid cache token for token (and a
left-padded batch of prompts), and each Mamba layer's implied attention's identity in float64; a model qkv saves is
read back by transformers with the same logits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import INIT_RANGE, TOL_ATTENTION, TOL_HIDDEN, case_seed, padded_batch, save
from live_scan import build_scan, check_read_back, check_writing
from transformers import JambaConfig, JambaForCausalLM

import qkv
from qkv.core.mamba import hidden_attention, mixer_parts
from qkv.core.stack import transformer
from qkv.core.trace import Recorder

pytestmark = pytest.mark.live

def jamba(d=32, layers=4, heads=4, kv=2, ff=40, experts=4, k=2, attn=(2, 1), expert=(2, 1), state=8, expand=2, conv=4,
          rank="auto", proj_bias=False, conv_bias=True, act="silu", tied=False, vocab=211, **kw):
    return JambaConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv, intermediate_size=ff, num_experts=experts, num_experts_per_tok=k,
                       attn_layer_period=attn[0], attn_layer_offset=attn[1], expert_layer_period=expert[0],
                       expert_layer_offset=expert[1], mamba_d_state=state, mamba_expand=expand, mamba_d_conv=conv,
                       mamba_dt_rank=rank, mamba_proj_bias=proj_bias, mamba_conv_bias=conv_bias, hidden_act=act,
                       tie_word_embeddings=tied, initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1,
                       eos_token_id=2, max_position_embeddings=256, attn_implementation="eager", **kw)


CASES = [
    pytest.param(jamba(), id="jamba-like-gqa-untied"),
    pytest.param(jamba(layers=3, attn=(4, 3), experts=1, state=4, expand=3, conv=2, rank=3, proj_bias=True,
                       conv_bias=False, tied=True, rms_norm_eps=1e-5), id="no-attention-dense-biases-tied"),
    pytest.param(jamba(layers=2, attn=(1, 0), expert=(1, 0), experts=3, k=1, head_dim=12, kv=4, act="gelu"),
                 id="every-layer-attention-routed-top1-head12-gelu"),
    pytest.param(jamba(d=24, layers=5, heads=6, kv=3, attn=(3, 0), expert=(3, 2), experts=3, k=3, state=16, conv=5,
                       rank=1), id="attention-every-third-top-all-state16"),
]


def check_batch(model, ours, vocab: int, side: str, seed: int) -> None:
    """A padded batch: the stream entering every layer, the final hidden states, the logits and the attention layers'
    weights at the real positions."""
    ids, mask = padded_batch(vocab, [11, 7, 9], seed, side=side)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True,
                    output_attentions=True, use_cache=False)
    rec = Recorder(keep=("residual", "attentions"))
    hidden, logits = transformer(ours.weights, ours.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert np.abs(logits - ref.logits.numpy())[real].max() < TOL_HIDDEN
    assert np.abs(hidden - ref.hidden_states[-1].numpy())[real].max() < TOL_HIDDEN
    for layer in range(ours.config.n_layers):
        got = rec.store[layer]["residual"]
        assert np.abs(got - ref.hidden_states[layer].numpy())[real].max() < TOL_HIDDEN, (side, layer)
    attention = [i for i, kind in enumerate(ours.config.layer_kinds) if kind == "attention"]
    assert len(ref.attentions) == len(attention)
    for want, layer in zip(ref.attentions, attention):
        for b in range(len(ids)):
            got = rec.store[layer]["attentions"][b][:, real[b]][:, :, real[b]]
            assert np.abs(got - want[b].numpy()[:, real[b]][:, :, real[b]]).max() < TOL_ATTENTION, (side, layer, b)


@pytest.mark.parametrize("config", CASES)
def test_jamba(config, tmp_path, request):
    seed = case_seed(request)
    model = build_scan(JambaForCausalLM, config, seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    assert list(ours.config.layer_kinds) == config.layers_block_type
    assert [ours.config.moe_layer(i) for i in range(config.num_hidden_layers)] == [
        n > 1 for n in config.layers_num_experts]
    for side in ("right", "left"):
        check_batch(model, ours, config.vocab_size, side, seed + 2)
    # one prompt and a left-padded batch of them, transformers writing with its cache (without it when the model has
    # no attention layer: transformers' hybrid cache then cannot measure its masks, `get_mask_sizes`)
    prompt = check_writing(model, ours, config.vocab_size, seed + 3, cached="attention" in config.layers_block_type)
    # each Mamba layer's implied attention reproduces every channel's scan, float64
    ours64 = qkv.load(tmp_path / "hf", dtype=np.float64)
    trace = ours64.run(prompt[0].tolist(), keep=("attn_in",))
    for layer, kind in enumerate(ours64.config.layer_kinds):
        if kind == "mamba":
            f = mixer_parts(trace.layer(layer).attn_in[None], ours64.weights.blocks[layer].mixer, ours64.config)
            y = np.einsum("bcts,bsc->btc", hidden_attention(f.dt, f.A, f.Bm, f.Cm), f.x)
            assert np.abs(y - f.y).max() < 1e-9
    check_read_back(JambaForCausalLM, model, ours, prompt, tmp_path / "ours", use_cache=False)   # qkv's save, read
