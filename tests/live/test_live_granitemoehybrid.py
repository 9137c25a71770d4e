"""Granite 4 hybrids (issue 47) against live transformers, on random checkpoints of other knob values than the
committed fixture: other orders of Mamba-2 and attention layers (every layer Mamba-2: layer_types absent), RoPE in the
attention layers, attention biases, a head_dim of its own, no experts (the shared FFN alone), one group of B and C,
in/out biases without a conv bias, another activation, tied embeddings, chunks longer than the text, other
multipliers, a time_step_limit that clamps Δ.

Each case builds a seeded, perturbed GraniteMoeHybridForCausalLM, saves it, loads it with qkv and compares a right- and
a left-padded batch (every layer's input, logits within 1e-4 at the real positions; positions counted over the real
tokens, as generate gives them), greedy writing with and without the cache token for token (and a left-padded batch of
prompts), and each Mamba-2 layer's implied attention in float64; a model qkv saves is read back by transformers with
the same logits.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from live_helpers import INIT_RANGE, TOL_HIDDEN, decoder_positions, padded_batch, perturb_, save
from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

import qkv
from qkv.core.mamba2 import implied_attention, mixer_parts
from qkv.core.stack import transformer
from qkv.core.trace import Recorder

pytestmark = pytest.mark.live

NEW = 8


def granite(d=32, kinds=("mamba", "attention", "mamba"), heads=4, kv=2, experts=3, k=2, f=16, shared=24, m_heads=8,
            m_head=8, state=8, groups=2, conv=4, chunk=4, vocab=211, **kw):
    return GraniteMoeHybridConfig(
        vocab_size=vocab, hidden_size=d, intermediate_size=f, shared_intermediate_size=shared,
        num_hidden_layers=len(kinds) if kinds else kw.pop("layers"), num_attention_heads=heads, num_key_value_heads=kv,
        num_local_experts=experts, num_experts_per_tok=k, layer_types=list(kinds) if kinds else None,
        mamba_n_heads=m_heads, mamba_d_head=m_head, mamba_expand=m_heads * m_head // d, mamba_d_state=state,
        mamba_n_groups=groups, mamba_d_conv=conv, mamba_chunk_size=chunk, initializer_range=INIT_RANGE, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, attn_implementation="eager", **kw)


CASES = [
    pytest.param(granite(kinds=("attention", "mamba", "mamba", "attention"), position_embedding_type="rope",
                         attention_bias=True, tie_word_embeddings=True, embedding_multiplier=2.0,
                         residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=4.0),
                 id="rope-biases-tied-multipliers"),
    pytest.param(granite(d=24, kinds=("mamba", "attention"), heads=2, kv=1, experts=0, shared=20, m_heads=6, m_head=8,
                         groups=1, state=4, conv=2, head_dim=16, position_embedding_type="rope",
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
                 id="no-experts-one-group-head-dim-rope500"),
    pytest.param(granite(kinds=None, layers=2, heads=2, kv=2, experts=4, k=1, m_heads=4, m_head=16, groups=4,
                         chunk=64, mamba_proj_bias=True, mamba_conv_bias=False, hidden_act="gelu",
                         rms_norm_eps=1e-5, position_embedding_type="nope"),
                 id="every-layer-mamba2-proj-bias-gelu-chunk64"),
]


def build(config, seed: int) -> GraniteMoeHybridForCausalLM:
    torch.manual_seed(seed)
    model = GraniteMoeHybridForCausalLM(config)
    perturb_(model, seed + 1)
    return model.float().eval()


def check_batch(model, ours, vocab: int, side: str, seed: int) -> None:
    """A padded batch: every layer's input (GraniteMoeHybrid's hidden_states) and the logits at the real positions."""
    ids, mask = padded_batch(vocab, [11, 7, 9], seed, side=side)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True,
                    position_ids=torch.from_numpy(decoder_positions(mask)), use_cache=False)
    rec = Recorder(keep=("residual",))
    _, logits = transformer(ours.weights, ours.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert np.abs(logits - ref.logits.numpy())[real].max() < TOL_HIDDEN
    for layer in range(ours.config.n_layers):
        got = rec.store[layer]["residual"]
        assert np.abs(got - ref.hidden_states[layer].numpy())[real].max() < TOL_HIDDEN, (side, layer)


def greedy(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers' greedy ids for IDS (B, n) + NEW tokens; without its cache when every layer is Mamba-2 (its hybrid
    cache then cannot size the attention mask it makes anyway: a ValueError in transformers 5.25)."""
    cached = "full_attention" in model.config.layer_types
    with torch.no_grad():
        return model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW,
                              do_sample=False, eos_token_id=None, pad_token_id=0, use_cache=cached).numpy()


def check_identity(path) -> None:
    """Each Mamba-2 layer's implied attention applied to the scan's input is the scan's output, float64."""
    ours64 = qkv.load(path, dtype=np.float64)
    ids = padded_batch(ours64.config.vocab_size, [13], 5)[0]
    trace = ours64.run(ids[0].tolist(), keep=("attn_in",))
    for layer in (i for i in range(ours64.config.n_layers) if ours64.config.layer_kind(i) == "mamba"):
        f = mixer_parts(trace.layer(layer).attn_in[None], ours64.weights.blocks[layer].mixer, ours64.config.mamba,
                        ours64.config.activation)
        y = np.einsum("bhts,bshp->bthp", implied_attention(f.dt, f.A, f.Bm, f.Cm), f.x)
        assert np.abs(y - f.y).max() < 1e-9


@pytest.mark.parametrize("config", CASES)
def test_granitemoehybrid(config, tmp_path, request):
    seed = zlib.crc32(request.node.callspec.id.encode()) % 10_000
    model = build(config, seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    for side in ("right", "left"):
        check_batch(model, ours, config.vocab_size, side, seed + 2)
    prompt = padded_batch(config.vocab_size, [9], seed + 3)[0]
    want = greedy(model, prompt, np.ones_like(prompt))
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False), want)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False, use_cache=False), want)
    ids, mask = padded_batch(config.vocab_size, [9, 6], seed + 4, side="left")
    want = greedy(model, ids, mask)
    assert np.array_equal(ours.generate(ids, max_new_tokens=NEW, attention_mask=mask, stop_at_eos=False), want)
    check_identity(tmp_path / "hf")
    back = GraniteMoeHybridForCausalLM.from_pretrained(ours.save(tmp_path / "ours")).eval()
    with torch.no_grad():
        a = back(input_ids=torch.from_numpy(prompt), use_cache=False).logits.numpy()
        b = model(input_ids=torch.from_numpy(prompt), use_cache=False).logits.numpy()
    assert np.abs(a - b).max() < 1e-5


def test_a_time_step_limit_clamps_delta(tmp_path):
    """time_step_limit (0.02, 0.3): the full passes equal transformers' (its one-token step does not clamp, so cached
    writing is not compared)."""
    model = build(granite(time_step_limit=(0.02, 0.3)), 41)
    save(model, tmp_path)
    ours = qkv.load(tmp_path)
    assert (ours.config.mamba.dt_min, ours.config.mamba.dt_max) == (0.02, 0.3)
    for side in ("right", "left"):
        check_batch(model, ours, 211, side, 42)
