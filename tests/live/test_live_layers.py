"""Layers of different kinds against live transformers (group A): Gemma 2, Gemma 3 (text), GPT-Neo, SmolLM3,
Qwen2 / Qwen3 with sliding layers, on random checkpoints of many shapes.

Each case builds a seeded, perturbed model with other knob values — windows of 3–7 tokens under inputs of
11 (and a 9-token prompt growing to 17 while generating), other layer patterns (Gemma 2's alternation, Gemma 3's
five-of-six, GPT-Neo's attention_types, Qwen's max_window_layers, SmolLM3's layers without RoPE), soft-caps
that bite or none, other query_pre_attn_scalar, RoPE bases and scaling per kind, GQA / MQA, tied or untied —
saves it, loads it with qkv and compares a right- and a left-padded batch (hidden states and logits within
1e-4, attention weights within 1e-5), then greedy generation with and without the KV cache token for token.
A model qkv saves is read back by transformers with equal logits, for each family; and the gradients of a
padded batch equal torch autograd.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from live_helpers import (INIT_RANGE, build, check_decoder_live, max_abs, padded_batch, save)
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GPTNeoConfig,
                          GPTNeoForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          SmolLM3Config, SmolLM3ForCausalLM)

import qkv
from qkv.train import gradients

pytestmark = pytest.mark.live

NEW = 8
COMMON = dict(max_position_embeddings=128, initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1,
              eos_token_id=2, attn_implementation="eager")


def gemma2(d=48, heads=4, kv=2, head_dim=16, layers=3, window=4, scalar=24, attn_cap=5.0, final_cap=3.0, tied=True,
           vocab=211, **kw):
    return Gemma2Config(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                        head_dim=head_dim, num_hidden_layers=layers, intermediate_size=80, sliding_window=window,
                        query_pre_attn_scalar=scalar, attn_logit_softcapping=attn_cap,
                        final_logit_softcapping=final_cap, tie_word_embeddings=tied, **COMMON | kw)


def gemma3(d=48, heads=4, kv=2, head_dim=16, layers=3, window=5, scalar=16, full=None, local=None, tied=False,
           vocab=211, **kw):
    rope = {"full_attention": full or {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": local or {"rope_type": "default", "rope_theta": 1e4}}
    return Gemma3TextConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                            head_dim=head_dim, num_hidden_layers=layers, intermediate_size=80, sliding_window=window,
                            query_pre_attn_scalar=scalar, rope_parameters=rope, tie_word_embeddings=tied,
                            **COMMON | kw)


def gpt_neo(d=48, heads=4, types=(("global", "local"), 1), window=4, tied=True, act="gelu_new", vocab=211):
    return GPTNeoConfig(vocab_size=vocab, hidden_size=d, num_heads=heads, num_layers=len(types[0]) * types[1],
                        attention_types=[[list(types[0]), types[1]]], window_size=window, intermediate_size=96,
                        activation_function=act, tie_word_embeddings=tied, **COMMON)


def smollm3(d=48, heads=4, kv=2, layers=4, no_rope=None, sliding=True, window=4, bias=False, tied=True, vocab=211,
            **kw):
    return SmolLM3Config(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                         num_hidden_layers=layers, intermediate_size=80, no_rope_layers=no_rope,
                         use_sliding_window=sliding, sliding_window=window, attention_bias=bias,
                         tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                         **COMMON | kw)


def qwen(cls, d=48, heads=4, kv=2, layers=3, first=1, window=4, tied=False, vocab=211, **kw):
    return cls(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
               num_hidden_layers=layers, intermediate_size=80, use_sliding_window=True, sliding_window=window,
               max_window_layers=first, tie_word_embeddings=tied, **COMMON | kw)


CASES = [
    pytest.param(Gemma2ForCausalLM, gemma2(), id="gemma2-alternate-w4-caps5/3-tied"),
    pytest.param(Gemma2ForCausalLM, gemma2(layers=4, window=7, scalar=64, attn_cap=50.0, final_cap=30.0, kv=1,
                                           tied=False), id="gemma2-L4-w7-caps50/30-mqa-untied"),
    pytest.param(Gemma2ForCausalLM, gemma2(window=3, attn_cap=None, final_cap=None, heads=2, kv=2, head_dim=24),
                 id="gemma2-w3-nocaps-h2"),
    pytest.param(Gemma2ForCausalLM, gemma2(layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                                           attn_cap=2.0), id="gemma2-layer_types-cap2"),
    pytest.param(Gemma3ForCausalLM, gemma3(), id="gemma3-sliding2-full-untied"),
    pytest.param(Gemma3ForCausalLM, gemma3(layers=7, window=3, tied=True,
                                           full={"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5},
                                           local={"rope_type": "default", "rope_theta": 2e3}),
                 id="gemma3-L7-pattern6-w3-linear4-tied"),
    pytest.param(Gemma3ForCausalLM, gemma3(kv=1, scalar=48, attn_logit_softcapping=4.0, final_logit_softcapping=6.0,
                                           layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
                 id="gemma3-mqa-caps-alternate"),
    pytest.param(GPTNeoForCausalLM, gpt_neo(), id="gpt_neo-global-local-w4-tied"),
    pytest.param(GPTNeoForCausalLM, gpt_neo(d=64, heads=8, types=(("local",), 3), window=6, tied=False, act="gelu"),
                 id="gpt_neo-local3-w6-h8-untied-gelu"),
    pytest.param(GPTNeoForCausalLM, gpt_neo(types=(("global", "local", "global"), 1), window=2),
                 id="gpt_neo-glg-w2"),
    pytest.param(SmolLM3ForCausalLM, smollm3(), id="smollm3-every4th-norope-sliding-tied"),
    pytest.param(SmolLM3ForCausalLM, smollm3(layers=3, no_rope=[0, 1, 0], bias=True, tied=False, kv=1),
                 id="smollm3-norope0,2-bias-mqa-untied"),
    pytest.param(SmolLM3ForCausalLM, smollm3(layers=2, no_rope=[1, 0], sliding=False), id="smollm3-nosliding"),
    pytest.param(Qwen2ForCausalLM, qwen(Qwen2ForCausalLM.config_class), id="qwen2-max_window_layers1-w4"),
    pytest.param(Qwen2ForCausalLM, qwen(Qwen2ForCausalLM.config_class, first=0, window=3, tied=True),
                 id="qwen2-all-sliding-w3-tied"),
    pytest.param(Qwen3ForCausalLM, qwen(Qwen3ForCausalLM.config_class, head_dim=24, attention_bias=True,
                                        layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
                 id="qwen3-layer_types-bias"),
]


@pytest.mark.parametrize(("cls", "config"), CASES)
def test_family(cls, config, tmp_path, request):
    seed = zlib.crc32(request.node.callspec.id.encode()) % 10_000
    model = build(cls, config, seed=seed)
    save(model, tmp_path)
    ours = qkv.load(tmp_path)
    windows = [ours.config.window(i) for i in range(ours.config.n_layers)]
    assert any(w is not None for w in windows) or ours.config.no_rope_layers, windows   # layers of two kinds
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)


SAVED = [CASES[0], CASES[5], CASES[8], CASES[11], CASES[13], CASES[15]]


@pytest.mark.parametrize(("cls", "config"), SAVED)
def test_a_model_qkv_saves_reads_back_in_transformers(cls, config, tmp_path):
    model = build(cls, config, seed=5)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    ours.save(tmp_path / "qkv")
    back = cls.from_pretrained(tmp_path / "qkv").eval()
    back.set_attn_implementation("eager")
    ids = padded_batch(config.vocab_size, [12], seed=3, low=3)[0]
    with torch.no_grad():
        a, b = model(torch.from_numpy(ids)).logits.numpy(), back(torch.from_numpy(ids)).logits.numpy()
    assert max_abs(a, b) < 1e-5


@pytest.mark.parametrize(("cls", "config"), SAVED)
def test_gradients_equal_autograd(cls, config, tmp_path):
    model = build(cls, config, seed=9)
    save(model, tmp_path)
    ids, mask = padded_batch(config.vocab_size, [12, 9, 5], seed=4, low=3)
    labels = torch.from_numpy(ids).masked_fill(torch.from_numpy(mask) == 0, -100)
    out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), labels=labels, use_cache=False)
    out.loss.backward()
    loss, grads = gradients(qkv.load(tmp_path), ids, mask)
    assert abs(loss - out.loss.item()) < 1e-5
    for key, p in model.named_parameters():
        key = {"lm_head.weight": "transformer.wte.weight"}.get(key, key) if key not in grads else key
        g_ref = p.grad.numpy()
        if np.linalg.norm(g_ref) < 1e-6:                   # b_K without RoPE: softmax ignores it (round-off)
            assert np.linalg.norm(grads[key]) < 1e-6, key
            continue
        err = np.linalg.norm(grads[key] - g_ref) / np.linalg.norm(g_ref)
        assert err < 1e-4, f"{key}: relative error {err:.2e}"
