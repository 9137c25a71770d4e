"""GGUF files of the state-space models and hybrids (llama.cpp's `jamba`, `mamba2`, `granitehybrid`, `falcon-h1`)
against live transformers (make test-live).

Random checkpoints of knob values the committed fixtures do not have (Jamba: attention every third layer from layer 2,
routed FFNs every other one from layer 0, MHA, tied, Δ's rank "auto", another state, conv and ε; every layer attention
and routed top-1; no attention layer at all. Mamba-2: one group, sixteen heads in four groups, tied, other states and
conv taps. Granite 4 hybrid: attention first and last, MQA, top-1 of four experts, other multipliers, tied; three
groups of six heads, every expert chosen. Falcon-H1, whose µP multipliers llama.cpp folds into the weights: other
multipliers, the gated norm after the gate or none, MQA, one group) are built with transformers, saved, written as
llama.cpp's convert_hf_to_gguf.py lays them out (tests/fixtures/gguf_convert.py), and qkv.load(file.gguf) is compared
with transformers on the directory as the families' own live tests compare it (the `check_batch` of
test_live_jamba.py, test_live_mamba2.py, test_live_granitemoehybrid.py and test_live_falcon_h1.py: a right- and a
left-padded batch, every layer's input and the logits within 1e-4 (Jamba's and Mamba-2's final hidden states too,
Jamba's and Falcon-H1's attention weights within 1e-5), at the real positions), and greedy ids with and without the
cache, token for token.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import test_live_falcon_h1 as FH
import test_live_granitemoehybrid as G
import test_live_jamba as J
import test_live_mamba2 as M2
from live_helpers import hf_greedy, padded_batch, save
from live_scan import build_scan
from transformers import FalconH1ForCausalLM, GraniteMoeHybridForCausalLM, JambaForCausalLM, Mamba2ForCausalLM

import qkv

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
import gguf_convert as C  # noqa: E402

pytestmark = pytest.mark.live

NEW = 8
V = 300                                     # gguf_convert writes a tokenizer of 260 ids: the vocabulary holds them

JAMBA = [
    pytest.param(J.jamba(d=48, layers=5, heads=4, kv=4, attn=(3, 2), expert=(2, 0), experts=3, k=2, state=4, conv=3,
                         tied=True, rms_norm_eps=1e-5, vocab=V), id="attention-every-3rd-mha-routed-2nd-tied"),
    pytest.param(J.jamba(layers=2, attn=(1, 0), expert=(1, 0), experts=3, k=1, rank=3, vocab=V),
                 id="every-layer-attention-and-routed-top1"),
    pytest.param(J.jamba(layers=3, attn=(4, 3), expert=(3, 1), state=16, expand=3, vocab=V),
                 id="no-attention-expand3-state16"),
]

MAMBA2 = [
    pytest.param(M2.mamba2(d=32, heads=4, head_dim=16, state=16, groups=1, conv=3, vocab=V), id="one-group-state16"),
    pytest.param(M2.mamba2(d=32, layers=3, heads=16, head_dim=4, state=4, groups=4, conv=2, tied=True,
                           layer_norm_epsilon=1e-6, vocab=V), id="16-heads-4-groups-conv2-tied"),
]


GRANITE = [
    pytest.param(G.granite(kinds=("attention", "mamba", "mamba", "attention"), kv=1, experts=4, k=1, shared=16,
                           embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2,
                           logits_scaling=3.0, tie_word_embeddings=True, vocab=V), id="attention-ends-mqa-top1-tied"),
    pytest.param(G.granite(d=24, kinds=("mamba", "mamba", "attention"), heads=2, kv=2, experts=2, k=2, m_heads=6,
                           m_head=8, groups=3, state=4, conv=3, vocab=V), id="3-groups-6-heads-every-expert"),
]


FALCON_H1 = [
    pytest.param(FH.falcon_h1(mamba_rms_norm=True, mamba_norm_before_gate=False, embedding_multiplier=1.7,
                              lm_head_multiplier=0.4, key_multiplier=0.5, attention_in_multiplier=1.3,
                              attention_out_multiplier=0.7, ssm_in_multiplier=0.8, ssm_out_multiplier=1.4,
                              mlp_multipliers=[0.6, 1.5], ssm_multipliers=[1.2, 0.7, 1.1, 0.9, 1.6], vocab=V),
                 id="norm-after-gate-multipliers"),
    pytest.param(FH.falcon_h1(d=24, heads=2, kv=1, d_ssm=48, m_heads=4, m_head=12, groups=1,
                              state=4, conv=3, mamba_rms_norm=False, key_multiplier=2.0, mlp_multipliers=[1.3, 0.8],
                              vocab=V), id="no-norm-mqa-one-group"),
]


def _seed(request) -> int:
    return zlib.crc32(request.node.callspec.id.encode()) % 10_000



def _greedy(model, prompt: np.ndarray, cached: bool) -> np.ndarray:
    """transformers' greedy ids for PROMPT (B, n) + NEW tokens; without its cache when no layer is attention (its
    hybrid cache then cannot size the attention mask: a ValueError in transformers 5.25)."""
    with torch.no_grad():
        return model.generate(torch.from_numpy(prompt), attention_mask=torch.ones_like(torch.from_numpy(prompt)),
                              max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0,
                              use_cache=cached).numpy()

@pytest.mark.parametrize("config", JAMBA)
def test_jamba_gguf_equals_transformers(config, tmp_path, request):
    """The file of transformers' seeded Jamba: its layers' kinds and routed layers the directory's, transformers'
    numbers on padded batches, its greedy ids with and without the hybrid cache."""
    seed = _seed(request)
    model = build_scan(JambaForCausalLM, config, seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(C.convert(tmp_path / "hf", tmp_path / "model.gguf"))
    assert list(ours.config.layer_kinds) == config.layers_block_type
    assert [ours.config.moe_layer(i) for i in range(config.num_hidden_layers)] == [
        n > 1 for n in config.layers_num_experts]
    for side in ("right", "left"):
        J.check_batch(model, ours, V, side, seed + 2)
    prompt = padded_batch(V, [9], seed + 3)[0]
    want = _greedy(model, prompt, "attention" in model.config.layers_block_type)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False), want)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False, use_cache=False), want)


@pytest.mark.parametrize("config", MAMBA2)
def test_mamba2_gguf_equals_transformers(config, tmp_path, request):
    """The file of transformers' seeded Mamba-2: transformers' numbers on padded batches, its greedy ids with and
    without the cache."""
    seed = _seed(request)
    model = build_scan(Mamba2ForCausalLM, config, seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(C.convert(tmp_path / "hf", tmp_path / "model.gguf"))
    assert ours.config.mamba.n_groups == config.n_groups and ours.config.n_heads == config.num_heads
    for side in ("right", "left"):
        M2.check_batch(model, ours, V, side, seed + 2)
    prompt = padded_batch(V, [9], seed + 3)[0]
    want = hf_greedy(model, prompt, NEW)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False), want)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False, use_cache=False), want)


@pytest.mark.parametrize("config", GRANITE)
def test_granite_hybrid_gguf_equals_transformers(config, tmp_path, request):
    """The file of transformers' seeded Granite 4 hybrid: its layers' kinds, transformers' numbers on padded batches,
    its greedy ids with and without the hybrid cache."""
    seed = _seed(request)
    model = build_scan(GraniteMoeHybridForCausalLM, config, seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(C.convert(tmp_path / "hf", tmp_path / "model.gguf"))
    assert [k == "attention" for k in ours.config.layer_kinds] == [t in ("attention", "full_attention")
                                                                   for t in config.layer_types]
    for side in ("right", "left"):
        G.check_batch(model, ours, V, side, seed + 2)
    prompt = padded_batch(V, [9], seed + 3)[0]
    want = _greedy(model, prompt, "full_attention" in model.config.layer_types)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False), want)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False, use_cache=False), want)


@pytest.mark.parametrize("config", FALCON_H1)
def test_falcon_h1_gguf_equals_transformers(config, tmp_path, request):
    """The file of transformers' seeded Falcon-H1 (its multipliers folded into the weights, read back as 1): its
    config every multiplier 1, transformers' numbers on padded batches, its greedy ids with and without the cache."""
    seed = _seed(request)
    model = build_scan(FalconH1ForCausalLM, config, seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(C.convert(tmp_path / "hf", tmp_path / "model.gguf"))
    assert ours.config.embedding_multiplier == ours.config.logit_scale == ours.config.mamba.in_scale == 1
    for side in ("right", "left"):
        FH.check_batch(model, ours, V, side, seed + 2)
    prompt = padded_batch(V, [9], seed + 3)[0]
    want = hf_greedy(model, prompt, NEW)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False), want)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False, use_cache=False), want)
