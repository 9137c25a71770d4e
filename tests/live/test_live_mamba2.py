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

import zlib

import numpy as np
import pytest
import torch
from live_helpers import INIT_RANGE, TOL_HIDDEN, hf_greedy, padded_batch, perturb_, save
from safetensors.torch import load_file, save_file
from transformers import Mamba2Config, Mamba2ForCausalLM

import qkv
from qkv.core.mamba2 import implied_attention, mixer_parts
from qkv.core.stack import transformer
from qkv.core.trace import Recorder

pytestmark = pytest.mark.live

NEW = 8


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


def build(config, seed: int) -> Mamba2ForCausalLM:
    torch.manual_seed(seed)
    model = Mamba2ForCausalLM(config)
    perturb_(model, seed + 1)
    return model.float().eval()


def check_batch(model, ours, vocab: int, side: str, seed: int) -> None:
    """A padded batch: every layer's input (Mamba2's hidden_states), the final hidden states and the logits at the
    real positions."""
    ids, mask = padded_batch(vocab, [11, 7, 9], seed, side=side)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True,
                    use_cache=False)
        last = model.backbone(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state
    rec = Recorder(keep=("residual",))
    hidden, logits = transformer(ours.weights, ours.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert np.abs(logits - ref.logits.numpy())[real].max() < TOL_HIDDEN
    assert np.abs(hidden - last.numpy())[real].max() < TOL_HIDDEN
    for layer in range(ours.config.n_layers):
        got = rec.store[layer]["residual"]
        assert np.abs(got - ref.hidden_states[layer].numpy())[real].max() < TOL_HIDDEN, (side, layer)


def check_identity(path) -> None:
    """Each layer's implied attention applied to the scan's input is the scan's output, every head, float64."""
    ours64 = qkv.load(path, dtype=np.float64)
    ids = padded_batch(ours64.config.vocab_size, [13], 5)[0]
    trace = ours64.run(ids[0].tolist(), keep=("attn_in",))
    for layer in range(ours64.config.n_layers):
        f = mixer_parts(trace.layer(layer).attn_in[None], ours64.weights.blocks[layer].mixer, ours64.config.mamba,
                        ours64.config.activation)
        y = np.einsum("bhts,bshp->bthp", implied_attention(f.dt, f.A, f.Bm, f.Cm), f.x)
        assert np.abs(y - f.y).max() < 1e-9


@pytest.mark.parametrize("config", CASES)
def test_mamba2(config, tmp_path, request):
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
    check_identity(tmp_path / "hf")
    # what qkv saves, transformers reads with the same logits
    back = Mamba2ForCausalLM.from_pretrained(ours.save(tmp_path / "ours")).eval()
    with torch.no_grad():
        a = back(input_ids=torch.from_numpy(prompt)).logits.numpy()
        b = model(input_ids=torch.from_numpy(prompt)).logits.numpy()
    assert np.abs(a - b).max() < 1e-5


def test_a_time_step_limit_clamps_delta(tmp_path):
    """time_step_limit (0.02, 0.3), inside the perturbed model's Δ: the full passes equal transformers' (which clamps
    in its chunked scan; its one-token step does not, so cached writing is not compared)."""
    model = build(mamba2(time_step_limit=(0.02, 0.3)), 31)
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
    model = build(mamba2(), 77)
    save(model, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["backbone.embedding.weight"] = tensors.pop("backbone.embeddings.weight")
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids = padded_batch(211, [9], 5)[0]
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert np.abs(qkv.load(tmp_path).forward(ids).logits - want).max() < TOL_HIDDEN
