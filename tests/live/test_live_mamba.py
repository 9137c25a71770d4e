"""Mamba (issue 47) against live transformers, on random checkpoints of other knob values than the committed
fixture: the state's size, expand, the conv's taps, Δ's rank, in/out biases, no conv bias, another conv
activation, tied or untied, an original checkpoint's `embedding` name.

Each case builds a seeded, perturbed MambaForCausalLM, saves it, loads it with qkv and compares a right- and a
left-padded batch (every layer's output, final hidden states and logits within 1e-4 at the real positions), greedy
writing with and without the recurrent cache token for token (and a left-padded batch of prompts), and the implied
attention's identity in float64; a model qkv saves is read back by transformers with the same logits.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from live_helpers import INIT_RANGE, TOL_HIDDEN, hf_greedy, padded_batch, perturb_, save
from safetensors.torch import load_file, save_file
from transformers import MambaConfig, MambaForCausalLM

import qkv
from qkv.core.mamba import hidden_attention, mixer_parts
from qkv.core.stack import transformer
from qkv.core.trace import Recorder

pytestmark = pytest.mark.live

NEW = 8


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


def build(config, seed: int) -> MambaForCausalLM:
    torch.manual_seed(seed)
    model = MambaForCausalLM(config)
    perturb_(model, seed + 1)
    return model.float().eval()


def check_batch(model, ours, vocab: int, side: str, seed: int) -> None:
    """A padded batch: every layer's output, the final hidden states and the logits at the real positions."""
    ids, mask = padded_batch(vocab, [11, 7, 9], seed, side=side)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True,
                    use_cache=False)
    rec = Recorder(keep=("residual_out",))
    hidden, logits = transformer(ours.weights, ours.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert np.abs(logits - ref.logits.numpy())[real].max() < TOL_HIDDEN
    assert np.abs(hidden - ref.hidden_states[-1].numpy())[real].max() < TOL_HIDDEN
    for layer in range(ours.config.n_layers):
        got = rec.store[layer]["residual_out"]
        assert np.abs(got - ref.hidden_states[layer].numpy())[real].max() < TOL_HIDDEN, (side, layer)


@pytest.mark.parametrize("config", CASES)
def test_mamba(config, tmp_path, request):
    seed = zlib.crc32(request.node.callspec.id.encode()) % 10_000
    model = build(config, seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    for side in ("right", "left"):
        check_batch(model, ours, config.vocab_size, side, seed + 2)
    prompt = padded_batch(config.vocab_size, [9], seed + 3)[0]
    want = hf_greedy(model, prompt, NEW)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False), want)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False, use_cache=False), want)
    # a left-padded batch of prompts, written together: transformers' ids (its padding masked in the first pass only)
    ids, mask = padded_batch(config.vocab_size, [9, 6], seed + 4, side="left")
    with torch.no_grad():
        want = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW,
                              do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
    assert np.array_equal(ours.generate(ids, max_new_tokens=NEW, attention_mask=mask, stop_at_eos=False), want)
    # the implied attention reproduces every channel's scan, float64
    ours64 = qkv.load(tmp_path / "hf", dtype=np.float64)
    trace = ours64.run(prompt[0].tolist(), keep=("attn_in",))
    for layer in range(config.num_hidden_layers):
        w = ours64.weights.blocks[layer].mixer
        f = mixer_parts(trace.layer(layer).attn_in[None], w, ours64.config)
        y = np.einsum("bcts,bsc->btc", hidden_attention(f.dt, f.A, f.Bm, f.Cm), f.x)
        assert np.abs(y - f.y).max() < 1e-9
    # what qkv saves, transformers reads with the same logits
    back = MambaForCausalLM.from_pretrained(ours.save(tmp_path / "ours")).eval()
    with torch.no_grad():
        a = back(input_ids=torch.from_numpy(prompt)).logits.numpy()
        b = model(input_ids=torch.from_numpy(prompt)).logits.numpy()
    assert np.abs(a - b).max() < 1e-5


def test_an_original_checkpoint_names_its_table_embedding(tmp_path):
    """state-spaces' checkpoints say backbone.embedding.weight (transformers renames it when loading)."""
    model = build(mamba(), 77)
    save(model, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["backbone.embedding.weight"] = tensors.pop("backbone.embeddings.weight")
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids = padded_batch(211, [9], 5)[0]
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert np.abs(qkv.load(tmp_path).forward(ids).logits - want).max() < TOL_HIDDEN
