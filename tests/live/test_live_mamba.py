"""Mamba (issue 47) against live transformers, on random checkpoints of other knob values than the committed
fixture: the state's size, expand, the conv's taps, Δ's rank, in/out biases, no conv bias, another conv
activation, tied or untied, an original checkpoint's `embedding` name.

Each case builds a seeded, perturbed MambaForCausalLM, saves it, loads it with qkv and compares a right- and a
left-padded batch (every layer's output, final hidden states and logits within 1e-4 at the real positions), greedy
writing with and without the recurrent cache token for token (and a left-padded batch of prompts), and the implied
attention's identity in float64; a model qkv saves is read back by transformers with the same logits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import INIT_RANGE, case_seed, save
from live_scan import build_scan, check_original_embedding_name, check_read_back, check_streams, check_writing
from transformers import MambaConfig, MambaForCausalLM

import qkv
from qkv.core.mamba import hidden_attention, mixer_parts

pytestmark = pytest.mark.live

def mamba(d=32, layers=2, state=8, expand=2, conv=4, rank="auto", bias=False, conv_bias=True, act="silu", tied=True,
          vocab=211, **kw):
    return MambaConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, state_size=state, expand=expand,
                       conv_kernel=conv, time_step_rank=rank, use_bias=bias, use_conv_bias=conv_bias, hidden_act=act,
                       tie_word_embeddings=tied, initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1,
                       eos_token_id=2, **kw)


CASES = [
    pytest.param(mamba(), id="default-like-tied"),
    pytest.param(mamba(d=24, layers=3, state=4, expand=3, conv=2, rank=5, tied=False),
                 id="state4-expand3-conv2-rank5-untied"),
    pytest.param(mamba(d=40, state=16, conv=5, rank=1, bias=True, conv_bias=False, layer_norm_epsilon=1e-6),
                 id="state16-conv5-rank1-biases-no-conv-bias"),
    pytest.param(mamba(d=16, layers=1, expand=1, act="gelu", tied=False), id="expand1-gelu-conv-untied"),
]


def last_hidden(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers' final hidden states (B, n, d): Mamba's last hidden_states, after norm_f."""
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True,
                     use_cache=False).hidden_states[-1].numpy()


@pytest.mark.parametrize("config", CASES)
def test_mamba(config, tmp_path, request):
    seed = case_seed(request)
    model = build_scan(MambaForCausalLM, config, seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    for side in ("right", "left"):             # every layer's output, the final hidden states, the logits
        check_streams(model, ours, config.vocab_size, side, seed + 2, key="residual_out", hidden=last_hidden)
    prompt = check_writing(model, ours, config.vocab_size, seed + 3)   # one prompt; a left-padded batch of them
    # the implied attention reproduces every channel's scan, float64
    ours64 = qkv.load(tmp_path / "hf", dtype=np.float64)
    trace = ours64.run(prompt[0].tolist(), keep=("attn_in",))
    for layer in range(config.num_hidden_layers):
        w = ours64.weights.blocks[layer].mixer
        f = mixer_parts(trace.layer(layer).attn_in[None], w, ours64.config)
        y = np.einsum("bcts,bsc->btc", hidden_attention(f.dt, f.A, f.Bm, f.Cm), f.x)
        assert np.abs(y - f.y).max() < 1e-9
    check_read_back(MambaForCausalLM, model, ours, prompt, tmp_path / "ours")   # what qkv saves, transformers reads


def test_an_original_checkpoint_names_its_table_embedding(tmp_path):
    """state-spaces' checkpoints say backbone.embedding.weight (transformers renames it when loading)."""
    check_original_embedding_name(MambaForCausalLM, mamba(), tmp_path)
