"""The newer decoder families against live transformers, on random checkpoints of many shapes:
GPT-NeoX (Pythia) and Phi (Qwen3's cases are in test_live_reference.py beside Llama's).

Each case builds a seeded, perturbed model with other knob values — GPT-NeoX: parallel or
sequential residual, RoPE over a quarter, half or all of each head, rope bases, biases or none, tied
or untied head, gelu / gelu_new / relu, 1–3 layers, d_head 8–16; Phi: partial RoPE 0.4 / 0.25 / 1,
q/k LayerNorm, GQA, tied — saves it, loads it with qkv and compares a right- and a left-padded batch
(hidden states and logits within 1e-4, attention weights within 1e-5), then greedy generation with
and without the KV cache token for token, and a model qkv saves read back by transformers.
"""

from __future__ import annotations

import zlib

import pytest
import torch
from live_helpers import (INIT_RANGE, build, check_decoder_live, max_abs, padded_batch, save)
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PhiConfig, PhiForCausalLM

import qkv

pytestmark = pytest.mark.live

NEW = 8


def neox(d=64, heads=4, layers=2, ff=128, factor=0.25, theta=10000.0, parallel=True, bias=True, tied=False,
         act="gelu", vocab=211, eps=1e-5):
    return GPTNeoXConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers,
                         intermediate_size=ff, hidden_act=act, layer_norm_eps=eps, max_position_embeddings=128,
                         rope_parameters={"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": factor},
                         use_parallel_residual=parallel, attention_bias=bias, tie_word_embeddings=tied,
                         initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                         attn_implementation="eager")


def phi(d=64, heads=4, kv=None, layers=2, ff=96, factor=0.4, theta=10000.0, qk=False, tied=False, act="gelu_new",
        vocab=211):
    return PhiConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv or heads,
                     num_hidden_layers=layers, intermediate_size=ff, hidden_act=act, max_position_embeddings=128,
                     rope_parameters={"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": factor},
                     qk_layernorm=qk, tie_word_embeddings=tied, initializer_range=INIT_RANGE, pad_token_id=0,
                     bos_token_id=1, eos_token_id=2, attn_implementation="eager")


CASES = [
    pytest.param(neox(), id="pythia-parallel-rot0.25-bias-untied"),
    pytest.param(neox(d=48, heads=3, factor=0.5, parallel=False, bias=False, tied=True, act="gelu_new"),
                 id="sequential-rot0.5-nobias-tied-gelu_new"),
    pytest.param(neox(d=64, heads=8, layers=3, factor=1.0, theta=1e6, eps=1e-6), id="h8-dk8-rot1.0-theta1e6-L3"),
    pytest.param(neox(d=96, heads=6, layers=1, ff=160, factor=0.25, act="relu", tied=True), id="d96-h6-dk16-relu-L1"),
]
PHI_CASES = [
    pytest.param(phi(), id="phi2-rot0.4-untied"),
    pytest.param(phi(d=48, heads=4, kv=2, factor=0.5, qk=True, tied=True, theta=5e4), id="phi-gqa-rot0.5-qk_layernorm-tied"),
    pytest.param(phi(d=64, heads=8, layers=3, factor=1.0, act="gelu"), id="phi-h8-rot1.0-gelu-L3"),
]


@pytest.mark.parametrize(("cls", "config"), [pytest.param(GPTNeoXForCausalLM, *c.values, id=c.id) for c in CASES]
                         + [pytest.param(PhiForCausalLM, *c.values, id=c.id) for c in PHI_CASES])
def test_family(cls, config, tmp_path, request):
    seed = zlib.crc32(request.node.callspec.id.encode()) % 10_000
    model = build(cls, config, seed=seed)
    save(model, tmp_path)
    ours = qkv.load(tmp_path)
    assert ours.config.parallel_residual == getattr(config, "use_parallel_residual", True)
    factor = config.rope_parameters["partial_rotary_factor"]
    assert (ours.config.rotary_dim or ours.config.d_head) == int(ours.config.d_head * factor)
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)


def test_a_model_qkv_saves_reads_back_in_transformers(tmp_path):
    model = build(GPTNeoXForCausalLM, neox(factor=0.5, tied=False), seed=5)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    ours.save(tmp_path / "qkv")
    back = GPTNeoXForCausalLM.from_pretrained(tmp_path / "qkv").eval()
    back.set_attn_implementation("eager")
    ids = padded_batch(211, [10], seed=3, low=3)[0]
    with torch.no_grad():
        a, b = model(torch.from_numpy(ids)).logits.numpy(), back(torch.from_numpy(ids)).logits.numpy()
    assert max_abs(a, b) < 1e-5
