"""GPT-J, Cohere and Granite against live transformers, on random checkpoints of many shapes.

Each case builds a seeded, perturbed model with other knob values — GPT-J: rotary_dim over part or all
of a head (interleaved pairs), sizes, heads, gelu_new / relu, tied or untied; Cohere: q/k LayerNorms per
head or none, GQA / MQA, attention biases, logit_scale, rope bases, tied or untied; Granite: its four
multipliers at other values, GQA, attention biases, tied — saves it, loads it with qkv and compares a
right- and a left-padded batch (hidden states and logits within 1e-4, attention weights within 1e-5),
then greedy generation with and without the KV cache token for token, a model qkv saves read back by
transformers with equal logits, and qkv's gradients against torch autograd.
"""

from __future__ import annotations

import zlib

import pytest
import torch
from test_live_grads import check
from live_helpers import (INIT_RANGE, build, check_decoder_live, max_abs, padded_batch, save)
from transformers import (CohereConfig, CohereForCausalLM, GPTJConfig, GPTJForCausalLM, GraniteConfig,
                          GraniteForCausalLM)

import qkv

pytestmark = pytest.mark.live

NEW = 8
COMMON = dict(initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager")


def gptj(d=64, heads=4, layers=2, ff=112, rotary=6, act="gelu_new", tied=False, vocab=211, eps=1e-5):
    return GPTJConfig(vocab_size=vocab, n_embd=d, n_head=heads, n_layer=layers, n_inner=ff, rotary_dim=rotary,
                      n_positions=128, activation_function=act, layer_norm_epsilon=eps, tie_word_embeddings=tied,
                      **COMMON)


def cohere(d=64, heads=4, kv=2, layers=2, ff=96, qk=True, bias=False, scale=0.0625, theta=10000.0, tied=True,
           vocab=211):
    return CohereConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                        num_hidden_layers=layers, intermediate_size=ff, max_position_embeddings=128,
                        use_qk_norm=qk, attention_bias=bias, logit_scale=scale, tie_word_embeddings=tied,
                        rope_parameters={"rope_type": "default", "rope_theta": theta}, **COMMON)


def granite(d=64, heads=4, kv=2, layers=2, ff=96, emb=12.0, res=0.22, att=0.0078125, logits=8.0, bias=False,
            tied=False, vocab=211):
    return GraniteConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                         num_hidden_layers=layers, intermediate_size=ff, max_position_embeddings=128,
                         embedding_multiplier=emb, residual_multiplier=res, attention_multiplier=att,
                         logits_scaling=logits, attention_bias=bias, tie_word_embeddings=tied,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **COMMON)


CASES = [
    pytest.param(GPTJForCausalLM, gptj(), id="gptj-rot6of16-untied"),
    pytest.param(GPTJForCausalLM, gptj(d=48, heads=3, rotary=16, act="relu", tied=True), id="gptj-rot-all-relu-tied"),
    pytest.param(GPTJForCausalLM, gptj(d=64, heads=8, layers=3, rotary=4, ff=96, eps=1e-6), id="gptj-h8-dk8-rot4-L3"),
    pytest.param(CohereForCausalLM, cohere(), id="cohere-qknorm-gqa-tied"),
    pytest.param(CohereForCausalLM, cohere(heads=4, kv=1, qk=False, bias=True, scale=0.5, theta=5e4, tied=False),
                 id="cohere-mqa-bias-scale0.5-untied"),
    pytest.param(CohereForCausalLM, cohere(d=96, heads=6, kv=6, layers=1, ff=128, scale=1.3), id="cohere-d96-h6-L1"),
    pytest.param(GraniteForCausalLM, granite(), id="granite-3.0-multipliers"),
    pytest.param(GraniteForCausalLM, granite(emb=0.5, res=1.4, att=0.3, logits=0.6, bias=True, tied=True, kv=4),
                 id="granite-other-multipliers-bias-tied"),
    pytest.param(GraniteForCausalLM, granite(d=48, heads=4, kv=1, layers=3, emb=1.0, res=1.0, att=1.0, logits=1.0),
                 id="granite-all-ones-mqa-L3"),
]


@pytest.mark.parametrize(("cls", "config"), CASES)
def test_family(cls, config, tmp_path, request):
    seed = zlib.crc32(request.node.callspec.id.encode()) % 10_000
    model = build(cls, config, seed=seed)
    save(model, tmp_path)
    ours = qkv.load(tmp_path)
    assert ours.config.family == config.model_type
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)


@pytest.mark.parametrize(("cls", "config"), [CASES[0], CASES[4], CASES[7]])
def test_a_model_qkv_saves_reads_back_in_transformers(cls, config, tmp_path):
    model = build(cls, config, seed=5)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    ours.save(tmp_path / "qkv")
    back = cls.from_pretrained(tmp_path / "qkv").eval()
    back.set_attn_implementation("eager")
    ids = padded_batch(config.vocab_size, [10], seed=3, low=3)[0]
    with torch.no_grad():
        a, b = model(torch.from_numpy(ids)).logits.numpy(), back(torch.from_numpy(ids)).logits.numpy()
    assert max_abs(a, b) < 1e-5


@pytest.mark.parametrize(("cls", "config"), CASES)
def test_gradients_equal_torch_autograd(cls, config, tmp_path, request):
    """qkv.train.gradients on a right-padded batch: the loss and every tensor's gradient equal torch autograd's
    (test_live_grads.check: loss within 1e-5, each gradient within 1e-4 relative error)."""
    model = build(cls, config, seed=zlib.crc32(request.node.callspec.id.encode()) % 10_000)
    ids, mask = padded_batch(config.vocab_size, [11, 7, 2], seed=5)
    check(model, tmp_path, ids, mask)
