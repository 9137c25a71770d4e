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

import pytest
from live_helpers import INIT_RANGE, case_seed, save
from live_scan import build_scan, check_mamba2_identity, check_read_back, check_streams, check_writing
from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

import qkv

pytestmark = pytest.mark.live

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


def check_batch(model, ours, vocab: int, side: str, seed: int) -> None:
    """A padded batch: every layer's input (GraniteMoeHybrid's hidden_states) and the logits at the real positions
    (positions counted over the real tokens)."""
    check_streams(model, ours, vocab, side, seed, positions=True)


@pytest.mark.parametrize("config", CASES)
def test_granitemoehybrid(config, tmp_path, request):
    seed = case_seed(request)
    model = build_scan(GraniteMoeHybridForCausalLM, config, seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    for side in ("right", "left"):
        check_batch(model, ours, config.vocab_size, side, seed + 2)
    # one prompt and a left-padded batch of them, transformers writing without its cache when every layer is Mamba-2
    # (its hybrid cache then cannot size the attention mask it makes anyway: a ValueError in transformers 5.25)
    prompt = check_writing(model, ours, config.vocab_size, seed + 3,
                           cached="full_attention" in model.config.layer_types)
    check_mamba2_identity(tmp_path / "hf")
    check_read_back(GraniteMoeHybridForCausalLM, model, ours, prompt, tmp_path / "ours", use_cache=False)


def test_a_time_step_limit_clamps_delta(tmp_path):
    """time_step_limit (0.02, 0.3): the full passes equal transformers' (its one-token step does not clamp, so cached
    writing is not compared)."""
    model = build_scan(GraniteMoeHybridForCausalLM, granite(time_step_limit=(0.02, 0.3)), 41)
    save(model, tmp_path)
    ours = qkv.load(tmp_path)
    assert (ours.config.mamba.dt_min, ours.config.mamba.dt_max) == (0.02, 0.3)
    for side in ("right", "left"):
        check_batch(model, ours, 211, side, 42)
