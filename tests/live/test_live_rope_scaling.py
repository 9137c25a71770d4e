"""YaRN and dynamic-NTK RoPE against live transformers on random Llama, Qwen2 and GPT-NeoX checkpoints
(make test-live).

YaRN: factors 2–8, original_max_position_embeddings short enough that the ramp lands inside the head, beta_fast /
beta_slow other than 32 / 1, mscale with mscale_all_dim (DeepSeek's attention factor), an explicit
attention_factor, truncate false, a partial rotary factor (GPT-NeoX); each compared on a right- and a left-padded
batch (hidden states and logits within 1e-4, attention weights within 1e-5), then greedy writing with and
without the KV cache, token for token.
Also YaRN in Cohere (interleaved pairs), Phi (partial), Mixtral (mscale), Gemma 2 (windows), Gemma 3 (its full
layers only), SmolLM3 (layers without RoPE) and Falcon; dynamic NTK in Falcon, Cohere and Phi.
Dynamic NTK: factors 1.5–4 with max_position_embeddings 8 or 12, so every pass past it grows the base (qkv
reads up to factor × max_position_embeddings positions). transformers
turns each new query and key with the base of the pass's length and keeps the cached keys as they were turned:
its cached writing is not its full pass. qkv's cached writing equals transformers' cached writing, and qkv's
writing without the cache equals transformers' without it (ids token for token, each step's logits within 1e-4).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import Spy
from live_helpers import INIT_RANGE, TOL_HIDDEN, build, check_decoder_live, max_abs, save
from transformers import (AutoModelForCausalLM, CohereConfig, FalconConfig, Gemma2Config, Gemma3TextConfig,
                          GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM, MixtralConfig, PhiConfig,
                          Qwen2Config, Qwen2ForCausalLM, SmolLM3Config)

import qkv
from qkv import QkvError
from qkv.writing.generate import decode

pytestmark = pytest.mark.live

NEW = 10
SPECIAL = dict(vocab_size=211, pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=INIT_RANGE,
               attn_implementation="eager")


def llama(rope: dict, max_positions: int = 64, head_dim: int | None = None) -> LlamaConfig:
    return LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                       intermediate_size=96, max_position_embeddings=max_positions, head_dim=head_dim,
                       rope_parameters={"rope_theta": 10000.0, **rope}, tie_word_embeddings=False, **SPECIAL)


def qwen2(rope: dict, max_positions: int = 64) -> Qwen2Config:
    return Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=2,
                       intermediate_size=96, max_position_embeddings=max_positions, use_sliding_window=False,
                       rope_parameters={"rope_theta": 1e6, **rope}, tie_word_embeddings=True, **SPECIAL)


def neox(rope: dict) -> GPTNeoXConfig:
    return GPTNeoXConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128,
                         max_position_embeddings=64, rope_parameters={"rope_theta": 10000.0,
                                                                      "partial_rotary_factor": 0.5, **rope},
                         **SPECIAL)


YARN = [
    pytest.param(llama({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
                 id="llama-f4-orig16"),
    pytest.param(llama({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                        "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False}, head_dim=32),
                 id="llama-f8-betas-notrunc"),
    pytest.param(llama({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16,
                        "mscale": 0.707, "mscale_all_dim": 1.0}), id="llama-mscale-all-dim"),
    pytest.param(qwen2({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                        "attention_factor": 1.3}), id="qwen2-attention-factor"),
    pytest.param(qwen2({"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 16}, max_positions=48),
                 id="qwen2-f3"),
    pytest.param(neox({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
                 id="neox-partial-f4"),
]


@pytest.mark.parametrize("config", YARN)
def test_yarn_equals_transformers(config, tmp_path):
    cls = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "gpt_neox": GPTNeoXForCausalLM}[config.model_type]
    model = build(cls, config, seed=31)
    save(model, tmp_path)
    check_decoder_live(model, qkv.load(tmp_path), 211, f"yarn-{config.model_type}", NEW)


def theirs(model, ids: np.ndarray, use_cache: bool) -> tuple[np.ndarray, np.ndarray]:
    """transformers' greedy generate from a fresh rotary table: (new ids (1, NEW), the logits (NEW, 1, V))."""
    for rotary in model.modules():                               # forget a longer pass's table (its state)
        if hasattr(rotary, "original_inv_freq"):
            rotary.inv_freq = rotary.original_inv_freq.clone()
            rotary.max_seq_len_cached = rotary.original_max_seq_len
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.ones_like(torch.from_numpy(ids)),
                             max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0,
                             use_cache=use_cache, output_logits=True, return_dict_in_generate=True)
    return out.sequences[:, ids.shape[1]:].numpy(), torch.stack(out.logits).numpy()


def ours(model, ids: np.ndarray, use_cache: bool) -> tuple[np.ndarray, np.ndarray]:
    spy = Spy(model)
    steps = [s.ids for s in decode(spy, ids, np.ones_like(ids), NEW, temperature=0, stop_at_eos=False,
                                   use_cache=use_cache)]
    return np.stack(steps, axis=1), np.stack(spy.seen)


DYNAMIC = [pytest.param(llama({"rope_type": "dynamic", "factor": 2.0}, max_positions=8), id="llama-f2"),
           pytest.param(llama({"rope_type": "dynamic", "factor": 4.0}, max_positions=8, head_dim=32),
                        id="llama-f4-d32"),
           pytest.param(qwen2({"rope_type": "dynamic", "factor": 1.5}, max_positions=12), id="qwen2-f1.5")]


def other(cls, rope: dict, max_positions: int = 64, **kw):
    """A small config of another RoPE family with ROPE (and its max_position_embeddings)."""
    return cls(**{"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                  "max_position_embeddings": max_positions, "rope_parameters": {"rope_theta": 10000.0, **rope}}
               | SPECIAL | kw)


YARN_4 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
OTHERS = [
    pytest.param(other(CohereConfig, YARN_4, num_key_value_heads=2, intermediate_size=96, logit_scale=0.25),
                 id="cohere-interleaved"),
    pytest.param(other(PhiConfig, YARN_4 | {"partial_rotary_factor": 0.5}, intermediate_size=96), id="phi-partial"),
    pytest.param(other(MixtralConfig, YARN_4 | {"mscale": 1.0, "mscale_all_dim": 0.5}, num_key_value_heads=2,
                       intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, head_dim=16),
                 id="mixtral-mscale"),
    pytest.param(other(Gemma2Config, YARN_4, num_key_value_heads=2, head_dim=16, intermediate_size=80,
                       sliding_window=4, query_pre_attn_scalar=16), id="gemma2-windows"),
    pytest.param(other(SmolLM3Config, YARN_4, num_key_value_heads=2, intermediate_size=80, num_hidden_layers=4),
                 id="smollm3-nope-layers"),
    pytest.param(other(FalconConfig, YARN_4, new_decoder_architecture=True, num_kv_heads=2, alibi=False,
                       bias=False, ffn_hidden_size=96), id="falcon"),
]


@pytest.mark.parametrize("config", OTHERS)
def test_yarn_in_other_families_equals_transformers(config, tmp_path):
    model = build(AutoModelForCausalLM.from_config, config, seed=35)
    save(model, tmp_path)
    check_decoder_live(model, qkv.load(tmp_path), 211, f"yarn-{config.model_type}", NEW)


def test_gemma3_yarn_on_its_full_layers_equals_transformers(tmp_path):
    rope = {"full_attention": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0,
                               "original_max_position_embeddings": 16},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    config = Gemma3TextConfig(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              num_hidden_layers=3, intermediate_size=80, sliding_window=5, query_pre_attn_scalar=16,
                              rope_parameters=rope, max_position_embeddings=64, **SPECIAL)
    model = build(AutoModelForCausalLM.from_config, config, seed=36)
    save(model, tmp_path)
    check_decoder_live(model, qkv.load(tmp_path), 211, "yarn-gemma3", NEW)


DYNAMIC_OTHERS = [
    pytest.param(other(FalconConfig, {"rope_type": "dynamic", "factor": 2.0}, 8, new_decoder_architecture=True,
                       num_kv_heads=2, alibi=False, bias=False, ffn_hidden_size=96), id="falcon"),
    pytest.param(other(CohereConfig, {"rope_type": "dynamic", "factor": 3.0}, 8, num_key_value_heads=2,
                       intermediate_size=96), id="cohere-interleaved"),
    pytest.param(other(PhiConfig, {"rope_type": "dynamic", "factor": 2.0, "partial_rotary_factor": 0.5}, 8,
                       intermediate_size=96), id="phi-partial"),
]


@pytest.mark.parametrize("config", DYNAMIC + DYNAMIC_OTHERS)
def test_dynamic_writes_as_transformers_with_and_without_the_cache(config, tmp_path):
    model = build(AutoModelForCausalLM.from_config, config, seed=32)
    save(model, tmp_path)
    mine = qkv.load(tmp_path)
    ids = np.array([[5, 17, 42, 9, 33, 60]])                         # 6 tokens, then past 8 (12) at a step
    cached, z_cached = theirs(model, ids, use_cache=True)
    full, z_full = theirs(model, ids, use_cache=False)
    assert max_abs(z_cached[-1], z_full[-1]) > 1e-4                   # the two ways differ past the length
    for use_cache, want, z_want in ((True, cached, z_cached), (False, full, z_full)):
        got, z = ours(mine, ids, use_cache)
        np.testing.assert_array_equal(got, want)
        assert max_abs(z, z_want) <= TOL_HIDDEN


@pytest.mark.parametrize("config", [DYNAMIC[0].values[0], YARN[0].values[0]], ids=["dynamic", "yarn"])
def test_a_long_padded_batch_equals_transformers(config, tmp_path):
    """A batch longer than max_position_embeddings (dynamic: 16 > 8, its context factor × 8) / the original
    length (YaRN) in one pass."""
    from live_helpers import compare, decoder_positions, padded_batch, run_reference
    model = build(LlamaForCausalLM, config, seed=33)
    save(model, tmp_path)
    ids, mask = padded_batch(211, [16, 11], seed=13, low=3, side="right")
    ref = run_reference(model, ids, mask, position_ids=decoder_positions(mask))
    compare(qkv.load(tmp_path).forward(ids, mask), ref, mask, label=config.rope_parameters["rope_type"])


@pytest.mark.parametrize("rope, message", [
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 1, "beta_slow": 4},
     "beta_fast ≥ beta_slow"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "truncate": "no"}, "truncate"),
    ({"rope_type": "yarn", "factor": -2.0, "original_max_position_embeddings": 16}, "factor"),
    ({"rope_type": "dynamic", "factor": 0.0}, "factor"),
])
def test_bad_knobs_are_one_line(rope, message, tmp_path):
    model = build(LlamaForCausalLM, llama({"rope_type": "default"}), seed=34)
    save(model, tmp_path)
    import json
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    cfg["rope_parameters"] = {"rope_theta": 10000.0, **rope}
    path.write_text(json.dumps(cfg))
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(tmp_path)
    assert "\n" not in str(e.value)
