"""Mamba-2 (issue 47) against live transformers, on random checkpoints of other knob values than the committed
fixture: heads and their width, groups of B and C (one, one per head), the state's size, the conv's taps, in/out
biases, no conv bias, another conv activation, tied or untied, chunks shorter and longer than the text, a
time_step_limit that clamps Δ, an original checkpoint's `embedding` name.

Each case builds a seeded, perturbed Mamba2ForCausalLM, saves it, loads it with qkv and compares a right- and a
left-padded batch (every layer's input, final hidden states and logits within 1e-4 at the real positions), greedy
writing with and without the recurrent cache token for token (and a left-padded batch of prompts), and the implied
attention's identity in float64; a model qkv saves is read back by transformers with the same logits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import INIT_RANGE, case_seed, padded_batch, save
from live_scan import (build_scan, check_mamba2_identity, check_original_embedding_name, check_read_back, check_streams,
                       check_writing)
from transformers import Mamba2Config, Mamba2ForCausalLM

import qkv

pytestmark = pytest.mark.live

def mamba2(d=32, layers=2, heads=8, head_dim=8, state=8, groups=2, conv=4, chunk=4, bias=False, conv_bias=True,
           act="silu", tied=False, vocab=211, **kw):
    return Mamba2Config(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, num_heads=heads, head_dim=head_dim,
                        expand=heads * head_dim // d, state_size=state, n_groups=groups, conv_kernel=conv,
                        chunk_size=chunk, use_bias=bias, use_conv_bias=conv_bias, hidden_act=act,
                        tie_word_embeddings=tied, initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2, **kw)


CASES = [
    pytest.param(mamba2(), id="default-like-chunk4"),
    pytest.param(mamba2(d=24, layers=3, heads=6, head_dim=8, state=4, groups=1, conv=2, chunk=64, tied=True),
                 id="one-group-state4-conv2-chunk64-tied"),
    pytest.param(mamba2(d=16, heads=4, head_dim=12, state=16, groups=4, conv=5, chunk=3, bias=True, conv_bias=False,
                        layer_norm_epsilon=1e-6), id="group-per-head-biases-no-conv-bias-chunk3"),
    pytest.param(mamba2(d=16, layers=1, heads=2, head_dim=8, groups=2, act="gelu", chunk=5), id="gelu-conv-one-layer"),
]


def check_batch(model, ours, vocab: int, side: str, seed: int) -> None:
    """A padded batch: every layer's input (Mamba2's hidden_states), the final hidden states and the logits at the
    real positions."""
    check_streams(model, ours, vocab, side, seed, hidden=last_hidden)


def last_hidden(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers' final hidden states (B, n, d): its backbone's, after norm_f."""
    with torch.no_grad():
        out = model.backbone(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    return out.last_hidden_state.numpy()


@pytest.mark.parametrize("config", CASES)
def test_mamba2(config, tmp_path, request):
    seed = case_seed(request)
    model = build_scan(Mamba2ForCausalLM, config, seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    for side in ("right", "left"):
        check_batch(model, ours, config.vocab_size, side, seed + 2)
    prompt = check_writing(model, ours, config.vocab_size, seed + 3)   # one prompt; a left-padded batch of them
    check_mamba2_identity(tmp_path / "hf")
    check_read_back(Mamba2ForCausalLM, model, ours, prompt, tmp_path / "ours")   # what qkv saves, transformers reads


def test_a_time_step_limit_clamps_delta(tmp_path):
    """time_step_limit (0.02, 0.3), inside the perturbed model's Δ: the full passes equal transformers' (which clamps
    in its chunked scan; its one-token step does not, so cached writing is not compared)."""
    model = build_scan(Mamba2ForCausalLM, mamba2(time_step_limit=(0.02, 0.3)), 31)
    save(model, tmp_path)
    ours = qkv.load(tmp_path)
    assert (ours.config.mamba.dt_min, ours.config.mamba.dt_max) == (0.02, 0.3)
    for side in ("right", "left"):
        check_batch(model, ours, 211, side, 32)
    plain = qkv.load(tmp_path).with_config(mamba=ours.config.mamba.__class__(
        **{**ours.config.mamba.__dict__, "dt_min": 0.0, "dt_max": float("inf")}))
    ids = padded_batch(211, [9], 5)[0]
    assert np.abs(plain.forward(ids).logits - ours.forward(ids).logits).max() > 1e-3   # the clamp bit


def test_an_original_checkpoint_names_its_table_embedding(tmp_path):
    """state-spaces' checkpoints say backbone.embedding.weight (transformers renames it when loading)."""
    check_original_embedding_name(Mamba2ForCausalLM, mamba2(), tmp_path)
