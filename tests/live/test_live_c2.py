"""Phi-3, StableLM, StarCoder2 and OPT against live transformers, on random checkpoints of many shapes.

Each case builds a seeded, perturbed model with other knob values — Phi-3: partial RoPE, LongRoPE with its
short and long tables (a short original length, so a batch and the greedy prompt take different tables),
a sliding window, GQA, tied; StableLM: parallel or sequential residual, per-head q/k LayerNorms, q/k/v
biases, partial RoPE 0.25 / 0.5 / 1; StarCoder2: biases or none, GQA, a window that cuts, tied or untied;
OPT: pre-LN, post-LN without a final norm (OPT-350m), a projected embedding width (d_embed ≠ d_model),
no biases, LayerNorms without γ, β, gelu — saves it, loads it with qkv and compares a right- and a
left-padded batch (hidden states and logits within 1e-4, attention weights within 1e-5), then greedy
generation with and without the KV cache token for token, and a model qkv saves read back by transformers
with equal logits.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from live_helpers import (INIT_RANGE, build, check_decoder_live, max_abs, padded_batch, save)
from transformers import (OPTConfig, OPTForCausalLM, Phi3Config, Phi3ForCausalLM, StableLmConfig, StableLmForCausalLM,
                          Starcoder2Config, Starcoder2ForCausalLM)

import qkv
import qkv.train

pytestmark = pytest.mark.live

NEW = 8
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=INIT_RANGE, attn_implementation="eager")


def longrope(pairs: int, original: int = 12) -> dict:
    """A LongRoPE table of PAIRS short and long factors; passes longer than ORIGINAL positions take the long one."""
    return {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.1 * i for i in range(pairs)], "long_factor": [1.5 + 0.4 * i for i in range(pairs)],
            "original_max_position_embeddings": original}


def phi3(d=64, heads=4, kv=2, layers=2, ff=96, factor=1.0, rope=None, window=None, tied=False, vocab=211, **kw):
    params = dict(rope or {"rope_type": "default", "rope_theta": 10000.0}) | {"partial_rotary_factor": factor}
    return Phi3Config(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                      num_hidden_layers=layers, intermediate_size=ff, max_position_embeddings=128,
                      original_max_position_embeddings=params.get("original_max_position_embeddings", 128),
                      rope_parameters=params, sliding_window=window, tie_word_embeddings=tied, **SPECIAL, **kw)


def stablelm(d=64, heads=4, kv=4, layers=2, ff=96, factor=0.25, parallel=False, qk=False, bias=False, tied=False,
             rope=None, vocab=211):
    params = dict(rope or {"rope_type": "default", "rope_theta": 10000.0}) | {"partial_rotary_factor": factor}
    return StableLmConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                          num_hidden_layers=layers, intermediate_size=ff, max_position_embeddings=128,
                          rope_parameters=params,
                          use_parallel_residual=parallel, qk_layernorm=qk, use_qkv_bias=bias, tie_word_embeddings=tied,
                          **SPECIAL)


def starcoder2(d=64, heads=4, kv=2, layers=2, ff=128, bias=True, window=None, tied=True, theta=10000.0, vocab=211):
    return Starcoder2Config(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                            num_hidden_layers=layers, intermediate_size=ff, max_position_embeddings=128,
                            rope_parameters={"rope_type": "default", "rope_theta": theta}, use_bias=bias,
                            sliding_window=window, tie_word_embeddings=tied, norm_epsilon=1e-5, **SPECIAL)


def opt(d=64, heads=4, layers=2, ff=128, pre=True, width=None, bias=True, affine=True, tied=True, act="relu",
        remove_final=False, vocab=211):
    return OPTConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers, ffn_dim=ff,
                     max_position_embeddings=128, do_layer_norm_before=pre, word_embed_proj_dim=width or d,
                     enable_bias=bias, layer_norm_elementwise_affine=affine, tie_word_embeddings=tied,
                     activation_function=act, _remove_final_layer_norm=remove_final, dropout=0.0, **SPECIAL)


CASES = [
    pytest.param(Phi3ForCausalLM, phi3(), id="phi3-gqa-untied"),
    pytest.param(Phi3ForCausalLM, phi3(d=48, heads=4, kv=1, factor=0.5, rope=longrope(3), window=6, tied=True),
                 id="phi3-mqa-rot0.5-longrope-window6-tied"),
    pytest.param(Phi3ForCausalLM, phi3(d=64, heads=8, kv=4, layers=3, rope=longrope(4, original=64)),
                 id="phi3-h8-longrope-short-L3"),
    pytest.param(StableLmForCausalLM, stablelm(), id="stablelm-sequential-rot0.25"),
    pytest.param(StableLmForCausalLM, stablelm(heads=4, kv=2, parallel=True, qk=True, bias=True, factor=0.5),
                 id="stablelm-parallel-qk_layernorm-bias-gqa-rot0.5"),
    pytest.param(StableLmForCausalLM, stablelm(d=48, heads=3, kv=3, qk=True, factor=1.0, tied=True, layers=3),
                 id="stablelm-sequential-qk_layernorm-rot1-tied-L3"),
    pytest.param(StableLmForCausalLM, stablelm(factor=0.5, rope=longrope(4)), id="stablelm-rot0.5-longrope"),
    pytest.param(Starcoder2ForCausalLM, starcoder2(), id="starcoder2-gqa-bias-tied"),
    pytest.param(Starcoder2ForCausalLM, starcoder2(d=48, heads=6, kv=1, bias=False, window=5, tied=False, theta=1e5),
                 id="starcoder2-mqa-nobias-window5-untied"),
    pytest.param(Starcoder2ForCausalLM, starcoder2(d=64, heads=8, kv=8, layers=3, window=64), id="starcoder2-mha-L3"),
    pytest.param(OPTForCausalLM, opt(), id="opt-preln-tied"),
    pytest.param(OPTForCausalLM, opt(pre=False, width=32, d=64), id="opt350m-postln-project32"),
    pytest.param(OPTForCausalLM, opt(d=48, heads=3, bias=False, affine=False, tied=False, act="gelu", layers=3),
                 id="opt-nobias-noaffine-untied-gelu-L3"),
    pytest.param(OPTForCausalLM, opt(width=40, remove_final=True, tied=False), id="opt-preln-project40-nofinal-untied"),
]


@pytest.mark.parametrize(("cls", "config"), CASES)
def test_family(cls, config, tmp_path, request):
    seed = zlib.crc32(request.node.callspec.id.encode()) % 10_000
    model = build(cls, config, seed=seed)
    save(model, tmp_path)
    ours = qkv.load(tmp_path)
    assert ours.config.family == config.model_type
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW, prompt_length=17,
                       positions=cls is not OPTForCausalLM)


@pytest.mark.parametrize(("cls", "config"), [CASES[1], CASES[4], CASES[8], CASES[11], CASES[12]])
def test_a_model_qkv_saves_reads_back_in_transformers(cls, config, tmp_path):
    model = build(cls, config, seed=5)
    save(model, tmp_path / "hf")
    qkv.load(tmp_path / "hf").save(tmp_path / "qkv")
    back = cls.from_pretrained(tmp_path / "qkv").eval()
    back.set_attn_implementation("eager")
    ids = padded_batch(config.vocab_size, [17], seed=3, low=3)[0]
    with torch.no_grad():
        a, b = model(torch.from_numpy(ids)).logits.numpy(), back(torch.from_numpy(ids)).logits.numpy()
    assert max_abs(a, b) < 1e-5


def autograd(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    model.zero_grad()
    labels = torch.tensor(ids).masked_fill(torch.tensor(mask) == 0, -100)
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), labels=labels, use_cache=False)
    out.loss.backward()
    return out.loss.item(), {k: p.grad.numpy().copy() for k, p in model.named_parameters()}


@pytest.mark.parametrize(("cls", "config"), CASES)
def test_gradients_equal_autograd(cls, config, tmp_path, request):
    """qkv.train.gradients on every case (loss within 1e-5, each tensor within 1e-4 relative error; a gradient
    that is 0 in exact arithmetic, OPT's b_K whose q·b_K is the same for every key, within 1e-6 absolute)."""
    model = build(cls, config, seed=zlib.crc32(request.node.callspec.id.encode()) % 10_000)
    save(model, tmp_path)
    ids, mask = padded_batch(config.vocab_size, [11, 7, 2], seed=5)
    loss_ref, ref = autograd(model, ids, mask)
    loss, grads = qkv.train.gradients(qkv.load(tmp_path), ids, mask)
    assert abs(loss - loss_ref) < 1e-5, (loss, loss_ref)
    assert set(grads) == set(ref)
    for key, g in ref.items():
        if np.linalg.norm(g) < 1e-6:
            assert np.linalg.norm(grads[key]) < 1e-6, key
            continue
        err = np.linalg.norm(grads[key] - g) / np.linalg.norm(g)
        assert err < 1e-4, f"{key}: relative error {err:.2e}"
